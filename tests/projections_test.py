"""Tests for mecefo_jax.neighbour.projections: rank resolution, V selection/quality, refresh schedule."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mecefo_jax.neighbour.contract import FFN_KERNELS
from mecefo_jax.neighbour.projections import (
    compute_projections,
    needs_refresh,
    resolve_rank,
    top_singular_vectors,
)

D, F = 8, 24  # d_model, d_ff


def _params(seed=0, n_layers=2):
    keys = iter(jax.random.split(jax.random.key(seed), 16 * n_layers))
    rnd = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    params = {'embed': {'embedding': rnd(32, D)}, 'final_norm': {'scale': jnp.ones((D,))}}
    for i in range(n_layers):
        params[f'layers_{i}'] = {
            'attn': {name: {'kernel': rnd(D, D)} for name in ('w_q', 'w_k', 'w_v', 'w_o')},
            'norm': {'scale': jnp.ones((D,))},
            'ffn': {
                'w_gate': {'kernel': rnd(D, F)},
                'w_up': {'kernel': rnd(D, F), 'bias': rnd(F)},  # bias is not a kernel
                'w_down': {'kernel': rnd(F, D)},
            },
        }
    return params


# ---------------------------------------------------------------- resolve_rank


@pytest.mark.parametrize(
    'rank, n, m, expected',
    [
        (1, 8, 24, 1),
        (8, 8, 24, 8),  # absolute, = min dim
        (4, 24, 8, 4),
        (np.int64(3), 8, 24, 3),
        (1.0, 8, 24, 8),  # full fraction
        (0.5, 8, 24, 4),
        (0.25, 24, 8, 2),
        (0.3, 8, 24, 2),  # 2.4 rounds to 2
        (0.3125, 8, 24, 3),  # 2.5 rounds half-up to 3
        (0.01, 8, 24, 1),  # tiny fraction clamps to 1
        (8.0, 8, 24, 8),  # ConfigDict float-locks ints: whole floats > 1 are absolute
        (3.0, 24, 8, 3),
    ],
)
def test_resolve_rank_ok(rank, n, m, expected):
    assert resolve_rank(rank, n, m) == expected


@pytest.mark.parametrize(
    'rank', [0, -1, 9, 9.0, 0.0, -0.5, 1.5, float('nan'), True, False, '4', None, [4]]
)
def test_resolve_rank_errors_name_field_and_range(rank):
    with pytest.raises(ValueError) as err:
        resolve_rank(rank, 8, 24, field='mecefo.rank')
    msg = str(err.value)
    assert 'mecefo.rank' in msg
    assert '[1, 8]' in msg and '(0, 1]' in msg


def test_resolve_rank_custom_field():
    with pytest.raises(ValueError, match='cfg.ffn_rank'):
        resolve_rank(100, 8, 24, field='cfg.ffn_rank')


# ---------------------------------------------------------------- SVD / projections


def test_compute_projections_picks_exactly_ffn_kernels():
    params = _params()
    proj = compute_projections(params, 3)
    paths = {
        tuple(p.key for p in path) for path, _ in jax.tree_util.tree_flatten_with_path(proj)[0]
    }
    expected = {
        (f'layers_{i}', 'ffn', name, 'kernel') for i in range(2) for name in FFN_KERNELS
    }
    assert paths == expected
    assert proj['layers_0']['ffn']['w_gate']['kernel'].shape == (D, 3)
    assert proj['layers_1']['ffn']['w_down']['kernel'].shape == (F, 3)


def test_projections_orthonormal_and_span_top_singular_directions():
    params = _params(seed=1)
    r = 3
    proj = jax.jit(compute_projections, static_argnums=1)(params, r)
    for i in range(2):
        for name in FFN_KERNELS:
            kernel = np.asarray(params[f'layers_{i}']['ffn'][name]['kernel'], np.float64)
            v_f32 = proj[f'layers_{i}']['ffn'][name]['kernel']
            assert v_f32.dtype == jnp.float32 and v_f32.shape == (kernel.shape[0], r)
            v = np.asarray(v_f32, np.float64)
            np.testing.assert_allclose(v.T @ v, np.eye(r), atol=1e-5)
            # Compare subspaces via projectors (singular vectors are only defined up to sign).
            u_ref = np.linalg.svd(kernel, full_matrices=False)[0][:, :r]
            np.testing.assert_allclose(v @ v.T, u_ref @ u_ref.T, atol=1e-4)
            # V captures the top-r singular values of kernel^T acting on V.
            s_ref = np.linalg.svd(kernel, compute_uv=False)[:r]
            np.testing.assert_allclose(
                np.linalg.svd(kernel.T @ v, compute_uv=False), s_ref, rtol=1e-4
            )


def test_fractional_rank_and_bf16_kernel():
    kernel_nm = jax.random.normal(jax.random.key(2), (D, F)).astype(jnp.bfloat16)
    params = {'ffn': {'w_up': {'kernel': kernel_nm}}}
    proj = compute_projections(params, 0.5)
    v = proj['ffn']['w_up']['kernel']
    assert v.shape == (D, D // 2) and v.dtype == jnp.float32  # SVD done in f32


def test_top_singular_vectors_batched_for_scanned_layers():
    kernels_lnm = jax.random.normal(jax.random.key(3), (3, D, F))
    v_lnr = top_singular_vectors(kernels_lnm, 2)
    assert v_lnr.shape == (3, D, 2)
    for l in range(3):
        np.testing.assert_allclose(v_lnr[l], top_singular_vectors(kernels_lnm[l], 2), atol=1e-5)


def test_compute_projections_errors():
    with pytest.raises(ValueError, match='no leaf'):
        compute_projections({'attn': {'w_q': {'kernel': jnp.ones((D, D))}}}, 2)
    with pytest.raises(ValueError, match='mecefo.rank'):
        compute_projections(_params(), D + 1)  # D is the min dim of every FFN kernel


# ---------------------------------------------------------------- refresh schedule


@pytest.mark.parametrize(
    'step, onset, active, expected',
    [
        (0, False, False, False),
        (4, False, False, False),  # multiple of tau but nobody uses V
        (3, False, False, False),
        (0, True, True, True),
        (3, True, True, True),  # onset off the tau grid still refreshes
        (4, True, True, True),
        (4, False, True, True),  # on the tau grid while active
        (8, False, True, True),
        (3, False, True, False),  # active, off the grid
        (5, False, True, False),
    ],
)
def test_needs_refresh_truth_table(step, onset, active, expected):
    assert needs_refresh(step, tau=4, failure_onset=onset, neighbour_active=active) is expected


def refresh_steps(active, *, tau, onset_steps=None, start_step=0):
    """The steps at which V is recomputed over a schedule of neighbour-active flags.

    Onsets default to the rising edges of `active`; a new failure while another
    device is already in neighbour mode needs `onset_steps`.
    """
    steps = range(start_step, start_step + len(active))
    if onset_steps is None:
        onset_steps = {s for i, s in enumerate(steps) if active[i] and (i == 0 or not active[i - 1])}
    return [s for s, a in zip(steps, active)
            if needs_refresh(s, tau=tau, failure_onset=s in onset_steps, neighbour_active=bool(a))]


def test_refresh_steps_schedule():
    #        step: 0  1  2  3  4  5  6  7  8  9 10 11 12
    active = [0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1]
    # Onsets at 2 and 10; tau grid hits at 4 (active), 8 (inactive: skipped), 12.
    assert refresh_steps(active, tau=4) == [2, 4, 10, 12]
    # A second failure starting at 5 while already in neighbour mode.
    assert refresh_steps(active, tau=4, onset_steps={2, 5, 10}) == [2, 4, 5, 10, 12]
    assert refresh_steps([1, 1, 1], tau=4, start_step=7) == [7, 8]


_REFRESH_ON_TWO_DEVICES = """
import os
os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=2'
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from mecefo_jax.neighbour.projections import subspace_iteration
replicated = NamedSharding(Mesh(np.array(jax.devices()), ('d',)), P())
rng = np.random.default_rng(0)
kernels = jax.device_put(rng.standard_normal((4, 512, 1376)).astype(np.float32), replicated)
v = jax.device_put(rng.standard_normal((4, 512, 32)).astype(np.float32), replicated)
refresh = jax.jit(lambda k, v: subspace_iteration(k, 32, v, iterations=2),
                  out_shardings=replicated)
