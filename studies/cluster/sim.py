"""Cluster-scale projection of the fault-tolerance strategies (Monte Carlo).

This module owns the *throughput model* of a strategy over a failure trace
(`simulate`) and the Monte Carlo that runs it over many seeded traces,
models, regimes and cluster sizes (`monte_carlo`). A step lasts as
long as its busiest device, each live-set change costs the strategy's
recovery, and the neighbour-mode strategies also pay the projection refresh;
the model and its strategy table are described in docs/cluster.md. The
strategies are read from `faults/strategies.py` by their fields, not their
names. Pure numpy: nothing here imports jax, so a projection to 1,024
replicas runs in seconds on a laptop.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from mecefo_jax.faults import costs as costs_lib
from mecefo_jax.faults import planner as planner_lib
from mecefo_jax.faults.strategies import SPECS, Orphans, StrategySpec
from mecefo_jax.neighbour.layout import ROLE_NORMAL
from studies.cluster import recovery as recovery_lib
from studies.cluster import traces as traces_lib
from studies.cluster.settings import (  # noqa: F401 (re-exported)
    ASSUMPTIONS,
    FAULT_FREE,
    STRATEGIES,
    TABLE2_REGIMES,
    SimConfig,
    cost_tables,
    refresh_charge,
)

CONTINUOUS_ROWS = 1000  # rows per shard the planner splits when batches are continuous


# ------------------------------------------------------------- one trace


def _spec(strategy: str) -> StrategySpec | None:
    """The registry's entry for `strategy`; None for `fault_free`."""
    if strategy == FAULT_FREE:
        return None
    if strategy not in SPECS:
        raise ValueError(f'strategy {strategy!r} is unknown; use one of {", ".join(STRATEGIES)}.')
    return SPECS[strategy]


def step_costs(strategy: str, iv: traces_lib.Intervals,
               cost: costs_lib.CostTable) -> tuple[np.ndarray, np.ndarray]:
    """(busiest device's cost in normal shards, useful fraction of the batch)
    per interval."""
    spec = _spec(strategy)
    down = iv.failed > 0
    useful = np.ones(iv.start.size)
    if spec is None or spec.orphans is Orphans.NOWHERE:  # every device runs one shard
        ratio = np.full(iv.start.size, cost.plain)
        if spec is not None:  # NOWHERE: only the live replicas' shards count
            useful = (iv.num_replicas - iv.failed) / iv.num_replicas
    elif spec.orphans is Orphans.PLANNER:
        ratio = np.where(down, planned_cost(iv, cost), cost.plain)
    else:
        shards = (iv.adopt_shards if spec.orphans is Orphans.NEAREST_NEIGHBOUR
                  else iv.elastic_shards)
        if spec.neighbour_mode:
            # Normal replicas of a layout with a neighbour run the role-switching
            # step (cost 1); nothing down means the plain fault-free step.
            ratio = np.where(down, np.maximum(1.0, cost.neighbour_cost(shards)), cost.plain)
        else:
            ratio = cost.plain * cost.exact_cost(shards)
    return ratio, useful


@functools.lru_cache(maxsize=64)
def _planner(cost: costs_lib.CostTable, shard: int) -> planner_lib.Planner:
    # One per table and shard size: its budgets are cached across traces.
    raw = costs_lib.role_cost(cost, shard)
    normal = raw(ROLE_NORMAL, shard)
    return planner_lib.Planner(shard, lambda role, rows: raw(role, rows) / normal)


def planned_cost(iv: traces_lib.Intervals, cost: costs_lib.CostTable) -> np.ndarray:
    """The planner's slowest device per interval, in normal shards (>= 1)."""
    shard = iv.shard_seqs or CONTINUOUS_ROWS
    planner = _planner(cost, shard)
    counts, inverse = np.unique(iv.failed, return_inverse=True)
    slowest = np.array([planner.budget(iv.num_replicas - int(f), int(f)).slowest_cost
                        for f in counts])
    return slowest[inverse]


