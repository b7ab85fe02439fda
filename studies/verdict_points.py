"""The verdict study's points: `configs/small.py` moved towards the MeCeFO paper's regime.

On `small` the `drop` baseline reached the fault-free loss sooner than every
MeCeFO setting. `small` differs from the paper's 350M run (Hu et al.,
NeurIPS 2025, arXiv 2510.16415) on every axis a reader would check, so each
point below moves one axis, and `paper_like` moves them all:

| point | replicas (rows each) | steps | data | failures |
|---|---|---|---|---|
| small | 8 (4) | 300 | embedded, about 5 passes | per replica, concurrent |
| replicas32 | 32 (1) | 300 | embedded | per replica, concurrent |
| replicas32_serial | 32 (1) | 300 | embedded | one at a time (the paper's) |
| fresh_data | 8 (4) | 300 | python_docs, under one pass | per replica, concurrent |
| horizon4x | 8 (4) | 1,200 | python_docs, one pass | per replica, concurrent |
| paper_like | 32 (1) | 1,200 | python_docs, one pass | one at a time |
| paper_like_60m | 32 (1), rows on one device | one pass | python_docs exported, 60M shape | one at a time |

Tokens per step stay 32 x 128 everywhere but at paper_like_60m (32 x 256).
Failures follow the paper's `high` regime read per replica of a 32-replica
cluster; a point of 4x the steps
keeps the failures per fraction of the run (`fault.step_time_sec` / 4), so
its failures last 4x the steps. `horizon4x` moves from `fresh_data`, not from
`small`: 1,200 steps over the embedded corpus read it 20 times and the
fault-free run over-learns it (validation loss 3.31 at step 400, 3.02 at 800,
3.10 at 1,200), which leaves time to target without meaning.

New runs meet their failures on the wall clock (`wall_clock`): a strategy
whose step is slower lives through fewer steps of the same outage, each
step priced by the analytic FLOP model diluted by the exposed all-reduce
modelled for the point (`allreduce.py`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from studies import verdict_60m
from studies.runs import Run, run_name

FRESH = {'data.source': 'python_docs'}
# 32 replicas of one sequence (the same tokens per step), as rows on the 8 fake devices: the same
# gradients as 32 devices (tests/replicas_as_rows_test.py), at two compiled steps a run.
WIDE = {'mesh.replicas': 32}
SERIAL = {'fault.max_concurrent': 1}
LONG = {'train.steps': 1200, 'fault.step_time_sec': 15.0}
# Evaluations at 4x the steps: as many, at the same fractions of the run.
LONG_EVALS = {'eval_every': 200, 'dense_eval_every': 40}

CAP = 8  # mecefo_planned's neighbour-row cap: a quarter of the batch where shards are 4 rows
# Where shards are 1 row, cap 8 never binds a single failure: its plan is mecefo's (both rows
# on one neighbour in neighbour mode, only the adopter differs). Cap 1 takes a mixed helper
# instead (its own row exact, only the orphaned row approximated; faults/planner.py).
ONE_ROW_CAP = 1
# The control that drops exactly the rows mecefo approximates, the two ablations
# (attention backward exact; FFN kernel gradients exact) and the rules that keep the
# approximated rows' progress without their bias (docs/verdict.md).
CONTROL = (Run('drop_adopters', 'high'),)
MECEFO_RUN, CONTROL_RUN = run_name('mecefo', 'high'), run_name(*CONTROL[0])  # v's two runs
ABLATIONS = (Run('mecefo', 'high', attention='exact'), Run('mecefo', 'high', projection='exact'))
RULES = (Run('mecefo', 'high', projection='none'), Run('mecefo', 'high', top=2),
         Run('mecefo', 'high', weight=0.5), Run('mecefo', 'high', attn_top=2))
# What every point compares, the capped plan (of the point's cap) after mecefo; elastic and
# checkpoint_restart are replays: free.
CORE_RUNS = (Run('fault_free', ''), Run('mecefo', 'high'), Run('drop', 'high'),
             Run('elastic', 'high'), Run('checkpoint_restart', 'high'))
DEFAULT = 'drop_high'  # the paired differences are drop's goodput minus each run's


@dataclasses.dataclass(frozen=True)
class Point:
    """One point of the study: overrides of `configs/small.py` and of the experiment's settings."""
    name: str
    overrides: dict
    moves: str  # what changes against the point it moves from
    settings: dict = dataclasses.field(default_factory=dict)
    min_seeds: int = 4
    cap: int = CAP  # the capped plan's fault.max_neighbour_rows
    extra_runs: tuple = ()  # runs beside CORE_RUNS (the controls and rules, where they are run)
    late: Callable[[], dict] | None = None  # overrides read when the point is built (its files)


POINTS = {p.name: p for p in (
    Point('small', {}, 'the baseline: configs/small.py', extra_runs=CONTROL + ABLATIONS + RULES),
    Point('replicas32', WIDE, 'granularity: 32 replicas of 1 sequence (from small)',
          cap=ONE_ROW_CAP),
    Point('replicas32_serial', {**WIDE, **SERIAL},
          "granularity with the paper's one failure at a time (from replicas32)", cap=ONE_ROW_CAP),
    Point('fresh_data', FRESH, 'data: python_docs, read less than once (from small)'),
    Point('horizon4x', {**FRESH, **LONG}, 'horizon: 1,200 steps (from fresh_data)',
          settings=LONG_EVALS),
    Point('paper_like', {**FRESH, **LONG, **WIDE, **SERIAL}, 'every axis at once',
          settings=LONG_EVALS, min_seeds=6, cap=ONE_ROW_CAP, extra_runs=CONTROL + RULES[-1:]),
    Point('paper_like_60m', SERIAL, "shape: configs/llama_60m.py's, 256 tokens, one pass of an "
          'exported corpus, 32 replicas as rows on one device (from paper_like; verdict_60m.py)',
          cap=ONE_ROW_CAP, extra_runs=CONTROL, late=verdict_60m.overrides),
)}


def point_config(base, point: Point):
    """`base` (configs/small.py's ConfigDict) with the point's overrides, unresolved."""
    for dotted, value in {**point.overrides, **(point.late() if point.late else {})}.items():
        section, _, field = dotted.partition('.')
        setattr(getattr(base, section), field, value)
    return base


def capped_plan(point: Point) -> Run:
    return Run('mecefo_planned', 'high', point.cap)


def runs_of(point: Point) -> tuple[Run, ...]:
    """CORE_RUNS with the point's capped plan after mecefo, then the point's extra runs."""
    return CORE_RUNS[:2] + (capped_plan(point),) + CORE_RUNS[2:] + tuple(point.extra_runs)


def contenders(point: Point) -> dict[str, str]:
    """{label: run name}: the runs the map sets against drop at `point`."""
    return {'mecefo': MECEFO_RUN, 'capped plan': run_name(*capped_plan(point)),
            'elastic': run_name('elastic', 'high'),
            'checkpoint_restart': run_name('checkpoint_restart', 'high')}


def wall_clock(cfg, replicas: int) -> dict:
    """The overrides of a point's new runs: failures in cluster seconds, each step priced
    as the fault controller prices it (analytic FLOPs of the point's shape), diluted by the
    exposed all-reduce share phi modelled for its shape and replicas (`allreduce.py`)."""
    from studies.allreduce import step_allreduce
    return {'fault.time_model': 'wall_clock',
            'fault.allreduce_exposed': round(step_allreduce(cfg, replicas)['phi'], 4)}
