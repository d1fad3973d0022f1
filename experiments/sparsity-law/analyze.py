#!/usr/bin/env python3
"""Direct per-budget comparison for experiments/sparsity-law, from `moelab db export` files.

Usage: analyze.py export.json [export-seed2.json export-seed3.json ...]
       analyze.py --long export-long.json export.json
       analyze.py --iso-token export.json out.json
       moelab fit --inputs ... --json | analyze.py --t-ratios

Every budget trains all sparsities on the same tokens with active FLOPs per token within 4 %, so
the final validation losses at one budget compare the sparsities directly, without a fitted law
(the power-law form is rejected at these budgets; see README). Runs are keyed by their seed
(train.seed), so the exports may come in any order. Prints:
- the loss table of the seed with the most budgets (seed 1: the full grid) and each sparsity's
  gap to the sparsest family per budget;
- with several seeds, the gap per seed at every budget two or more seeds trained, its mean over
  seeds, the seed SD and a 90 % t interval over seeds (the replicate is a seed: the budgets of a
  seed are branches of one trunk and share its noise, so they are not independent replicates);
- the per-run seed SD of the loss, pooled over (sparsity, budget).

--long prints the longer trunk's table (final loss per budget for each sparsity, the gap and
the relative gap) and the reproduction check: each budget the long export shares with the
reference export (seed 1's 3200-step runs) must give the same final loss; it prints the
difference and whether the two are bit for bit equal.

--t-ratios reads `moelab fit --json` on stdin and prints, next to fit's seed bootstrap, a 90 %
Student t interval over seeds on the log of each model-free FLOPs ratio (per-seed values from
fit's model_free rows): a parametric cross-check that, unlike a bootstrap over 3-4 seeds, can
reach beyond the range of the per-seed values.

--iso-token writes a copy of the export whose compute axis leaves the router out: every run's
FLOPs become tokens × the smallest sparsity's FLOPs per token (the sparsities differ only in the
router's d·E multiply-adds), so `moelab fit --inputs out.json` gives the multipliers on the
"active FLOPs without the router" axis next to the one with it.

Python standard library only.
"""
import json
import math
import statistics
import sys

# Two-sided 90 % Student t quantiles (0.95 one-sided) by degrees of freedom.
T90 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860}


def final_losses(paths):
    """(seed, sparsity, steps) -> (val_loss, tokens, flops) of every done run's final point."""
    out = {}
    for path in paths:
        d = json.load(open(path))
        runs = {r["id"]: r for r in d["runs"] if r["status"] == "done"}
        for p in d["points"]:
            r = runs.get(p["run"])
            if r is None or not p["final"] or p["step"] != r["steps"]:
                continue
            key = (int(r["config"]["train"]["seed"]), int(r["vars"]["sparsity"]), r["steps"])
            if key in out:
                sys.exit(f"{path}: run '{r['name']}' duplicates seed {key[0]}, sparsity "
                         f"{key[1]}, {key[2]} steps of an earlier export")
            out[key] = (p["val_loss"], p["tokens"], p["flops"])
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


def loss_table(runs, seed, sparsities, ref):
    budgets = sorted({b for s_, _, b in runs if s_ == seed})
    print(f"Final validation loss (seed {seed}) and gap to sparsity {ref} (negative: the sparser "
          "model is better)\n")
    others = [s for s in sparsities if s != ref]
    print("| steps | tokens | " + " | ".join(f"S={s}" for s in sparsities) + " | " +
          " | ".join(f"S={s} − S={ref}" for s in others) + " |")
    print("|---|---|" + "---|" * (len(sparsities) + len(others)))
    for b in budgets:
        if not all((seed, s, b) in runs for s in sparsities):
            continue
        loss = {s: runs[(seed, s, b)][0] for s in sparsities}
        tokens = runs[(seed, ref, b)][1]
        print(f"| {b} | {tokens / 1e6:.2f} M | " +
              " | ".join(f"{loss[s]:.4f}" for s in sparsities) + " | " +
              " | ".join(f"{loss[s] - loss[ref]:+.4f}" for s in others) + " |")


def seed_gaps(runs, seeds, sparsities, ref):
    """Gap to ref per seed at the budgets several seeds trained, with seed-level summaries."""
    budgets = sorted({b for _, _, b in runs})
    others = [s for s in sparsities if s != ref]
    print(f"\nGap to S={ref} per seed (seeds {', '.join(map(str, seeds))}); mean over seeds, seed "
          "SD, 90 % t interval over seeds; 'behind' counts the seeds where the denser model's "
          "loss is higher\n")
    print("| steps | sparsity | " + " | ".join(f"seed {k}" for k in seeds) +
          " | mean | seed SD | 90 % t interval | behind |")
    print("|---|---|" + "---|" * (len(seeds) + 4))
    for b in budgets:
        for s in others:
            have = [k for k in seeds if (k, s, b) in runs and (k, ref, b) in runs]
            if len(have) < 2:
                continue
            g = {k: runs[(k, s, b)][0] - runs[(k, ref, b)][0] for k in have}
            vals = list(g.values())
            mean = statistics.fmean(vals)
            sd = statistics.stdev(vals)
            half = T90[len(vals) - 1] * sd / math.sqrt(len(vals))
            cells = [f"{g[k]:+.4f}" if k in g else "–" for k in seeds]
            print(f"| {b} | {s} | " + " | ".join(cells) +
                  f" | {mean:+.4f} | {sd:.4f} | [{mean - half:+.4f}, {mean + half:+.4f}] | "
                  f"{sum(v > 0 for v in vals)}/{len(vals)} |")


