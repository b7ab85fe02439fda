"""Damaged newest checkpoint: moved aside with a warning, the older intact step restores."""
import logging
import os
import shutil

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mecefo_jax.checkpointing import checkpoint
from mecefo_jax.checkpointing.damage import NoIntactCheckpointError, restore_newest_intact

# Orbax's read/write coroutines that fail on purpose here report again when
# their event loop is gone ('Event loop is closed'); that noise is Orbax's.
pytestmark = pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')


def _state(step):
    # 64x64 random float32 is 16 KiB even compressed: over OCDBT's 1 KiB inline
    # limit, so the array lives in its own data file (as real weights do).
    w = np.random.default_rng(step).standard_normal((64, 64)).astype(np.float32)
    return {'w': w, 'b': np.arange(3, dtype=np.float32) + step}


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
    """Steps 1 and 2 (different values), copied fresh into each test."""
    directory = str(tmp_path_factory.mktemp('ckpt') / 'run')
    with checkpoint.Checkpointer(directory, save_every=1, keep=3) as ckpt:
        for step in (1, 2):
            ckpt.maybe_save(step, _state(step), {'position': step})
        ckpt.wait()
    return directory


@pytest.fixture
def run_dir(saved, tmp_path):
    directory = str(tmp_path / 'run')
    shutil.copytree(saved, directory)
    return directory


def _target(shape_w=(64, 64)):
    sharding = NamedSharding(jax.make_mesh((8, 1), ('data', 'model')), P())
    return {'w': jax.ShapeDtypeStruct(shape_w, np.float32, sharding=sharding),
            'b': jax.ShapeDtypeStruct((3,), np.float32, sharding=sharding)}


def _largest_array_file(step_dir):
    files = [os.path.join(root, f) for root, _, names in os.walk(os.path.join(step_dir, 'state'))
             for f in names if os.sep + 'd' + os.sep in os.path.join(root, f) + os.sep]
    return max(files, key=os.path.getsize)


def _truncate_array(step_dir):
    path = _largest_array_file(step_dir)
    with open(path, 'r+b') as f:
        f.truncate(os.path.getsize(path) // 2)


def _flip_manifest(step_dir):
    path = os.path.join(step_dir, 'state', 'manifest.ocdbt')
    with open(path, 'rb') as f:
        data = bytearray(f.read())
    middle = len(data) // 2
    data[middle:middle + 4] = bytes(b ^ 0xFF for b in data[middle:middle + 4])
    with open(path, 'wb') as f:
        f.write(data)


def _delete_data_metadata(step_dir):
    os.remove(os.path.join(step_dir, 'data', 'metadata'))


DAMAGE = {'truncated array': _truncate_array, 'flipped bytes': _flip_manifest,
          'deleted data/metadata': _delete_data_metadata}


@pytest.mark.parametrize('damage', sorted(DAMAGE))
def test_damaged_newest_step_falls_back_with_warning(run_dir, damage, caplog):
    DAMAGE[damage](os.path.join(run_dir, '2'))
    with caplog.at_level(logging.WARNING, logger='mecefo_jax.checkpointing.damage'):
        with checkpoint.Checkpointer(run_dir, save_every=1) as ckpt:
            state, data_state, step = restore_newest_intact(ckpt, _target())
            assert ckpt.all_steps() == [1]
    assert step == 1 and data_state == {'position': 1}
    np.testing.assert_array_equal(np.asarray(state['w']), _state(1)['w'])
    assert sorted(os.listdir(run_dir)) == ['1', '2.damaged-1']
    warning = ' '.join(r.getMessage() for r in caplog.records)
    assert f'step 2 in {run_dir} is damaged' in warning
    assert os.path.join(run_dir, '2.damaged-1') in warning


def test_every_step_damaged_is_an_error_listing_them(run_dir):
    _truncate_array(os.path.join(run_dir, '2'))
    _delete_data_metadata(os.path.join(run_dir, '1'))
    with checkpoint.Checkpointer(run_dir, save_every=1) as ckpt:
        with pytest.raises(NoIntactCheckpointError) as e:
            restore_newest_intact(ckpt, _target())
    message = str(e.value)
    assert 'step 2:' in message and 'step 1:' in message and '--workdir' in message
    # Nothing deleted: both steps wait, renamed, for inspection.
    assert sorted(os.listdir(run_dir)) == ['1.damaged-1', '2.damaged-1']


def test_config_mismatch_is_not_damage(run_dir):
    with checkpoint.Checkpointer(run_dir, save_every=1) as ckpt:
        with pytest.raises(checkpoint.CheckpointMismatchError, match=r'w shape saved \(64, 64\)'):
            restore_newest_intact(ckpt, _target(shape_w=(32, 64)))
    assert sorted(os.listdir(run_dir)) == ['1', '2']


def test_intact_newest_step_restores_and_moves_nothing(run_dir):
    with checkpoint.Checkpointer(run_dir, save_every=1) as ckpt:
        state, data_state, step = restore_newest_intact(ckpt, _target())
    assert step == 2 and data_state == {'position': 2}
    np.testing.assert_array_equal(np.asarray(state['b']), _state(2)['b'])
    assert sorted(os.listdir(run_dir)) == ['1', '2']


def test_no_checkpoint_is_not_found(tmp_path):
    with checkpoint.Checkpointer(str(tmp_path / 'empty'), save_every=1) as ckpt:
        with pytest.raises(checkpoint.CheckpointNotFoundError):
            restore_newest_intact(ckpt, _target())
