"""Tests for mecefo_jax.parallel.step: the combined MeCeFO gradient over a device mesh.

Every expected gradient is written out here from single-device `jax.grad`
calls on `token_loss_sum`, then compared with the shard_map step on fake CPU
devices (conftest.py provides 8).
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from tree_asserts import assert_tree_close

from configs import tiny
from mecefo_jax.config.resolve import resolve, updated
from mecefo_jax.model.llama import build_model, init_params
from mecefo_jax.neighbour.contract import is_attention_branch
from mecefo_jax.neighbour.layout import (
    ROLE_MIXED,
    ROLE_NEIGHBOUR,
    ROLE_NORMAL,
    Layout,
    Piece,
    Program,
    assemble,
    full_layout,
)
from mecefo_jax.neighbour.projections import compute_projections
from mecefo_jax.parallel import sharding, state, step

N_SHARDS, SHARD_BATCH, T = 8, 2, 9  # 8 batch shards of 2 sequences, 8 predicted tokens each
TOKENS_PER_SHARD = SHARD_BATCH * (T - 1)
RANK = 8
FAILED = 3  # replica whose shard is adopted in the failure layouts

# Compile time dominates this file: XLA's CPU backend at optimisation level 0
# compiles these programs about twice as fast. It changes machine-code
# generation only, not the HLO (collectives, op order), so the gradients
# checked here are the same computation the default level would run.
FAST = {'xla_backend_optimization_level': 0}


def _jit(fn, **kwargs):
    return jax.jit(fn, compiler_options=FAST, **kwargs)


# One block is enough here: how the step routes and combines gradients does
# not depend on depth (model_test.py checks neighbour mode through 2 blocks).
MODEL = build_model(resolve(tiny.get_config()), num_layers=1)
CFG = MODEL.cfg


@pytest.fixture(scope='module')
def setup():
    boxed = jax.eval_shape(lambda: init_params(MODEL, jax.random.key(0)))
    rng = np.random.default_rng(0)

    def fill(path, sds):
        # numpy values at init scale: avoids compiling Flax's RNG initialisers.
        if jax.tree_util.keystr(path).endswith("['scale']"):
            return jnp.asarray(1.0 + 0.3 * rng.standard_normal(sds.shape), jnp.float32)
        name = jax.tree_util.keystr(path)
        # Scanned blocks carry a leading layer axis; the fan-in comes after it.
        shape = sds.shape[1:] if name.startswith("['layers']") else sds.shape
        if name == "['embedding']":
            fan_in = 1
        else:
            fan_in = shape[0] * (shape[1] if name.endswith("['wo']") else 1)
        return jnp.asarray(rng.standard_normal(sds.shape) / np.sqrt(fan_in), jnp.float32)

    params = jax.tree_util.tree_map_with_path(fill, nn.unbox(boxed))
    projections = _jit(compute_projections, static_argnums=1)(params, RANK)
    tokens_nbt = rng.integers(0, CFG.vocab_size, (N_SHARDS, SHARD_BATCH, T), dtype=np.int32)
    return boxed, params, projections, tokens_nbt


@pytest.fixture(scope='module')
def reference(setup):
    """Unsharded references: global exact loss/grad and per-shard grads in both roles."""
    _, params, projections, tokens_nbt = setup
    ones = jnp.ones((SHARD_BATCH,), jnp.float32)

    def global_mean_loss(p, tokens_mt):
        weights = jnp.ones(tokens_mt.shape[:1], jnp.float32)
        loss_sum = step.token_loss_sum(MODEL, p, projections, tokens_mt, weights,
                                       neighbour=False)
        return loss_sum / (tokens_mt.shape[0] * (tokens_mt.shape[1] - 1))

    def per_shard(neighbour):
        def shard_mean_loss(p, tokens_bt):
            return step.token_loss_sum(MODEL, p, projections, tokens_bt, ones,
                                       neighbour=neighbour) / TOKENS_PER_SHARD
        # [N, ...] stacked gradients, one jax.grad per shard.
        return _jit(jax.vmap(jax.grad(shard_mean_loss), in_axes=(None, 0)))(params, tokens_nbt)

    loss, grads = _jit(jax.value_and_grad(global_mean_loss))(
        params, tokens_nbt.reshape(N_SHARDS * SHARD_BATCH, T))
    return {'loss': loss, 'grads': grads, 'exact': per_shard(False),
            'neighbour': per_shard(True)}


@functools.cache
def _mesh_and_step(rows, programs):
    """Mesh over `rows` (tuples of device ids) and its jitted grad fn, built once."""
    by_id = {d.id: d for d in jax.devices()}
    mesh = sharding.mesh_from_rows([[by_id[i] for i in row] for row in rows])
    return mesh, _jit(step.make_grad_fn(MODEL, mesh, programs, ordered_reduction=False))


def _put(batch, mesh):
    shardings = sharding.batch_shardings(mesh)
    return jax.device_put(batch, {k: shardings[k] for k in batch})


def _run(rows, layout, setup, tokens_nbt=None, place_params=False):
    _, params, projections, default_tokens = setup
    tokens_nbt = default_tokens if tokens_nbt is None else tokens_nbt
    mesh, fn = _mesh_and_step(rows, layout.programs)
    assert layout.signature[0] == len(rows)
    if place_params:
        # Production placement: params and V split over 'model' by logical names.
        shardings = state.state_shardings(MODEL, optax.sgd(0.1), mesh, RANK)
        params = jax.device_put(params, shardings.params)
        projections = jax.device_put(projections, shardings.projections)
    grads, stats = fn(params, projections, _put(assemble(layout, tokens_nbt), mesh))
    return fn, grads, stats


def _hand_average(reference, roles_by_shard):
    """MeCeFO's gradient-combination rule (docs/algorithm.md), from per-shard grads.

    `roles_by_shard[s]` is the role shard s was computed in. All shards have
    the same token count, so token-weighted means are plain means: attention
    params over the normally computed shards only, everything else over all.
    """
    roles = np.asarray(roles_by_shard)
    normal = roles == ROLE_NORMAL

    def combine(path, exact_n, neigh_n):
        exact_n, neigh_n = np.asarray(exact_n), np.asarray(neigh_n)
        if is_attention_branch(path):
            if not normal.any():
                return np.zeros_like(exact_n[0])
            return exact_n[normal].sum(0) / normal.sum()
        return (exact_n[normal].sum(0) + neigh_n[~normal].sum(0)) / len(roles)

    return jax.tree_util.tree_map_with_path(combine, reference['exact'], reference['neighbour'])


def _failure_layout(neighbour_row):
    """Replica FAILED is dead; live row `neighbour_row` adopts its shard.

    Live rows are the surviving replicas in order, each computing its own
    shard; the adopting row computes its own shard and then shard FAILED.
    """
    replicas = tuple(r for r in range(N_SHARDS) if r != FAILED)
    pieces = [(Piece(r, 0, SHARD_BATCH),) for r in replicas]
    pieces[neighbour_row] += (Piece(FAILED, 0, SHARD_BATCH),)
    roles = tuple(ROLE_NEIGHBOUR if i == neighbour_row else ROLE_NORMAL
                  for i in range(len(replicas)))
    return Layout(replicas=replicas, roles=roles, pieces=tuple(pieces))


LIVE_ROWS = tuple((r,) for r in range(N_SHARDS) if r != FAILED)  # 7 devices, model width 1

# Tolerances: the step sums per-slot gradients across devices (psum) and
# divides once, the references average per-shard float32 gradients; only
# summation order differs, so 1e-5 of each leaf's max is ample.
REL = 1e-5


@pytest.mark.parametrize('data,model', [(8, 1), (4, 2)])
def test_full_layout_matches_global_grad(setup, reference, data, model):
    _, _, _, tokens_nbt = setup
    rows = tuple(tuple(range(r * model, (r + 1) * model)) for r in range(data))
    # `data` replicas, each computing N/data of the global batch as one shard.
    per_replica = N_SHARDS * SHARD_BATCH // data
    layout = full_layout(data, per_replica)
    _, grads, stats = _run(rows, layout, setup, place_params=model > 1,
                           tokens_nbt=tokens_nbt.reshape(data, per_replica, T))
    if model > 1:
        # Tensor parallelism really happened: some gradient comes back split over 'model'.
        specs = [g.sharding.spec for g in jax.tree.leaves(grads)]
        assert any('model' in tuple(s) for s in specs), specs
    assert_tree_close(grads, reference['grads'], REL, f'({data},{model}) ')
    total = N_SHARDS * TOKENS_PER_SHARD
    assert float(stats['tokens']) == total and float(stats['attn_tokens']) == total
    np.testing.assert_allclose(stats['loss'], reference['loss'], rtol=1e-6)


def test_reference_per_shard_grads_average_to_global(reference):
    # Sanity of the references themselves: with every shard normal, the hand
    # average is the global mean gradient.
    assert_tree_close(_hand_average(reference, [ROLE_NORMAL] * N_SHARDS),
                       reference['grads'], REL, 'hand average ')


def test_failure_layout_combines_neighbour_and_normal_grads(setup, reference):
    # Replica 3 failed; replica 2 (live row 2) computes shards 2 and 3 as the neighbour,
    # in one joined batch; the normal rows are padded to that capacity.
    layout = _failure_layout(neighbour_row=2)
    assert layout.shards_covered() == {s: SHARD_BATCH for s in range(N_SHARDS)}
    assert layout.programs == (Program(ROLE_NORMAL, SHARD_BATCH),
                               Program(ROLE_NEIGHBOUR, 2 * SHARD_BATCH))
    assert not layout.is_plain
    _, grads, stats = _run(LIVE_ROWS, layout, setup)

    roles_by_shard = [ROLE_NORMAL] * N_SHARDS
    roles_by_shard[2] = roles_by_shard[FAILED] = ROLE_NEIGHBOUR
    expected = _hand_average(reference, roles_by_shard)
    assert_tree_close(grads, expected, REL, 'failure layout ')
    # The neighbour's contribution is really approximate: the result is not the exact grad.
    for path in [('ffn', 'w_up', 'kernel'), ('attn', 'wq')]:
        g, exact = grads['layers'], reference['grads']['layers']
        for key in path:
            g, exact = g[key], exact[key]
        assert np.max(np.abs(g - exact)) > 1e-3 * np.max(np.abs(exact)), path

    # Forward is exact: the reported loss is the exact global mean loss.
    np.testing.assert_allclose(stats['loss'], reference['loss'], rtol=1e-6)
    assert float(stats['tokens']) == N_SHARDS * TOKENS_PER_SHARD
    assert float(stats['attn_tokens']) == (N_SHARDS - 2) * TOKENS_PER_SHARD


def test_mixed_helpers_compute_their_own_shards_exactly_and_adopted_rows_in_neighbour_mode(
        setup, reference):
    # Replica 3 failed; replicas 2 and 4 each adopt one of its rows as mixed helpers:
    # their own shards count as exact (attention included), shard 3 as neighbour mode,
    # split over two devices (neighbour-mode gradients add up row by row).
    replicas = tuple(r for r in range(N_SHARDS) if r != FAILED)
    pieces = [(Piece(r, 0, SHARD_BATCH),) for r in replicas]
    pieces[2] += (Piece(FAILED, 0, 1),)
    pieces[3] += (Piece(FAILED, 1, SHARD_BATCH),)
    roles = tuple(ROLE_MIXED if i in (2, 3) else ROLE_NORMAL for i in range(len(replicas)))
    layout = Layout(replicas=replicas, roles=roles, pieces=tuple(pieces))
    assert layout.programs == (Program(ROLE_NORMAL, SHARD_BATCH),
                               Program(ROLE_MIXED, SHARD_BATCH + 1, SHARD_BATCH))
    assert layout.neighbour_mode_rows() == SHARD_BATCH
    _, grads, stats = _run(LIVE_ROWS, layout, setup)

    roles_by_shard = [ROLE_NORMAL] * N_SHARDS
    roles_by_shard[FAILED] = ROLE_NEIGHBOUR
    assert_tree_close(grads, _hand_average(reference, roles_by_shard), REL, 'mixed helpers ')
    np.testing.assert_allclose(stats['loss'], reference['loss'], rtol=1e-6)
    assert float(stats['tokens']) == N_SHARDS * TOKENS_PER_SHARD
    assert float(stats['attn_tokens']) == (N_SHARDS - 1) * TOKENS_PER_SHARD


def test_a_mixed_layout_names_what_it_computes_exactly():
    mixed = Program(ROLE_MIXED, 5, 4)
    assert (mixed.name, mixed.exact_rows) == ('mixedx4+1', 4)
    assert Program(ROLE_NEIGHBOUR, 5).exact_rows == 0
    with pytest.raises(ValueError, match='0 < exact < rows'):
        Program(ROLE_MIXED, 4, 4)
    with pytest.raises(ValueError, match='0 < exact < rows'):
        Program(ROLE_NEIGHBOUR, 4, 2)
    with pytest.raises(ValueError, match='adopts more'):
        Layout(replicas=(0,), roles=(ROLE_MIXED,), pieces=((Piece(0, 0, 2),),))
    with pytest.raises(ValueError, match='first pieces'):
        Layout(replicas=(0, 1), roles=(ROLE_MIXED,) * 2,
               pieces=((Piece(0, 0, 2), Piece(2, 0, 1)), (Piece(1, 0, 1), Piece(2, 1, 2))))
    layout = Layout(replicas=(0, 1), roles=(ROLE_NORMAL, ROLE_MIXED),
                    pieces=((Piece(0, 0, 2),), (Piece(1, 0, 2), Piece(2, 0, 2))))
    assert (layout.neighbour_rows(0), layout.neighbour_rows(1)) == (0, 2)
    assert layout.uses_neighbour_mode and not Layout(
        replicas=(0,), roles=(ROLE_NORMAL,), pieces=((Piece(0, 0, 2),),)).uses_neighbour_mode


def test_padding_rows_change_nothing(setup, reference):
    """Weight-0 rows add nothing, in a layout that runs as plain data parallelism.

    All roles normal: row 0 holds its shard as two pieces, row 2 also computes
    shard 3 (a normal-role adoption, i.e. exact), so every other row is padded
    to the capacity of 2 shards. Grads must be the exact global ones.
    """
    replicas = tuple(r for r in range(N_SHARDS) if r != FAILED)
    pieces = [(Piece(r, 0, SHARD_BATCH),) for r in replicas]
    pieces[0] = (Piece(0, 0, 1), Piece(0, 1, SHARD_BATCH))
    pieces[2] = (Piece(2, 0, SHARD_BATCH), Piece(FAILED, 0, SHARD_BATCH))
    layout = Layout(replicas=replicas, roles=(ROLE_NORMAL,) * len(replicas),
                    pieces=tuple(pieces))
    assert layout.is_plain and layout.capacity == 2 * SHARD_BATCH
    batch = assemble(layout, setup[3])
    assert (batch['weights'] == 0).sum() == 6 * SHARD_BATCH  # padding really present
    _, grads, stats = _run(LIVE_ROWS, layout, setup)
    assert_tree_close(grads, reference['grads'], REL, 'padded layout ')
    np.testing.assert_allclose(stats['loss'], reference['loss'], rtol=1e-6)
    total = N_SHARDS * TOKENS_PER_SHARD
    assert float(stats['tokens']) == total and float(stats['attn_tokens']) == total


def test_moving_the_neighbour_reuses_the_compiled_step(setup, reference):
    """Which device runs which program is data: no recompilation."""
    fn = _mesh_and_step(LIVE_ROWS, _failure_layout(2).programs)[1]
    for row, neighbour_replica in ((2, 2), (3, 4), (0, 0)):
        layout = _failure_layout(row)
        _, grads, stats = _run(LIVE_ROWS, layout, setup)
        roles_by_shard = [ROLE_NEIGHBOUR if s in (neighbour_replica, FAILED) else ROLE_NORMAL
                          for s in range(N_SHARDS)]
        assert_tree_close(grads, _hand_average(reference, roles_by_shard), REL,
                          f'neighbour at row {row}: ')
        np.testing.assert_allclose(stats['loss'], reference['loss'], rtol=1e-6)
        assert fn._cache_size() == 1, f'neighbour at row {row} recompiled the step'


def test_every_replica_a_neighbour_gives_attention_no_gradient(setup, reference):
    layout = dataclasses.replace(_failure_layout(2), roles=(ROLE_NEIGHBOUR,) * 7)
    assert layout.programs == (Program(ROLE_NEIGHBOUR, 2 * SHARD_BATCH),)
    _, grads, stats = _run(LIVE_ROWS, layout, setup)
    # With no normal device, attention params get an exactly-zero gradient.
    assert_tree_close(grads, _hand_average(reference, [ROLE_NEIGHBOUR] * N_SHARDS), REL,
                      'all neighbours: ')
    assert float(stats['attn_tokens']) == 0.0


def test_neighbour_under_tensor_parallelism(setup, reference):
    """A failure on a (data, model) = (4, 2) mesh: params and V split over 'model'.

    Replica 2 (devices 4, 5) failed; the 3 live rows each compute two shards,
    and replica 1 also adopts replica 2's two shards as the neighbour.
    """
    rows = ((0, 1), (2, 3), (6, 7))
    pieces = ((Piece(0, 0, SHARD_BATCH), Piece(1, 0, SHARD_BATCH)),
              tuple(Piece(s, 0, SHARD_BATCH) for s in (2, 3, 4, 5)),
              (Piece(6, 0, SHARD_BATCH), Piece(7, 0, SHARD_BATCH)))
    layout = Layout(replicas=(0, 1, 3), roles=(ROLE_NORMAL, ROLE_NEIGHBOUR, ROLE_NORMAL),
                    pieces=pieces)
    _, grads, stats = _run(rows, layout, setup, place_params=True)
    roles_by_shard = [ROLE_NEIGHBOUR if s in (2, 3, 4, 5) else ROLE_NORMAL
                      for s in range(N_SHARDS)]
    assert_tree_close(grads, _hand_average(reference, roles_by_shard), REL, 'TP failure ')
    np.testing.assert_allclose(stats['loss'], reference['loss'], rtol=1e-6)
    assert float(stats['attn_tokens']) == 4 * TOKENS_PER_SHARD


def test_no_attention_gradient_leaves_attention_and_its_adam_state_untouched(setup):
    """Every live replica is a neighbour (mesh.data=2, one failure): no attention grad.

    Two normal steps first give AdamW non-zero moments and a non-zero learning
    rate, so without the rule momentum and weight decay would move attention.
    """
    from configs import tiny as tiny_cfg
    from mecefo_jax.model import optim
    _, params, projections, tokens_nbt = setup
    # A non-zero learning rate from the first step.
    train_cfg = updated(resolve(tiny_cfg.get_config()), {'train.warmup_fraction': 0.0}).train
    optimizer = optim.make_optimizer(train_cfg)
    by_id = {d.id: d for d in jax.devices()}
    both = sharding.mesh_from_rows([[by_id[0]], [by_id[1]]])
    survivor = sharding.mesh_from_rows([[by_id[0]]])

    full = full_layout(2, SHARD_BATCH)
    neighbour_only = Layout(replicas=(0,), roles=(ROLE_NEIGHBOUR,),
                            pieces=((Piece(0, 0, SHARD_BATCH), Piece(1, 0, SHARD_BATCH)),))

    def train_step(mesh, layout):
        shardings = state.state_shardings(MODEL, optimizer, mesh, RANK)
        return step.make_train_step(MODEL, optimizer, mesh, shardings, layout.programs,
                                    ordered_reduction=False), shardings

    def batch(layout, mesh, at_step):
        return _put(dict(assemble(layout, two_shards), step=np.int32(at_step)), mesh)

    full_step, full_shardings = train_step(both, full)
    # Copies: the steps donate their state, and the module's fixture keeps its arrays.
    params, projections = jax.tree.map(jnp.array, (params, projections))
    current = jax.device_put(
        state.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                         opt_state=optimizer.init(params), projections=projections),
        full_shardings)
    two_shards = tokens_nbt[:2]
    for i in range(2):
        current, _ = full_step(current, batch(full, both, i))
    lone_step, lone_shardings = train_step(survivor, neighbour_only)
    before = jax.device_get(current)
    after, metrics = lone_step(jax.device_put(current, lone_shardings),
                               batch(neighbour_only, survivor, 2))
    after = jax.device_get(after)
    assert float(metrics['attn_tokens']) == 0.0 and bool(metrics['applied'])
    assert int(after.step) == 3
    params_before = jax.tree_util.tree_leaves_with_path(before.params)
    params_after = jax.tree.leaves(after.params)
    moved = {jax.tree_util.keystr(p): not np.array_equal(a, b)
             for (p, b), a in zip(params_before, params_after)}
    for name, changed in moved.items():
        # Attention (and its norm) stay put bit for bit; everything else trains.
        assert changed != ("['attn']" in name or "['attn_norm']" in name), name
    # The Adam moments of attention are untouched too (both mu and nu).
    adam_before, adam_after = before.opt_state[1][0], after.opt_state[1][0]
    for moments in ('mu', 'nu'):
        b, a = getattr(adam_before, moments), getattr(adam_after, moments)
        np.testing.assert_array_equal(a['layers']['attn']['wq'], b['layers']['attn']['wq'])
        np.testing.assert_array_equal(a['layers']['attn_norm']['scale'],
                                      b['layers']['attn_norm']['scale'])
        assert not np.array_equal(a['layers']['ffn']['w_up']['kernel'],
                                  b['layers']['ffn']['w_up']['kernel'])


def test_a_batch_for_another_step_leaves_the_state_untouched(setup):
    """The guard behind the asynchronous loop's NaN stop.

    After a non-finite step the state keeps its step number, so every later
    batch in flight (stamped with later steps) must change nothing, even when
    its own loss is finite.
    """
    _, params, projections, tokens_nbt = setup
    optimizer = optax.adamw(1e-2)
    mesh = sharding.mesh_from_rows([[jax.devices()[0]]])
    layout = full_layout(1, SHARD_BATCH)
    shardings = state.state_shardings(MODEL, optimizer, mesh, RANK)
    train_step = step.make_train_step(MODEL, optimizer, mesh, shardings, layout.programs,
                                      ordered_reduction=False)
    # Copies: the step donates its state, and the module's fixture keeps its arrays.
    params, projections = jax.tree.map(jnp.array, (params, projections))
    start = jax.device_put(state.TrainState(step=jnp.asarray(4, jnp.int32), params=params,
                                            opt_state=optimizer.init(params),
                                            projections=projections), shardings)
    before = jax.device_get(start)
    host = assemble(layout, tokens_nbt[:1])
    stale, metrics = train_step(start, _put(dict(host, step=np.int32(5)), mesh))
    assert bool(metrics['finite']) and not bool(metrics['applied'])
    for a, b in zip(jax.tree.leaves(jax.device_get(stale)), jax.tree.leaves(before)):
        np.testing.assert_array_equal(a, b)
    # Control: the batch of the state's own step trains.
    moved, metrics = train_step(stale, _put(dict(host, step=np.int32(4)), mesh))
    assert bool(metrics['applied']) and int(moved.step) == 5


@pytest.mark.parametrize('role', [ROLE_NEIGHBOUR, ROLE_MIXED])
def test_a_single_live_replica_under_tensor_parallelism(setup, reference, role):
    """mesh.data=4 x model=2 with three replicas down: one 2-device replica adopts all.

    A one-row data axis takes no shard_map (XLA rejects its psum beside the
    automatic 'model' axis); the gradient must still be the combination rule's
    (a mixed replica's own shard 0 exact, the rest in neighbour mode).
    """
    layout = Layout(replicas=(0,), roles=(role,),
                    pieces=(tuple(Piece(s, 0, SHARD_BATCH) for s in range(N_SHARDS)),))
    _, grads, stats = _run(((0, 1),), layout, setup, place_params=True)
    roles_by_shard = [ROLE_NEIGHBOUR] * N_SHARDS
    roles_by_shard[0] = ROLE_NORMAL if role == ROLE_MIXED else ROLE_NEIGHBOUR
    assert_tree_close(grads, _hand_average(reference, roles_by_shard), REL,
                      'single TP replica ')
    np.testing.assert_allclose(stats['loss'], reference['loss'], rtol=1e-6)
    assert float(stats['attn_tokens']) == (TOKENS_PER_SHARD if role == ROLE_MIXED else 0.0)


def test_a_neighbour_with_both_ablation_switches_off_gives_the_exact_global_grad(setup,
                                                                                  reference):
    """mecefo.skip_attention=False and projection='exact': the neighbour computes exactly,
    and its attention gradient counts, so the combined gradient is the global one."""
    _, params, projections, tokens_nbt = setup
    model = MODEL.variant(skip_attention=False, projection='exact')
    layout = _failure_layout(neighbour_row=2)
    mesh, _ = _mesh_and_step(LIVE_ROWS, layout.programs)
    fn = _jit(step.make_grad_fn(model, mesh, layout.programs, ordered_reduction=False))
    grads, stats = fn(params, projections, _put(assemble(layout, tokens_nbt), mesh))
    assert_tree_close(grads, reference['grads'], REL, 'both switches off ')
    assert float(stats['attn_tokens']) == N_SHARDS * TOKENS_PER_SHARD


def test_drop_adopters_drops_the_failed_shard_and_its_adopters_own(setup, reference):
    """The control: the rows mecefo would approximate are dropped, the rest exact."""
    from mecefo_jax.faults.strategies import adopters, layout_for
    live = [r != FAILED for r in range(N_SHARDS)]
    adopter = adopters(live)[FAILED]
    layout = layout_for('drop_adopters', live, SHARD_BATCH)
    assert layout.shards_covered() == {s: SHARD_BATCH for s in range(N_SHARDS)
                                       if s not in (FAILED, adopter)}
    _, grads, stats = _run(LIVE_ROWS, layout, setup)
    kept = [s for s in range(N_SHARDS) if s not in (FAILED, adopter)]
    expected = jax.tree.map(lambda g: np.asarray(g)[kept].mean(0), reference['exact'])
    assert_tree_close(grads, expected, REL, 'drop_adopters ')
    assert float(stats['tokens']) == float(stats['attn_tokens']) == len(kept) * TOKENS_PER_SHARD


def test_the_neighbours_trust_weighs_its_rows_gradient_and_count(setup, reference):
    """mecefo.neighbour_weight w and trust_top_blocks K (combination.py), against the
    per-shard references: g = (S_exact + w S_neighbour) / (T_exact + w T_neighbour)
    where the neighbour is trusted (the one block, K = 1, and the head), the exact rows
    alone in the embedding (below the top K) and the attention branch (skipped)."""
    _, params, projections, tokens_nbt = setup
    w = 0.25
    model = MODEL.variant(neighbour_weight=w, trust_top_blocks=1)
    layout = _failure_layout(neighbour_row=2)
    mesh, _ = _mesh_and_step(LIVE_ROWS, layout.programs)
    fn = _jit(step.make_grad_fn(model, mesh, layout.programs, ordered_reduction=False))
    grads, stats = fn(params, projections, _put(assemble(layout, tokens_nbt), mesh))
    neighbour = np.zeros(N_SHARDS, bool)
    neighbour[[2, FAILED]] = True

    def expected(path, exact_n, neigh_n):
        exact_n, neigh_n = np.asarray(exact_n), np.asarray(neigh_n)
        weight = 0.0 if is_attention_branch(path) or path[0].key == 'embedding' else w
        total = exact_n[~neighbour].sum(0) + weight * neigh_n[neighbour].sum(0)
        return total / ((~neighbour).sum() + weight * neighbour.sum())

    assert_tree_close(grads, jax.tree_util.tree_map_with_path(
        expected, reference['exact'], reference['neighbour']), REL, 'trust ')
    assert float(stats['tokens']) == N_SHARDS * TOKENS_PER_SHARD


def test_the_trust_tree_trusts_the_top_blocks_only():
    from mecefo_jax.neighbour.combination import trust_tree
    model = build_model(resolve(tiny.get_config()), num_layers=3, neighbour_weight=0.5,
                        trust_top_blocks=2)
    params = jax.eval_shape(lambda: nn.unbox(init_params(model, jax.random.key(0))))
    trust = trust_tree(model.rules, model.cfg.num_layers, params)
    np.testing.assert_array_equal(np.ravel(trust['layers']['ffn']['w_up']['kernel']),
                                  [0.0, 0.5, 0.5])
    assert np.all(np.asarray(trust['layers']['attn']['wq']) == 0.0)  # skipped: no gradient
    assert trust['embedding'] == 0.0 and trust['head'] == 0.5
    assert trust_tree(MODEL.rules, MODEL.cfg.num_layers, params) is None  # the paper's rule: nothing to weigh


def test_without_ffn_kernel_gradients_the_neighbour_counts_as_dropped_for_them(setup,
                                                                                reference):
    """mecefo.projection='none': the FFN kernels average the exact rows only; the rest
    follows the paper's rule."""
    _, params, projections, tokens_nbt = setup
    model = MODEL.variant(projection='none')
    layout = _failure_layout(neighbour_row=2)
    mesh, _ = _mesh_and_step(LIVE_ROWS, layout.programs)
    fn = _jit(step.make_grad_fn(model, mesh, layout.programs, ordered_reduction=False))
    grads, _ = fn(params, projections, _put(assemble(layout, tokens_nbt), mesh))
    roles = [ROLE_NORMAL] * N_SHARDS
    roles[2] = roles[FAILED] = ROLE_NEIGHBOUR
    normal = [s for s in range(N_SHARDS) if roles[s] == ROLE_NORMAL]
    paper = _hand_average(reference, roles)
    exact_only = jax.tree.map(lambda g: np.asarray(g)[normal].mean(0), reference['exact'])

    def expected(path, p, e):
        names = [str(getattr(k, 'key', k)) for k in path]
        return e if names[-1] == 'kernel' and 'ffn' in names else p
    assert_tree_close(grads, jax.tree_util.tree_map_with_path(expected, paper, exact_only), REL,
                      "projection='none' ")


def test_attention_in_the_top_blocks_counts_the_neighbours_rows_there():
    """mecefo.attention_top_blocks: the blocks whose attention backward the neighbour
    computes average their attention over every row; the others over the exact rows."""
    from mecefo_jax.neighbour.combination import trust_tree
    model = build_model(resolve(tiny.get_config()), num_layers=3, attention_top_blocks=1)
    params = jax.eval_shape(lambda: nn.unbox(init_params(model, jax.random.key(0))))
    trust = trust_tree(model.rules, model.cfg.num_layers, params)
    np.testing.assert_array_equal(np.ravel(trust['layers']['attn']['wq']), [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(np.ravel(trust['layers']['ffn']['w_up']['kernel']), [1, 1, 1])


def test_the_ordered_reduction_gives_the_same_gradients(setup, reference):
    """train.ordered_reduction: every replica's sums gathered and added in replica order,
    for the full layout (plain programs, routed through it) and a neighbour's."""
    _, params, projections, tokens_nbt = setup
    model = MODEL
    for layout, expected, rows in (
            (full_layout(N_SHARDS, SHARD_BATCH), reference['grads'],
             tuple((r,) for r in range(N_SHARDS))),
            (_failure_layout(neighbour_row=2), _hand_average(reference, [
                ROLE_NEIGHBOUR if s in (2, FAILED) else ROLE_NORMAL for s in range(N_SHARDS)]),
             LIVE_ROWS)):
        mesh, _ = _mesh_and_step(rows, layout.programs)
        fn = _jit(step.make_grad_fn(model, mesh, layout.programs, ordered_reduction=True))
        grads, _ = fn(params, projections, _put(assemble(layout, tokens_nbt), mesh))
        assert_tree_close(grads, expected, REL, 'ordered reduction ')
