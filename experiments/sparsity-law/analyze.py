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
  seeds, a 90 % t interval (df = seeds - 1), the exact sign-flip p and the seed bootstrap
  ("seed range" below 8 seeds) (the replicate is a seed: the budgets of a seed are branches of
  one trunk and share its noise, so they are not independent replicates);
- the per-run seed SD of the loss, pooled over (sparsity, budget), with its degrees of freedom
  counted by seed (budgets of one seed share its trunk: they add no degrees of freedom).

--long prints the longer trunk's table (final loss per budget for each sparsity, the gap and
the relative gap) and the reproduction check: each budget the long export shares with the
reference export (seed 1's 3200-step runs) must give the same final loss; it prints the
difference and whether the two are bit for bit equal.

--ratios (alias --t-ratios) reads `moelab fit --json` on stdin and prints, from fit's model_free
rows, each FLOPs ratio's per-seed values and its primary statement (90 % t interval on the log
ratio, df = seeds - 1, exact sign-flip p, seed range), then the pre-registered estimand: the
per-doubling slope beta in log(C_S / C_48) = beta * log2(48 / S), per seed at each target, and
its trend in L* (each seed's slope d beta / d L*), with the same statement.

--iso-token writes a copy of the export whose compute axis leaves the router out: every run's
FLOPs become tokens × the smallest sparsity's FLOPs per token at its model size (the sparsities
of one size differ only in the router's d·E multiply-adds; sizes, the sweep variables other than
sparsity, budget and seed, keep their own), so `moelab fit --inputs out.json` gives the multipliers on the
"active FLOPs without the router" axis next to the one with it.

