"""Student-t intervals over a handful of seeds, and how many seeds a difference needs.

With 4 to 6 seeds a percentile bootstrap is too narrow (it never sees a wider spread than its few values); the t
interval widens by the t quantile (3.18 at 4 seeds against the normal's 1.96). Intervals are two-sided, df = n - 1, on
paired per-seed differences where runs are compared. No scipy: the t distribution's two-sided mass has a finite series
for integer df (Abramowitz and Stegun, 26.7.3 and 26.7.4), inverted by bisection.
"""
from __future__ import annotations

import math
import statistics

LEVEL = 0.95  # two-sided
POWER = 0.8  # of the test `seeds_to_separate` sizes
MAX_SEEDS = 10_000  # past this many, a difference counts as never separated


def _central_mass(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer `df` (A&S 26.7.3 odd, 26.7.4 even)."""
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    power, coefficient, total = df % 2, 1.0, 0.0
    while power <= df - 2:
        total += coefficient * c ** power
        coefficient *= (power + 1) / (power + 2)
        power += 2
    return 2.0 / math.pi * (theta + s * total) if df % 2 else s * total


def t_quantile(p: float, df: int) -> float:
    """The p quantile of Student's t with `df` degrees of freedom, e.g. t(0.975, 3) = 3.182."""
    if not isinstance(df, int) or df < 1:
        raise ValueError(f'df={df!r}: the t quantile needs an integer df >= 1 (two seeds or more).')
    if not 0.0 < p < 1.0:
        raise ValueError(f'p={p!r} must be in (0, 1).')
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    target, lo, hi = 2.0 * p - 1.0, 0.0, 1.0
    while _central_mass(hi, df) < target:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if _central_mass(mid, df) < target else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


def t_interval(values, level: float = LEVEL) -> dict | None:
    """{mean, lo, hi, n, sd, per_seed}: the t interval of the mean of the values that are not None; None without a
    value. One value has no interval (lo = hi)."""
    kept = [float(v) for v in values if v is not None]
    if not kept:
        return None
    mean = statistics.fmean(kept)
    sd = statistics.stdev(kept) if len(kept) > 1 else None
    half = 0.0 if sd is None else t_quantile((1 + level) / 2, len(kept) - 1) * sd / math.sqrt(len(kept))
    return {'mean': mean, 'lo': mean - half, 'hi': mean + half, 'n': len(kept), 'sd': sd,
            'per_seed': list(values)}


def side(interval: dict | None) -> str:
    """Which side of 0 an interval is on: '+' above, '−' below, '=' across it."""
    if interval is None or interval['n'] < 2:
        return 'n/a' if interval is None else 'one seed'
    return '+' if interval['lo'] > 0 else '−' if interval['hi'] < 0 else '='


def cell(interval: dict | None, spec: str = '.3f') -> str:
    """'mean [lo, hi] (side)' ('[unbounded]' without bounds, no side unless it has one), or n/a."""
    if interval is None:
        return 'n/a'
    lo, hi, mean = (interval[k] for k in ('lo', 'hi', 'mean'))
    bounds = 'unbounded' if lo is None else f'{format(lo, spec)}, {format(hi, spec)}'
    return f'{format(mean, spec)} [{bounds}]' + (f" ({interval['side']})" if 'side' in interval else '')


def paired(per_seed: dict, base: str, sign: int = 1) -> dict:
    """{run: the t interval of sign * (base's value - run's) per seed, with its side of 0 and seeds_needed}, each run
    of `per_seed` ({run: values per seed, or None}) but the fault-free run's; a seed where either has no value is
    left out."""
    if per_seed.get(base) is None:
        return {}
    out = {}
    for name, values in per_seed.items():
        if name in (base, 'fault_free') or values is None:
            continue
        diffs = [sign * (a - b) for a, b in zip(per_seed[base], values) if a is not None and b is not None]
        interval = t_interval(diffs)
        if interval is not None:
            out[name] = dict(interval, side=side(interval), seeds_needed=seeds_to_separate(diffs))
    return out


def seeds_to_separate(differences, level: float = LEVEL, power: float = POWER) -> float | None:
    """The fewest seeds n at which a paired two-sided t test of the mean difference d and sd s has `power`: sqrt(n)
    |d| / s >= t(1 - a/2, n - 1) + t(power, n - 1), a = 1 - level (then the t interval excludes 0). None with fewer
    than two values; infinity where d is 0."""
    kept = [v for v in differences if v is not None]
    if len(kept) < 2:
        return None
    d, s = abs(statistics.fmean(kept)), statistics.stdev(kept)
    if d == 0:
        return math.inf if s else None
    if s == 0:
        return 2
    # t quantiles exceed the normal ones, so the normal approximation's n is a lower bound.
    normal = statistics.NormalDist()
    start = max(2, math.floor(((normal.inv_cdf((1 + level) / 2) + normal.inv_cdf(power)) * s / d) ** 2))
    for n in range(start, MAX_SEEDS + 1):
        if math.sqrt(n) * d / s >= t_quantile((1 + level) / 2, n - 1) + t_quantile(power, n - 1):
            return n
    return math.inf


def ratio_interval(numerators, denominators, level: float = LEVEL) -> tuple[float, float] | None:
    """Fieller's interval for mean(a) / mean(b), paired per seed: the r whose differences a_i - r b_i have a t
    interval holding 0; None where that set is unbounded."""
    pairs = [(a, b) for a, b in zip(numerators, denominators) if a is not None and b is not None]
    n = len(pairs)
    if n < 2:
        return None
    a_bar, b_bar = (statistics.fmean(x) for x in zip(*pairs))
    s_aa, s_bb = (statistics.variance(x) for x in zip(*pairs))
    s_ab = statistics.covariance(*zip(*pairs))
    q = t_quantile((1 + level) / 2, n - 1) ** 2 / n
    # (a_bar - r b_bar)^2 <= q (s_aa - 2 r s_ab + r^2 s_bb): a quadratic in r.
    quad, lin, const = b_bar ** 2 - q * s_bb, -2 * (a_bar * b_bar - q * s_ab), a_bar ** 2 - q * s_aa
    disc = lin ** 2 - 4 * quad * const
    if quad <= 0 or disc < 0:
        return None
    root = math.sqrt(disc)
    return (-lin - root) / (2 * quad), (-lin + root) / (2 * quad)