def event_recovery(strategy: str, assumption: str,
                   table: recovery_lib.RecoveryTable) -> tuple[float, float | None]:
    """(seconds of no progress, lost steps or None = since last checkpoint) per change."""
    if assumption not in ASSUMPTIONS:
        raise ValueError(f'assumption {assumption!r} is unknown; use {" or ".join(ASSUMPTIONS)}.')
    spec = _spec(strategy)
    if spec is None:
        return 0.0, 0.0
    if spec.restores_at_failure:
        if assumption == 'in_process':  # no relaunch: restore from disk in place
            return table.disk.restore_sec, table.disk.lost_steps
        return table.disk.recovery_sec, table.disk.lost_steps
    entry = table.in_process if assumption == 'in_process' else table.memory
    return entry.recovery_sec, entry.lost_steps


def _lost_since_checkpoint(since: np.ndarray, onset: np.ndarray, every: float) -> np.ndarray:
    """Steps redone at each change, with a checkpoint every `every` steps.

    A failure rolls back to the last checkpoint; a return saves first (the
    new set resumes where the old one stopped), which moves the base.
    """
    lost = np.zeros(since.size)
    position = last_saved = 0.0
    for i, (s, fail) in enumerate(zip(since, onset)):
        position += s
        last_saved = max(last_saved, math.floor(position / every) * every)
        if fail:
            lost[i] = position - last_saved
            position = last_saved
        else:
            last_saved = position
    return lost


def simulate(strategy: str, iv: traces_lib.Intervals, cost: costs_lib.CostTable,
             recovery: recovery_lib.RecoveryTable, *, assumption: str, global_tokens: float,
             checkpoint_every: float, tau: float = 100.0) -> dict[str, float]:
    """Useful tokens/s of `strategy` over one trace, and what went into it."""
    ratio, useful = step_costs(strategy, iv, cost)
    spec = _spec(strategy)
    # Neighbour modes refresh the projections at each onset and every tau
    # steps while a replica is down (docs/cluster.md).
    live = np.maximum(iv.num_replicas - iv.failed, 1)
    refresh = (cost.refresh_sec + cost.refresh_split_sec / live
               if spec is not None and spec.neighbour_mode else np.zeros(live.shape))
    step_sec = cost.step_sec * ratio / cost.plain + np.where(iv.failed > 0, refresh / tau, 0.0)
    tokens_per_step = global_tokens * useful
    sec, lost_fixed = event_recovery(strategy, assumption, recovery)
    event = iv.event & (spec is not None)
    busy_until = np.maximum.accumulate(np.where(event, iv.start + sec + refresh * iv.onset,
                                                -np.inf))
    productive = np.clip(iv.end - np.maximum(iv.start, busy_until), 0.0, None)
    steps = productive / step_sec
    executed_before = np.concatenate([[0.0], np.cumsum(steps)])
    at = np.flatnonzero(event)
    since = np.diff(np.concatenate([[0.0], executed_before[at]]))
    if lost_fixed is None:
        if not checkpoint_every > 0:
            raise ValueError(f'--checkpoint_every={checkpoint_every!r} must be > 0 when the '
                             f'lost steps are derived from the checkpoint period.')
        lost = _lost_since_checkpoint(since, iv.onset[at], checkpoint_every)
    else:
        lost = np.where(iv.onset[at], np.minimum(lost_fixed, since), 0.0)
    lost_tokens = float(np.sum(lost * tokens_per_step[at - 1])) if at.size else 0.0
    tokens = float(np.sum(steps * tokens_per_step)) - lost_tokens
    horizon = iv.horizon_sec
    fault_free_tps = global_tokens / cost.step_sec
    tps = tokens / horizon
    down = (iv.failed > 0) & (productive > 0)
    weight = productive[down]
    return {
        'tokens_per_sec': tps,
        'drop_pct': 100.0 * (1.0 - tps / fault_free_tps),
        'fault_free_tokens_per_sec': fault_free_tps,
        'events': float(at.size),
        'lost_steps': float(np.sum(lost)),
        'recovery_sec': float(np.sum(iv.duration - productive)),
        # Busiest device's step over the fault-free one, time-weighted over
        # productive time with a replica down (1.0 when there was none).
        'step_ratio_when_down': float(np.sum(weight * ratio[down] / cost.plain) / weight.sum())
        if weight.sum() > 0 else 1.0,
    }


