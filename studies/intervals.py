"""Student-t intervals over a handful of seeds, and how many seeds a difference needs.

With 4 to 6 seeds a percentile bootstrap is too narrow: it resamples the few
values it has and never sees a wider spread, while the t interval widens by
the t quantile (3.18 at 4 seeds against the normal's 1.96). Every interval
here is the two-sided t interval of a mean, df = n - 1, taken on the paired
per-seed differences where a comparison is meant (every strategy of a seed
runs on the same data and failures). No scipy: the t distribution's
two-sided mass has a finite series for integer df (Abramowitz and Stegun,
Handbook of Mathematical Functions, 26.7.3 and 26.7.4), inverted here by
bisection.
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
    power, coefficient, total = (1, 1.0, 0.0) if df % 2 else (0, 1.0, 0.0)
    while power <= df - 2:
        total += coefficient * c ** power
        coefficient *= (power + 1) / (power + 2)
        power += 2
    if df % 2:
        return 2.0 / math.pi * (theta + s * total)
    return s * total


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
    """{mean, lo, hi, n, sd, per_seed} of the values that are not None: the two-sided
    t interval of their mean; None without a value. One value has no interval (lo = hi)."""
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
    if interval is None:
        return 'n/a'
    if interval['n'] < 2:
        return 'one seed'
    return '+' if interval['lo'] > 0 else '−' if interval['hi'] < 0 else '='


def seeds_to_separate(differences, level: float = LEVEL, power: float = POWER) -> float | None:
    """The fewest seeds n at which a paired t test (two-sided, `level`) of the measured mean
    difference d and sample sd s has `power`: sqrt(n) |d| / s >= t(1 - a/2, n - 1) +
    t(power, n - 1), with a = 1 - level. At that n the t interval of n differences of mean d
    and sd s excludes 0. None with fewer than two values; infinity where d is 0."""
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
    """Fieller's interval for mean(numerators) / mean(denominators), paired per seed: the
    ratios r whose paired differences a_i - r b_i have a t interval that holds 0. None where
    that set is unbounded (the denominators' mean is not told apart from 0)."""
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
