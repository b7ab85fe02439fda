"""Tests for the cheap refresh of V: subspace iteration, its config and its sharded program.

References are computed another way: numpy's float64 SVD gives the exact
top-r subspace and singular values; principal angles come from the singular
values of V_ref^T V.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from mecefo_jax.neighbour.projections import (
    compute_projections,
    subspace_iteration,
)
from mecefo_jax.parallel import step as refresh_lib
from mecefo_jax.parallel.state import TrainState

N, M, R = 48, 96, 4
GAP = 0.1  # sigma_{r+1} / sigma_r of the planted spectra
# Jitted once per shape: op-by-op dispatch of the QRs costs seconds.
_subspace = jax.jit(subspace_iteration, static_argnums=1, static_argnames='iterations')


def _planted(seed, n=N, m=M, r=R, gap=GAP):
    """[n, m] with singular values 10..5 on the top r, then <= 10 * gap / 2 (ratio <= gap)."""
    rng = np.random.default_rng(seed)
    k = min(n, m)
    u = np.linalg.qr(rng.standard_normal((n, k)))[0]
    w = np.linalg.qr(rng.standard_normal((m, k)))[0]
    top = np.linspace(10.0, 5.0, r)
    rest = np.linspace(5.0 * gap, 0.01, k - r)
    return (u * np.concatenate([top, rest])) @ w.T


def _exact(kernel, r=R):
    u, s, _ = np.linalg.svd(np.asarray(kernel, np.float64), full_matrices=False)
    return u[:, :r], s


def _cosines(v_ref, v):
    """Cosines of the principal angles between span(v_ref) and span(v)."""
    return np.linalg.svd(np.asarray(v_ref, np.float64).T @ np.asarray(v, np.float64),
                         compute_uv=False)


def _tan_max(v_ref, v):
    """tan of the largest principal angle; the sine from the residual off span(v_ref),
    as sqrt(1 - cos^2) would turn a 1e-7 orthonormality error of float32 into 4e-4."""
    v_ref, v = np.asarray(v_ref, np.float64), np.asarray(v, np.float64)
    v = np.linalg.qr(v)[0]
    sin = np.linalg.norm(v - v_ref @ (v_ref.T @ v), 2)
    return sin / max(_cosines(v_ref, v).min(), 1e-300)


def _energy_ratio(kernel, v, r=R):
    """||kernel^T V||_F^2 over the exact top-r energy, the latter from numpy's singular values."""
    k = np.asarray(kernel, np.float64)
    s = np.linalg.svd(k, compute_uv=False)
    return np.sum((k.T @ np.asarray(v, np.float64)) ** 2) / np.sum(s[:r] ** 2)


def test_cold_start_recovers_the_top_subspace_within_the_power_iteration_bound():
    kernel = _planted(0)
    v_ref, _ = _exact(kernel)
    key = jax.random.key(1)
    start = np.asarray(jax.random.normal(key, (N, R)), np.float64)
    iters = 3
    v = np.asarray(_subspace(jnp.asarray(kernel, jnp.float32), R, None,
                                      iterations=iters, key=key), np.float64)
    np.testing.assert_allclose(v.T @ v, np.eye(R), atol=1e-5)
    # Each iteration applies kernel kernel^T, so tan(theta_max) shrinks by at least
    # (sigma_{r+1} / sigma_r)^2 (Halko et al. 2011, thm 9.1; Saad): a bound from the
    # start's own angle, plus 1e-5 of float32 room (measured floor: 2e-7 from the 4th
    # iteration on).
    bound = GAP ** (2 * iters) * _tan_max(v_ref, start) + 1e-5
    assert _tan_max(v_ref, v) <= bound, (_tan_max(v_ref, v), bound)
    assert _tan_max(v_ref, start) > 0.5  # the start was far: the test is not vacuous
    assert _energy_ratio(kernel, v) >= 1 - 1e-6