def trace_stats(iv: traces_lib.Intervals) -> dict[str, float]:
    """Model-independent figures of one trace: the time with any replica down, and
    the mean number down (each row's `>=1 down %` and `mean down`)."""
    d = iv.duration
    return {'time_frac_any_down': float(np.sum(d[iv.failed > 0]) / iv.horizon_sec),
            'mean_replicas_down': float(np.sum(d * iv.failed) / iv.horizon_sec)}


# ---------------------------------------------------------- Monte Carlo


def _summary(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, float)
    return {'mean': float(a.mean()), 'std': float(a.std(ddof=1)) if a.size > 1 else 0.0,
            'min': float(a.min()), 'max': float(a.max())}


def run_setting(config: SimConfig, tables: dict[str, costs_lib.CostTable],
                recovery: recovery_lib.RecoveryTable, *, regime: str,
                num_replicas: int, seeds: int, models) -> dict[str, Any]:
    """Every (model, assumption, strategy) over `seeds` traces of one setting.

    Returns {'trace': stats summaries, 'results': {(model, assumption,
    strategy): {metric: summary}}}.
    """
    horizon = config.hours * 3600.0
    shard = None if config.granularity == 'continuous' else config.replica_seqs
    global_tokens = float(config.replica_seqs * config.seq_len * num_replicas)
    per_seed: dict[tuple, list[dict]] = {}
    stats: list[dict] = []
    for seed in range(1 if regime == 'none' else seeds):
        if regime == 'none':
            iv = traces_lib.no_failures(num_replicas, horizon)
        else:
            mtbf, mttr = traces_lib.regime_rates(regime, config.mtbf_hours, config.mttr_hours)
            trace = traces_lib.sample_trace(
                num_replicas=num_replicas, mtbf_hours=mtbf, mttr_hours=mttr,
                horizon_hours=config.hours, seed=seed, rate_scaling=config.rate_scaling)
            iv = traces_lib.intervals(trace, shard_seqs=shard)
        stats.append(trace_stats(iv))
        for model in models:
            for assumption in config.assumptions:
                for strategy in config.strategies:
                    per_seed.setdefault((model, assumption, strategy), []).append(simulate(
                        strategy, iv, tables[model], recovery, assumption=assumption,
                        global_tokens=global_tokens, checkpoint_every=config.checkpoint_every,
                        tau=config.tau))
    results = {key: {m: _summary([r[m] for r in runs]) for m in runs[0]}
               for key, runs in per_seed.items()}
    trace = {m: _summary([s[m] for s in stats]) for m in stats[0]}
    return {'trace': trace, 'results': results, 'seeds': len(stats)}


def _row(config, tables, setting: dict, model, assumption, strategy, res, trace) -> dict[str, Any]:
    table = tables[model]
    return {
        'model': model, 'regime': setting['regime'], 'strategy': strategy,
        'assumption': assumption,
        'num_replicas': setting['num_replicas'], 'seeds': setting['seeds'], 'hours': config.hours,
        'drop_pct': res['drop_pct']['mean'], 'drop_pct_std': res['drop_pct']['std'],
        'drop_pct_min': res['drop_pct']['min'], 'drop_pct_max': res['drop_pct']['max'],
        'tokens_per_sec': res['tokens_per_sec']['mean'],
        'tokens_per_sec_std': res['tokens_per_sec']['std'],
        'fault_free_tokens_per_sec': res['fault_free_tokens_per_sec']['mean'],
        'events_mean': res['events']['mean'], 'lost_steps_mean': res['lost_steps']['mean'],
        'recovery_sec_mean': res['recovery_sec']['mean'],
        'step_ratio_when_down': res['step_ratio_when_down']['mean'],
        'time_frac_any_down': trace['time_frac_any_down']['mean'],
        'mean_replicas_down': trace['mean_replicas_down']['mean'],
        'cost_source': table.source, 'step_time_source': table.step_sec_source,
    }


