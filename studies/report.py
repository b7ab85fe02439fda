"""What every experiment report shares: number formatting, spreads over seeds, tables, plots.

The experiments write JSON (what the run measured) and markdown tables made
by `markdown_table` alone; what the figures mean is written once, by hand, in
docs/. A missing figure reads 'n/a' everywhere and a figure over seeds
'mean ± std [min, max]'.
"""
import math
import statistics
from collections.abc import Sequence


def fmt(value, spec: str = '.2f', missing: str = 'n/a') -> str:
    """`value` formatted with `spec`, or `missing` for None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, spec)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    """A markdown table: one header row, then a row per entry of `rows` (cells as str)."""
    lines = ['| ' + ' | '.join(headers) + ' |', '|' + '---|' * len(headers)]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f'markdown_table: a row of {len(row)} cells under {len(headers)} '
                             f'headers ({list(headers)}): {list(row)}')
        lines.append('| ' + ' | '.join(str(cell) for cell in row) + ' |')
    return '\n'.join(lines)


def distinct_seeds(seeds) -> list[int]:
    """`seeds` as ints, at least one and none repeated (a repeat would double-count it)."""
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f'--seeds must give at least one distinct seed, got {seeds}.')
    return seeds


def stats(values) -> dict | None:
    """mean, sample std (ddof=1; None for one value), min, max and the values; None if any is."""
    values = list(values)
    if not values or any(v is None for v in values):
        return None
    return {'mean': statistics.fmean(values),
            'std': statistics.stdev(values) if len(values) > 1 else None,
            'min': min(values), 'max': max(values), 'values': values}


def resampled_means(data, *, resamples: int, seed: int):
    """`resamples` means of `data`'s rows (seeds) drawn with replacement, from a numpy
    RNG seeded with `seed`; one row of column means per resample for 2-D `data`."""
    import numpy as np
    rng = np.random.default_rng(seed)
    return data[rng.integers(0, len(data), (resamples, len(data)))].mean(axis=1)


def percentile_interval(draws, level: float) -> tuple[float, float]:
    """The (1 - level) / 2 and (1 + level) / 2 quantiles of bootstrap draws."""
    import numpy as np
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def bootstrap_mean(values, *, resamples: int = 10_000, seed: int = 0,
                   level: float = 0.95) -> dict | None:
    """The mean over seeds and its percentile-bootstrap interval; None if any value is.

    Resamples the seeds with replacement (`resamples` times, from a numpy RNG
    seeded with `seed`, so the interval is the same on every machine) and
    takes the (1 - level) / 2 and (1 + level) / 2 quantiles of the resampled
    means. With few seeds the interval is too narrow rather than too wide
    (the percentile bootstrap's known bias), so it reads as a lower bound on
    the uncertainty.
    """
    import numpy as np
    values = list(values)
    if not values or any(v is None for v in values):
        return None
    data = np.asarray(values, float)
    lo, hi = percentile_interval(resampled_means(data, resamples=resamples, seed=seed), level)
    return {'mean': float(data.mean()), 'lo': lo, 'hi': hi, 'per_seed': values}


def significance(a: dict | None, b: dict | None) -> dict:
    """Whether two figures' means differ by more than their spread.

    The gap |mean_b - mean_a| is significant when it exceeds std_a + std_b
    (sample stds over seeds): a loose one-sigma-each criterion, as few seeds
    allow no more; None with one seed (no spread) or a missing figure. Every
    seed runs all strategies on the same trace, so the paired view is given
    too: whether b - a has the same sign in every seed.
    """
    if a is None or b is None:
        return {'gap': None, 'spread': None, 'significant': None, 'same_order_in_every_seed': None}
    gap = abs(b['mean'] - a['mean'])
    sign = math.copysign(1.0, b['mean'] - a['mean'])
    same_order = all((vb - va) * sign > 0 for va, vb in zip(a['values'], b['values']))
    spread = None if a['std'] is None or b['std'] is None else a['std'] + b['std']
    return {'gap': gap, 'spread': spread, 'significant': None if spread is None else gap > spread,
            'same_order_in_every_seed': same_order}


def format_spread(s: dict | None, spec: str) -> str:
    """A `stats` dict as 'mean ± std [min, max]' ('n/a' for none)."""
    if s is None:
        return 'n/a'
    std = 'n/a' if s['std'] is None else format(s['std'], spec.lstrip('+'))
    return (f"{format(s['mean'], spec)} ± {std} "
            f"[{format(s['min'], spec)}, {format(s['max'], spec)}]")


def write_json(path: str, value) -> None:
    """`value` as JSON at `path`, atomically: a temporary file, then a rename, so an
    interrupted write never leaves a partial file that a resumed run would trust."""
    import json
    import os
    tmp = f'{path}.{os.getpid()}.tmp'
    with open(tmp, 'w') as f:
        json.dump(value, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (imported only to draw)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt
