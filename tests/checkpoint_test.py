"""Tests for mecefo_jax.checkpointing.checkpoint: save/restore, resharding, cadence, errors."""

import os
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mecefo_jax.checkpointing import checkpoint
from mecefo_jax.checkpointing.checkpoint import Checkpointer


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any
    projections: Any


def _spec(x, mesh):
    # Shard leading dims over 'data' when divisible, else replicate.
    if np.ndim(x) >= 1 and np.shape(x)[0] % mesh.shape['data'] == 0:
        return NamedSharding(mesh, P('data'))
    return NamedSharding(mesh, P())


def _make_state(mesh, seed=0):
    # Built with numpy, not jax ops: each eager jax op compiles, and that
    # dominated this file's runtime on small CPUs.
    rng = np.random.default_rng(seed)
    params = {
        'embed': {'embedding': rng.standard_normal((32, 8), np.float32)},
        'dense': {
            'kernel': rng.standard_normal((8, 16), np.float32),
            'bias': np.arange(16, dtype=np.float32),
        },
        'scale': np.ones((3,), np.float32),  # not divisible: replicated
    }
    opt_state = optax.adamw(1e-3).init(params)
    # Non-trivial moments and count, so a restore of zeros cannot pass.
    opt_state = jax.tree.map(
        lambda x: np.asarray(x) + rng.integers(1, 100, np.shape(x)).astype(np.asarray(x).dtype),
        opt_state,
    )
    state = TrainState(
        step=np.asarray(7, np.int32),
        params=params,
        opt_state=opt_state,
        projections={},
    )
    return jax.tree.map(lambda x: jax.device_put(x, _spec(x, mesh)), state)


def _abstract(state, mesh):
    return checkpoint.abstract_like(state, lambda x: _spec(x, mesh))


def _assert_identical(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope='module')
def mesh8():
    return jax.make_mesh((8, 1), ('data', 'model'))


@pytest.fixture(scope='module')
def mesh4():
    return jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(4, 1), ('data', 'model'))


@pytest.fixture(scope='module')
def saved(tmp_path_factory, mesh8):
    """One checkpoint written from the 8-device mesh, shared by restore tests."""
    directory = str(tmp_path_factory.mktemp('ckpt') / 'run')
    state = _make_state(mesh8)
    data_state = {'epoch': 2, 'position': 12345, 'shard_order': [3, 1, 2], 'seed': 'abc'}
    ckpt = Checkpointer(directory, save_every=10, keep=2)
    blocked = ckpt.maybe_save(10, state, data_state)
    assert isinstance(blocked, float) and blocked >= 0.0
    ckpt.wait()
    ckpt.close()
    return directory, state, data_state


def test_restore_same_mesh_bit_identical(saved, mesh8):
    directory, state, data_state = saved
    with Checkpointer(directory, save_every=10) as ckpt:
        assert ckpt.latest_step() == 10
        target = _abstract(state, mesh8)
        restored, data = ckpt.restore(target)
    assert isinstance(restored, TrainState)
    _assert_identical(restored, state)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(target)):
        assert got.sharding == want.sharding
    assert data == data_state


def test_restore_onto_smaller_mesh(saved, mesh4):
    directory, state, data_state = saved
    with Checkpointer(directory, save_every=10) as ckpt:
        target = _abstract(state, mesh4)
        restored, data = ckpt.restore(target, step=10)
    _assert_identical(restored, state)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(target)):
        assert got.sharding == want.sharding
        assert got.sharding.mesh.devices.size == 4
    kernel = restored.params['embed']['embedding']
    assert kernel.sharding.spec == P('data')
    assert len(kernel.addressable_shards) == 4
    assert data == data_state


def test_restore_accepts_pytree_of_shardings(saved, mesh4):
    directory, state, _ = saved
    shardings = jax.tree.map(lambda x: _spec(x, mesh4), state)
    with Checkpointer(directory, save_every=10) as ckpt:
        restored, _ = ckpt.restore(checkpoint.abstract_like(state, shardings))
    _assert_identical(restored, state)


def test_mismatched_tree_is_a_clear_error(saved, mesh8):
    directory, state, _ = saved
    target = _abstract(state, mesh8)
    bad_shape = target.replace(
        params={
            **target.params,
            'dense': {
                **target.params['dense'],
                'kernel': jax.ShapeDtypeStruct((8, 32), jnp.float32, sharding=NamedSharding(mesh8, P())),
            },
        }
    )
    extra_leaf = target.replace(
        projections={'w': jax.ShapeDtypeStruct((4,), jnp.float32, sharding=NamedSharding(mesh8, P()))}
    )
    with Checkpointer(directory, save_every=10) as ckpt:
        with pytest.raises(checkpoint.CheckpointMismatchError, match=r'params\.dense\.kernel shape') as e:
            ckpt.restore(bad_shape)
        assert directory in str(e.value)
        with pytest.raises(checkpoint.CheckpointMismatchError, match=r'not in checkpoint: projections\.w'):
            ckpt.restore(extra_leaf)
        with pytest.raises(checkpoint.CheckpointMismatchError, match='in checkpoint but not requested'):
            ckpt.restore({'params': target.params})
        # Errors must leave the checkpoint usable.
        restored, _ = ckpt.restore(target)
    _assert_identical(restored, state)


