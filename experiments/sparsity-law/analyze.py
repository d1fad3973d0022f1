#!/usr/bin/env python3
"""Direct per-budget comparison for experiments/sparsity-law, from `moelab db export` files.

Usage: analyze.py export.json [seed2.json]
       analyze.py --iso-token export.json out.json


Every budget trains all sparsities on the same tokens with active FLOPs per token within 4 %, so
the final validation losses at one budget compare the sparsities directly, without a fitted law
(the law's asymptote E is not identified at these budgets; see README). Prints the loss table,
each sparsity's gap to sparsity 48 per budget, and, with the seed-2 export, the seed-to-seed
spread at the shared budget. Python standard library only.

--iso-token writes a copy of the export whose compute axis leaves the router out: every run's
FLOPs become tokens × the smallest sparsity's FLOPs per token (the sparsities differ only in the
router's d·E multiply-adds), so `moelab fit --inputs out.json` gives the multipliers on the
"active FLOPs without the router" axis next to the one with it.
"""
import json
import sys


def final_losses(path):
    d = json.load(open(path))
    runs = {r["id"]: r for r in d["runs"] if r["status"] == "done"}
    out = {}  # (sparsity, steps) -> (val_loss, flops)
    for p in d["points"]:
        r = runs.get(p["run"])
        if r is None or not p["final"] or p["step"] != r["steps"]:
            continue
        out[(int(r["vars"]["sparsity"]), r["steps"])] = (p["val_loss"], p["flops"])
    return out


def iso_token(src, dst):
    d = json.load(open(src))
    per_token = min(r["flops_per_token"] for r in d["runs"])
    for r in d["runs"]:
        r["flops_per_token"] = per_token
    for p in d["points"]:
        p["flops"] = p["tokens"] * per_token
    d["note"] = ("compute axis without the router: FLOPs = tokens x %g (the smallest sparsity's "
                 "FLOPs per token), written by experiments/sparsity-law/analyze.py --iso-token"
                 % per_token)
    json.dump(d, open(dst, "w"), indent=1)
    print(f"{dst}: FLOPs = tokens × {per_token:g} for every run")


def main():
    if sys.argv[1] == "--iso-token":
        iso_token(sys.argv[2], sys.argv[3])
        return
    seed1 = final_losses(sys.argv[1])
    sparsities = sorted({s for s, _ in seed1})
    budgets = sorted({b for _, b in seed1})
    ref = max(sparsities)
    print("Final validation loss (seed 1) and gap to sparsity %d (negative: the sparser model "
          "is better)\n" % ref)
    print("| steps | tokens | " + " | ".join(f"S={s}" for s in sparsities) + " | " +
          " | ".join(f"S={s} − S={ref}" for s in sparsities if s != ref) + " |")
    print("|---|---|" + "---|" * (2 * len(sparsities) - 1))
    for b in budgets:
        if not all((s, b) in seed1 for s in sparsities):
            continue
        loss = {s: seed1[(s, b)][0] for s in sparsities}
        print(f"| {b} | {b * 8 * 128 / 1e6:.2f} M | " +
              " | ".join(f"{loss[s]:.4f}" for s in sparsities) + " | " +
              " | ".join(f"{loss[s] - loss[ref]:+.4f}" for s in sparsities if s != ref) + " |")
    if len(sys.argv) > 2:
        seed2 = final_losses(sys.argv[2])
        shared = sorted({b for _, b in seed2})
        for b in shared:
            print(f"\nSeed noise at {b} steps (seed 2 − seed 1, same sparsity):\n")
            print("| " + " | ".join(f"S={s}" for s in sparsities) + " |")
            print("|" + "---|" * len(sparsities))
            print("| " + " | ".join(f"{seed2[(s, b)][0] - seed1[(s, b)][0]:+.4f}"
                                    for s in sparsities if (s, b) in seed2) + " |")
            gaps = [seed2[(s, b)][0] - seed2[(ref, b)][0] for s in sparsities if s != ref]
            others = [s for s in sparsities if s != ref]
            print(f"\nseed 2 gaps to S={ref} at {b} steps: " +
                  ", ".join(f"S={s}: {g:+.4f}" for s, g in zip(others, gaps)))


if __name__ == "__main__":
    main()
