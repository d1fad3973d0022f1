#!/usr/bin/env python3
"""Tables for experiments/muon-vs-adamw from the sweep database or its committed export.

Usage: analyze.py runs/muon.db [ADAMW_LR MUON_LR]   (the sweep database; LRs: compare there)
       analyze.py experiments/muon-vs-adamw/export.csv    (the committed `moelab db export --format csv`)

Python standard library only. Prints Markdown tables: the LR sweep (final validation loss of
every decayed WSD endpoint), the frontier at each optimizer's best LR per seed, and the
tokens-to-target-loss ratio AdamW / Muon with a seed bootstrap interval.
"""
import json
import math
import random
import sqlite3
import sys
from collections import defaultdict


def load(path):
    """Returns a list of dicts: name, optimizer, lr, steps, seed, tokens, val_loss (final)."""
    runs = []
    if path.endswith(".csv"):
        import csv
        by_run = {}
        for row in csv.DictReader(open(path)):
            r = by_run.setdefault(row["run_id"], dict(
                name=row["run_name"], optimizer=row["optimizer.name"],
                lr=float(row["optimizer.lr"]), steps=int(row["train.steps"]),
                seed=int(row.get("train.seed") or 1), status=row["status"], evals=[]))
            r["evals"].append(dict(step=int(row["step"]), tokens=int(float(row["tokens"])),
                                   val_loss=float(row["val_loss"])))
        for r in by_run.values():
            last = max(r["evals"], key=lambda e: e["step"])
            r["tokens"], r["val_loss"] = last["tokens"], last["val_loss"]
            runs.append(r)
        return runs
    db = sqlite3.connect(path)
    for rid, name, cfg_json, status in db.execute(
            "SELECT id, name, config_json, status FROM runs ORDER BY id"):
        cfg = json.loads(cfg_json)
        evals = [dict(step=s, tokens=t, val_loss=v) for s, t, v in db.execute(
            "SELECT step, tokens, val_loss FROM evals WHERE run_id = ? ORDER BY step", (rid,))]
        last = evals[-1] if evals else None
        runs.append(dict(name=name, optimizer=cfg["optimizer"]["name"], lr=cfg["optimizer"]["lr"],
                         steps=cfg["train"]["steps"], seed=cfg["train"]["seed"],
                         tokens=last["tokens"] if last else None,
                         val_loss=last["val_loss"] if last else None, status=status,
                         evals=evals))
    return runs


def tokens_to_target(frontier, target):
    """frontier: [(tokens, loss)] sorted by tokens. Linear interpolation of log(tokens) against
    loss between the first pair of consecutive points that brackets target. None if the
    frontier never reaches target; the first point's tokens if it is already below."""
    if not frontier:
        return None
    if frontier[0][1] <= target:
        return frontier[0][0]
    for (t0, l0), (t1, l1) in zip(frontier, frontier[1:]):
        if l1 <= target < l0:
            f = (l0 - target) / (l0 - l1)
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    return None