Python standard library only.
"""
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import seed_stats  # noqa: E402


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


# Sweep variables that are not the model's size: the sparsity arm (and the expert count it
# derives), the budget, the seed and the build.
NOT_SIZE = {"sparsity", "moe.experts_total", "train.steps", "train.tokens", "train.seed",
            "build.commit"}


def size_key(run):
    """The run's model size: its sweep variables other than sparsity, budget, seed and build
    (d_model, expert_hidden, ... in a frontier design; empty in a single-size one)."""
    return tuple(sorted((k, v) for k, v in run.get("vars", {}).items() if k not in NOT_SIZE))


def iso_token(src, dst):
    d = json.load(open(src))
    # Per model size: the sparsities of one size differ only in the router's d·E multiply-adds,
    # so each run's FLOPs per token becomes its size's smallest-sparsity value (sizes differ
    # for real: a frontier design keeps its sizes apart on the compute axis).
    per_token = {}
    for r in d["runs"]:
        k = size_key(r)
        per_token[k] = min(per_token.get(k, math.inf), r["flops_per_token"])
    run_size = {r["id"]: size_key(r) for r in d["runs"]}
    for r in d["runs"]:
        r["flops_per_token"] = per_token[run_size[r["id"]]]
    for p in d["points"]:
        p["flops"] = p["tokens"] * per_token[run_size[p["run"]]]
    values = ", ".join(f"{v:g}" for v in sorted(per_token.values()))
    d["note"] = ("compute axis without the router: FLOPs = tokens x the smallest sparsity's FLOPs "
                 "per token at the run's model size (%s), written by "
                 "experiments/sparsity-law/analyze.py --iso-token" % values)
    json.dump(d, open(dst, "w"), indent=1)
    print(f"{dst}: FLOPs = tokens × the smallest sparsity's FLOPs per token of each model size "
          f"({len(per_token)} size(s): {values})")


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
    """Gap to ref per seed at the budgets several seeds trained, with seed-level statements."""
    budgets = sorted({b for _, _, b in runs})
    others = [s for s in sparsities if s != ref]
    print(f"\nGap to S={ref} per seed (seeds {', '.join(map(str, seeds))}); mean over seeds, 90 % t "
          "interval (df = seeds - 1), exact sign-flip p, seed bootstrap ('seed range' below 8 "
          "seeds); 'behind' counts the seeds where the denser model's loss is higher\n")
    seed_stats.print_seed_table_header(
        ["steps", "sparsity"], seeds,
        ["mean", "90 % t interval (df)", "p", "seed range", "behind"])
    for b in budgets:
        for s in others:
            have = [k for k in seeds if (k, s, b) in runs and (k, ref, b) in runs]
            if len(have) < 2:
                continue
            g = {k: runs[(k, s, b)][0] - runs[(k, ref, b)][0] for k in have}
            vals = list(g.values())
            d = seed_stats.describe(vals)
            cells = [f"{g[k]:+.4f}" if k in g else "–" for k in seeds]
            if "note" in d:
                stats = f" | {d['point']:+.4f} | none ({d['note']}) | – | – |"
            else:
                stats = (f" | {d['point']:+.4f} | [{d['t_lo']:+.4f}, {d['t_hi']:+.4f}] "
                         f"({d['df']}) | {d['p']:.3g} | [{d['boot_lo']:+.4f}, "
                         f"{d['boot_hi']:+.4f}] |")
            print(f"| {b} | {s} | " + " | ".join(cells) + stats +
                  f" {sum(v > 0 for v in vals)}/{len(vals)} |")


def pooled_seed_sd(runs):
    """Per-run seed SD of the loss, pooled over the (sparsity, budget) cells with >= 2 seeds.

    Degrees of freedom are counted by seed: the budgets of a seed are branches of one trunk, so
    a sparsity trained with n seeds contributes n - 1 however many budgets it has."""
    cells = {}
    for (k, s, b), v in runs.items():
        cells.setdefault((s, b), []).append(v[0])
    ss, cell_dof = 0.0, 0
    for vals in cells.values():
        if len(vals) >= 2:
            m = statistics.fmean(vals)
            ss += sum((x - m) ** 2 for x in vals)
            cell_dof += len(vals) - 1
    seeds_of = {}
    for (k, s, b) in runs:
        if len(cells[(s, b)]) >= 2:
            seeds_of.setdefault(s, set()).add(k)
    dof = sum(len(v) - 1 for v in seeds_of.values())
    if cell_dof:
        sd = math.sqrt(ss / cell_dof)
        print(f"\nPer-run seed SD of the final loss, pooled over (sparsity, budget) cells with "
              f"two or more seeds: {sd:.4f} nats, {dof} degrees of freedom counted by seed "
              f"(sum over sparsities of seeds - 1; the {cell_dof} cell-wise ones are not "
              f"independent: a seed's budgets share its trunk)")


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


def ratios(fit):
    mf = fit["model_free"]
    ref = mf["reference"]
    rows = sorted(mf["rows"], key=lambda r: (r["target_loss"], float(r["family"])))
    print(f"Model-free FLOPs ratio to S={ref}: per seed, then the geometric mean over seeds with "
          "its 90 % t interval on the log ratio (df = seeds - 1), the exact sign-flip p and the "
          "seed bootstrap (enumerated; 'seed range' below 8 seeds)\n")
    print("| L* | S | per seed | ratio [90 % t] (df) | p | seed range |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        per = [a / b for a, b in zip(r["flops_family"], r["flops_reference"])]
        d = seed_stats.describe(per, log_scale=True)
        seeds = " / ".join(f"{v:.3f}" for v in per)
        if "note" in d:
            print(f"| {r['target_loss']:.3f} | {r['family']} | {seeds} | {d['point']:.3f} "
                  f"({d['note']}) | – | – |")
            continue
        print(f"| {r['target_loss']:.3f} | {r['family']} | {seeds} | {d['point']:.3f} "
              f"[{d['t_lo']:.3f}, {d['t_hi']:.3f}] ({d['df']}) | {d['p']:.3g} | "
              f"[{d['boot_lo']:.3f}, {d['boot_hi']:.3f}] |")
    # The pre-registered estimand: beta per seed through the origin over the sparsities.
    print(f"\nPer-doubling slope beta in log(C_S / C_{ref}) = beta * log2({ref} / S), per seed "
          "(least squares through the origin over every S), exp(beta) = FLOPs factor per "
          "doubling (K2: 1.22x)\n")
    print("| L* | beta per seed | beta [90 % t] (df) | p | seed range | per doubling [90 % t] |")
    print("|---|---|---|---|---|---|")
    by_seed = {}
    for target in sorted({r["target_loss"] for r in rows}):
        xy = {}
        at = [r for r in rows if r["target_loss"] == target and float(r["family"]) != float(ref)]
        for r in at:
            x = math.log2(float(ref) / float(r["family"]))
            for k, a, b in zip(r["seeds"], r["flops_family"], r["flops_reference"]):
                xy.setdefault(k, []).append((x, math.log(a / b)))
        betas = {k: sum(x * y for x, y in v) / sum(x * x for x, y in v)
                 for k, v in xy.items() if len(v) == len(at)}
        for k, v in betas.items():
            by_seed.setdefault(k, {})[target] = v
        d = seed_stats.describe(list(betas.values()))
        per = " / ".join(f"{betas[k]:+.3f}" for k in sorted(betas))
        if "note" in d:
            print(f"| {target:.3f} | {per} | {d['point']:+.3f} ({d['note']}) | – | – | "
                  f"{math.exp(d['point']):.3f} |")
            continue
        print(f"| {target:.3f} | {per} | {d['point']:+.3f} [{d['t_lo']:+.3f}, {d['t_hi']:+.3f}] "
              f"({d['df']}) | {d['p']:.3g} | [{d['boot_lo']:+.3f}, {d['boot_hi']:+.3f}] | "
              f"{math.exp(d['point']):.3f} [{math.exp(d['t_lo']):.3f}, "
              f"{math.exp(d['t_hi']):.3f}] |")
    slopes = {}
    for k, bt in by_seed.items():
        if len(bt) < 2:
            continue
        xs, ys = list(bt), list(bt.values())
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        slopes[k] = (sum((x - mx) * (y - my) for x, y in zip(xs, ys)) /
                     sum((x - mx) ** 2 for x in xs))
    if slopes:
        d = seed_stats.describe(list(slopes.values()))
        print(f"\nTrend d beta / d L* per seed: " +
              ", ".join(f"seed {k} {v:+.3f}" for k, v in sorted(slopes.items())) +
              f"; over seeds: {seed_stats.format_statement(d, '{:+.3f}')} (negative: beta "
              "grows as the target falls)")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if sys.argv[1] == "--iso-token":
        iso_token(sys.argv[2], sys.argv[3])
        return
    if sys.argv[1] in ("--ratios", "--t-ratios"):
        ratios(json.load(sys.stdin))
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
