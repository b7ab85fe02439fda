"""The neighbour's backward rules (MeCeFO): the attention branch skipped, the FFN's low-rank gradient.

`skip_in_backward` is rule 2 of docs/algorithm.md section 3: the branch
`x + MHA(norm(x))` is identity in backward; `jax.lax.stop_gradient` is its exact form,
and XLA drops the branch's linearisation, attention activations included. The branch's
parameters then get no gradient from a neighbour's rows (`combination.py` averages them
over exact rows only).

The two rules `mecefo.projection` selects (docs/algorithm.md section 3): both run an
ordinary matmul forward and keep the activation gradient exact. `lowrank_dense`
('weights', the paper's) projects the kernel gradient onto V, the kernel's top-r
input-side singular directions, held as state (`projections.py`); `sketched_dense`
('gradient', this project's) onto the range of the batch's own kernel gradient, found in
the backward itself. `model/llama.py` chooses when to use them.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def skip_in_backward(attn_bld: jax.Array, gate=None) -> jax.Array:
    """The attention branch's output, unchanged in forward, cut in backward; a `gate` g
    (mecefo.attention_top_blocks: 1 in the top blocks, 0 below) returns
    `frozen + g (attn - frozen)`: `attn` bit for bit in forward, its cotangent scaled by g."""
    frozen_bld = jax.lax.stop_gradient(attn_bld)
    if gate is None:
        return frozen_bld
    return frozen_bld + gate.astype(attn_bld.dtype) * (attn_bld - frozen_bld)


@jax.custom_vjp
def lowrank_dense(x_bn: jax.Array, kernel_nm: jax.Array, v_nr: jax.Array) -> jax.Array:
    """`x @ kernel` (in x's dtype) whose kernel gradient is low-rank.

    Flax stores `kernel = W^T` ([n_in, m_out]); with V ([n_in, r]) its top-r left singular
    vectors, the backward returns G_x = G_y kernel^T (exact), G_kernel = V ((x V)^T G_y)
    ~= x^T G_y and G_v = 0 (V is refreshed state). Only `x @ V` is saved, never x. Inside
    `shard_map`, kernel and v need x's varying axes (`jax.lax.pcast`): the kernel cotangent
    is per-shard.
    """
    return x_bn @ kernel_nm.astype(x_bn.dtype)


def _lowrank_dense_fwd(x_bn, kernel_nm, v_nr):
    y_bm = x_bn @ kernel_nm.astype(x_bn.dtype)
    xv_br = x_bn @ v_nr.astype(x_bn.dtype)
    return y_bm, (xv_br, kernel_nm, v_nr)


def _lowrank_dense_bwd(res, g_bm):
    xv_br, kernel_nm, v_nr = res
    r, m = v_nr.shape[-1], g_bm.shape[-1]
    g_x_bn = g_bm @ kernel_nm.astype(g_bm.dtype).T
    # Contract the tokens first ([r, m]) so the n x m product is formed once, by the rank-r
    # outer product; accumulate in f32, as the sum runs over every token of the batch.
    acc_dtype = jnp.promote_types(jnp.float32, g_bm.dtype)
    g_rm = jnp.matmul(xv_br.reshape(-1, r).T, g_bm.reshape(-1, m), preferred_element_type=acc_dtype)
    g_kernel_nm = (v_nr.astype(acc_dtype) @ g_rm).astype(kernel_nm.dtype)
    # zeros_like keeps v's varying-axes type, so shard_map's vma check accepts it.
    return g_x_bn, g_kernel_nm, jnp.zeros_like(v_nr)


lowrank_dense.defvjp(_lowrank_dense_fwd, _lowrank_dense_bwd)


SKETCH_SEED = 20251016  # Omega's seed: fixed, so every device and process draws the same one


def sketch_matrix(n_in: int, m_out: int, rank: int) -> jax.Array:
    """Omega ([m_out, rank], float32, Gaussian) of `sketched_dense` for an [n_in, m_out] kernel.

    A function of `SKETCH_SEED` and the shape only (threefry whatever the default PRNG), so
    the same everywhere with no RNG state in training: the range finder's bound holds for
    any Gaussian Omega independent of the matrix it sketches.
    """
    root = jax.random.key(SKETCH_SEED, impl='threefry2x32')
    key = jax.random.fold_in(jax.random.fold_in(root, n_in), m_out)
    return jax.random.normal(key, (m_out, rank), jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def sketched_dense(x_bn: jax.Array, kernel_nm: jax.Array, rank: int) -> jax.Array:
    """`x @ kernel` whose kernel gradient is projected onto the range of its own sketch.

    A W-based projection cannot keep gradient directions outside W's row space (for `w_down`
    about half the gradient lies there). G = x^T G_y has rank at most the token count and a
    fast-decaying spectrum, so a randomized range finder (Halko, Martinsson & Tropp, 2011,
    Algorithm 4.1) keeps most of it: G_kernel = Q (Q^T x^T G_y), Q = orth(x^T (G_y Omega)),
    exact when r >= rank(G), never forming G. It saves x whole, giving up the W-based rule's
    memory saving; dtypes and `shard_map` as `lowrank_dense`.
    """
    return x_bn @ kernel_nm.astype(x_bn.dtype)


def _sketched_dense_fwd(x_bn, kernel_nm, rank):
    return x_bn @ kernel_nm.astype(x_bn.dtype), (x_bn, kernel_nm)


def _sketched_dense_bwd(rank, res, g_bm):
    x_bn, kernel_nm = res
    n, m = kernel_nm.shape
    g_x_bn = g_bm @ kernel_nm.astype(g_bm.dtype).T
    acc_dtype = jnp.promote_types(jnp.float32, g_bm.dtype)
    x_tn, g_tm = x_bn.reshape(-1, n), g_bm.reshape(-1, m)

    def tokens_first(a, b):  # a^T b over the token axis, accumulated in float32
        return jnp.matmul(a.T, b, preferred_element_type=acc_dtype)
    omega_mr = sketch_matrix(n, m, rank).astype(g_tm.dtype)
    sketch_tr = jnp.matmul(g_tm, omega_mr, preferred_element_type=acc_dtype)
    y_nr = tokens_first(x_tn, sketch_tr.astype(x_tn.dtype))
    q_nr = jnp.linalg.qr(y_nr, mode='reduced')[0]
    xq_tr = jnp.matmul(x_tn, q_nr.astype(x_tn.dtype), preferred_element_type=acc_dtype)
    g_rm = tokens_first(xq_tr.astype(x_tn.dtype), g_tm)
    g_kernel_nm = (q_nr @ g_rm).astype(kernel_nm.dtype)
    return g_x_bn, g_kernel_nm


sketched_dense.defvjp(_sketched_dense_fwd, _sketched_dense_bwd)