def main():
    runs = [r for r in load(sys.argv[1]) if r["status"] == "done" and r["val_loss"] is not None]
    budgets = sorted({r["steps"] for r in runs})
    longest = budgets[-1]

    # 1. LR sweep (seed 1).
    print("### LR sweep, seed 1: final validation loss of each WSD endpoint\n")
    print("| optimizer | lr | " + " | ".join(f"{b} steps" for b in budgets) + " |")
    print("|---|---|" + "---|" * len(budgets))
    by = {}
    for r in runs:
        by[(r["optimizer"], r["lr"], r["steps"], r["seed"])] = r
    for opt in ("adamw", "muon"):
        for lr in sorted({r["lr"] for r in runs if r["optimizer"] == opt}):
            cells = []
            for b in budgets:
                r = by.get((opt, lr, b, 1))
                cells.append(f"{r['val_loss']:.4f}" if r else "—")
            print(f"| {opt} | {lr:g} | " + " | ".join(cells) + " |")

    # 2. Best LR per optimizer: lowest seed-1 loss at the longest budget.
    best = {}
    for opt in ("adamw", "muon"):
        cand = [r for r in runs if r["optimizer"] == opt and r["steps"] == longest
                and r["seed"] == 1]
        if cand:
            best[opt] = min(cand, key=lambda r: r["val_loss"])["lr"]
    print("\nBest LR (lowest seed-1 loss at %d steps): %s\n" %
          (longest, ", ".join(f"{o} {lr:g}" for o, lr in best.items())))
    if len(sys.argv) > 3:  # compare at given LRs instead: analyze.py DB ADAMW_LR MUON_LR
        best = {"adamw": float(sys.argv[2]), "muon": float(sys.argv[3])}
        print("Compared at the given LRs: adamw %g, muon %g\n" % (best["adamw"], best["muon"]))

    fronts = defaultdict(dict)  # opt -> seed -> [(tokens, loss)]
    for opt, lr in best.items():
        for r in runs:
            if r["optimizer"] == opt and r["lr"] == lr:
                fronts[opt].setdefault(r["seed"], []).append((r["tokens"], r["val_loss"]))
        for s in fronts[opt]:
            fronts[opt][s].sort()

    print("### Frontier at the best LRs (decayed WSD endpoints; tokens ∝ training FLOPs)\n")
    print("| optimizer | lr | seed | " + " | ".join(f"{b} steps" for b in budgets) + " |")
    print("|---|---|---|" + "---|" * len(budgets))
    for opt, lr in best.items():
        for s in sorted(fronts[opt]):
            cells = []
            for b in budgets:
                r = by.get((opt, lr, b, s))
                cells.append(f"{r['val_loss']:.4f}" if r else "—")
            print(f"| {opt} | {lr:g} | {s} | " + " | ".join(cells) + " |")
    if "adamw" not in best or "muon" not in best:
        return
    # Seed means per budget, and the Muon - AdamW gap at equal FLOPs.
    print("\n| steps | tokens | AdamW mean (n) | Muon mean (n) | Muon − AdamW |")
    print("|---|---|---|---|---|")
    for b in budgets:
        a = [by[k]["val_loss"] for k in by if k[0] == "adamw" and k[1] == best["adamw"]
             and k[2] == b]
        m = [by[k]["val_loss"] for k in by if k[0] == "muon" and k[1] == best["muon"]
             and k[2] == b]
        toks = next(r["tokens"] for r in runs if r["steps"] == b)
        if a and m:
            ma, mm = sum(a) / len(a), sum(m) / len(m)
            print(f"| {b} | {toks} | {ma:.4f} ({len(a)}) | {mm:.4f} ({len(m)}) | {mm - ma:+.4f} |")

    # 3. Tokens to target: target = AdamW's seed-mean loss at the longest budget.
    def mean_frontier(seed_fronts):
        pts = defaultdict(list)
        for f in seed_fronts:
            for t, l in f:
                pts[t].append(l)
        return sorted((t, sum(v) / len(v)) for t, v in pts.items())

    def ratio(a_fronts, m_fronts):
        fa, fm = mean_frontier(a_fronts), mean_frontier(m_fronts)
        target = fa[-1][1]
        ta, tm = tokens_to_target(fa, target), tokens_to_target(fm, target)
        if ta is None or tm is None:
            return None, target, ta, tm
        return ta / tm, target, ta, tm

    a_seeds = [fronts["adamw"][s] for s in sorted(fronts["adamw"])]
    m_seeds = [fronts["muon"][s] for s in sorted(fronts["muon"])]
    r, target, ta, tm = ratio(a_seeds, m_seeds)
    print(f"\n### Tokens to AdamW's final loss (target {target:.4f}, seed mean of "
          f"{len(a_seeds)} AdamW / {len(m_seeds)} Muon seeds)\n")
    if r is None:
        print("Muon's frontier does not reach the target (or AdamW's does not): no ratio.")
        return
    print(f"AdamW: {ta:.0f} tokens, Muon: {tm:.0f} tokens (log-linear interpolation between "
          f"decayed endpoints); ratio AdamW/Muon = {r:.2f}")
    # Per seed pair (seed i of each optimizer, target fixed at the mean).
    for s in sorted(set(fronts["adamw"]) & set(fronts["muon"])):
        t_a = tokens_to_target(fronts["adamw"][s], target)
        t_m = tokens_to_target(fronts["muon"][s], target)
        txt = f"{t_a / t_m:.2f}" if t_a and t_m else "n/a (target not reached)"
        print(f"- seed {s}: AdamW {t_a and round(t_a)} tokens, Muon {t_m and round(t_m)} tokens, "
              f"ratio {txt}")
    # The same ratio with AdamW's seed-mean loss at each shorter budget as the target.
    fa, fm = mean_frontier(a_seeds), mean_frontier(m_seeds)
    print("\n| target = AdamW mean loss at | target | AdamW tokens | Muon tokens | ratio |")
    print("|---|---|---|---|---|")
    for t_a, target_b in fa:
        t_m = tokens_to_target(fm, target_b)
        below = fm[0][1] <= target_b
        txt = "—" if t_m is None else (f"≥ {t_a / t_m:.2f}" if below else f"{t_a / t_m:.2f}")
        print(f"| {t_a} tokens | {target_b:.4f} | {t_a} | "
              f"{'≤ ' if below else ''}{t_m and round(t_m)} | {txt} |")
    # Seed bootstrap, paired: resample seed indices and take both optimizers' runs of each drawn
    # seed (the same data order), so seed noise common to both cancels as it does in the point
    # estimate. Resampling each optimizer's seeds separately treated them as independent.
    paired = sorted(set(fronts["adamw"]) & set(fronts["muon"]))
    if len(paired) < 3:
        print(f"\nSeed bootstrap: {len(paired)} seeds run with both optimizers: too few for an "
              f"interval (needs >= 3)")
        return
    rng = random.Random(13)
    vals, fails = [], 0
    for _ in range(2000):
        draw = [rng.choice(paired) for _ in paired]
        ra, _, _, _ = ratio([fronts["adamw"][s] for s in draw], [fronts["muon"][s] for s in draw])
        if ra is None:
            fails += 1
        else:
            vals.append(ra)
    vals.sort()
    if vals:
        lo, hi = vals[int(0.025 * len(vals))], vals[int(0.975 * len(vals)) - 1]
        print(f"\nSeed bootstrap (2000 resamples of the {len(paired)} seeds, both optimizers' "
              f"runs of a drawn seed together; {fails} failed): 95 % interval of the ratio "
              f"[{lo:.2f}, {hi:.2f}]")

if __name__ == "__main__":
    main()
