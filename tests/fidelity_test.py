"""The gradient-fidelity measures and runs (studies/fidelity.py, studies/fidelity_runs.py).

The projection's error formula e(r) = ||(I - V_r V_r^T) G|| / ||G|| is checked
against an independent computation (`jax.grad` through `lowrank.lowrank_dense`,
the neighbour's kernel gradient, against `jax.grad` of the exact product), then
on cases whose answer is known in closed form; each mode of scripts/fidelity.py
runs at tiny settings and its figures obey what holds by construction.
"""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.tiny import get_config
from mecefo_jax.config.resolve import resolve
from mecefo_jax.faults.costs import ModelShape
from mecefo_jax.neighbour import projections as proj_lib
from mecefo_jax.neighbour.lowrank import lowrank_dense
from studies import fidelity as fid
from studies import fidelity_runs as runs
from studies.refresh_bench import energy


def _orthonormal(rng, n, k):
    return np.linalg.qr(rng.standard_normal((n, k)))[0]


@pytest.mark.parametrize('n, m', [(12, 7), (7, 12)])  # w_down-like (n_in > m_out) and w_gate-like
def test_the_error_is_the_lowrank_custom_vjps_error(n, m):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((20, n)), jnp.float32)
    g = jnp.asarray(rng.standard_normal((20, m)), jnp.float32)
    kernel = jnp.asarray(rng.standard_normal((n, m)), jnp.float32)
    exact = jax.grad(lambda k: jnp.sum(g * (x @ k)))(kernel)
    curves = fid.kernel_curves(kernel, exact)
    for r in (1, 3, min(n, m)):
        v = proj_lib.top_singular_vectors(kernel, r)
        approx = jax.grad(lambda k, v=v: jnp.sum(g * lowrank_dense(x, k, v)))(kernel)
        a, e = np.asarray(approx, np.float64), np.asarray(exact, np.float64)
        want = np.linalg.norm(a - e) / np.linalg.norm(e)
        # At full rank a w_gate-like kernel keeps everything; otherwise a visible share is lost.
        assert want < 1e-5 if r == n <= m else 0.05 < want < 1.0
        assert fid.gradient_error(exact, v) == pytest.approx(want, rel=1e-4, abs=1e-5)
        assert curves.error_at(r) == pytest.approx(want, rel=1e-3, abs=1e-3)
        assert curves.energy_at(r) == pytest.approx(
            energy(kernel, v) / float(np.sum(np.square(kernel, dtype=np.float64))), rel=1e-5)


def test_full_rank_keeps_all_the_energy_and_all_the_gradient():
    rng = np.random.default_rng(1)
    kernel = rng.standard_normal((9, 15))  # n_in <= m_out: V spans every input direction
    grad = rng.standard_normal((9, 15))
    curves = fid.kernel_curves(kernel, grad, v_nk=np.linalg.svd(kernel)[0])
    assert curves.energy_at(9) == pytest.approx(1.0, abs=1e-12)
    assert curves.error_at(9) == pytest.approx(0.0, abs=1e-6)
    assert curves.rank_for(1e-3) == 9
    assert np.all(np.diff(curves.errors()) <= 1e-12)  # more rank never hurts


def test_inputs_inside_the_top_subspace_lose_nothing_and_a_flat_spectrum_keeps_r_over_n():
    rng = np.random.default_rng(2)
    n, m, r = 16, 24, 5
    u, w = _orthonormal(rng, n, n), _orthonormal(rng, m, n)
    kernel = u @ np.diag(np.linspace(3.0, 1.0, n)) @ w.T  # distinct singular values, V = u
    x = rng.standard_normal((40, r)) @ u[:, :r].T  # every token inside the top-r subspace
    grad = x.T @ rng.standard_normal((40, m))
    curves = fid.kernel_curves(kernel, grad, v_nk=np.linalg.svd(kernel)[0])
    assert curves.error_at(r) == pytest.approx(0.0, abs=1e-6)
    assert curves.error_at(r - 1) > 0.1
    flat = fid.kernel_curves(u @ w.T, grad, v_nk=u)  # every singular value 1
    assert [flat.energy_at(k) for k in (1, 5, 16)] == pytest.approx([1 / 16, 5 / 16, 1.0])


def test_gradient_outside_the_row_space_is_an_error_floor():
    rng = np.random.default_rng(3)
    n, m, q = 20, 8, 0.3  # w_down-like: n_in > m_out, so n - m input directions are never kept
    basis = _orthonormal(rng, n, n)
    kernel = basis[:, :m] @ np.diag(np.linspace(2.0, 1.0, m)) @ _orthonormal(rng, m, m).T
    inside, outside = rng.standard_normal((m, 6)), rng.standard_normal((n - m, 6))
    inside *= np.sqrt((1 - q) / np.sum(inside ** 2))
    outside *= np.sqrt(q / np.sum(outside ** 2))
    grad = basis[:, :m] @ inside + basis[:, m:] @ outside
    curves = fid.kernel_curves(kernel, grad, v_nk=np.linalg.svd(kernel, full_matrices=False)[0])
    assert curves.k == m and curves.error_at(m) == pytest.approx(np.sqrt(q), rel=1e-9)
    assert curves.rank_for(0.5) is None  # sqrt(0.3) = 0.55 is out of reach at any rank
    assert fid.fit_curves(curves)['outside'] == pytest.approx(q, rel=1e-9)


