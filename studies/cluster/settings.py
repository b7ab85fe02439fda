"""What a cluster projection depends on: strategies, assumptions, the config and its cost tables.

Split from `cluster.sim` (which re-exports these names) so that the
simulation module holds the model and the Monte Carlo only. Pure numpy.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from mecefo_jax.faults import costs as costs_lib
from mecefo_jax.faults import refresh_costs
from mecefo_jax.faults import strategies as strategies_lib
from studies.cluster import traces as traces_lib

FAULT_FREE = 'fault_free'  # the baseline: no failures at all
STRATEGIES = (FAULT_FREE,) + strategies_lib.STRATEGIES
ASSUMPTIONS = ('in_process', 'real_crash')
TABLE2_REGIMES = ('none', 'low', 'mid', 'high')


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """Everything a projection depends on (see scripts/simulate_cluster.py)."""
    models: tuple[str, ...] = ('350M', '1B', '7B')
    regimes: tuple[str, ...] = TABLE2_REGIMES
    assumptions: tuple[str, ...] = ASSUMPTIONS
    strategies: tuple[str, ...] = STRATEGIES
    replicas: int = 32
    seeds: int = 100
    hours: float = 24.0
    sizes: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512, 1024)
    sweep_model: str = '350M'
    sweep_regimes: tuple[str, ...] = ('low', 'mid', 'high')
    sweep_seeds: int = 0  # 0: min(seeds, max(4, seeds * 32 / n))
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
    refresh_method: str = 'subspace'  # as mecefo.refresh: 'subspace' (default) | 'svd'
    refresh_iters: int = 3  # as mecefo.refresh_iters
    # as mecefo.refresh_split_min_elements
    refresh_split_min_elements: int = refresh_costs.DEFAULT_SPLIT_MIN_ELEMENTS
    granularity: str = 'sequence'  # or 'continuous'
    checkpoint_every: int = 1000
    recompute_ffn: bool = False  # as mecefo.remat_ffn, off by default (docs/algorithm.md section 6)
    causal_scores: bool = False
    mfu: float = 0.4
    peak_tflops: float = 312.0

    @property
    def replica_seqs(self) -> int:
        return self.global_batch // self.replicas

    def validate(self) -> None:
        if self.global_batch % self.replicas:
            raise ValueError(f'--global_batch={self.global_batch} must divide evenly over '
                             f'--replicas={self.replicas} (one shard per replica).')
        for name in self.models:
            if name not in costs_lib.PAPER_MODELS:
                raise ValueError(f'--models: {name!r} is unknown; use '
                                 f'{", ".join(costs_lib.PAPER_MODELS)}.')
        if self.sizes and self.sweep_model not in costs_lib.PAPER_MODELS:
            raise ValueError(f'--sweep_model={self.sweep_model!r}: use one of '
                             f'{", ".join(costs_lib.PAPER_MODELS)}.')
        for s in self.strategies:
            if s not in STRATEGIES:
                raise ValueError(f'--strategies: {s!r} is unknown; use {", ".join(STRATEGIES)}.')
        for a in self.assumptions:
            if a not in ASSUMPTIONS:
                raise ValueError(f'--assumption: {a!r} is unknown; use {ASSUMPTIONS} or both.')
        for regime in self.regimes + (self.sweep_regimes if self.sizes else ()):
            if regime != 'none':
                traces_lib.regime_rates(regime, self.mtbf_hours, self.mttr_hours)
        if self.granularity not in ('sequence', 'continuous'):
            raise ValueError(f"--granularity={self.granularity!r}: use 'sequence' or "
                             f"'continuous'.")
        if self.seeds < 1 or self.hours <= 0:
            raise ValueError(f'--seeds={self.seeds} must be >= 1 and --hours={self.hours} > 0.')
        if self.refresh_method not in ('subspace', 'svd') or self.refresh_iters < 1:
            raise ValueError(f"--refresh_method={self.refresh_method!r} must be 'subspace' or "
                             f"'svd' and --refresh_iters={self.refresh_iters} >= 1.")
        if self.refresh_split_min_elements < 0:
            raise ValueError(f'--refresh_split_min_elements={self.refresh_split_min_elements} '
                             'must be >= 0 (0 splits every kernel).')
        if self.tau < 1 or not self.svd_tflops > 0 or not self.link_gbps > 0:
            raise ValueError(f'--tau={self.tau} must be >= 1, --svd_tflops='
                             f'{self.svd_tflops} > 0 and --link_gbps={self.link_gbps} > 0.')

    def seeds_for(self, n: int) -> int:
        if self.sweep_seeds > 0:
            return self.sweep_seeds
        return min(self.seeds, max(4, (self.seeds * self.replicas) // n))


def cost_tables(config: SimConfig, *, source: str = 'analytic', bench: dict | None = None,
                bench_metric: str = 'step_ms', bench_path: str = '') -> dict[str, costs_lib.CostTable]:
    """One cost table per model named in the config (Table 2 and the sweep)."""
    names = dict.fromkeys(config.models + ((config.sweep_model,) if config.sizes else ()))
    peak = config.peak_tflops * 1e12
    tables = {}
    for name in names:
        shape = costs_lib.PAPER_MODELS[name]
        common = dict(seq_len=config.seq_len, replica_seqs=config.replica_seqs, mfu=config.mfu)
        flop_kw = dict(rank=config.rank, recompute_ffn=config.recompute_ffn,
                       causal_scores=config.causal_scores, peak_flops=peak)
        if source == 'analytic':
            tables[name] = costs_lib.analytic_table(shape, **common, **flop_kw)
        elif source == 'bench':
            if bench is None:
                raise ValueError('--cost=bench needs --bench_json PATH (bench_step.json).')
            if bench_metric not in ('step_ms', 'flops'):
                raise ValueError(f"--bench_metric={bench_metric!r}: use 'step_ms' or 'flops'.")
            tables[name] = costs_lib.bench_table(bench, shape, metric=bench_metric,
                                                 path=bench_path, **common, **flop_kw)
        else:
            raise ValueError(f"--cost={source!r}: use 'analytic' or 'bench'.")
        tables[name] = dataclasses.replace(tables[name], **refresh_charge(config, shape))
    return tables


def refresh_charge(config: SimConfig, shape: costs_lib.ModelShape) -> dict[str, Any]:
    """{refresh_sec, refresh_split_sec, refresh_source}: the flag, or the refresh's
    FLOPs at `svd_tflops` and its collective bytes at `link_gbps` (`refresh_costs`)."""
    if config.refresh_sec >= 0:
        return {'refresh_sec': config.refresh_sec, 'refresh_split_sec': 0.0,
                'refresh_source': '--refresh_sec'}
    return refresh_costs.refresh_charge(shape, method=config.refresh_method, rank=config.rank,
                                        iterations=config.refresh_iters,
                                        split_min_elements=config.refresh_split_min_elements,
                                        tflops=config.svd_tflops, link_gbps=config.link_gbps)
