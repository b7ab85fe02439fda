"""Per-role step costs: what one device pays per step in each role.

The *cost table* the planner (`faults/planner.py`) and the cluster simulator read: the
cost of `x` batch shards in each role relative to one normal shard, and the seconds of
a fault-free step. Pure numpy. Sources: ``analytic``, the FLOP model of
docs/algorithm.md section 6 (attention scores count the full L x L matrix, ``4Ld``, as
a dense masked attention computes it and XLA counts it; elementwise work, about 1% of
a block, is left out); ``bench``, `scripts/bench_step.py`'s ratios
(`studies/bench_costs.py`); ``roles``, per-program seconds of `studies/fault_plan.py`.
Between a table's points cost is linear, through (0, 0), extrapolated with the last slope.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from mecefo_jax.config.defaults import PROJECTION_RULES

PEAK_FLOPS_A100_BF16 = 312e12  # A100 dense bf16 tensor-core peak, FLOP/s


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A LLaMA shape (multi-head attention: as many KV heads as heads)."""
    name: str
    d_model: int
    num_layers: int
    num_heads: int
    ffn_hidden: int
    vocab_size: int


PAPER_VOCAB = 32000  # the LLaMA tokenizer's vocabulary, as the paper's C4 runs use
# The paper's Table-2 models (LLaMA on C4).
PAPER_MODELS: dict[str, ModelShape] = {
    '350M': ModelShape('350M', 1024, 24, 16, 2736, PAPER_VOCAB),
    '1B': ModelShape('1B', 2048, 24, 32, 5461, PAPER_VOCAB),
    '7B': ModelShape('7B', 4096, 32, 32, 11008, PAPER_VOCAB),
}


def ffn_kernels(shape) -> tuple[tuple[int, int], ...]:
    """[n, m] of the three FFN kernels of a block (w_gate, w_up: [d, h]; w_down: [h, d])."""
    return ((shape.d_model, shape.ffn_hidden),) * 2 + ((shape.ffn_hidden, shape.d_model),)


def thin_qr_flops(k: int, r: int) -> float:
    """Householder thin QR of a k x r block: ``2 k r^2 - 2 r^3 / 3``."""
    return 2.0 * k * r * r - 2.0 * r ** 3 / 3.0


def ffn_wgrad_flops(n: int, m: int, *, rank: int, tokens: float, projection: str) -> float:
    """FLOPs of one [n, m] FFN kernel's neighbour-mode weight gradient over `tokens` tokens.

    'weights' (`lowrank.lowrank_dense`): x V, (x V)^T G_y, V (.): ``2t(n+m)r + 2nmr``.
    'gradient' (`lowrank.sketched_dense`): G_y Omega, x^T (.), a thin QR, x Q, (x Q)^T G_y,
    Q (.): ``4t(n+m)r + 2nmr + QR(n, r)``; drawing Omega is elementwise, left out.
    'exact' (no projection, an ablation): x^T G_y, ``2tnm``.
    """
    if projection not in PROJECTION_RULES:
        raise ValueError(f"projection={projection!r}: use one of {', '.join(PROJECTION_RULES)}.")
    if projection in ('exact', 'none'):
        return 2.0 * tokens * n * m if projection == 'exact' else 0.0
    sketch = 2.0 * tokens * (n + m) * rank + thin_qr_flops(n, rank) if projection == 'gradient' else 0.0
    return 2.0 * tokens * (n + m) * rank + 2.0 * n * m * rank + sketch


