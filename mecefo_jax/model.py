"""LLaMA in Flax Linen, with the MeCeFO neighbour mode selectable per call.

Shape letters: B batch, L sequence length, D d_model, H query heads,
K key/value heads, G query heads per KV head (H = K * G), E head dim,
F FFN hidden, V vocab, R low-rank projection rank.

Normal mode is the exact model. Neighbour mode (docs/algorithm.md) has the
same forward output but a cheaper backward:
  * the attention branch is cut from the backward pass (no cotangent, no
    parameter gradient, no saved activations);
  * the FFN keeps only its input and recomputes its inner activations;
  * each FFN weight gets the low-rank gradient of `lowrank.lowrank_dense`,
    using projections read from the 'projections' variable collection.
"""
import dataclasses

import jax
import jax.numpy as jnp
from flax import linen as nn

from mecefo_jax.lowrank import lowrank_dense

PROJECTIONS = 'projections'  # variable collection holding the SVD projections V
ATTENTION_BRANCH_MODULES = ('attn', 'attn_norm')  # averaged over normal devices only


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    dtype: str = 'float32'
    remat_ffn: bool = True  # neighbour-mode FFN recomputation

    @classmethod
    def from_config(cls, cfg) -> 'ModelConfig':
        """From the full ConfigDict (model section plus mecefo.remat_ffn)."""
        m = cfg.model
        model_cfg = cls(
            vocab_size=int(m.vocab_size), d_model=int(m.d_model),
            num_layers=int(m.num_layers), num_heads=int(m.num_heads),
            num_kv_heads=int(m.num_kv_heads), ffn_hidden=int(m.ffn_hidden),
            rope_theta=float(m.rope_theta), norm_eps=float(m.norm_eps),
            dtype=str(m.dtype), remat_ffn=bool(cfg.mecefo.remat_ffn))
        model_cfg.validate()
        return model_cfg

    def validate(self) -> None:
        if self.d_model % self.num_heads:
            raise ValueError(f'model.d_model={self.d_model} must be divisible by '
                             f'model.num_heads={self.num_heads}.')
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f'model.num_heads={self.num_heads} must be a multiple '
                             f'of model.num_kv_heads={self.num_kv_heads}.')
        if self.dtype not in ('float32', 'bfloat16'):
            raise ValueError(f"model.dtype={self.dtype!r}: use 'float32' or 'bfloat16'.")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)


def is_attention_branch(path) -> bool:
    """True for parameters of `x + MHA(norm(x))`: MHA weights and their norm."""
    names = [getattr(k, 'key', getattr(k, 'name', k)) for k in path]
    return any(name in ATTENTION_BRANCH_MODULES for name in names)


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