for _ in range(20):
    v = refresh(kernels, v).block_until_ready()
print('done')
"""


@pytest.mark.subprocess
def test_a_layered_refresh_on_two_cpu_devices_finishes():
    """Batched LAPACK QRs after large matmuls hung every time on 2 CPU devices (jax 0.10.2)."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, '-c', _REFRESH_ON_TWO_DEVICES], cwd=root,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.split()[-1] == 'done', run.stderr[-2000:]


def test_the_contract_names_what_a_model_lacks():
    """The names the neighbour's rules read: the LLaMA has them all; a model whose FFN
    kernels or attention are named otherwise is refused, naming what is missing."""
    from mecefo_jax.neighbour import contract
    kernel = {'kernel': jnp.zeros((4, 6))}
    llama_like = {'layers': {'attn': {'wq': jnp.zeros((4, 2))}, 'attn_norm': {'scale': jnp.ones(4)},
                             'ffn': {'w_gate': kernel, 'w_up': kernel, 'w_down': kernel}}}
    contract.check(llama_like)
    renamed = {'layers': {'mha': {'wq': jnp.zeros((4, 2))}, 'mlp': {'fc1': kernel, 'fc2': kernel}}}
    with pytest.raises(ValueError, match=r"attention under \('attn', 'attn_norm'\); FFN kernels "
                                         r"'ffn/<w_gate\|w_up\|w_down>/kernel'.*Adding a model"):
        contract.check(renamed)