def test_the_power_law_fit_recovers_its_exponent_and_the_standins_match_their_expectation():
    fit = fid.fit_exponent(fid.power_law_fraction(0.7, 128))
    assert fit['exponent'] == pytest.approx(0.7, abs=1e-3) and fit['rms'] < 1e-6
    law = {'spectrum': {'exponent': 0.9}, 'profile': {'exponent': 0.6}, 'outside': 0.25}
    expected = fid.fitted_curves(640, 512, law)
    assert expected.error_at(512) == pytest.approx(0.5)  # sqrt(outside)
    # The sampled profile's noise shrinks with m_out (each row of x^T G_y sums m_out products).
    measured = fid.fitted_standin(640, 512, law, tokens=2000, seed=0)
    assert measured.error_at(8) == pytest.approx(expected.error_at(8), abs=0.02)
    assert measured.energy_at(8) == pytest.approx(expected.energy_at(8))
    # Random initialisation with independent inputs: each direction keeps 1 / n_in of the gradient.
    random = fid.random_init_standin(64, 160, tokens=3000, seed=0)
    assert random.error_at(16) == pytest.approx(np.sqrt(1 - 16 / 64), abs=0.02)


@pytest.fixture(scope='module')
def tiny_cfg(tokenizer_cache):
    cfg = get_config()
    cfg.train.steps, cfg.train.eval_every, cfg.train.log_every = 2, 0, 1
    cfg.data.cache_dir = tokenizer_cache
    return resolve(cfg)


def test_the_rank_mode_writes_every_standin_at_tiny_settings(tmp_path, tiny_cfg):
    toy = ModelShape('toy', 48, 1, 4, 128, 32000)
    result = runs.run_rank(tiny_cfg, workdir=str(tmp_path / 'work'), widths=[32], models={'toy': toy},
                           paper_rank=8, tokens=256, snapshots=2, log=lambda _: None)
    text = runs.write(str(tmp_path / 'out'), 'rank_fidelity', {'command': 'smoke', **result},
                      runs.rank_tables(result))
    with open(tmp_path / 'out' / 'rank_fidelity.json') as f:
        assert json.load(f)['paper'].keys() == {'toy'}
    trained = result['trained']['32']
    assert [row['step'] for row in trained['steps']] == [0, 2]
    final = trained['steps'][-1]
    # Rank 8 of tiny's 32-wide input is toy's 8 of 48 scaled: round(8 * 32 / 48) = 5.
    assert final['kinds']['w_gate']['pooled']['ranks'] == {'own': 8, 'toy': 5}
    assert 0.0 < final['projection_ffn_error'] < 1.0 and 0.0 < final['neighbour_error']['ffn'] < 1.5
    for kind, row in result['paper']['toy'].items():
        assert row['shape'] == list(fid.kernel_shapes(toy)[kind])
        assert 0.0 < row['random_init']['error']['paper'] < 1.0
    assert text == (tmp_path / 'out' / 'rank_fidelity.md').read_text()
    assert 'smoke' in text and 'nan' not in text and all(kind in text for kind in fid.FFN_KINDS)
    assert (tmp_path / 'work' / 'd32').is_dir()


def test_the_projection_mode_orders_the_rules(tmp_path, tiny_cfg):
    result = runs.run_projection(tiny_cfg, workdir=str(tmp_path), ranks=[4], log=lambda _: None)
    (row,) = result['rows']
    for errors in row['projection'].values():  # no rank-r rule beats the SVD truncation
        assert errors['best'] <= min(errors.values()) + 1e-9 and 0.0 < errors['weights'] < 1.0
    assert row['gradient']['neighbour_cost'] > row['weights']['neighbour_cost'] > 1.0
    assert len(runs.projection_tables(result)[1].splitlines()) == 2 + len(fid.FFN_KINDS)


def test_the_neighbour_mode_is_exact_with_every_switch_off(tmp_path, tiny_cfg):
    result = runs.run_neighbour(tiny_cfg, workdir=str(tmp_path), snapshots=1, log=lambda _: None)
    (entry,) = result['steps']
    assert entry['step'] == 2 and len(entry['variants']['exact']['layers']) == result['num_layers']
    for name, variant in entry['variants'].items():
        for block in variant['layers']:
            skipped = name in ('mecefo', 'exact_ffn')  # the neighbour gives no attention gradient
            assert block['attention'] == pytest.approx(
                {'rel_error': 1.0, 'cosine': 0.0} if skipped else {'rel_error': 0.0, 'cosine': 1.0}, abs=1e-5)
            if name == 'exact':
                assert block['ffn']['rel_error'] == pytest.approx(0.0, abs=1e-5)
    assert entry['variants']['mecefo']['layers'][0]['ffn']['rel_error'] > 0.1
    table = runs.neighbour_tables(result)[0]
    assert len(table.splitlines()) == 2 + 3 * result['num_layers'] + 2


def test_snapshot_steps_are_evenly_spaced_and_end_at_the_last_step():
    assert runs.snapshot_steps(300, 4) == [0, 100, 200, 300]
    assert runs.snapshot_steps(300, 1) == [300]
    with pytest.raises(ValueError, match='--snapshots=0'):
        runs.snapshot_steps(300, 0)
