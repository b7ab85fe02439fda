"""Low-rank backward pass for an FFN dense layer (MeCeFO neighbour mode).

This module owns `lowrank_dense`: the forward is an ordinary dense matmul,
the backward keeps the activation gradient exact but replaces the kernel
gradient by its projection onto the top-r input-side singular directions of
the kernel. Choosing *when* to use it and computing V lives elsewhere
(`mecefo_jax.projections`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.custom_vjp
def lowrank_dense(x_bn: jax.Array, kernel_nm: jax.Array, v_nr: jax.Array) -> jax.Array:
    """`x @ kernel` whose kernel gradient is low-rank (MeCeFO neighbour mode).

    Flax stores `kernel = W^T` ([n_in, m_out]) and computes `y = x @ kernel`.
    With V ([n_in, r]) the top-r left singular vectors of the kernel (= top-r
    right singular vectors of W), the backward pass returns:

      * G_x      = G_y @ kernel^T                (exact)
      * G_kernel = V ((x V)^T G_y)  ~= x^T G_y   (low rank; i.e. G_W ~= G_y (x^T V) V^T),
                   summed over all leading dims of x, in the kernel's dtype
      * G_v      = 0                             (V is refreshed state, not trained)

    Residuals saved for the backward pass: only the projected activations
    `x @ V` ([..., r]) plus `kernel` and `V` (parameters/state that are alive
    anyway). The full activation x ([..., n_in]) is never saved, which is
    where the memory saving comes from; the FLOP saving is
    2brn + 2brm + 2rmn instead of 2bmn for the kernel gradient.

    Like a Flax Dense with a compute dtype, the output is in x's dtype (the
    kernel is cast to x.dtype). Inside `shard_map`, kernel and v must have the
    same varying axes as x (e.g. `jax.lax.pcast(kernel, 'data', to='varying')`)
    because the kernel cotangent is per-shard; the caller reduces it.
    """
    return x_bn @ kernel_nm.astype(x_bn.dtype)


def _lowrank_dense_fwd(x_bn, kernel_nm, v_nr):
    y_bm = x_bn @ kernel_nm.astype(x_bn.dtype)
    # Save x V ([..., r]) instead of x ([..., n]): this is the activation-memory saving.
    xv_br = x_bn @ v_nr.astype(x_bn.dtype)
    return y_bm, (xv_br, kernel_nm, v_nr)


def _lowrank_dense_bwd(res, g_bm):
    xv_br, kernel_nm, v_nr = res
    r, m = v_nr.shape[-1], g_bm.shape[-1]
    g_x_bn = g_bm @ kernel_nm.astype(g_bm.dtype).T
    # Contract the token dims first ([r, m]) so the n x m product is only formed
    # once, by the cheap rank-r outer product; accumulate in f32 because the sum
    # runs over every token of the batch.
    acc_dtype = jnp.promote_types(jnp.float32, g_bm.dtype)
    g_rm = jnp.matmul(
        xv_br.reshape(-1, r).T, g_bm.reshape(-1, m), preferred_element_type=acc_dtype
    )
    g_kernel_nm = (v_nr.astype(acc_dtype) @ g_rm).astype(kernel_nm.dtype)
    # zeros_like keeps v's varying-axes type, so shard_map's vma check accepts it.
    return g_x_bn, g_kernel_nm, jnp.zeros_like(v_nr)


lowrank_dense.defvjp(_lowrank_dense_fwd, _lowrank_dense_bwd)
