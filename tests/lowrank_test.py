"""Tests for mecefo_jax.neighbour.lowrank: both gradient rules, residuals, dtypes, shard_map."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mecefo_jax.neighbour.lowrank import SKETCH_SEED, lowrank_dense, sketch_matrix, sketched_dense

# Distinct sizes so a residual's shape identifies what it is.
B, T, N, M, R = 4, 6, 12, 20, 3


def _inputs(seed=0, n=N, m=M, r=R):
    kx, kk, kg = jax.random.split(jax.random.key(seed), 3)
    x_btn = jax.random.normal(kx, (B, T, n), jnp.float32)
    kernel_nm = jax.random.normal(kk, (n, m), jnp.float32) / np.sqrt(n)
    g_btm = jax.random.normal(kg, (B, T, m), jnp.float32)
    # Same construction as projections.top_singular_vectors, done independently here.
    v_nr = jnp.linalg.svd(kernel_nm, full_matrices=False)[0][:, :r]
    return x_btn, kernel_nm, v_nr, g_btm


def _exact(x, k):
    return x @ k


def test_primal_matches_dense():
    x, k, v, _ = _inputs()
    np.testing.assert_allclose(lowrank_dense(x, k, v), x @ k, rtol=1e-6, atol=1e-6)


def test_kernel_grad_is_projected_exact_grad():
    # Exact kernel grad x^T G_y comes from jax.vjp of the plain matmul; with
    # kernel = W^T, G_W ~= G_y (x^T V) V^T transposes to V V^T (x^T G_y).
    x, k, v, g = _inputs()
    _, exact_vjp = jax.vjp(_exact, x, k)
    _, g_kernel_exact = exact_vjp(g)
    expected = v @ (v.T @ g_kernel_exact)

    _, lr_vjp = jax.vjp(lowrank_dense, x, k, v)
    _, g_kernel, g_v = lr_vjp(g)
    assert g_kernel.shape == k.shape and g_kernel.dtype == k.dtype
    np.testing.assert_allclose(g_kernel, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(g_v, np.zeros_like(v))
    # Sanity: with r < n the approximation really differs from the exact grad.
    assert not np.allclose(g_kernel, g_kernel_exact, atol=1e-3)


def test_kernel_grad_matches_numpy_formula():
    # Literal paper formula in float64 numpy on the flattened tokens: G_W ~= G_y (x^T V) V^T.
    x, k, v, g = _inputs(seed=1)
    x_bn = np.asarray(x, np.float64).reshape(-1, N)
    g_bm = np.asarray(g, np.float64).reshape(-1, M)
    v64 = np.asarray(v, np.float64)
    g_w_mn = g_bm.T @ (x_bn @ v64) @ v64.T
    _, g_kernel, _ = jax.vjp(lowrank_dense, x, k, v)[1](g)
    np.testing.assert_allclose(g_kernel, g_w_mn.T, rtol=1e-5, atol=1e-5)


def test_x_grad_is_exact():
    x, k, v, g = _inputs(seed=2)
    loss_exact = lambda x: jnp.sum(_exact(x, k) * g)
    loss_lr = lambda x: jnp.sum(lowrank_dense(x, k, v) * g)
    np.testing.assert_allclose(jax.grad(loss_lr)(x), jax.grad(loss_exact)(x), rtol=1e-6, atol=1e-6)


def test_full_rank_recovers_exact_kernel_grad():
    # r = n (n <= m): V is square orthogonal, V V^T = I, so only float32
    # roundoff separates the two (tolerance 1e-5 abs/rel on O(1) entries).
    x, k, v, g = _inputs(seed=3, r=N)
    assert v.shape == (N, N)
    loss_exact = lambda k: jnp.sum(_exact(x, k) * g)
    loss_lr = lambda k: jnp.sum(lowrank_dense(x, k, v) * g)
    np.testing.assert_allclose(jax.grad(loss_lr)(k), jax.grad(loss_exact)(k), rtol=1e-5, atol=1e-5)


def test_residuals_are_projected_activations(capsys):
    x, k, v, _ = _inputs()
    # The vjp closure is a pytree whose leaves are the saved residuals.
    _, vjp_fn = jax.vjp(lowrank_dense, x, k, v)
    shapes = sorted(leaf.shape for leaf in jax.tree_util.tree_leaves(vjp_fn))
    assert shapes == sorted([(B, T, R), (N, M), (N, R)])
    assert x.shape not in shapes

    # Same check through JAX's own residual report, differentiating x and kernel only.
    print_saved_residuals(lambda x, k: lowrank_dense(x, k, v).sum(), x, k)
    report = capsys.readouterr().out
    assert f'f32[{B},{T},{R}]' in report
    assert f'f32[{B},{T},{N}]' not in report

    # Control: the plain matmul does save the full x, so the check above can fail.
    print_saved_residuals(lambda x, k: _exact(x, k).sum(), x, k)
    assert f'f32[{B},{T},{N}]' in capsys.readouterr().out


def test_mixed_precision_dtypes():
    # bf16 compute with f32 params, as a Flax Dense with dtype=bf16 would do.
    x, k, v, g = _inputs(seed=4)
    x16, g16 = x.astype(jnp.bfloat16), g.astype(jnp.bfloat16)
    y, vjp_fn = jax.vjp(lowrank_dense, x16, k, v)
    g_x, g_kernel, g_v = vjp_fn(g16)
    assert y.dtype == jnp.bfloat16
    assert g_x.dtype == jnp.bfloat16
    assert g_kernel.dtype == jnp.float32 and g_v.dtype == v.dtype
    expected = v @ (v.T @ (x.reshape(-1, N).T @ g.reshape(-1, M)))
    np.testing.assert_allclose(g_kernel, expected, rtol=5e-2, atol=5e-2)


def test_jit_and_leading_dims():
    x, k, v, g = _inputs(seed=5)
    x_bn, g_bm = x.reshape(-1, N), g.reshape(-1, M)
    grad3 = jax.jit(jax.grad(lambda k: jnp.sum(lowrank_dense(x, k, v) * g)))(k)
    grad2 = jax.grad(lambda k: jnp.sum(lowrank_dense(x_bn, k, v) * g_bm))(k)
    np.testing.assert_allclose(grad3, grad2, rtol=1e-5, atol=1e-5)


def test_inside_shard_map():
    n_dev = jax.device_count()
    assert n_dev == 8, 'conftest should provide 8 fake CPU devices'
    mesh = jax.make_mesh((n_dev,), ('data',))
    kx, kk, kg = jax.random.split(jax.random.key(6), 3)
    x = jax.random.normal(kx, (n_dev * 2, T, N))
    k = jax.random.normal(kk, (N, M)) / np.sqrt(N)
    g = jax.random.normal(kg, (n_dev * 2, T, M))
    v = jnp.linalg.svd(k, full_matrices=False)[0][:, :R]
    # jax 0.10's shard_map wants arguments already laid out as in_specs says.
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))
    x_s, k_s, v_s, g_s = put(x, P('data')), put(k, P()), put(v, P()), put(g, P('data'))

    def per_shard(x, k, v, g):
        def loss(x, k, v):
            # Replicated params are made varying so their cotangents type-check
            # against x's per-shard ones; pcast's transpose psums them back.
            k_v = jax.lax.pcast(k, 'data', to='varying')
            v_v = jax.lax.pcast(v, 'data', to='varying')
            return jnp.sum(lowrank_dense(x, k_v, v_v) * g)

        return jax.grad(loss, argnums=(0, 1, 2))(x, k, v)

    sharded = jax.jit(
        jax.shard_map(
            per_shard,
            mesh=mesh,
            in_specs=(P('data'), P(), P(), P('data')),
            out_specs=(P('data'), P(), P()),
        )
    )
    g_x, g_k, g_v = sharded(x_s, k_s, v_s, g_s)
    expected_k = v @ (v.T @ (x.reshape(-1, N).T @ g.reshape(-1, M)))
    np.testing.assert_allclose(g_k, expected_k, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(g_x, g @ k.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(g_v, np.zeros_like(v))



# ------------------------------------------------ the 'gradient' rule: sketched_dense


def _sketched_vjp(x, k, g, r=R):
    return jax.vjp(lambda x, k: sketched_dense(x, k, r), x, k)[1](g)


def test_sketched_kernel_grad_is_the_stated_projection():
    # Independently in float64 numpy, with the same Omega: Q = orth(x^T G_y Omega),
    # G_kernel = Q Q^T x^T G_y. A QR's basis is unique up to signs; Q Q^T is not.
    x, k, _, g = _inputs(seed=7)
    x_tn = np.asarray(x, np.float64).reshape(-1, N)
    g_tm = np.asarray(g, np.float64).reshape(-1, M)
    omega_mr = np.asarray(sketch_matrix(N, M, R), np.float64)
    q_nr = np.linalg.qr(x_tn.T @ (g_tm @ omega_mr))[0]
    expected = q_nr @ (q_nr.T @ (x_tn.T @ g_tm))
    g_x, g_kernel = _sketched_vjp(x, k, g)
    assert g_kernel.shape == k.shape and g_kernel.dtype == k.dtype
    np.testing.assert_allclose(g_kernel, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g_x, g @ k.T, rtol=1e-6, atol=1e-6)
    # r < rank(x^T G_y) here, so the projection really drops something.
    assert not np.allclose(g_kernel, x_tn.T @ g_tm, atol=1e-3)


def test_sketched_is_exact_when_r_covers_the_gradient_rank():
    # 1 x 2 tokens: rank(x^T G_y) <= 2 < R = 3, so the sketch spans the whole
    # gradient and the rule returns jax.grad of the plain matmul.
    x, k, _, g = _inputs(seed=8)
    x, g = x[:1, :2], g[:1, :2]
    loss_exact = lambda x, k: jnp.sum(_exact(x, k) * g)  # noqa: E731
    loss_sketch = lambda x, k: jnp.sum(sketched_dense(x, k, R) * g)  # noqa: E731
    exact = jax.grad(loss_exact, argnums=(0, 1))(x, k)
    sketched = jax.grad(loss_sketch, argnums=(0, 1))(x, k)
    np.testing.assert_allclose(sketched[1], exact[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sketched[0], exact[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(sketched_dense(x, k, R), x @ k, rtol=1e-6, atol=1e-6)


def _relative_error(approx, exact):
    return float(np.linalg.norm(approx - exact) / np.linalg.norm(exact))


def test_sketched_beats_the_weights_rule_on_a_decaying_gradient_spectrum():
    # 256 tokens whose activations have a decaying spectrum (scales 0.8^i over
    # 48 input directions, as trained FFN inputs have), random output cotangents
    # and a random kernel: the kernel's top 8 directions miss most of G
    # (measured error 0.93), the batch's own sketch keeps most of it (0.34;
    # the best rank-8 approximation's is 0.17). Bound: below half the weights rule's.
    n, m, r, t = 48, 80, 8, 256
    kx, kk, kg = jax.random.split(jax.random.key(9), 3)
    basis_nn = jnp.linalg.qr(jax.random.normal(kk, (n, n)))[0]
    x_tn = jax.random.normal(kx, (t, n)) @ (0.8 ** jnp.arange(n) * basis_nn).T
    k = jax.random.normal(jax.random.fold_in(kk, 1), (n, m)) / np.sqrt(n)
    g_tm = jax.random.normal(kg, (t, m))
    v = jnp.linalg.svd(k, full_matrices=False)[0][:, :r]
    exact = np.asarray(x_tn.T @ g_tm)
    weights = jax.vjp(lowrank_dense, x_tn, k, v)[1](g_tm)[1]
    sketched = _sketched_vjp(x_tn, k, g_tm, r)[1]
    err_w, err_s = _relative_error(weights, exact), _relative_error(sketched, exact)
    assert err_s < 0.5 * err_w, (err_s, err_w)


def test_sketched_is_deterministic_and_omega_depends_on_seed_and_shape_only():
    x, k, _, g = _inputs(seed=10)
    grad = jax.jit(lambda x, k, g: _sketched_vjp(x, k, g)[1])
    np.testing.assert_array_equal(grad(x, k, g), grad(x, k, g))
    np.testing.assert_array_equal(_sketched_vjp(x, k, g)[1], _sketched_vjp(x, k, g)[1])
    # Omega: the same under jit, after other draws, and from its stated derivation.
    omega = sketch_matrix(N, M, R)
    jax.random.normal(jax.random.key(123), (5,))
    np.testing.assert_array_equal(jax.jit(sketch_matrix, static_argnums=(0, 1, 2))(N, M, R),
                                  omega)
    root = jax.random.key(SKETCH_SEED, impl='threefry2x32')
    key = jax.random.fold_in(jax.random.fold_in(root, N), M)
    np.testing.assert_array_equal(omega, jax.random.normal(key, (M, R), jnp.float32))
    # A kernel of another shape gets another Omega.
    assert not np.array_equal(sketch_matrix(N + 1, M, R), omega)


def test_sketched_residuals_are_the_input_and_the_kernel():
    x, k, _, _ = _inputs()
    _, vjp_fn = jax.vjp(lambda x, k: sketched_dense(x, k, R), x, k)
    shapes = sorted(leaf.shape for leaf in jax.tree_util.tree_leaves(vjp_fn))
    assert shapes == sorted([(B, T, N), (N, M)])


def test_sketched_mixed_precision_dtypes():
    # bf16 compute, f32 kernel; 2 tokens < R, so the rule is exact up to bf16 rounding.
    x, k, _, g = _inputs(seed=11)
    x, g = x[:1, :2], g[:1, :2]
    y, vjp_fn = jax.vjp(lambda x, k: sketched_dense(x, k, R), x.astype(jnp.bfloat16), k)
    g_x, g_kernel = vjp_fn(g.astype(jnp.bfloat16))
    assert (y.dtype, g_x.dtype, g_kernel.dtype) == (jnp.bfloat16, jnp.bfloat16, jnp.float32)
    expected = x.reshape(-1, N).T @ g.reshape(-1, M)
    np.testing.assert_allclose(g_kernel, expected, rtol=5e-2, atol=5e-2)


def test_sketched_inside_shard_map():
    mesh = jax.make_mesh((jax.device_count(),), ('data',))
    n_dev = jax.device_count()
    kx, kk, kg = jax.random.split(jax.random.key(12), 3)
    x = jax.random.normal(kx, (n_dev * 2, T, N))
    k = jax.random.normal(kk, (N, M)) / np.sqrt(N)
    g = jax.random.normal(kg, (n_dev * 2, T, M))
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731

    def per_shard(x, k, g):
        def loss(x, k):
            return jnp.sum(sketched_dense(x, jax.lax.pcast(k, 'data', to='varying'), R) * g)
        return jax.grad(loss, argnums=(0, 1))(x, k)

    sharded = jax.jit(jax.shard_map(per_shard, mesh=mesh, in_specs=(P('data'), P(), P('data')),
                                    out_specs=(P('data'), P())))
    g_x, g_k = sharded(put(x, P('data')), put(k, P()), put(g, P('data')))
    # Each shard projects its own gradient; pcast's transpose sums them.
    expected = sum(_sketched_vjp(x[i:i + 2], k, g[i:i + 2])[1] for i in range(0, 2 * n_dev, 2))
    np.testing.assert_allclose(g_k, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(g_x, g @ k.T, rtol=1e-5, atol=1e-5)


if __name__ == '__main__':
    raise SystemExit(pytest.main([__file__]))
