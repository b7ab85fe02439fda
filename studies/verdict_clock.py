"""The clock a verdict column prices: its all-reduce share, its replays, and the bound where a run cannot be replayed.

Every record met its failures on its fault controller's clock (`faults/step_clock.py`): the FLOP model's step ratios
diluted by the all-reduce share phi of the point's own 1M-parameter step, with steps alone advancing it. A column
that prices steps otherwise differs from that clock twice over:

- its step ratios: on the wall clock an outage lasts the same seconds at any step, so a run whose degraded step is
  c_col rather than the clock's c_rec lives through c_rec / c_col as many steps of it;
- the pauses of its live-set changes (detect, rebuild or relaunch, compile: `goodput.TimeModel.change_sec`): the
  trace goes on while a run stands still, but the controller's clock does not.

`elastic` and `checkpoint_restart` are the fault-free run replayed (`replay.py`), so each column replays them again
at its own ratios with every pause on the clock (`time_to_target.derived_record`). A trained run's steps cannot be
replayed without training it again; its goodput's error is bounded under the verdict's rate model instead
(`clock_bound`).
"""
from __future__ import annotations

import math
import statistics

from mecefo_jax.config.resolve import resolve, updated
from mecefo_jax.failure_schedule import parse_events
from studies import allreduce
from studies.goodput import HOUR
from studies.replay import DERIVED

# The other values the Cluster's assumptions could take, each from the source `allreduce.Cluster` cites for it.
ASSUMPTIONS = {'float32 gradients': {'grad_bytes': 4}, 'MFU 0.52 (Megatron-LM on A100s)': {'mfu': 0.52}}


def bench_config(bench: dict, replicas: int):
    """configs/llama_350m.py at the tokens per device the bench ran (`bench['config']`) on `replicas` replicas: the
    step whose ratios the H200 columns use, and so the step whose all-reduce share dilutes them."""
    from configs.llama_350m import get_config
    cfg, timed = resolve(get_config()), bench['config']
    shape = ('vocab_size', 'd_model', 'num_layers', 'num_heads', 'num_kv_heads', 'ffn_hidden')
    if any(getattr(cfg.model, k) != timed[k] for k in shape):
        raise ValueError(f"the bench timed {({k: timed[k] for k in shape})}, not configs/llama_350m.py's shape: "
                         'give the H200 columns the config of the shape it timed.')
    return updated(cfg, {'data.seq_len': timed['seq_len'],
                         'data.global_batch_size': timed['per_device_batch'] * replicas})


def phi_sensitivity(cfg, replicas: int, bench: dict | None = None) -> dict:
    """{assumption: phi} of `cfg`'s step over `replicas`: as stated (`allreduce.Cluster`), under each of ASSUMPTIONS,
    and, given `bench`, with the bench's measured normal step as the compute (where it ran `cfg`'s shape)."""
    out = {'as stated': allreduce.step_allreduce(cfg, replicas)['phi']}
    for label, change in ASSUMPTIONS.items():
        out[label] = allreduce.step_allreduce(cfg, replicas, allreduce.Cluster(**change))['phi']
    if bench is not None:
        out["the bench's measured step"] = allreduce.step_allreduce(cfg, replicas, bench=bench)['phi']
    return out


def clock_phi(records: dict) -> float:
    """The all-reduce share the records' clock ran at (one per point: `verdict_points.wall_clock`)."""
    phis = {r.get('allreduce_exposed', 0.0) for seed in records.values() for r in seed.values()
            if r['strategy'] != 'fault_free'}
    if len(phis) != 1:
        raise ValueError(f'records of one point met their failures at several all-reduce shares {sorted(phis)}.')
    return phis.pop()


def replayed(records: dict, model_for, run_cfg_for, steps: int, replicas: int) -> dict:
    """`records` with each derived run replayed on its own trace (the record's `schedule`) at `model_for`'s step
    ratios, every pause on the clock; `run_cfg_for(seed, record)` is the config it ran under."""
    from studies.time_to_target import derived_record
    out = {}
    for seed, runs in records.items():
        out[seed] = dict(runs)
        for name, record in runs.items():
            if record['strategy'] in DERIVED:
                derived = derived_record(record['strategy'], parse_events(record['schedule']),
                                         run_cfg_for(seed, record), replicas, steps, model_for(record))
                out[seed][name] = dict(record, **derived)
    return out