def pooled_seed_sd(runs):
    """Per-run seed SD of the loss, pooled over the (sparsity, budget) cells with >= 2 seeds."""
    cells = {}
    for (k, s, b), v in runs.items():
        cells.setdefault((s, b), []).append(v[0])
    ss, dof = 0.0, 0
    for vals in cells.values():
        if len(vals) >= 2:
            m = statistics.fmean(vals)
            ss += sum((x - m) ** 2 for x in vals)
            dof += len(vals) - 1
    if dof:
        sd = math.sqrt(ss / dof)
        print(f"\nPer-run seed SD of the final loss, pooled over (sparsity, budget) cells with "
              f"two or more seeds: {sd:.4f} nats ({dof} degrees of freedom)")


def long_trunk(long_path, ref_path):
    runs = final_losses([long_path])
    ref = final_losses([ref_path])
    sparsities = sorted({s for _, s, _ in runs})
    budgets = sorted({b for _, _, b in runs})
    seeds = sorted({k for k, _, _ in runs})
    lo, hi = min(sparsities), max(sparsities)
    print(f"Longer trunk ({long_path}; seed {', '.join(map(str, seeds))}): final validation "
          "loss per budget; one seed: no interval\n")
    print("| steps | tokens | " + " | ".join(f"S={s}" for s in sparsities) +
          f" | S={lo} − S={hi} | relative |")
    print("|---|---|" + "---|" * (len(sparsities) + 2))
    for k in seeds:
        for b in budgets:
            if not all((k, s, b) in runs for s in sparsities):
                print(f"| {b} | (not all sparsities done) |")
                continue
            loss = {s: runs[(k, s, b)][0] for s in sparsities}
            gap = loss[lo] - loss[hi]
            print(f"| {b} | {runs[(k, hi, b)][1] / 1e6:.2f} M | " +
                  " | ".join(f"{loss[s]:.4f}" for s in sparsities) +
                  f" | {gap:+.4f} | {100 * gap / loss[hi]:+.2f} % |")
    print(f"\nReproduction check against {ref_path} (same seed, sparsity and budget):\n")
    shared = sorted(key for key in runs if key in ref)
    if not shared:
        print("no budget in common")
    for key in shared:
        a, b = runs[key][0], ref[key][0]
        print(f"seed {key[0]}, S={key[1]}, {key[2]} steps: long {a!r} vs reference {b!r}: "
              f"difference {a - b:+.3e} ({'bit for bit equal' if a == b else 'NOT equal'})")


def t_ratios(fit):
    mf = fit["model_free"]
    print(f"Model-free FLOPs ratio to S={mf['reference']}: geometric mean over seeds, 90 % t "
          "interval on the log ratio over seeds (fit's bootstrap interval for comparison)\n")
    print("| L* | sparsity | seeds | ratio | 90 % t interval | bootstrap interval |")
    print("|---|---|---|---|---|---|")
    for r in sorted(mf["rows"], key=lambda r: (r["target_loss"], int(r["family"]))):
        logs = [math.log(a / b) for a, b in zip(r["flops_family"], r["flops_reference"])]
        m = statistics.fmean(logs)
        boot = r["flops_ratio"]
        boot_text = (f"[{boot['lo']:.3f}, {boot['hi']:.3f}]"
                     if boot.get("lo") is not None else "none")
        if len(logs) < 2:
            t_text = "none (one seed)"
        else:
            half = T90[len(logs) - 1] * statistics.stdev(logs) / math.sqrt(len(logs))
            t_text = f"[{math.exp(m - half):.3f}, {math.exp(m + half):.3f}]"
        print(f"| {r['target_loss']:.2f} | {r['family']} | {len(logs)} | {math.exp(m):.3f} | "
              f"{t_text} | {boot_text} |")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if sys.argv[1] == "--iso-token":
        iso_token(sys.argv[2], sys.argv[3])
        return
    if sys.argv[1] == "--t-ratios":
        t_ratios(json.load(sys.stdin))
        return
    if sys.argv[1] == "--long":
        long_trunk(sys.argv[2], sys.argv[3])
        return
    runs = final_losses(sys.argv[1:])
    seeds = sorted({k for k, _, _ in runs})
    sparsities = sorted({s for _, s, _ in runs})
    ref = max(sparsities)
    full = max(seeds, key=lambda k: sum(1 for k_, _, _ in runs if k_ == k))
    loss_table(runs, full, sparsities, ref)
    if len(seeds) > 1:
        seed_gaps(runs, seeds, sparsities, ref)
        pooled_seed_sd(runs)


if __name__ == "__main__":
    main()
