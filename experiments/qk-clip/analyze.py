#!/usr/bin/env python3
"""Tables for experiments/qk-clip (self-deactivation, per-head vs global) from the database.

Usage: analyze.py runs/qk-clip.db [WINDOW]      (WINDOW: steps per row, default 100)

Python standard library only. For every finished run: peak max logit (raw, before the step's
clip), clip events, heads touched per clipping step, last clip step, final validation loss, and
the cumulative shrinkage of each head's q·k scale (the product of the γ applied to that head: the
clipped logits scale by exactly γ, W_q by γ^α and W_k by γ^(1−α)); global scope also counts the
heads that were below τ but scaled with their layer. Then the fraction of
(step, head) pairs clipped per window, and the max logit at the end of each window.
"""
import json
import math
import sqlite3
import struct
import sys
from collections import defaultdict


def main():
    db = sqlite3.connect(sys.argv[1])
    window = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    runs = db.execute("SELECT id, name, config_json FROM runs WHERE status = 'done' ORDER BY id")
    runs = [(rid, name, json.loads(cfg)) for rid, name, cfg in runs]
    print("| run | τ | scope | peak S_max | clip events | clipping steps | heads per clipping "
          "step | events on heads below τ | mean γ | last clip step | min Πγ (head) | "
          "norm-gain RMS step 1 / max / final | final val loss |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    cols = [r[1] for r in db.execute("PRAGMA table_info(steps)")]
    finals = {}  # (lr, seed, tau, scope) -> final val loss
    per_run = {}
    for rid, name, cfg in runs:
        opt = cfg["optimizer"]
        tau = opt.get("qk_clip_tau", 0)
        scope = opt.get("qk_clip_mode", "per_head") if tau > 0 else "—"
        steps = cfg["train"]["steps"]
        nheads = cfg["model"]["layers"] * cfg["model"]["heads"]
        ml = {}
        for s, a, b in db.execute("SELECT step, max_logit, max_logit_raw FROM max_logits WHERE "
                                  "run_id = ? ORDER BY step", (rid,)):
            blob = b if b is not None else a
            ml[s] = struct.unpack("<%df" % (len(blob) // 4), blob)
        ev = db.execute("SELECT step, layer, head, gamma, s_max FROM clip_events WHERE "
                        "run_id = ? ORDER BY step", (rid,)).fetchall()
        below = sum(1 for e in ev if e[4] <= tau)  # global scope: heads scaled with their layer
        mean_g = sum(e[3] for e in ev) / len(ev) if ev else float("nan")
        ev = [e[:4] for e in ev]
        shrink = defaultdict(float)  # (layer, head) -> sum log gamma
        clip_steps = defaultdict(int)
        for s, l, h, g in ev:
            shrink[(l, h)] += math.log(g)
            clip_steps[s] += 1
        peak = max(max(v) for v in ml.values()) if ml else float("nan")
        val = db.execute("SELECT val_loss FROM evals WHERE run_id = ? ORDER BY step DESC LIMIT 1",
                         (rid,)).fetchone()
        min_prod = math.exp(min(shrink.values())) if shrink else 1.0
        n_cs = len(clip_steps)
        gains = "not logged"
        if "norm_gain_rms" in cols:  # schema 6 and later (earlier runs: not logged)
            g = [v for (v,) in db.execute("SELECT norm_gain_rms FROM steps WHERE run_id = ? AND "
                                          "norm_gain_rms IS NOT NULL ORDER BY step", (rid,))]
            if g:
                gains = f"{g[0]:.3f} / {max(g):.3f} / {g[-1]:.3f}"
        final = val[0] if val else float("nan")
        print(f"| {name} | {tau:g} | {scope} | {peak:.1f} | {len(ev)} | {n_cs} | "
              f"{(len(ev) / n_cs if n_cs else 0):.2f} | {below} | {mean_g:.3f} | {max(clip_steps) if clip_steps else '—'} | "
              f"{min_prod:.3f} | {gains} | {final:.4f} |")
        finals[(opt["lr"], cfg["train"]["seed"], tau, scope)] = final
        per_run[name] = (steps, nheads, ml, ev)

    # Loss cost of clipping: each clipped run against its unclipped twin (same lr and seed).
    print("\nFinal validation loss, clipped minus unclipped twin (same Muon lr and seed), per "
          "seed and mean:\n")
    print("| Muon lr | τ | scope | Δ per seed | mean Δ |")
    print("|---|---|---|---|---|")
    arms = sorted({(lr, tau, scope) for (lr, _, tau, scope) in finals if tau > 0})
    for lr, tau, scope in arms:
        deltas = []
        for (lr2, seed, tau2, scope2), v in sorted(finals.items()):
            twin = finals.get((lr, seed, 0, "—"))
            if (lr2, tau2, scope2) == (lr, tau, scope) and twin is not None:
                deltas.append((seed, v - twin))
        if deltas:
            mean = sum(d for _, d in deltas) / len(deltas)
            cells = ", ".join(f"s{sd}: {d:+.4f}" for sd, d in deltas)
            print(f"| {lr:g} | {tau:g} | {scope} | {cells} | {mean:+.4f} |")

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