def test_warm_start_tracks_a_perturbed_matrix_in_one_or_two_iterations():
    kernel0 = _planted(2)
    rng = np.random.default_rng(3)
    kernel1 = kernel0 + 0.3 * rng.standard_normal(kernel0.shape) / np.sqrt(N)
    v0, _ = _exact(kernel0)
    v1, _ = _exact(kernel1)
    stale = _energy_ratio(kernel1, v0)
    assert stale < 0.999  # the old V is measurably off the new subspace
    for iters in (1, 2):
        v = _subspace(jnp.asarray(kernel1, jnp.float32), R,
                               jnp.asarray(v0, jnp.float32), iterations=iters)
        ratio = _energy_ratio(kernel1, v)
        assert ratio >= 0.999, (iters, ratio, stale)
        # Same subspace as the exact SVD to a few 1e-3 (gap^2 = 1e-2 per iteration
        # from a start already within ~1e-1).
        assert _tan_max(v1, v) <= 0.1 * GAP ** (2 * iters - 1) + 1e-4


def test_energy_ratio_matches_the_singular_value_sum_for_the_exact_basis():
    kernel = _planted(4)
    v_ref, s = _exact(kernel)
    k = np.asarray(kernel)
    assert np.sum((k.T @ v_ref) ** 2) == pytest.approx(np.sum(s[:R] ** 2), rel=1e-12)
    assert _energy_ratio(kernel, v_ref) == pytest.approx(1.0, abs=1e-12)


def test_batched_leading_dims_match_one_matrix_at_a_time():
    kernels = np.stack([_planted(5), _planted(6)]).astype(np.float32)
    starts = jax.random.normal(jax.random.key(7), (2, N, R))
    v = _subspace(jnp.asarray(kernels), R, starts, iterations=2)
    assert v.shape == (2, N, R)
    for i in range(2):
        one = _subspace(jnp.asarray(kernels[i]), R, starts[i], iterations=2)
        np.testing.assert_allclose(v[i] @ v[i].T, one @ one.T, atol=1e-5)


def test_subspace_iteration_input_errors():
    kernel = jnp.ones((N, M))
    with pytest.raises(ValueError, match='PRNG key'):
        subspace_iteration(kernel, R, None, iterations=1)
    with pytest.raises(ValueError, match='init_v has shape'):
        subspace_iteration(kernel, R, jnp.ones((M, R)), iterations=1)
    with pytest.raises(ValueError, match='iterations'):
        subspace_iteration(kernel, R, jnp.ones((N, R)), iterations=0)


def _ffn_params(kernels):
    return {'layers': {'ffn': {name: {'kernel': jnp.asarray(k, jnp.float32)}
                               for name, k in kernels.items()}},
            'embed': {'embedding': jnp.ones((8, N))}}


def test_refresh_fn_runs_the_configured_method_on_the_state():
    """make_refresh_fn: 'svd' is compute_projections; 'subspace' warm-starts from state V."""
    before = _ffn_params({'w_gate': _planted(8), 'w_down': _planted(9, n=M, m=N)})
    rng = np.random.default_rng(10)
    after = jax.tree.map(lambda x: x + 0.05 * jnp.asarray(rng.standard_normal(x.shape),
                                                        jnp.float32), before)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=after, opt_state={},
                       projections=compute_projections(before, R))
    device = NamedSharding(Mesh(np.array(jax.devices()[:1]), ('x',)), P())
    shardings = jax.tree.map(lambda _: device, state)
    exact = compute_projections(after, R)
    for method in ('svd', 'subspace'):
        fn = refresh_lib.make_refresh_fn(R, shardings, method=method, iterations=2)
        got = fn(jax.tree.map(jnp.copy, state)).projections  # the refresh donates its input
        for path, v in jax.tree_util.tree_leaves_with_path(got):
            ref = exact
            for entry in path:
                ref = ref[entry.key]
            assert _tan_max(ref, v) <= 1e-3, (method, path)