def clock_bound(record: dict, figures: dict, model, clock_model, replicas: int) -> float:
    """How far `record`'s goodput under `model` could move if its run had met its failures on `model`'s clock, pauses
    included, rather than on `clock_model`'s (its controller's): 0 for a replayed run, and for one whose failures
    were counted in steps (an outage lasts its steps at any price, and no pause moves a step).

    Under the rate model (`verdict_model`; progress linear in a step's exact rows), a step with f of n replicas down
    loses at most s = 2f/n of a step's progress (the rows `mecefo` approximates, each worth 0 to 1 of an exact one;
    `drop` loses f/n), so each second it steps through an outage costs at most k = 1 - (1 - s) / c seconds more than
    a normal second. Up to the target:
    - each degraded step of ratio c_rec, priced c, stands for c_rec / c steps of the same outage, each costing at most
      (|c - 1| + s) normal steps more than a normal one: |c_rec / c - 1| (|c - 1| + s) steps' seconds;
    - the pauses (S seconds of changes, as `timeline` charges them) shift the trace under the run: it no longer steps
      through the outage seconds its pauses take (at most the S_in seconds of pauses into a degraded layout) and
      steps through those of the S seconds of trace past the point it reached (S_end): at most max(S_in, S_end) k
      seconds, k the largest of its layouts', and each outage boundary in those S seconds adds a change.
    Then a run of goodput G and time T to target moves by at most G dT / (T - dT)."""
    if (record.get('pauses_on_clock') or record.get('time_model', 'steps') != 'wall_clock' or not figures['reached']
            or not record['events']):
        return 0.0
    step_sec, relaunch = model.step_time_sec, record['relaunch']
    crossing = math.ceil(figures['steps_to_target'])
    executed = [e for e in record['executed'] if e[1] < crossing]
    reclock, worst = 0.0, 0.0
    for _, _, index in executed:
        layout = record['layouts'][index]
        c, c_rec = model.step_ratio(layout), clock_model.step_ratio(layout)
        lost = min(1.0, 2.0 * layout['live'].count(False) / replicas)
        reclock += abs(c_rec / c - 1.0) * (abs(c - 1.0) + lost) * step_sec
    for layout in record['layouts']:  # every layout it met, past the target too
        lost = min(1.0, 2.0 * layout['live'].count(False) / replicas)
        worst = max(worst, 1.0 - (1.0 - lost) / model.step_ratio(layout))
    pauses = model.timeline(dict(record, executed=executed))[1]['change_sec']
    after = {clock: record['layouts'][index]['live'] for clock, _, index in executed}
    healthy = sum(False not in after.get(e['clock'], [False]) for e in record['events'])  # back to the full mesh
    inside = pauses - healthy * model.change_sec(relaunch, False)
    reached = sum(clock_model.step_ratio(record['layouts'][i]) for _, _, i in executed) * step_sec
    events = parse_events(record['schedule'])
    later = sum(reached < b * step_sec <= reached + pauses for e in events for b in (e.step, e.step + e.duration_steps))
    moved = reclock + max(inside, _down_seconds(events, step_sec, reached, reached + pauses)) * worst \
        + later * model.change_sec(relaunch, True)
    seconds = figures['time_to_target_h'] * HOUR
    return figures['goodput'] * moved / max(seconds - moved, 1e-9)


def _down_seconds(events, step_sec: float, start: float, end: float) -> float:
    """The seconds of (start, end] in which some replica of `events` is down."""
    total, reach = 0.0, start
    for lo, hi in sorted((e.step * step_sec, (e.step + e.duration_steps) * step_sec) for e in events):
        lo, hi = max(lo, reach), min(hi, end)
        if hi > lo:
            total, reach = total + hi - lo, hi
    return total


def mean_bounds(records: dict, rows: dict, model_for, clock_for, replicas: int) -> dict:
    """{run: the mean over seeds of `clock_bound`}, from the column's figures `rows` ({run: per seed})."""
    return {name: statistics.fmean(clock_bound(seed[name], figures, model_for(seed[name]), clock_for(seed[name]),
                                               replicas)
                                   for seed, figures in zip(records.values(), per_seed))
            for name, per_seed in rows.items()}