class Attention(nn.Module):
    """Causal multi-head attention with optional grouped KV heads."""
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_bld):
        c, dt = self.cfg, self.cfg.compute_dtype
        d, h, k, e = c.d_model, c.num_heads, c.num_kv_heads, c.head_dim
        init = nn.initializers.normal(stddev=d ** -0.5)
        w_dhe = _param(self, 'wq', init, (d, h, e), ('embed', 'heads', 'head_dim'))
        wk_dke = _param(self, 'wk', init, (d, k, e), ('embed', 'kv_heads', 'head_dim'))
        wv_dke = _param(self, 'wv', init, (d, k, e), ('embed', 'kv_heads', 'head_dim'))
        wo_hed = _param(self, 'wo', nn.initializers.normal(stddev=(h * e) ** -0.5),
                        (h, e, d), ('heads', 'head_dim', 'embed'))
        x_bld = x_bld.astype(dt)
        q_blhe = rotary(jnp.einsum('bld,dhe->blhe', x_bld, w_dhe.astype(dt)), c.rope_theta)
        k_blke = rotary(jnp.einsum('bld,dke->blke', x_bld, wk_dke.astype(dt)), c.rope_theta)
        v_blke = jnp.einsum('bld,dke->blke', x_bld, wv_dke.astype(dt))
        b, length = x_bld.shape[:2]
        q_blkge = q_blhe.reshape(b, length, k, h // k, e)
        logits_bkglm = jnp.einsum('blkge,bmke->bkglm', q_blkge, k_blke) * e ** -0.5
        causal_lm = jnp.tril(jnp.ones((length, length), dtype=bool))
        logits_bkglm = jnp.where(causal_lm, logits_bkglm.astype(jnp.float32), -1e30)
        probs_bkglm = jax.nn.softmax(logits_bkglm, axis=-1).astype(dt)
        out_blkge = jnp.einsum('bkglm,bmke->blkge', probs_bkglm, v_blke)
        return jnp.einsum('blhe,hed->bld', out_blkge.reshape(b, length, h, e),
                          wo_hed.astype(dt))


class FFNLinear(nn.Module):
    """`x @ kernel`; in neighbour mode with the low-rank weight gradient."""
    features: int
    logical_axes: tuple
    dtype: jnp.dtype
    neighbour: bool = False

    @nn.compact
    def __call__(self, x_bln):
        n = x_bln.shape[-1]
        kernel_nm = _param(self, 'kernel', nn.initializers.normal(stddev=n ** -0.5),
                           (n, self.features), self.logical_axes)
        x_bln = x_bln.astype(self.dtype)
        if not self.neighbour:
            return x_bln @ kernel_nm.astype(self.dtype)
        v_nr = self.get_variable(PROJECTIONS, 'kernel')
        if v_nr is None:
            raise ValueError('neighbour mode needs SVD projections: pass the '
                             "'projections' collection (projections.compute_projections).")
        return lowrank_dense(x_bln, kernel_nm, v_nr)


class FeedForward(nn.Module):
    """SwiGLU: w_down(silu(w_gate x) * w_up x)."""
    cfg: ModelConfig
    neighbour: bool = False

    @nn.compact
    def __call__(self, x_bld):
        c, dt = self.cfg, self.cfg.compute_dtype

        def linear(features, axes, name):
            return FFNLinear(features, axes, dt, self.neighbour, name=name)

        gate_blf = linear(c.ffn_hidden, ('embed', 'mlp'), 'w_gate')(x_bld)
        up_blf = linear(c.ffn_hidden, ('embed', 'mlp'), 'w_up')(x_bld)
        return linear(c.d_model, ('mlp', 'embed'), 'w_down')(nn.silu(gate_blf) * up_blf)


class Block(nn.Module):
    cfg: ModelConfig
    neighbour: bool = False

    @nn.compact
    def __call__(self, x_bld):
        c = self.cfg
        attn_bld = Attention(c, name='attn')(RMSNorm(c.norm_eps, name='attn_norm')(x_bld))
        if self.neighbour:
            # Identity in backward: the cotangent takes the residual path only.
            # stop_gradient makes the branch's linearisation dead code, so XLA
            # keeps none of its activations and runs none of its backward.
            attn_bld = jax.lax.stop_gradient(attn_bld)
        x_bld = x_bld + attn_bld
        ffn_cls = FeedForward
        if self.neighbour and c.remat_ffn:
            # Keep only the FFN input; recompute its inner activations.
            ffn_cls = nn.remat(FeedForward, static_argnums=())
        ffn_in_bld = RMSNorm(c.norm_eps, name='ffn_norm')(x_bld)
        return x_bld + ffn_cls(c, self.neighbour, name='ffn')(ffn_in_bld)


class Llama(nn.Module):
    """Decoder-only LLaMA with an untied output head; returns float32 logits."""
    cfg: ModelConfig

    @nn.compact
    def __call__(self, tokens_bl, neighbour: bool = False):
        c = self.cfg
        embed_vd = _param(self, 'embedding', nn.initializers.normal(stddev=1.0),
                          (c.vocab_size, c.d_model), ('vocab', 'embed'))
        x_bld = embed_vd.astype(c.compute_dtype)[tokens_bl]
        for i in range(c.num_layers):
            x_bld = Block(c, neighbour, name=f'layers_{i}')(x_bld)
        x_bld = RMSNorm(c.norm_eps, name='final_norm')(x_bld)
        head_dv = _param(self, 'head', nn.initializers.normal(stddev=c.d_model ** -0.5),
                         (c.d_model, c.vocab_size), ('embed', 'vocab'))
        return (x_bld @ head_dv.astype(c.compute_dtype)).astype(jnp.float32)


def init_params(model: Llama, rng, seq_len: int = 8):
    """Boxed (logically partitioned) float32 parameters."""
    tokens_bl = jnp.zeros((1, seq_len), jnp.int32)
    return model.init(rng, tokens_bl)['params']
