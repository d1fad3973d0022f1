"""Seed-level statistics for the experiments' analyze scripts (Python standard library only).

The same methods as analysis/seed_stats.{h,cc} (docs/analysis.md, "How intervals are drawn"):
the replicate is the seed, so degrees of freedom are counted by seed. The primary statement of
a paired comparison is the per-seed values, a Student t interval on their mean (for a ratio: on
the mean log ratio), df = seeds - 1, and an exact sign-flip p-value. The seed bootstrap is
enumerated exactly (every multiset of draws with its multinomial weight) and, below 8 seeds,
labelled "seed range": its percentile ends are then essentially the extreme seeds.
"""
import itertools
import math
import random
import statistics

MIN_SEEDS_FOR_BOOTSTRAP_LEVEL = 8


def t_cdf(t, df):
    """Student t CDF for integer df (Abramowitz & Stegun 26.7.3-4, exact)."""
    if df < 1:
        raise ValueError(f"df {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    c2 = c * c
    if df % 2 == 1:
        total = 0.0
        if df > 1:
            term = c
            total = term
            k = 1
            while 2 * k + 1 <= df - 2:
                term *= c2 * (2 * k) / (2 * k + 1)
                total += term
                k += 1
        a = 2 / math.pi * (theta + s * total)
    else:
        term = total = 1.0
        k = 1
        while 2 * k <= df - 2:
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
            k += 1
        a = s * total
    return 0.5 + 0.5 * a if t >= 0 else 0.5 - 0.5 * a


def t_quantile(p, df):
    """p-quantile of Student t with integer df, by bisection on the exact CDF."""
    if not 0 < p < 1:
        raise ValueError(f"p {p}")
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > p:
        lo *= 2
    while t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def t_interval(values, level=0.90):
    """(mean, lo, hi); lo = hi = None for fewer than 2 values."""
    n = len(values)
    m = statistics.fmean(values)
    if n < 2:
        return m, None, None
    half = t_quantile(1 - (1 - level) / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return m, m - half, m + half


def sign_flip_p(values):
    """Exact two-sided sign-flip p of H0 'symmetric about 0' (smallest possible: 2 / 2^n)."""
    n = len(values)
    obs = abs(sum(values))
    tol = 1e-12 * (1 + sum(abs(v) for v in values))
    if n <= 20:
        hits = sum(abs(sum(v if s else -v for v, s in zip(values, signs))) >= obs - tol
                   for signs in itertools.product((True, False), repeat=n))
        return hits / 2 ** n
    rng = random.Random(n)
    total = 1 << 16
    hits = sum(abs(sum(v if rng.random() < 0.5 else -v for v in values)) >= obs - tol
               for _ in range(total))
    return (hits + 1) / (total + 1)


def _multisets(n):
    """Every composition of n into n parts with its multinomial probability."""
    norm = math.lgamma(n + 1) - n * math.log(n)
    for combo in itertools.combinations_with_replacement(range(n), n):
        counts = [0] * n
        for i in combo:
            counts[i] += 1
        yield counts, math.exp(norm - sum(math.lgamma(c + 1) for c in counts))


def bootstrap_interval(values, level=0.90, max_exact=50000, resamples=4000):
    """Percentile interval of the bootstrap mean; exact enumeration when small. (lo, hi, exact)."""
    n = len(values)
    if math.comb(2 * n - 1, n) <= max_exact:
        dist = [(sum(c * v for c, v in zip(counts, values)) / n, w) for counts, w in _multisets(n)]
        exact = True
    else:
        rng = random.Random(12345)
        dist = [(statistics.fmean(rng.choices(values, k=n)), 1 / resamples)
                for _ in range(resamples)]
        exact = False
    dist.sort()
    tail = (1 - level) / 2
    cum, lo, hi = 0.0, dist[0][0], dist[-1][0]
    lo_set = False
    for v, w in dist:
        cum += w
        if not lo_set and cum >= tail - 1e-12:
            lo, lo_set = v, True
        if cum >= 1 - tail - 1e-12:
            hi = v
            break
    return lo, hi, exact


def describe(per_seed, level=0.90, log_scale=False, min_seeds=3):
    """The primary statement as a dict: point, t interval, df, exact p, bootstrap + its label."""
    x = [math.log(v) for v in per_seed] if log_scale else list(per_seed)
    back = math.exp if log_scale else (lambda v: v)
    n = len(x)
    out = dict(seeds=n, df=max(0, n - 1), level=level, point=back(statistics.fmean(x)) if x else None)
    if n < max(2, min_seeds):
        out["note"] = f"{n} seed{'s' if n != 1 else ''}: too few for an interval"
        return out
    m, lo, hi = t_interval(x, level)
    blo, bhi, exact = bootstrap_interval(x, level)
    out.update(t_lo=back(lo), t_hi=back(hi), p=sign_flip_p(x), boot_lo=back(blo),
               boot_hi=back(bhi), exact=exact,
               label="seed range" if n < MIN_SEEDS_FOR_BOOTSTRAP_LEVEL
               else f"{100 * level:.0f}% bootstrap")
    return out


def format_statement(d, fmt="{:.3f}"):
    """'1.29 [1.13, 1.48] (90% t, df 2), p = 0.25 (exact sign-flip); seed range [1.27, 1.31]'."""
    f = fmt.format
    if "note" in d:
        return f"{f(d['point'])} (no interval: {d['note']})"
    return (f"{f(d['point'])} [{f(d['t_lo'])}, {f(d['t_hi'])}] ({100 * d['level']:.0f}% t, "
            f"df {d['df']}), p = {d['p']:.3g} (exact sign-flip); {d['label']} "
            f"[{f(d['boot_lo'])}, {f(d['boot_hi'])}]")


def print_seed_table_header(leading, seeds, trailing):
    """The Markdown header of a per-seed table: `leading` columns, a 'seed k' column per seed,
    then `trailing` columns (the seed-level statement), and the separator row."""
    columns = list(leading) + [f"seed {k}" for k in seeds] + list(trailing)
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
