"""LLaMA in Flax Linen, with the MeCeFO neighbour mode selectable per call.

Shape letters: B batch, L sequence length, D d_model, H query heads,
K key/value heads, G query heads per KV head (H = K * G), E head dim,
F FFN hidden, V vocab, R low-rank projection rank, N layers.

Blocks run under `nn.scan` (one compiled body whatever the depth) or unrolled
(`model.scan_layers=False`); the loss is chunked, so no [B, L, V] float32 logits are ever
live. Neighbour mode (MeCeFO, Hu et al., NeurIPS 2025, arXiv 2510.16415; docs/algorithm.md
section 3) has the same forward but a cheaper backward.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.ad_checkpoint import checkpoint_name

from mecefo_jax.config.defaults import Config, MecefoSection, ModelSection
from mecefo_jax.model.loss import chunked_cross_entropy
from mecefo_jax.neighbour.contract import PROJECTIONS
from mecefo_jax.neighbour.lowrank import lowrank_dense, sketched_dense, skip_in_backward
from mecefo_jax.neighbour.projections import resolve_rank


def head_dim(cfg: ModelSection) -> int:
    return cfg.d_model // cfg.num_heads


def _param(module, name, init, shape, logical_axes):
    return module.param(name, nn.with_logical_partitioning(init, logical_axes),
                        shape, jnp.float32)


class RMSNorm(nn.Module):
    eps: float

    @nn.compact
    def __call__(self, x_bld):
        scale_d = _param(self, 'scale', nn.initializers.ones, (x_bld.shape[-1],),
                         ('embed',))
        x32 = x_bld.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + self.eps)
        return (normed * scale_d).astype(x_bld.dtype)


def rotary(x_blhe, theta: float):
    """Rotary position embedding over the last axis (half-split pairing)."""
    half = x_blhe.shape[-1] // 2
    freq_e = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle_le = jnp.arange(x_blhe.shape[1], dtype=jnp.float32)[:, None] * freq_e
    cos, sin = jnp.cos(angle_le)[:, None, :], jnp.sin(angle_le)[:, None, :]
    x1, x2 = jnp.split(x_blhe.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_blhe.dtype)


# Names tagged with `checkpoint_name`, for remat policies.
ATTN_PROJECTIONS = ('attn_q', 'attn_k', 'attn_v')
ATTN_CONTEXT = 'attn_context'  # attention output before the output projection


def remat_policy(name: str):
    """The jax.checkpoint policy for a named block remat policy; None for 'none'."""
    cp = jax.checkpoint_policies
    return {
        'none': None,
        'full': cp.nothing_saveable,
        'save_attention': cp.save_only_these_names(*ATTN_PROJECTIONS, ATTN_CONTEXT),
        'save_dots': cp.dots_with_no_batch_dims_saveable,
    }[name]


def attention_implementation(name: str, dtype: str, head_dim: int) -> str:
    """'xla' or 'cudnn' for `model.attention`; 'auto' picks cuDNN where its fused kernel applies
    (a GPU, bfloat16, a head dim that is a multiple of 8)."""
    if name != 'auto':
        return name
    fused = (jax.default_backend() == 'gpu' and dtype == 'bfloat16' and head_dim % 8 == 0)
    return 'cudnn' if fused else 'xla'


class Attention(nn.Module):
    """Causal multi-head attention with optional grouped KV heads."""
    cfg: ModelSection

    @nn.compact
    def __call__(self, x_bld):
        c, dt = self.cfg, jnp.dtype(self.cfg.dtype)
        d, h, k, e = c.d_model, c.num_heads, c.num_kv_heads, head_dim(c)
        init = nn.initializers.normal(stddev=d ** -0.5)
        wq_dhe = _param(self, 'wq', init, (d, h, e), ('embed', 'heads', 'head_dim'))
        wk_dke = _param(self, 'wk', init, (d, k, e), ('embed', 'kv_heads', 'head_dim'))
        wv_dke = _param(self, 'wv', init, (d, k, e), ('embed', 'kv_heads', 'head_dim'))
        wo_hed = _param(self, 'wo', nn.initializers.normal(stddev=(h * e) ** -0.5),
                        (h, e, d), ('heads', 'head_dim', 'embed'))
        x_bld = x_bld.astype(dt)
        q_blhe = rotary(jnp.einsum('bld,dhe->blhe', x_bld, wq_dhe.astype(dt)), c.rope_theta)
        k_blke = rotary(jnp.einsum('bld,dke->blke', x_bld, wk_dke.astype(dt)), c.rope_theta)
        v_blke = jnp.einsum('bld,dke->blke', x_bld, wv_dke.astype(dt))
        q_blhe, k_blke, v_blke = (checkpoint_name(t, n) for t, n in
                                  zip((q_blhe, k_blke, v_blke), ATTN_PROJECTIONS))
        # Query head h reads KV head h // G, as in LLaMA's grouped-query attention.
        context_blhe = jax.nn.dot_product_attention(
            q_blhe, k_blke, v_blke, is_causal=True, scale=e ** -0.5,
            implementation=attention_implementation(c.attention, c.dtype, e))
        context_blhe = checkpoint_name(context_blhe, ATTN_CONTEXT)
        return jnp.einsum('blhe,hed->bld', context_blhe, wo_hed.astype(dt))


class FFNLinear(nn.Module):
    """`x @ kernel`; in neighbour mode with the low-rank weight gradient of `projection`."""
    features: int
    logical_axes: tuple
    dtype: jnp.dtype
    neighbour: bool
    projection: str  # mecefo.projection
    rank: float  # mecefo.rank (the 'gradient' rule's r; 'weights' reads r off V)

    @nn.compact
    def __call__(self, x_bln):
        n = x_bln.shape[-1]
        kernel_nm = _param(self, 'kernel', nn.initializers.normal(stddev=n ** -0.5),
                           (n, self.features), self.logical_axes)
        x_bln = x_bln.astype(self.dtype)
        if not self.neighbour or self.projection == 'exact':
            return x_bln @ kernel_nm.astype(self.dtype)
        if self.projection == 'none':  # exact activation gradient, no kernel gradient
            return x_bln @ jax.lax.stop_gradient(kernel_nm).astype(self.dtype)
        if self.projection == 'gradient':
            return sketched_dense(x_bln, kernel_nm, resolve_rank(self.rank, n, self.features))
        v_nr = self.get_variable(PROJECTIONS, 'kernel')
        if v_nr is None:
            raise ValueError('neighbour mode needs SVD projections: pass the '
                             "'projections' collection (projections.compute_projections).")
        return lowrank_dense(x_bln, kernel_nm, v_nr)


class FeedForward(nn.Module):
    """SwiGLU: w_down(silu(w_gate x) * w_up x)."""
    cfg: ModelSection
    rules: MecefoSection
    neighbour: bool = False

    @nn.compact
    def __call__(self, x_bld):
        c, dt = self.cfg, jnp.dtype(self.cfg.dtype)

        def linear(features, axes, name):
            return FFNLinear(features, axes, dt, self.neighbour, self.rules.projection,
                             self.rules.rank, name=name)

        gate_blf = linear(c.ffn_hidden, ('embed', 'mlp'), 'w_gate')(x_bld)
        up_blf = linear(c.ffn_hidden, ('embed', 'mlp'), 'w_up')(x_bld)
        return linear(c.d_model, ('mlp', 'embed'), 'w_down')(nn.silu(gate_blf) * up_blf)


class Block(nn.Module):
    """One pre-norm block; `(x, _) -> (x, None)` so `nn.scan` can carry x."""
    cfg: ModelSection
    rules: MecefoSection  # how the block's backward runs in neighbour mode
    neighbour: bool = False

    @nn.compact
    def __call__(self, x_bld, attention_grad=None):
        c = self.cfg
        attn_bld = Attention(c, name='attn')(RMSNorm(c.norm_eps, name='attn_norm')(x_bld))
        if self.neighbour and self.rules.skip_attention:
            # attention_grad: this block's gate (mecefo.attention_top_blocks), or None.
            attn_bld = skip_in_backward(attn_bld, attention_grad)
        x_bld = x_bld + attn_bld
        ffn_cls = FeedForward
        if self.neighbour and self.rules.remat_ffn:
            # Keep only the FFN input; recompute its inner activations.
            ffn_cls = nn.remat(FeedForward, static_argnums=())
        ffn_in_bld = RMSNorm(c.norm_eps, name='ffn_norm')(x_bld)
        ffn_bld = ffn_cls(c, self.rules, self.neighbour, name='ffn')(ffn_in_bld)
        return x_bld + ffn_bld, None


def attention_gates(rules: MecefoSection, num_layers: int):
    """Per block, 1.0 where a skipping neighbour still computes the attention backward
    (the top `attention_top_blocks`), else 0.0; None where no block needs a gate."""
    if not rules.skip_attention or not rules.attention_top_blocks:
        return None
    top = num_layers - rules.attention_top_blocks
    return jnp.asarray([float(i >= top) for i in range(num_layers)], jnp.float32)


def _run_blocks(model: Llama, neighbour: bool, x_bld):
    """All blocks: scanned (one body, params [N, ...]) or looped (`layers_i`)."""
    cfg, rules = model.cfg, model.rules
    gates = attention_gates(rules, cfg.num_layers) if neighbour else None
    block = Block
    policy = remat_policy(cfg.remat_policy)
    if policy is not None:
        # In a scan, CSE cannot merge the recomputation back into the forward.
        block = nn.remat(Block, policy=policy, prevent_cse=not cfg.scan_layers)
    if cfg.scan_layers:
        scanned = nn.scan(block, variable_axes={'params': 0, PROJECTIONS: 0},
                          split_rngs={'params': True}, length=cfg.num_layers,
                          unroll=cfg.num_layers if model.unroll_loops else 1,
                          metadata_params={nn.PARTITION_NAME: 'layers'})
        x_bld, _ = scanned(cfg, rules, neighbour, name='layers')(x_bld, gates)
        return x_bld
    for i in range(cfg.num_layers):
        gate = None if gates is None else gates[i]
        x_bld, _ = block(cfg, rules, neighbour, name=f'layers_{i}')(x_bld, gate)
    return x_bld


class Llama(nn.Module):
    """Decoder-only LLaMA with an untied output head: `__call__(tokens)` returns float32 logits
    [B, L, V] (inspection, tests); with `targets` (and per-example `weights`, default 1) the
    weighted sum of next-token cross-entropies, in chunks of `loss_chunk_tokens` tokens."""
    cfg: ModelSection
    rules: MecefoSection  # the neighbour's backward (mecefo.*): used in neighbour mode only
    unroll_loops: bool = False  # straight-line layers and loss chunks (FLOP counting)

    @nn.nowrap  # a plain method: the new model is no submodule of this one
    def variant(self, **changes) -> Llama:
        """The same model with some `model` or `mecefo` fields, or `unroll_loops`, changed."""
        unroll = changes.pop('unroll_loops', self.unroll_loops)
        rules = {k: changes.pop(k) for k in list(changes) if k in _RULE_FIELDS}
        return Llama(dataclasses.replace(self.cfg, **changes),
                     dataclasses.replace(self.rules, **rules), unroll, parent=None)

    @nn.compact
    def __call__(self, tokens_bl, neighbour: bool = False, targets_bl=None, weights_b=None):
        c = self.cfg
        embed_vd = _param(self, 'embedding', nn.initializers.normal(stddev=1.0),
                          (c.vocab_size, c.d_model), ('vocab', 'embed'))
        # Gather, then cast: casting the table would move V x D values for a few thousand tokens.
        x_bld = embed_vd[tokens_bl].astype(c.dtype)
        x_bld = _run_blocks(self, neighbour, x_bld)
        x_bld = RMSNorm(c.norm_eps, name='final_norm')(x_bld)
        head_dv = _param(self, 'head', nn.initializers.normal(stddev=c.d_model ** -0.5),
                         (c.d_model, c.vocab_size), ('embed', 'vocab'))
        if targets_bl is None:
            return jnp.matmul(x_bld, head_dv.astype(c.dtype),
                              preferred_element_type=jnp.float32)
        b, length = tokens_bl.shape
        if weights_b is None:
            weights_b = jnp.ones((b,), jnp.float32)
        weights_n = jnp.broadcast_to(weights_b[:, None], (b, length)).reshape(-1)
        return chunked_cross_entropy(x_bld.reshape(b * length, -1), head_dv,
                                     targets_bl.reshape(-1), weights_n,
                                     chunk_tokens=c.loss_chunk_tokens, unroll=self.unroll_loops)


_RULE_FIELDS = {f.name for f in dataclasses.fields(MecefoSection)}


def init_params(model: Llama, rng, seq_len: int = 8):
    """Boxed (logically partitioned) float32 parameters (layer axis first when scanned)."""
    tokens_bl = jnp.zeros((1, seq_len), jnp.int32)
    return model.init(rng, tokens_bl)['params']


def build_model(cfg: Config, **changes) -> Llama:
    """The LLaMA of a resolved config, the one way every caller builds it; `changes` make a
    `variant` (benchmarks: fewer layers, unrolled loops, no scan)."""
    return Llama(cfg.model, cfg.mecefo).variant(**changes)
