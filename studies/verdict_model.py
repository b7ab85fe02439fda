"""When can MeCeFO beat `drop`? A progress-rate model of one failure, beside the measurement.

While f of n data-parallel replicas are down, each strategy makes progress at
a rate (progress per unit of time, the fault-free step being 1 of each):

* `drop`: (n - f) / n of the batch, at a step of 1;
* `elastic`: the whole batch, at a step of at least 1 + f / (n - f) (its
  survivors re-split the failed shards in whole rows: 2 where shards are one
  row; a GPU with headroom does it for less). Its rate is then at most
  (n - f) / n, `drop`'s: at best it ties `drop`, paying in time what `drop`
  pays in rows;
* `mecefo` (Hu et al., NeurIPS 2025, arXiv 2510.16415): n - 2f exact rows
  and 2f approximated ones (each failed shard and its neighbour's own), each
  worth v of an exact row, at the neighbour's two-shard step c.

`mecefo` matches `drop` where (n - 2f + 2fv) / c = n - f, that is at

    v* = 1/2 + (c - 1)(n - f) / (2f),

the *break-even v*. Read the other way, at a measured v the neighbour's step
must stay under

    c* = 1 + (2v - 1) f / (n - f),

the *break-even step*, for `mecefo` to keep up with `drop`. `drop` loses f/n
of the batch, a share that shrinks with n, while the neighbour's slower step
holds up all n replicas: at 32 replicas a neighbour step 4% slower needs v
above 1, which no approximation reaches.

Where shards hold many rows (the paper's batch), each failed shard can be
split over k neighbours in neighbour mode instead (what `mecefo_planned`
chooses among): (k + 1) f shards are approximated, at a step of
max(1, c_k), c_k the neighbour-mode step of 1 + 1/k shards. Then

    v*_k = k / (k + 1) + (max(1, c_k) - 1)(n - f) / ((k + 1) f),

which is the above at k = 1. Once c_k is under a normal step the split costs
no time and v*_k = k / (k + 1): a GPU on which a neighbour absorbs half a
shard for free (the H200 at 350M: 1.5 shards in neighbour mode take 0.88x a
normal step) lets `mecefo` beat `drop` wherever an approximated row is worth
more than 2/3 of an exact one.

v itself is measured by the `drop_adopters` control, which drops exactly the
rows `mecefo` approximates: the steps `mecefo` loses over the steps the
control loses are 1 - v. The model assumes progress linear in the rows of a
step. Past the critical batch size a dropped row costs less than that, which
favours `drop`.
"""
from __future__ import annotations

from studies.verdict_points import CONTROL_RUN, MECEFO_RUN

V_RUNS = ('fault_free', MECEFO_RUN, CONTROL_RUN)  # v: steps lost by mecefo over the control's
FAILED = 1  # the model's failures at once: the paper's rule of one at a time
STRATEGIES = ('mecefo', 'elastic', 'drop')


MAX_HELPERS = 8  # the most neighbours a failed shard is split over in `best_split`


def break_even_v(replicas: int, neighbour_step: float, failed: int = FAILED,
                 helpers: int = 1) -> float:
    """The v at which `mecefo`'s progress rate equals `drop`'s, each failed shard on
    `helpers` neighbours in neighbour mode at `neighbour_step` (module docstring)."""
    slow = max(neighbour_step, 1.0) - 1.0  # a neighbour faster than normal waits for the rest
    return (helpers + slow * (replicas - failed) / failed) / (helpers + 1.0)


def break_even_step(replicas: int, v: float, failed: int = FAILED) -> float:
    """The neighbour step c* at which `mecefo`'s rate equals `drop`'s for a row worth v;
    below 1 where v < 1/2: `mecefo` falls behind even with a free neighbour."""
    return 1.0 + (2.0 * v - 1.0) * failed / (replicas - failed)


def one_failure_steps(cfg, replicas: int, cost_spec: str) -> dict[str, float]:
    """{strategy: its slowest device's step over a normal one} with replica 0 down."""
    from mecefo_jax.faults.plan import plan_all
    report = plan_all(cfg, replicas=replicas, down=(0,), cost_spec=cost_spec,
                      strategies=STRATEGIES)
    return {name: entry['slowest_cost'] for name, entry in report.items()}


def best_split(table, replicas: int, failed: int = FAILED, exposed: float = 0.0) -> dict:
    """The split of a failed shard over k neighbours (1 to MAX_HELPERS) with the lowest
    break-even v under `table` (a `faults.costs.CostTable`), each step diluted by the
    all-reduce's exposed share `exposed`: {helpers, neighbour_step, break_even_v}. A model
    of the paper's batch: where shards are one row, no row splits."""
    from mecefo_jax.faults.step_clock import diluted
    splits = []
    for k in range(1, min(MAX_HELPERS, replicas - failed) + 1):
        step = diluted(float(table.neighbour_cost(1.0 + 1.0 / k)), exposed)
        splits.append({'helpers': k, 'neighbour_step': step,
                       'break_even_v': break_even_v(replicas, step, failed, helpers=k)})
    return min(splits, key=lambda s: s['break_even_v'])


def measured_v(steps_to_target: dict) -> float | None:
    """1 - (mecefo's steps lost) / (the control's), from mean steps to target per run;
    None without the control, or where the control lost no steps."""
    try:
        free, ours, control = (steps_to_target[n] for n in V_RUNS)
    except KeyError:
        return None
    if None in (free, ours, control) or control <= free:
        return None
    return 1.0 - (ours - free) / (control - free)


def measured_v_interval(per_seed: dict) -> dict | None:
    """`measured_v` with its 95% interval: {mean, lo, hi, seeds}.

    `per_seed` holds each run's steps to target per seed (None: not reached; such a seed
    is left out, the three runs together). v = 1 - r, r the ratio of mecefo's mean steps
    lost to the control's, and r's interval is Fieller's on the paired per-seed steps
    lost (`intervals.ratio_interval`, Student-t). lo and hi are None where that interval
    is unbounded: the control's loss is not told apart from none at these seeds.
    """
    from studies.intervals import ratio_interval
    if not all(n in per_seed for n in V_RUNS):
        return None
    rows = [row for row in zip(*(per_seed[n] for n in V_RUNS)) if None not in row]
    mean = measured_v(dict(zip(V_RUNS, (sum(c) / len(rows) for c in zip(*rows))))) if rows else None
    if mean is None:
        return None
    ratio = ratio_interval([ours - free for free, ours, _ in rows],
                           [control - free for free, _, control in rows])
    lo, hi = (None, None) if ratio is None else (1.0 - ratio[1], 1.0 - ratio[0])
    return {'mean': mean, 'lo': lo, 'hi': hi, 'seeds': len(rows)}


def model_row(cfg, replicas: int, cost_spec: str, exposed: float = 0.0) -> dict:
    """The point's figures under one step-cost model, each step diluted by the all-reduce's
    exposed share `exposed`: the steps of one failure, the break-even v and the best split
    of a failed shard (`best_split`)."""
    from mecefo_jax.faults.plan import cost_table
    from mecefo_jax.faults.step_clock import diluted
    steps = {k: diluted(v, exposed) for k, v in one_failure_steps(cfg, replicas, cost_spec).items()}
    shard = cfg.data.global_batch_size // replicas
    return {'one_failure_steps': steps,
            'break_even_v': break_even_v(replicas, steps['mecefo']),
            'best_split': best_split(cost_table(cfg, cost_spec, shard), replicas, exposed=exposed)}
