"""Chunked, fused next-token cross-entropy: the loss never builds [tokens, V] logits whole.

Shape letters: N tokens (batch x sequence, flattened), C tokens per chunk,
K chunks, D d_model, V vocab.

A plain loss on full logits keeps a float32 [N, V] tensor live through the backward (at
32k vocab and 4k tokens, 512 MiB). Here the forward computes, chunk by chunk, the loss and
its gradients for `x` and `head`, so the backward only scales them by the cotangent: no
recomputation, no saved logits. Matmuls take `x`'s dtype with float32 accumulation;
softmax, the loss and the head-gradient accumulator are float32.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax


def chunked_cross_entropy(x_nd, head_dv, targets_n, weights_n, *, chunk_tokens: int,
                          unroll: bool = False):
    """Sum over tokens of `weights * CE(x @ head, targets)`, float32; `chunk_tokens <= 0` (or >= N)
    is one chunk. `unroll` makes the chunk loop straight-line code (same arithmetic), so XLA's
    cost analysis, which counts a loop body once, sees every chunk."""
    n = x_nd.shape[0]
    chunk = n if chunk_tokens <= 0 or chunk_tokens >= n else int(chunk_tokens)
    return _fused_xent(x_nd, head_dv, targets_n, weights_n.astype(jnp.float32), chunk, unroll)


def _chunks(x_nd, targets_n, weights_n, chunk):
    """[K, C, ...] views, zero-weight padding at the end when C does not divide N."""
    pad = -x_nd.shape[0] % chunk
    if pad:
        x_nd = jnp.pad(x_nd, ((0, pad), (0, 0)))
        targets_n = jnp.pad(targets_n, (0, pad))
        weights_n = jnp.pad(weights_n, (0, pad))
    k = x_nd.shape[0] // chunk
    return (x_nd.reshape(k, chunk, -1), targets_n.reshape(k, chunk),
            weights_n.reshape(k, chunk), pad)


def _loss_and_grads(x_nd, head_dv, targets_n, weights_n, chunk, unroll):
    """Loss sum, dloss/dx [N, D] (x's dtype) and dloss/dhead [D, V] (float32)."""
    x_kcd, t_kc, w_kc, pad = _chunks(x_nd, targets_n, weights_n, chunk)
    head = head_dv.astype(x_nd.dtype)

    def one_chunk(dhead_dv, xs):
        x_cd, t_c, w_c = xs
        logits_cv = jnp.matmul(x_cd, head, preferred_element_type=jnp.float32)
        lse_c = jax.nn.logsumexp(logits_cv, axis=-1)
        target_logit_c = jnp.take_along_axis(logits_cv, t_c[:, None], axis=-1)[:, 0]
        loss = jnp.sum((lse_c - target_logit_c) * w_c)
        # d CE / d logits = softmax - one_hot, per token times its weight.
        dlogits_cv = jnp.exp(logits_cv - lse_c[:, None])
        dlogits_cv = dlogits_cv.at[jnp.arange(t_c.shape[0]), t_c].add(-1.0) * w_c[:, None]
        dlogits_cv = dlogits_cv.astype(x_cd.dtype)
        dx_cd = jnp.matmul(dlogits_cv, head.T, preferred_element_type=jnp.float32)
        dhead_dv = dhead_dv + jnp.matmul(x_cd.T, dlogits_cv, preferred_element_type=jnp.float32)
        return dhead_dv, (loss, dx_cd.astype(x_cd.dtype))

    # zeros_like keeps the varying-axes type of the inputs inside shard_map.
    dhead0 = jnp.zeros_like(head_dv, dtype=jnp.float32)
    dhead_dv, (loss_k, dx_kcd) = lax.scan(one_chunk, dhead0, (x_kcd, t_kc, w_kc),
                                         unroll=bool(unroll))
    dx_nd = dx_kcd.reshape(-1, x_nd.shape[-1])
    if pad:
        dx_nd = dx_nd[:x_nd.shape[0]]
    return jnp.sum(loss_k), dx_nd, dhead_dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _fused_xent(x_nd, head_dv, targets_n, weights_n, chunk, unroll):
    return _loss_and_grads(x_nd, head_dv, targets_n, weights_n, chunk, unroll)[0]


def _fused_xent_fwd(x_nd, head_dv, targets_n, weights_n, chunk, unroll):
    loss, dx_nd, dhead_dv = _loss_and_grads(x_nd, head_dv, targets_n, weights_n, chunk, unroll)
    return loss, (dx_nd, dhead_dv.astype(head_dv.dtype), targets_n, weights_n)


def _fused_xent_bwd(chunk, unroll, residuals, g):
    """Scale the gradients computed in the forward pass by the loss cotangent."""
    del chunk, unroll
    dx_nd, dhead_dv, targets_n, weights_n = residuals
    # Token weights mark padding and role membership; they are data, not trained.
    return ((g * dx_nd).astype(dx_nd.dtype), (g * dhead_dv).astype(dhead_dv.dtype),
            _integer_cotangent(targets_n), jnp.zeros_like(weights_n))


def _integer_cotangent(x):
    return jnp.zeros(x.shape, jax.dtypes.float0)


_fused_xent.defvjp(_fused_xent_fwd, _fused_xent_bwd)
