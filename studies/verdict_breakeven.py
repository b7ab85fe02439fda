"""The step a run's slower layouts may cost for it to keep up with `drop`, read off its records.

`verdict_model.break_even_step` models it for the paper's rule; this re-times the stored records of any run instead:
every step whose layout is slower than a normal one is charged `c` normal steps, all else as modelled before, and `c`
is found where the run's mean goodput equals `drop`'s. Above 1 the run keeps up with a helper that much slower than a
normal step; below 1 not even a free helper would.
"""
from __future__ import annotations

import functools
import statistics

from studies import time_to_target_report as ttt_report
from studies.goodput import TimeModel

LOW, HIGH = 0.25, 4.0  # the bracket searched, in normal steps
TOLERANCE = 1e-5


class HelperStepModel(TimeModel):
    """`TimeModel` with every layout slower than a normal step charged `helper_step` (None: as the model prices it)."""

    def __init__(self, *args, helper_step: float | None, **kwargs):
        super().__init__(*args, **kwargs)
        self.helper_step = helper_step

    def step_ratio(self, layout: dict) -> float:
        ratio = super().step_ratio(layout)
        return ratio if ratio <= 1.0 or self.helper_step is None else self.helper_step


def mean_goodput(records: dict, run: str, cfg, replicas: int, helper_step: float | None = None) -> float:
    """`run`'s mean goodput over the seeds of `records` ({seed: {run: record}}), its slower layouts charged
    `helper_step` normal steps (None: as the analytic model prices them)."""
    cls = functools.partial(HelperStepModel, helper_step=helper_step)
    model_for = ttt_report.time_models(cfg, replicas, None, model_cls=cls)
    pairs = {s: {'fault_free': r['fault_free'], run: r[run]} for s, r in records.items()}
    per_seed = ttt_report.figures_per_seed(pairs, model_for, cfg.train.steps)[run]
    return statistics.fmean(row['goodput'] for row in per_seed)


def break_even_helper_step(records: dict, run: str, baseline: str, cfg, replicas: int) -> float | None:
    """The `c` at which `run` keeps up with `baseline`, by bisection; None where it stays behind even at LOW or ahead
    even at HIGH."""
    target = mean_goodput(records, baseline, cfg, replicas)

    def gap(c: float) -> float:
        return mean_goodput(records, run, cfg, replicas, c) - target
    lo, hi = LOW, HIGH
    if gap(lo) < 0 or gap(hi) > 0:
        return None
    while hi - lo > TOLERANCE:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) >= 0 else (lo, mid)
    return (lo + hi) / 2
