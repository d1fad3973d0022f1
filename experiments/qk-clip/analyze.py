#!/usr/bin/env python3
"""Tables for experiments/qk-clip (self-deactivation, per-head vs global).

Usage: analyze.py SOURCE [WINDOW]      (WINDOW: steps per row, default 100)

SOURCE is the database (runs/qk-clip.db, git-ignored) or the folder holding the committed
exports (experiments/qk-clip: export.csv, clip_events.csv, max_logits_every10.csv,
norm_gain_rms_every10.csv), so the tables can be rebuilt from committed files. From the exports
the max logits are every 10th step: a peak between two of them is seen only when a clip event
records it (clipped runs: exact; unclipped runs: the peak of the sampled steps), and the
per-window "max logit at the window's last step" is the same sample.

Python standard library only. For every finished run: peak max logit (raw, before the step's
clip), clip events, heads touched per clipping step, last clip step, final validation loss, and
the cumulative shrinkage of each head's q·k scale (the product of the γ applied to that head: the
clipped logits scale by exactly γ, W_q by γ^α and W_k by γ^(1−α)); global scope also counts the
heads that were below τ but scaled with their layer. Then the fraction of
(step, head) pairs clipped per window, and the max logit at the end of each window.
"""
import csv
import json
import math
import os
import re
import sqlite3
import struct
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import seed_stats  # noqa: E402


def load_db(path):
    """Per run: (name, cfg, max logits by step, clip events, norm-gain RMS series, final loss)."""
    db = sqlite3.connect(path)
    runs = db.execute("SELECT id, name, config_json FROM runs WHERE status = 'done' ORDER BY id")
    cols = [r[1] for r in db.execute("PRAGMA table_info(steps)")]
    out = []
    for rid, name, cfg in runs.fetchall():
        cfg = json.loads(cfg)
        opt = cfg["optimizer"]
        c = {"tau": opt.get("qk_clip_tau", 0), "scope": opt.get("qk_clip_mode", "per_head"),
             "lr": opt["lr"], "seed": cfg["train"]["seed"], "steps": cfg["train"]["steps"],
             "nheads": cfg["model"]["layers"] * cfg["model"]["heads"]}
        ml = {}
        for s, a, b in db.execute("SELECT step, max_logit, max_logit_raw FROM max_logits WHERE "
                                  "run_id = ? ORDER BY step", (rid,)):
            blob = b if b is not None else a
            ml[s] = struct.unpack("<%df" % (len(blob) // 4), blob)
        ev = db.execute("SELECT step, layer, head, gamma, s_max FROM clip_events WHERE "
                        "run_id = ? ORDER BY step", (rid,)).fetchall()
        g = []
        if "norm_gain_rms" in cols:  # schema 6 and later (earlier runs: not logged)
            g = [v for (v,) in db.execute("SELECT norm_gain_rms FROM steps WHERE run_id = ? AND "
                                          "norm_gain_rms IS NOT NULL ORDER BY step", (rid,))]
        val = db.execute("SELECT val_loss FROM evals WHERE run_id = ? ORDER BY step DESC LIMIT 1",
                         (rid,)).fetchone()
        out.append((name, c, ml, ev, g, val[0] if val else float("nan")))
    return out


def load_exports(folder):
    """The same from the committed CSV exports; the config is read from the run names (the
    names self-deactivation.sh gives: tau, scope, lr and seed) and base.json."""
    base = json.load(open(os.path.join(folder, "base.json")))
    rows = list(csv.DictReader(open(os.path.join(folder, "export.csv"))))
    ml_rows = list(csv.DictReader(open(os.path.join(folder, "max_logits_every10.csv"))))
    heads = [k for k in ml_rows[0] if re.fullmatch(r"l\d+h\d+", k)] if ml_rows else []
    ml = defaultdict(dict)
    for r in ml_rows:
        ml[r["run"]][int(r["step"])] = tuple(float(r[h]) for h in heads)
    ev = defaultdict(list)
    for r in csv.DictReader(open(os.path.join(folder, "clip_events.csv"))):
        ev[r["run"]].append((int(r["step"]), int(r["layer"]), int(r["head"]), float(r["gamma"]),
                             float(r["s_max"])))
    gains = defaultdict(list)
    for r in csv.DictReader(open(os.path.join(folder, "norm_gain_rms_every10.csv"))):
        gains[r["run"]].append(float(r["norm_gain_rms"]))
    steps, final, order = {}, {}, []
    for r in rows:
        if r["status"] != "done":
            continue
        name = r["run_name"]
        if name not in steps:
            order.append(name)
        steps[name] = max(steps.get(name, 0), int(r["step"]))
        if r["final"] == "1":
            final[name] = float(r["val_loss"])
    out = []
    for name in order:
        tau = re.search(r"tau(\d+)", name)
        lr = re.search(r"lr([\d.]+?)(?:-|$)", name)
        seed = re.search(r"seed(\d+)", name)
        c = {"tau": float(tau.group(1)) if tau else 0,
             "scope": "global" if "global" in name else "per_head",
             "lr": float(lr.group(1)) if lr else base["optimizer"]["lr"],
             "seed": int(seed.group(1)) if seed else 1, "steps": steps[name],
             "nheads": len(heads)}
        # Clip events carry the raw S_max of their step: merge them into the sampled logits.
        m = dict(ml[name])
        for s, l, h, _, smax in ev[name]:
            cur = list(m.get(s, [0.0] * len(heads)))
            cur[l * 2 + h] = max(cur[l * 2 + h], smax)
            m[s] = tuple(cur)
        out.append((name, c, m, sorted(ev[name]), gains[name], final.get(name, float("nan"))))
    return out


def main():
    src = sys.argv[1]
    window = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    runs = load_exports(src) if os.path.isdir(src) else load_db(src)
    print("| run | τ | scope | peak S_max | clip events | clipping steps | heads per clipping "
          "step | events on heads below τ | mean γ | last clip step | min Πγ (head) | "
          "norm-gain RMS step 1 / max / final | final val loss |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    finals = {}  # (lr, seed, tau, scope) -> final val loss
    per_run = {}
    for name, c, ml, ev, gain, final in runs:
        tau = c["tau"]
        scope = c["scope"] if tau > 0 else "—"
        steps, nheads = c["steps"], c["nheads"]
        below = sum(1 for e in ev if e[4] <= tau)  # global scope: heads scaled with their layer
        mean_g = sum(e[3] for e in ev) / len(ev) if ev else float("nan")
        ev = [e[:4] for e in ev]
        shrink = defaultdict(float)  # (layer, head) -> sum log gamma
        clip_steps = defaultdict(int)
        for s, l, h, g in ev:
            shrink[(l, h)] += math.log(g)
            clip_steps[s] += 1
        peak = max(max(v) for v in ml.values()) if ml else float("nan")
        min_prod = math.exp(min(shrink.values())) if shrink else 1.0
        n_cs = len(clip_steps)
        gains = f"{gain[0]:.3f} / {max(gain):.3f} / {gain[-1]:.3f}" if gain else "not logged"
        print(f"| {name} | {tau:g} | {scope} | {peak:.1f} | {len(ev)} | {n_cs} | "
              f"{(len(ev) / n_cs if n_cs else 0):.2f} | {below} | {mean_g:.3f} | {max(clip_steps) if clip_steps else '—'} | "
              f"{min_prod:.3f} | {gains} | {final:.4f} |")
        finals[(c["lr"], c["seed"], tau, scope)] = final
        per_run[name] = (steps, nheads, ml, ev)

    # Loss cost of clipping: each clipped run against its unclipped twin (same lr and seed).
    print("\nFinal validation loss, clipped minus unclipped twin (same Muon lr and seed), per "
          "seed and mean:\n")
    print("| Muon lr | τ | scope | Δ per seed | mean Δ |")
    print("|---|---|---|---|---|")
    arms = sorted({(lr, tau, scope) for (lr, _, tau, scope) in finals if tau > 0})
    by_seed = defaultdict(list)  # seed -> every arm's clipped - unclipped difference
    for lr, tau, scope in arms:
        deltas = []
        for (lr2, seed, tau2, scope2), v in sorted(finals.items()):
            twin = finals.get((lr, seed, 0, "—"))
            if (lr2, tau2, scope2) == (lr, tau, scope) and twin is not None:
                deltas.append((seed, v - twin))
        for sd, d in deltas:
            by_seed[sd].append(d)
        if deltas:
            mean = sum(d for _, d in deltas) / len(deltas)
            cells = ", ".join(f"s{sd}: {d:+.4f}" for sd, d in deltas)
            print(f"| {lr:g} | {tau:g} | {scope} | {cells} | {mean:+.4f} |")
    # The replicate is the seed: each seed's mean difference over the arms (the arms of a seed
    # share its data order and initialisation), then a t interval with df = seeds - 1.
    if by_seed:
        per = {sd: sum(v) / len(v) for sd, v in sorted(by_seed.items())}
        d = seed_stats.describe(list(per.values()), min_seeds=2)
        print("\nPer seed, mean over the arms: " +
              ", ".join(f"seed {sd} {v:+.4f}" for sd, v in per.items()))
        if "note" in d:
            print(f"Over seeds: {d['point']:+.4f} ({d['note']})")
        else:
            one_sided = seed_stats.describe(list(per.values()), level=0.80, min_seeds=2)
            print(f"Over seeds: {seed_stats.format_statement(d, '{:+.4f}')}; one-sided 90 % "
                  f"upper bound on the cost of clipping: {one_sided['t_hi']:+.4f} nats "
                  f"(df {d['df']}: a cost up to that size is not excluded)")

    print(f"\nFraction of (step, head) pairs clipped per {window}-step window "
          "(max logit at the window's last step in brackets: the largest head):\n")
    names = [n for n in per_run]
    print("| steps | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    steps_max = max(v[0] for v in per_run.values())
    for w0 in range(0, steps_max, window):
        cells = []
        for n in names:
            steps, nheads, ml, ev = per_run[n]
            if w0 >= steps:
                cells.append("")
                continue
            w1 = min(w0 + window, steps)
            k = sum(1 for s, _, _, _ in ev if w0 < s <= w1)
            frac = k / ((w1 - w0) * nheads)
            last = ml.get(w1)
            cells.append(f"{frac:.2f} ({max(last):.0f})" if last else f"{frac:.2f}")
        print(f"| {w0 + 1}–{min(w0 + window, steps_max)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
