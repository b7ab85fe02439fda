"""The subspace refresh split over the data axis: same V, about 1/data of the FLOPs.

The reference is the same refresh compiled without the split (the kernels
where the model's shardings put them, as before the split existed) on the
same mesh; FLOPs are XLA's `cost_analysis` of each compiled program, which is
per device after GSPMD partitioning.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from mecefo_jax.neighbour.projections import subspace_iteration
from mecefo_jax.parallel import step as refresh_lib
from mecefo_jax.parallel.state import TrainState
from studies import xla_costs as aot

L, R = 2, 4


def _planted(rng, n, m, gap=0.1):
    """[n, m] with singular values 10..5 on the top R and <= 10 * gap / 2 below."""
    k = min(n, m)
    u = np.linalg.qr(rng.standard_normal((n, k)))[0]
    w = np.linalg.qr(rng.standard_normal((m, k)))[0]
    values = np.concatenate([np.linspace(10.0, 5.0, R), np.linspace(5.0 * gap, 0.01, k - R)])
    return ((u * values) @ w.T).astype(np.float32)


def _state_and_shardings(mesh, d, h):
    """A state with scanned w_gate [L, d, h] and w_down [L, h, d], sharded as the model does
    ('mlp' on 'model' where it divides), and random warm starts for V."""
    rng = np.random.default_rng(d * 1000 + h)
    model = mesh.shape['model']
    gate = np.stack([_planted(rng, d, h) for _ in range(L)])
    down = np.stack([_planted(rng, h, d) for _ in range(L)])
    params = {'layers': {'ffn': {'w_gate': {'kernel': jnp.asarray(gate)},
                                 'w_down': {'kernel': jnp.asarray(down)}}}}
    projections = {'layers': {'ffn': {
        'w_gate': {'kernel': jnp.asarray(rng.standard_normal((L, d, R)), jnp.float32)},
        'w_down': {'kernel': jnp.asarray(rng.standard_normal((L, h, R)), jnp.float32)}}}}
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state={},
                       projections=projections)
    mlp = 'model' if h % model == 0 else None
    specs = TrainState(step=P(), opt_state={}, projections=jax.tree.map(lambda _: P(),
                                                                        projections),
                       params={'layers': {'ffn': {'w_gate': {'kernel': P(None, None, mlp)},
                                                  'w_down': {'kernel': P(None, mlp, None)}}}})
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                             is_leaf=lambda x: isinstance(x, P))
    return jax.device_put(state, shardings), shardings


def _unsplit_fn(shardings):
    def refresh(state):
        return jax.tree.map(lambda k, v: subspace_iteration(k, R, v, iterations=2),
                            state.params, state.projections)
    return jax.jit(refresh, in_shardings=(shardings,), out_shardings=shardings.projections)


def _kernel_sized_collectives(hlo, matrix):
    """Results of data-moving collectives at least half a kernel large."""
    pattern = r'= \(?(f32\[[\d,]*\][^=]*?) (all-gather|all-to-all|collective-permute)'
    sizes = [int(np.prod([int(x) for x in dims.split(',') if x]))
             for shapes, _ in re.findall(pattern, hlo)
             for dims in re.findall(r'\[([\d,]*)\]', shapes)]
    return [s for s in sizes if s >= matrix // 2]


# (data, model, d, h, per-device share of the kernel's rows the split leaves)
CASES = [(8, 1, 48, 96, 1 / 8), (4, 2, 48, 96, 1 / 4),
         # uneven: 100 and 45 split in 8 neither; GSPMD pads 100 to 8 x 13 rows
         (8, 1, 45, 100, 13 / 100)]


@pytest.mark.parametrize('data,model,d,h,share', CASES)
def test_split_refresh_matches_the_unsplit_one_at_about_one_over_data_the_flops(
        data, model, d, h, share):
    mesh = Mesh(np.array(jax.devices()).reshape(data, model), ('data', 'model'))
    state, shardings = _state_and_shardings(mesh, d, h)
    split = refresh_lib.make_refresh_fn(R, shardings, method='subspace', iterations=2)
    split_c = split.lower(state).compile()
    unsplit_c = _unsplit_fn(shardings).lower(state).compile()
    want = unsplit_c(state)
    got = split_c(jax.tree.map(jnp.copy, state)).projections  # the refresh donates its input
    # The two programs differ only in the summation order of the products (sums of
    # <= 100 float32 terms: relative error <= 100 * 2^-24 = 6e-6) and the planted
    # gap 0.1 keeps the subspace well conditioned, so V V^T moves by less than 1e-5.
    for v_want, v_got in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        for i in range(L):
            a, b = np.asarray(v_want[i], np.float64), np.asarray(v_got[i], np.float64)
            assert np.abs(a @ a.T - b @ b.T).max() <= 1e-5
    # Per-device FLOPs: XLA counts the products (the QRs are LAPACK calls it does not
    # count), which the split cuts to `share` of the unsplit program's rows; the
    # unsplit one already splits them over 'model'. 15% slack for the replicated
    # elementwise work of the orthonormalisation and, uneven, GSPMD's masking of
    # the padded rows (measured: 0.98 of `expected` even, 0.89 uneven).
    expected = (1 / model) / share
    ratio = aot.flops_of(unsplit_c) / aot.flops_of(split_c)
    assert ratio >= 0.85 * expected, (ratio, expected)
    assert not _kernel_sized_collectives(split_c.as_text(), d * h)


def _collectives(hlo):
    return re.findall(r'(all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)\(',
                      hlo)


def test_a_kernel_under_the_split_threshold_refreshes_whole_with_no_collective():
    """mecefo.refresh_split_min_elements: 48 x 96 kernels (4,608 elements) under a
    threshold of 4,609 compile to the unsplit program (every replica computes all of
    it, no collective at all on an 8 x 1 mesh); at 4,608 they split."""
    mesh = Mesh(np.array(jax.devices()).reshape(8, 1), ('data', 'model'))
    state, shardings = _state_and_shardings(mesh, 48, 96)
    whole_c = refresh_lib.make_refresh_fn(R, shardings, method='subspace', iterations=2,
                                       split_min_elements=48 * 96 + 1).lower(state).compile()
    split_c = refresh_lib.make_refresh_fn(R, shardings, method='subspace', iterations=2,
                                       split_min_elements=48 * 96).lower(state).compile()
    unsplit_c = _unsplit_fn(shardings).lower(state).compile()
    assert not _collectives(whole_c.as_text())
    assert _collectives(split_c.as_text())
    assert aot.flops_of(whole_c) >= 0.98 * aot.flops_of(unsplit_c)
    assert aot.flops_of(split_c) <= 0.25 * aot.flops_of(whole_c)


def test_data_split_spec_takes_the_long_axis_or_one_that_splits_evenly():
    shape = {'data': 4, 'model': 2}
    assert refresh_lib.data_split_spec(P(None, None, 'model'), (2, 48, 96), shape) == \
        P(None, None, ('model', 'data'))
    assert refresh_lib.data_split_spec(P(None, 'model', None), (2, 96, 48), shape) == \
        P(None, ('model', 'data'), None)
    # 100 is not a multiple of 4 x 2; 48 is a multiple of 4: the short axis is taken.
    assert refresh_lib.data_split_spec(P(None, None, 'model'), (2, 48, 100), shape) == \
        P(None, 'data', 'model')
    # Neither splits evenly: the long axis, padded by GSPMD.
    assert refresh_lib.data_split_spec(P(), (45, 99), shape) == P(None, 'data')