def _collective_sizes(hlo: str, ops=('all-gather', 'all-to-all', 'collective-permute')):
    """Element counts of the results of data-moving collectives in HLO text."""
    sizes = []
    pattern = r'= \(?((?:f32|bf16)\[[\d,]*\][^=]*?) (%s)(?:-start)?\(' % '|'.join(ops)
    for shapes, _ in re.findall(pattern, hlo):
        for dims in re.findall(r'\[([\d,]*)\]', shapes):
            sizes.append(int(np.prod([int(d) for d in dims.split(',') if d])))
    return sizes


def test_sharded_refresh_matches_one_device_and_never_gathers_a_kernel():
    """mesh.model=2 on the 8 fake devices: kernels split on their hidden axis, as the model does."""
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('data', 'model'))
    layers = 2
    gate = np.stack([_planted(11 + i) for i in range(layers)]).astype(np.float32)  # [L, d, h]
    down = np.stack([_planted(13 + i, n=M, m=N) for i in range(layers)]).astype(np.float32)
    starts = {'gate': np.asarray(jax.random.normal(jax.random.key(0), (layers, N, R))),
              'down': np.asarray(jax.random.normal(jax.random.key(1), (layers, M, R)))}
    specs = {'gate': (P(None, None, 'model'), P(None, None, None)),  # V: like the kernel's input axis
             'down': (P(None, 'model', None), P(None, 'model', None))}

    def refresh(kernel, v):
        return subspace_iteration(kernel, R, v, iterations=2)

    for name, kernel in (('gate', gate), ('down', down)):
        k_spec, v_spec = (NamedSharding(mesh, s) for s in specs[name])
        sharded = jax.jit(refresh, in_shardings=(k_spec, v_spec), out_shardings=v_spec)
        compiled = sharded.lower(jax.device_put(kernel, k_spec),
                                 jax.device_put(starts[name], v_spec)).compile()
        got = compiled(jax.device_put(kernel, k_spec), jax.device_put(starts[name], v_spec))
        one = jax.jit(refresh)(jax.device_put(kernel, jax.devices()[0]),
                               jax.device_put(starts[name], jax.devices()[0]))
        for i in range(layers):
            assert _tan_max(np.asarray(one[i]), np.asarray(got[i])) <= 1e-4, name
        hlo = compiled.as_text()
        matrix = kernel.shape[-2] * kernel.shape[-1]
        sizes = _collective_sizes(hlo)
        assert all(s < matrix // 2 for s in sizes), (name, sizes)
        # The products run on the local half of the kernel.
        local = [layers, N, M // 2] if name == 'gate' else [layers, M // 2, N]
        assert re.search(r'f32\[%s\]' % ','.join(map(str, local)), hlo), name


def test_collective_check_sees_a_gathered_kernel():
    """Positive control for the HLO check above: replicating the kernel shows up."""
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('data', 'model'))
    k_spec = NamedSharding(mesh, P(None, 'model'))
    full = NamedSharding(mesh, P())
    fn = jax.jit(lambda k: jax.lax.with_sharding_constraint(k, full) * 2.0,
                 in_shardings=(k_spec,), out_shardings=full)
    hlo = fn.lower(jax.ShapeDtypeStruct((N, M), jnp.float32, sharding=k_spec)).compile().as_text()
    assert max(_collective_sizes(hlo)) >= N * M


def test_a_bad_refresh_is_refused_when_the_config_is_resolved(tmp_path):
    from configs import tiny
    from mecefo_jax.config.defaults import ConfigError
    from mecefo_jax.config.resolve import resolve
    cfg = tiny.get_config()
    cfg.mecefo.refresh = 'qr'
    with pytest.raises(ConfigError, match=r"mecefo\.refresh='qr'.*--config\.mecefo\.refresh"):
        resolve(cfg)
    cfg.mecefo.refresh, cfg.mecefo.refresh_iters = 'subspace', 0
    with pytest.raises(ConfigError, match=r'mecefo\.refresh_iters=0'):
        resolve(cfg)
    cfg.mecefo.refresh_iters, cfg.mecefo.refresh_split_min_elements = 3, -1
    with pytest.raises(ConfigError, match=r'mecefo\.refresh_split_min_elements=-1.*>= 0'):
        resolve(cfg)
