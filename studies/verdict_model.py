"""A progress-rate model of the verdict: when can `mecefo` keep up with `drop`?

While f of n replicas are down, `drop` makes (n - f)/n of a step's progress at a step of 1;
the paper's rule makes n - 2f exact rows' and 2f approximated rows' (each worth v of an exact
row) at its neighbour's step c. It keeps up where v >= v* = 1/2 + (c - 1)(n - f)/(2f), that
is where c <= c* = 1 + (2v - 1) f/(n - f); a failed shard split over k neighbours needs
v*_k = k/(k + 1) + (max(1, c_k) - 1)(n - f)/((k + 1) f). v is measured against the
`drop_adopters` control, which drops exactly the rows `mecefo` approximates.
docs/verdict.md ("A model of the verdict") derives all three.
"""
from __future__ import annotations

from studies.verdict_points import CONTROL_RUN, MECEFO_RUN

V_RUNS = ('fault_free', MECEFO_RUN, CONTROL_RUN)  # v: steps lost by mecefo over the control's
FAILED = 1  # the model's failures at once: the paper's rule of one at a time
MAX_HELPERS = 8  # the most neighbours a failed shard is split over in `best_split`


def break_even_v(replicas: int, neighbour_step: float, helpers: int = 1) -> float:
    """v*_k for each failed shard on `helpers` neighbours in neighbour mode at `neighbour_step`."""
    slow = max(neighbour_step, 1.0) - 1.0  # a neighbour faster than normal waits for the rest
    return (helpers + slow * (replicas - FAILED) / FAILED) / (helpers + 1.0)


def break_even_step(replicas: int, v: float) -> float:
    """c* for a row worth v; below 1 where v < 1/2: `mecefo` falls behind even with a free neighbour."""
    return 1.0 + (2.0 * v - 1.0) * FAILED / (replicas - FAILED)


def best_split(table, replicas: int, exposed: float = 0.0) -> dict:
    """{helpers, neighbour_step, break_even_v} of the split over k = 1..MAX_HELPERS neighbours with the lowest v*_k
    under `table` (a `faults.costs.CostTable`), each step diluted by the all-reduce's exposed share. A model of the
    paper's batch: where shards are one row, no row splits."""
    from mecefo_jax.faults.step_clock import diluted
    steps = {k: diluted(float(table.neighbour_cost(1.0 + 1.0 / k)), exposed)
             for k in range(1, min(MAX_HELPERS, replicas - FAILED) + 1)}
    return min(({'helpers': k, 'neighbour_step': step, 'break_even_v': break_even_v(replicas, step, helpers=k)}
                for k, step in steps.items()), key=lambda s: s['break_even_v'])


def measured_v_interval(per_seed: dict) -> dict | None:
    """v = 1 - (mecefo's mean steps lost) / (the control's), from each run's steps to target per seed, with Fieller's
    95% interval on the paired per-seed steps lost: {mean, lo, hi, seeds}. A seed where one of the three runs has no
    steps (None) is left out. None without the control, or where it lost no steps; lo and hi are None where the
    control's loss is not told apart from none."""
    from studies.intervals import ratio_interval
    rows = [row for row in zip(*(per_seed[n] for n in V_RUNS)) if None not in row] \
        if all(n in per_seed for n in V_RUNS) else []
    if not rows:
        return None
    free, ours, control = (sum(c) / len(rows) for c in zip(*rows))
    if control <= free:
        return None
    ratio = ratio_interval([o - f for f, o, _ in rows], [c - f for f, _, c in rows])
    lo, hi = (None, None) if ratio is None else (1.0 - ratio[1], 1.0 - ratio[0])
    return {'mean': 1.0 - (ours - free) / (control - free), 'lo': lo, 'hi': hi, 'seeds': len(rows)}


def model_row(cfg, replicas: int, cost_spec: str, exposed: float = 0.0) -> dict:
    """The point's steps of one failure, v* and `best_split` under one step-cost model, each step diluted by the
    all-reduce's exposed share `exposed`."""
    from mecefo_jax.faults.step_clock import diluted
    from studies.fault_plan import cost_table, plan_all
    plans = plan_all(cfg, replicas=replicas, down=(0,), cost_spec=cost_spec, strategies=('mecefo', 'elastic', 'drop'))
    steps = {name: diluted(plan['slowest_cost'], exposed) for name, plan in plans.items()}
    shard = cfg.data.global_batch_size // replicas
    return {'one_failure_steps': steps,
            'break_even_v': break_even_v(replicas, steps['mecefo']),
            'best_split': best_split(cost_table(cfg, cost_spec, shard), replicas, exposed=exposed)}