def block_flops_per_token(shape: ModelShape, *, mode: str, seq_len: int, rank: int,
                          batch_tokens: float, recompute_ffn: bool,
                          causal_scores: bool = False, projection: str = 'weights',
                          attention_backward: float = 0.0) -> float:
    """FLOPs of one block per token, forward + backward, in `mode` ('normal' or 'neighbour').
    `batch_tokens`: the b of the low-rank product paid once per batch; `attention_backward`:
    the share of blocks whose attention backward the neighbour computes (`attention_share`)."""
    d, h, L = shape.d_model, shape.ffn_hidden, seq_len
    ffn_fwd = 2 * 3 * d * h
    scores = (2 if causal_scores else 4) * L * d
    forward = 2 * 4 * d * d + ffn_fwd + scores
    if mode == 'normal':
        return 3.0 * forward
    if mode != 'neighbour':
        raise ValueError(f"mode={mode!r}: use 'normal' or 'neighbour'.")
    if not batch_tokens > 0:
        raise ValueError(f'batch_tokens={batch_tokens!r} must be > 0.')
    low_rank_wgrad = sum(ffn_wgrad_flops(n, m, rank=rank, tokens=batch_tokens,
                                         projection=projection)
                         for n, m in ffn_kernels(shape)) / batch_tokens
    ffn_act_grad = 2 * 3 * d * h
    recompute = ffn_fwd if recompute_ffn else 0.0
    attention = attention_backward * 2.0 * (2 * 4 * d * d + scores)
    return forward + recompute + ffn_act_grad + low_rank_wgrad + attention


def flops_per_token(shape: ModelShape, *, mode: str, seq_len: int, rank: int = 128,
                    batch_tokens: float = 1.0, recompute_ffn: bool = True,
                    causal_scores: bool = False, num_layers: int | None = None,
                    projection: str = 'weights', attention_backward: float = 0.0) -> float:
    """Forward + backward FLOPs per token of the whole model (blocks + head); `num_layers`
    overrides the shape's depth (the CPU benchmark used 4 blocks)."""
    layers = shape.num_layers if num_layers is None else num_layers
    head = 6.0 * shape.d_model * shape.vocab_size  # 2dV forward + 4dV backward
    return layers * block_flops_per_token(
        shape, mode=mode, seq_len=seq_len, rank=rank, batch_tokens=batch_tokens,
        recompute_ffn=recompute_ffn, causal_scores=causal_scores, projection=projection,
        attention_backward=attention_backward) + head


def interpolate(points, x) -> np.ndarray:
    """Cost of `x` shards from (shards, cost) points (module docstring)."""
    pts = sorted({0.0: 0.0, **{float(a): float(b) for a, b in points}}.items())
    xs = np.array([p[0] for p in pts])
    ys = np.array([p[1] for p in pts])
    x = np.asarray(x, dtype=float)
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return np.where(x <= xs[-1], np.interp(x, xs, ys), ys[-1] + slope * (x - xs[-1]))


@dataclasses.dataclass(frozen=True)
class CostTable:
    """Step cost per role, in normal shards on one device: (shards, cost) points of the
    `exact` and `neighbour` programs; `plain` is the fault-free program over `normal`, so
    layouts without a neighbour cost `plain * exact(x)` and the others `max(1, neighbour(x))`."""
    source: str
    exact: tuple[tuple[float, float], ...]
    neighbour: tuple[tuple[float, float], ...]
    step_sec: float
    step_sec_source: str
    plain: float = 1.0
    note: str = ''
    refresh_sec: float = 0.0  # one projection refresh, seconds every replica pays whole
    refresh_split_sec: float = 0.0  # and the seconds split over the live replicas
    refresh_source: str = 'not charged'

    def __post_init__(self):
        for name in ('exact', 'neighbour'):
            pts = getattr(self, name)
            if not pts or any(not (x > 0 and c > 0) for x, c in pts):
                raise ValueError(f'CostTable.{name} needs (shards > 0, cost > 0) points, got {pts!r}.')
        if not (self.step_sec > 0 and self.plain > 0 and self.refresh_sec >= 0
                and self.refresh_split_sec >= 0):
            raise ValueError(f'CostTable needs step_sec > 0 and plain > 0, got '
                             f'{self.step_sec!r} and {self.plain!r}.')

    def exact_cost(self, shards) -> np.ndarray:
        return interpolate(self.exact, shards)

    def neighbour_cost(self, shards) -> np.ndarray:
        return interpolate(self.neighbour, shards)

    def ratio(self, name: str) -> float:
        """A few named ratios over one normal shard, for reports."""
        return {'ndb_naive': float(self.exact_cost(2.0)),
                'mecefo': float(self.neighbour_cost(2.0)),
                'mecefo_per_batch': float(self.neighbour_cost(1.0)),
                'plain_dp': self.plain}[name]

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d['ratios'] = {k: self.ratio(k) for k in
                       ('ndb_naive', 'mecefo', 'mecefo_per_batch', 'plain_dp')}
        return d