def test_abstract_leaves_need_shardings(saved):
    directory, state, _ = saved
    no_sharding = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    with Checkpointer(directory, save_every=10) as ckpt:
        with pytest.raises(ValueError, match='has no sharding'):
            ckpt.restore(no_sharding)


def test_empty_directory(tmp_path, mesh8):
    directory = str(tmp_path / 'empty')
    with Checkpointer(directory, save_every=5) as ckpt:
        assert ckpt.latest_step() is None
        with pytest.raises(checkpoint.CheckpointNotFoundError, match='No checkpoint found') as e:
            ckpt.restore(_abstract(_make_state(mesh8), mesh8))
    assert directory in str(e.value) and 'Fix' in str(e.value)
    assert isinstance(e.value, FileNotFoundError)


def test_cadence_retention_and_missing_step(tmp_path, mesh8):
    directory = str(tmp_path / 'run')
    state = _make_state(mesh8)
    with Checkpointer(directory, save_every=3, keep=2) as ckpt:
        saved_steps = []
        for step in range(1, 11):
            blocked = ckpt.maybe_save(step, state, {'position': step})
            assert isinstance(blocked, float) and blocked >= 0.0
            if blocked > 0.0:
                saved_steps.append(step)
            else:
                assert step % 3 != 0
        assert saved_steps == [3, 6, 9]
        assert ckpt.maybe_save(10, state, {'position': 10}, force=True) > 0.0
        ckpt.wait()
        assert ckpt.latest_step() == 10
        assert ckpt.all_steps() == [9, 10]
        assert sorted(int(d) for d in os.listdir(directory) if d.isdigit()) == [9, 10]
        # A step that already exists is skipped, never overwritten.
        other = _make_state(mesh8, seed=1)
        assert ckpt.maybe_save(10, other, {'position': -1}, force=True) == 0.0
        with pytest.raises(checkpoint.CheckpointNotFoundError, match=r'available steps: \[9, 10\]'):
            ckpt.restore(_abstract(state, mesh8), step=3)
        restored, data = ckpt.restore(_abstract(state, mesh8), step=9)
    _assert_identical(restored, state)
    assert data == {'position': 9}


def test_async_save_snapshots_inputs(tmp_path, mesh8):
    """The caller may delete/donate arrays and mutate its dict right after."""
    directory = str(tmp_path / 'run')
    state = _make_state(mesh8)
    expected = jax.tree.map(np.asarray, state)
    live = jax.tree.map(lambda x: x + 0, state)  # private copy we can delete
    data_state = {'position': 1}
    with Checkpointer(directory, save_every=1, async_save=True) as ckpt:
        ckpt.maybe_save(1, live, data_state)
        for leaf in jax.tree.leaves(live):
            leaf.delete()
        data_state['position'] = 999
        restored, data = ckpt.restore(_abstract(state, mesh8))
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(np.asarray(got), want)
    assert data == {'position': 1}


def test_sync_save_and_bad_data_state(tmp_path, mesh8):
    directory = str(tmp_path / 'run')
    state = _make_state(mesh8)
    with Checkpointer(directory, save_every=1, async_save=False) as ckpt:
        with pytest.raises(TypeError, match='not JSON-serialisable'):
            ckpt.maybe_save(1, state, {'position': object()})
        assert ckpt.latest_step() is None
        assert ckpt.maybe_save(2, state, {'position': 2}) > 0.0
        assert ckpt.latest_step() == 2


def test_failed_async_save_keeps_good_checkpoint(tmp_path, mesh8, monkeypatch):
    directory = str(tmp_path / 'run')
    state = _make_state(mesh8)
    target = _abstract(state, mesh8)
    with Checkpointer(directory, save_every=1, keep=1) as ckpt:
        ckpt.maybe_save(1, state, {'position': 1})
        ckpt.wait()

        async def broken_write(self, *args, **kwargs):
            raise OSError('disk full (injected)')

        # Fails in the background commit, after maybe_save has returned.
        monkeypatch.setattr(ocp.JsonCheckpointHandler, '_save_fn', broken_write)
        ckpt.maybe_save(2, state, {'position': 2})
        with pytest.raises(OSError, match='injected'):
            ckpt.wait()
        monkeypatch.undo()

        # keep=1 must not have deleted step 1 for the failed step 2.
        assert ckpt.latest_step() == 1
        assert '1' in os.listdir(directory) and '2' not in os.listdir(directory)
        restored, data = ckpt.restore(target)
        _assert_identical(restored, state)
        assert data == {'position': 1}

        # The same checkpointer keeps working; retention resumes once a
        # newer step has committed.
        assert ckpt.maybe_save(3, state, {'position': 3}) > 0.0
        ckpt.wait()
        assert ckpt.all_steps() == [3]


def test_typed_prng_key_round_trip(tmp_path, mesh8, mesh4):
    replicated = NamedSharding(mesh8, P())
    state = {'rng': jax.device_put(jax.random.key(42), replicated), 'w': jnp.ones((8,))}
    with Checkpointer(str(tmp_path / 'run'), save_every=1) as ckpt:
        ckpt.maybe_save(1, state, {})
        restored, data = ckpt.restore(checkpoint.abstract_like(state, NamedSharding(mesh4, P())))
    assert jax.dtypes.issubdtype(restored['rng'].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(restored['rng']), jax.random.key_data(state['rng']))
    assert data == {}