def _settings(config: SimConfig):
    """(part, regime, replicas, seeds, models) of every setting: Table 2, then the sweep."""
    for regime in config.regimes:
        yield 'table2', regime, config.replicas, config.seeds, config.models
    for regime in config.sweep_regimes if config.sizes else ():
        for n in config.sizes:
            yield 'sweep', regime, n, config.seeds_for(n), (config.sweep_model,)


def monte_carlo(config: SimConfig, tables: dict[str, costs_lib.CostTable],
                recovery: recovery_lib.RecoveryTable,
                log: Callable[[str], None] = print) -> dict[str, Any]:
    """Table 2 (every model and regime at `replicas`) and the size sweep."""
    config.validate()
    rows = {'table2': [], 'sweep': []}
    start = time.perf_counter()
    for part, regime, n, seeds, models in _settings(config):
        t0 = time.perf_counter()
        out = run_setting(config, tables, recovery, regime=regime, num_replicas=n, seeds=seeds,
                          models=models)
        setting = {'regime': regime, 'num_replicas': n, 'seeds': out['seeds']}
        rows[part] += [_row(config, tables, setting, model, assumption, strategy, res, out['trace'])
                       for (model, assumption, strategy), res in out['results'].items()]
        log(f'[simulate] {part}, regime {regime:<6} n={n:>4}: '
            f'{out["seeds"]} seed(s), >=1 replica down '
            f'{100 * out["trace"]["time_frac_any_down"]["mean"]:.1f}% of the time, '
            f'{out["trace"]["mean_replicas_down"]["mean"]:.1f} on average '
            f'({time.perf_counter() - t0:.1f} s)')
    log(f'[simulate] done in {time.perf_counter() - start:.1f} s')
    return {'config': dataclasses.asdict(config), 'rows': rows['table2'],
            'sweep_rows': rows['sweep'],
            'cost_tables': {name: t.to_json() for name, t in tables.items()},
            'recovery': recovery.to_json()}


# ------------------------------------------------------------- end to end


def run(config: SimConfig, *, out_dir: str | None = None, cost: str = 'analytic',
        bench_json: str = '', bench_metric: str = 'step_ms', recovery_json: str = '',
        recovery_overrides: dict | None = None,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    """Loads the tables, runs the Monte Carlo, writes the reports to `out_dir`."""
    from studies.cluster import report as cluster_report  # matplotlib only when writing

    config.validate()
    bench = costs_lib.load_json(bench_json, '--bench_json') if bench_json else None
    tables = cost_tables(config, source=cost, bench=bench, bench_metric=bench_metric,
                         bench_path=bench_json)
    drill = costs_lib.load_json(recovery_json, '--recovery_json') if recovery_json else None
    recovery = recovery_lib.recovery_table(drill=drill, overrides=recovery_overrides,
                                           drill_path=recovery_json or '--recovery_json')
    for name, t in tables.items():
        log(f'[simulate] {name}: {t.source} costs, mecefo x{t.ratio("mecefo"):.3f}, '
            f'ndb_naive x{t.ratio("ndb_naive"):.3f}, fault-free step {t.step_sec * 1e3:.1f} ms '
            f'({t.step_sec_source}), refresh {t.refresh_sec:.3f} s + '
            f'{t.refresh_split_sec:.3f} s / live ({t.refresh_source})')
    result = monte_carlo(config, tables, recovery, log=log)
    if out_dir:
        paths = cluster_report.write(result, out_dir)
        log('[simulate] wrote ' + ', '.join(paths.values()))
    return result