def mfu_step_sec(shape: ModelShape, *, seq_len: int, replica_seqs: int, mfu: float,
                 peak_flops: float = PEAK_FLOPS_A100_BF16, **flop_kw) -> float:
    """Seconds of one fault-free step: one replica's shard's FLOPs at `mfu` of `peak_flops`."""
    if not 0 < mfu <= 1:
        raise ValueError(f'--mfu={mfu!r} must be in (0, 1].')
    tokens = replica_seqs * seq_len
    return flops_per_token(shape, mode='normal', seq_len=seq_len, **flop_kw) * tokens / (
        mfu * peak_flops)


def analytic_table(shape: ModelShape, *, seq_len: int, replica_seqs: int, rank: int,
                   recompute_ffn: bool, mfu: float,
                   peak_flops: float = PEAK_FLOPS_A100_BF16,
                   causal_scores: bool = False, projection: str = 'weights',
                   attention_backward: float = 0.0) -> CostTable:
    """The FLOP model's table for `shape` with `replica_seqs` sequences per shard, the
    neighbour's FFN gradient under the `projection` rule (`mecefo.projection`) and its
    attention backward computed in `attention_backward` of the blocks (`attention_share`)."""
    b = replica_seqs * seq_len
    kw = dict(seq_len=seq_len, rank=rank, recompute_ffn=recompute_ffn,
              causal_scores=causal_scores, projection=projection,
              attention_backward=attention_backward)
    normal = flops_per_token(shape, mode='normal', **kw)
    one = flops_per_token(shape, mode='neighbour', batch_tokens=b, **kw) / normal
    two = 2 * flops_per_token(shape, mode='neighbour', batch_tokens=2 * b, **kw) / normal
    step = mfu_step_sec(shape, seq_len=seq_len, replica_seqs=replica_seqs, mfu=mfu,
                        peak_flops=peak_flops, rank=rank, recompute_ffn=recompute_ffn,
                        causal_scores=causal_scores)
    return CostTable(
        source='analytic', exact=((1.0, 1.0), (2.0, 2.0)), neighbour=((1.0, one), (2.0, two)),
        step_sec=step,
        step_sec_source=f'analytic FLOPs at MFU {mfu:g} of {peak_flops / 1e12:g} TFLOP/s',
        note=(f'FLOP model, recompute_ffn={recompute_ffn}, '
              f'{"causal" if causal_scores else "full"} attention scores, r={rank}, '
              f'projection={projection}, attention backward in {attention_backward:g} of '
              f'the blocks, b={b} tokens per shard'))


def role_cost(table: CostTable, shard_rows: int):
    """The planner's `cost(role, rows)` of `table` for shards of `shard_rows` examples, in
    normal shards; `rows` may be an array (the planner weighs every split at once)."""
    if shard_rows < 1:
        raise ValueError(f'shard_rows={shard_rows!r} must be >= 1.')

    def cost(role: int, rows):
        shards = np.asarray(rows, float) / shard_rows
        out = table.neighbour_cost(shards) if role else table.exact_cost(shards)
        return float(out) if out.ndim == 0 else out
    return cost


def shape_of(model_cfg) -> ModelShape:
    """The `ModelShape` of a config's `model` section (for the analytic costs)."""
    return ModelShape('config', model_cfg.d_model, model_cfg.num_layers, model_cfg.num_heads,
                      model_cfg.ffn_hidden, model_cfg.vocab_size)
