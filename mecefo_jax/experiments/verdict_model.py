"""When can MeCeFO beat `drop`? A progress-rate model of one failure, beside the measurement.

While f of n data-parallel replicas are down, each strategy makes progress at
a rate (progress per unit of time, the fault-free step being 1 of each):

* `drop`: (n - f) / n of the batch, at a step of 1;
* `elastic`: the whole batch, at a step of at least 1 + f / (n - f) (its
  survivors re-split the failed shards in whole rows: 2 where shards are one
  row; a GPU with headroom does it for less);
* `mecefo` (Hu et al., NeurIPS 2025, arXiv 2510.16415): n - 2f exact rows
  and 2f approximated ones (each failed shard and its neighbour's own), each
  worth v of an exact row, at the neighbour's two-shard step c.

`mecefo` matches `drop` where (n - 2f + 2fv) / c = n - f, that is at

    v* = 1/2 + (c - 1)(n - f) / (2f),

the *break-even v*. Read the other way, at a measured v the neighbour's step
must stay under

    c* = 1 + (2v - 1) f / (n - f),

the *break-even step*, for `mecefo` to keep up with `drop`. `drop` loses f/n of the batch, a share that shrinks with
n, while the neighbour's slower step holds up all n replicas: at 32
replicas a neighbour step 4% slower needs v above 1, which no approximation
reaches. v itself is measured by the `drop_adopters` control, which drops
exactly the rows `mecefo` approximates: the steps `mecefo` loses over the
steps the control loses are 1 - v.

The model assumes progress linear in the rows of a step. Past the critical
batch size a dropped row costs less than that, which favours `drop`.
"""
from __future__ import annotations

FAILED = 1  # the model's failures at once: the paper's rule of one at a time
STRATEGIES = ('mecefo', 'elastic', 'drop')


def break_even_v(replicas: int, neighbour_step: float, failed: int = FAILED) -> float:
    """The v at which `mecefo`'s progress rate equals `drop`'s (module docstring)."""
    return 0.5 + (neighbour_step - 1.0) * (replicas - failed) / (2.0 * failed)


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


def measured_v(steps_to_target: dict) -> float | None:
    """1 - (mecefo's steps lost) / (the control's), from mean steps to target per run;
    None without the control, or where the control lost no steps."""
    try:
        free, ours, control = (steps_to_target[n] for n in
                               ('fault_free', 'mecefo_high', 'drop_adopters_high'))
    except KeyError:
        return None
    if None in (free, ours, control) or control <= free:
        return None
    return 1.0 - (ours - free) / (control - free)


def model_row(cfg, replicas: int, steps_to_target: dict, cost_spec: str) -> dict:
    """The point's figures under one step-cost model: the steps of one failure, the
    break-even v, v as measured (where the control ran) and the break-even step at it."""
    steps = one_failure_steps(cfg, replicas, cost_spec)
    v = measured_v(steps_to_target)
    return {'one_failure_steps': steps,
            'break_even_v': break_even_v(replicas, steps['mecefo']),
            'measured_v': v,
            'break_even_step': None if v is None else break_even_step(replicas, v)}
