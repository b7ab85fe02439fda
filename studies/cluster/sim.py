"""The projection's config and cost tables, a strategy's throughput over one failure trace
(the model of docs/cluster.md, reading `faults/strategies.py` by fields, not names), and
the Monte Carlo over many traces. No jax."""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from mecefo_jax.config import defaults as config_defaults
from mecefo_jax.faults import costs as costs_lib
from mecefo_jax.faults import planner as planner_lib
from mecefo_jax.faults.strategies import SPECS, Orphans, StrategySpec
from mecefo_jax.neighbour.layout import ROLE_NORMAL
from studies import bench_costs, refresh_costs
from studies.cluster import traces as traces_lib

CONTINUOUS_ROWS = 1000  # rows per shard the planner splits when batches are continuous
FAULT_FREE = 'fault_free'  # the baseline: no failures at all
STRATEGIES = (FAULT_FREE,) + config_defaults.STRATEGIES
ASSUMPTIONS = ('in_process', 'real_crash')


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """Everything a projection depends on (the flags of scripts/simulate_cluster.py)."""
    models: tuple[str, ...] = ('350M', '1B', '7B')
    regimes: tuple[str, ...] = ('none', 'low', 'mid', 'high')  # the paper's Table 2
    assumptions: tuple[str, ...] = ASSUMPTIONS
    strategies: tuple[str, ...] = STRATEGIES
    replicas: int = 32
    seeds: int = 100
    hours: float = 24.0
    sizes: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512, 1024)
    sweep_model: str = '350M'
    sweep_regimes: tuple[str, ...] = ('low', 'mid', 'high')
    sweep_seeds: int = 0  # 0: `seeds_for`
    mtbf_hours: float = 0.0  # the 'custom' regime
    mttr_hours: float = 0.0
    rate_scaling: str = 'per_replica'
    global_batch: int = 512  # sequences per step at `replicas`
    seq_len: int = 256
    rank: int = 128
    tau: int = 100  # steps between projection refreshes while a neighbour is active (paper)
    refresh_sec: float = -1.0  # seconds per refresh; < 0: its FLOPs and bytes (refresh_costs)
    svd_tflops: float = refresh_costs.DEFAULT_REFRESH_TFLOPS  # assumed TFLOP/s of the refresh
    link_gbps: float = refresh_costs.DEFAULT_LINK_GBPS  # replica-to-replica GB/s (DGX A100)
    refresh_method: str = 'subspace'  # as mecefo.refresh: 'subspace' | 'svd'
    refresh_iters: int = 3  # as mecefo.refresh_iters
    refresh_split_min_elements: int = refresh_costs.DEFAULT_SPLIT_MIN_ELEMENTS
    granularity: str = 'sequence'  # or 'continuous'
    checkpoint_every: int = 1000
    recompute_ffn: bool = False  # as mecefo.remat_ffn
    causal_scores: bool = False
    mfu: float = 0.4
    peak_tflops: float = 312.0

    @property
    def replica_seqs(self) -> int:
        return self.global_batch // self.replicas

    def seeds_for(self, n: int) -> int:
        """--sweep_seeds, or fewer at larger sizes: min(seeds, max(4, seeds * replicas / n))."""
        return self.sweep_seeds or min(self.seeds, max(4, self.seeds * self.replicas // n))

    def validate(self) -> None:
        known = costs_lib.PAPER_MODELS
        for name, value, allowed in (('models', self.models, known),
                                     ('sweep_model', (self.sweep_model,) if self.sizes else (), known),
                                     ('strategies', self.strategies, STRATEGIES),
                                     ('assumption', self.assumptions, ASSUMPTIONS),
                                     ('granularity', (self.granularity,), ('sequence', 'continuous')),
                                     ('rate_scaling', (self.rate_scaling,), ('per_replica', 'cluster')),
                                     ('refresh_method', (self.refresh_method,), ('subspace', 'svd'))):
            for v in value:
                if v not in allowed:
                    raise ValueError(f'--{name}: {v!r} is unknown; use {", ".join(allowed)}.')
        for regime in [g for g in self.regimes + (self.sweep_regimes if self.sizes else ()) if g != 'none']:
            traces_lib.regime_rates(regime, self.mtbf_hours, self.mttr_hours)
        if min(self.sizes, default=1) < 1:
            raise ValueError(f'--sizes={",".join(map(str, self.sizes))}: use sizes >= 1.')
        if self.replicas < 1 or self.global_batch % self.replicas:
            raise ValueError(f'--global_batch={self.global_batch} must divide evenly over '
                             f'--replicas={self.replicas} (one shard per replica).')
        for name, low in (('seeds', 1), ('refresh_iters', 1), ('tau', 1), ('refresh_split_min_elements', 0),
                          ('sweep_seeds', 0), ('hours', None), ('svd_tflops', None), ('link_gbps', None),
                          ('checkpoint_every', None)):
            value = getattr(self, name)
            if not (value > 0 if low is None else value >= low):
                raise ValueError(f'--{name}={value} must be {"> 0" if low is None else f">= {low}"}.')


def cost_tables(config: SimConfig, *, bench: dict | None = None,
                bench_path: str = '') -> dict[str, costs_lib.CostTable]:
    """One cost table per model: analytic, or bench_step.json's step_ms; the refresh is
    `--refresh_sec`, or its FLOPs at `svd_tflops` and bytes at `link_gbps` (`refresh_costs`)."""
    tables = {}
    for name in dict.fromkeys(config.models + ((config.sweep_model,) if config.sizes else ())):
        shape = costs_lib.PAPER_MODELS[name]
        kw = dict(seq_len=config.seq_len, replica_seqs=config.replica_seqs, mfu=config.mfu,
                  rank=config.rank, recompute_ffn=config.recompute_ffn,
                  causal_scores=config.causal_scores, peak_flops=config.peak_tflops * 1e12)
        table = (costs_lib.analytic_table(shape, **kw) if bench is None else
                 bench_costs.bench_table(bench, shape, metric='step_ms', path=bench_path, **kw))
        if config.refresh_sec >= 0:
            refresh = {'refresh_sec': config.refresh_sec, 'refresh_split_sec': 0.0, 'refresh_source': '--refresh_sec'}
        else:
            refresh = refresh_costs.refresh_charge(
                shape, method=config.refresh_method, rank=config.rank,
                iterations=config.refresh_iters, split_min_elements=config.refresh_split_min_elements,
                tflops=config.svd_tflops, link_gbps=config.link_gbps)
        tables[name] = dataclasses.replace(table, **refresh)
    return tables


def _spec(strategy: str) -> StrategySpec | None:
    """The registry's entry for `strategy`; None for `fault_free`."""
    if strategy != FAULT_FREE and strategy not in SPECS:
        raise ValueError(f'strategy {strategy!r} is unknown; use one of {", ".join(STRATEGIES)}.')
    return SPECS.get(strategy)


@functools.lru_cache(maxsize=64)
def _planner(cost: costs_lib.CostTable, shard: int) -> planner_lib.Planner:
    # One per table and shard size: its budgets are cached across traces.
    raw = costs_lib.role_cost(cost, shard)
    normal = raw(ROLE_NORMAL, shard)
    return planner_lib.Planner(shard, lambda role, rows: raw(role, rows) / normal)


def step_costs(strategy: str, iv: traces_lib.Intervals,
               cost: costs_lib.CostTable) -> tuple[np.ndarray, np.ndarray]:
    """(busiest device's cost in normal shards, useful fraction of the batch) per interval."""
    spec = _spec(strategy)
    down = iv.failed > 0
    useful = np.ones(iv.start.size)
    if spec is None or spec.orphans is Orphans.NOWHERE:  # every device runs one shard
        ratio = np.full(iv.start.size, cost.plain)
        if spec is not None:  # NOWHERE: only the live replicas' shards count
            useful = (iv.num_replicas - iv.failed) / iv.num_replicas
    elif spec.orphans is Orphans.PLANNER:  # the planner's slowest device, per count down
        planner = _planner(cost, iv.shard_seqs or CONTINUOUS_ROWS)
        counts, inverse = np.unique(iv.failed, return_inverse=True)
        slowest = np.array([planner.budget(iv.num_replicas - int(f), int(f)).slowest_cost
                            for f in counts])
        ratio = np.where(down, slowest[inverse], cost.plain)
    else:
        shards = iv.adopt_shards if spec.orphans is Orphans.NEAREST_NEIGHBOUR else iv.elastic_shards
        if spec.neighbour_mode:  # normal replicas of a layout with a neighbour: cost 1
            ratio = np.where(down, np.maximum(1.0, cost.neighbour_cost(shards)), cost.plain)
        else:
            ratio = cost.plain * cost.exact_cost(shards)
    return ratio, useful


def event_recovery(strategy: str, assumption: str, table: dict) -> tuple[float, float | None]:
    """(seconds of no progress, lost steps or None = since last checkpoint) per change."""
    if assumption not in ASSUMPTIONS:
        raise ValueError(f'assumption {assumption!r} is unknown; use {" or ".join(ASSUMPTIONS)}.')
    spec, in_process = _spec(strategy), assumption == 'in_process'
    if spec is None:
        return 0.0, 0.0
    if spec.restores_at_failure:  # in_process: no relaunch, restore from disk in place
        return table['disk']['restore_sec' if in_process else 'recovery_sec'], table['disk']['lost_steps']
    entry = table['in_process' if in_process else 'memory']
    return entry['recovery_sec'], entry['lost_steps']


def _lost_since_checkpoint(since: np.ndarray, onset: np.ndarray, every: float) -> np.ndarray:
    """Steps redone at each change with a checkpoint every `every` steps: a failure rolls
    back to the last one; a return saves first (the new set resumes where the old stopped)."""
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


def simulate(strategy: str, iv: traces_lib.Intervals, cost: costs_lib.CostTable, recovery: dict, *,
             assumption: str, global_tokens: float, checkpoint_every: float,
             tau: float = 100.0) -> dict[str, float]:
    """Useful tokens/s of `strategy` over one trace, and what went into it."""
    ratio, useful = step_costs(strategy, iv, cost)
    spec = _spec(strategy)
    # Neighbour modes refresh the projections at each onset and every tau steps while one is down.
    live = np.maximum(iv.num_replicas - iv.failed, 1)
    refresh = (cost.refresh_sec + cost.refresh_split_sec / live
               if spec is not None and spec.neighbour_mode else np.zeros(live.shape))
    step_sec = cost.step_sec * ratio / cost.plain + np.where(iv.failed > 0, refresh / tau, 0.0)
    tokens_per_step = global_tokens * useful
    sec, lost_fixed = event_recovery(strategy, assumption, recovery)
    event = iv.event & (spec is not None)
    busy_until = np.maximum.accumulate(np.where(event, iv.start + sec + refresh * iv.onset, -np.inf))
    productive = np.clip(iv.end - np.maximum(iv.start, busy_until), 0.0, None)
    steps = productive / step_sec
    at = np.flatnonzero(event)
    since = np.diff(np.concatenate([[0.0], np.concatenate([[0.0], np.cumsum(steps)])[at]]))
    if lost_fixed is None:
        lost = _lost_since_checkpoint(since, iv.onset[at], checkpoint_every)
    else:
        lost = np.where(iv.onset[at], np.minimum(lost_fixed, since), 0.0)
    lost_tokens = float(np.sum(lost * tokens_per_step[at - 1])) if at.size else 0.0
    tps = (float(np.sum(steps * tokens_per_step)) - lost_tokens) / iv.horizon_sec
    fault_free_tps = global_tokens / cost.step_sec
    down = (iv.failed > 0) & (productive > 0)
    weight = productive[down]
    return {
        'tokens_per_sec': tps, 'drop_pct': 100.0 * (1.0 - tps / fault_free_tps),
        'fault_free_tokens_per_sec': fault_free_tps, 'events': float(at.size),
        'lost_steps': float(np.sum(lost)), 'recovery_sec': float(np.sum(iv.duration - productive)),
        # Busiest device's step over the fault-free one, time-weighted while a replica is down.
        'step_ratio_when_down': float(np.sum(weight * ratio[down] / cost.plain) / weight.sum())
        if weight.sum() > 0 else 1.0,
    }


def trace_stats(iv: traces_lib.Intervals) -> dict[str, float]:
    """Model-independent figures of one trace: time with any replica down, mean number down."""
    d = iv.duration
    return {'time_frac_any_down': float(np.sum(d[iv.failed > 0]) / iv.horizon_sec),
            'mean_replicas_down': float(np.sum(d * iv.failed) / iv.horizon_sec)}


def _summary(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, float)
    return {'mean': float(a.mean()), 'std': float(a.std(ddof=1)) if a.size > 1 else 0.0,
            'min': float(a.min()), 'max': float(a.max())}


def setting_rows(config: SimConfig, tables: dict[str, costs_lib.CostTable], recovery: dict, *,
                 regime: str, num_replicas: int, seeds: int, models) -> tuple[list[dict], dict]:
    """One row per (model, assumption, strategy) over `seeds` traces of one setting (one
    trace without failures), and the traces' mean `trace_stats`."""
    shard = None if config.granularity == 'continuous' else config.replica_seqs
    global_tokens = float(config.replica_seqs * config.seq_len * num_replicas)
    per_seed: dict[tuple, list[dict]] = {}
    stats: list[dict] = []
    none = regime == 'none'
    mtbf, mttr = (0.0, 0.0) if none else traces_lib.regime_rates(regime, config.mtbf_hours, config.mttr_hours)
    for seed in range(1 if none else seeds):
        outages = () if none else traces_lib.sample_trace(
            num_replicas=num_replicas, mtbf_hours=mtbf, mttr_hours=mttr, horizon_hours=config.hours,
            seed=seed, rate_scaling=config.rate_scaling)
        iv = traces_lib.intervals(num_replicas, config.hours * 3600.0, outages, shard_seqs=shard)
        stats.append(trace_stats(iv))
        for key in ((m, a, s) for m in models for a in config.assumptions for s in config.strategies):
            per_seed.setdefault(key, []).append(simulate(
                key[2], iv, tables[key[0]], recovery, assumption=key[1], global_tokens=global_tokens,
                checkpoint_every=config.checkpoint_every, tau=config.tau))
    trace = {m: _summary([s[m] for s in stats])['mean'] for m in stats[0]}
    rows = []
    for (model, assumption, strategy), runs in per_seed.items():
        res = {m: _summary([r[m] for r in runs]) for m in runs[0]}
        mean = {m: res[m]['mean'] for m in res}
        rows.append({
            'model': model, 'regime': regime, 'strategy': strategy, 'assumption': assumption,
            'num_replicas': num_replicas, 'seeds': len(stats), 'hours': config.hours,
            'drop_pct': mean['drop_pct'], 'drop_pct_std': res['drop_pct']['std'],
            'drop_pct_min': res['drop_pct']['min'], 'drop_pct_max': res['drop_pct']['max'],
            'tokens_per_sec': mean['tokens_per_sec'], 'tokens_per_sec_std': res['tokens_per_sec']['std'],
            'fault_free_tokens_per_sec': mean['fault_free_tokens_per_sec'], 'events_mean': mean['events'],
            'lost_steps_mean': mean['lost_steps'], 'recovery_sec_mean': mean['recovery_sec'],
            'step_ratio_when_down': mean['step_ratio_when_down'], **trace,
            'cost_source': tables[model].source, 'step_time_source': tables[model].step_sec_source})
    return rows, trace


def monte_carlo(config: SimConfig, tables: dict[str, costs_lib.CostTable], recovery: dict,
                log: Callable[[str], None] = print) -> dict[str, Any]:
    """Table 2 (every model and regime at `replicas`), then the size sweep."""
    config.validate()
    settings = [('table2', regime, config.replicas, config.seeds, config.models)
                for regime in config.regimes]
    settings += [('sweep', regime, n, config.seeds_for(n), (config.sweep_model,))
                 for regime in config.sweep_regimes for n in config.sizes]
    rows = {'table2': [], 'sweep': []}
    start = time.perf_counter()
    for part, regime, n, seeds, models in settings:
        t0 = time.perf_counter()
        new, trace = setting_rows(config, tables, recovery, regime=regime, num_replicas=n,
                                  seeds=seeds, models=models)
        rows[part] += new
        log(f'[simulate] {part}, regime {regime:<6} n={n:>4}: {1 if regime == "none" else seeds} seed(s), >=1 replica '
            f'down {100 * trace["time_frac_any_down"]:.1f}% of the time, '
            f'{trace["mean_replicas_down"]:.1f} on average ({time.perf_counter() - t0:.1f} s)')
    log(f'[simulate] done in {time.perf_counter() - start:.1f} s')
    return {'config': dataclasses.asdict(config), 'rows': rows['table2'], 'sweep_rows': rows['sweep'],
            'cost_tables': {name: t.to_json() for name, t in tables.items()}, 'recovery': recovery}
