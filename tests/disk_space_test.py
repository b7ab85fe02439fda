"""A full disk: warned before the first save; a failed save explained and cleaned up."""
import collections
import errno
import logging
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mecefo_jax.checkpointing import checkpoint
from mecefo_jax.host import disk_space

# Orbax's read/write coroutines that fail on purpose here report again when
# their event loop is gone ('Event loop is closed'); that noise is Orbax's.
pytestmark = pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')


def _state():
    return {'w': np.ones((64, 64), np.float32), 'b': np.zeros((3,), np.int32)}


def _target():
    sharding = NamedSharding(jax.make_mesh((8, 1), ('data', 'model')), P())
    return checkpoint.abstract_like(_state(), sharding)


def test_state_nbytes_counts_global_array_bytes():
    assert disk_space.state_nbytes(_state()) == 64 * 64 * 4 + 3 * 4
    assert disk_space.state_nbytes({'k': jax.random.key(0)}) == 8  # two uint32 of key data
    assert disk_space.bytes_needed(_state()) == int((64 * 64 * 4 + 12) * disk_space.SAVE_HEADROOM)


def _fake_free(monkeypatch, free):
    usage = collections.namedtuple('usage', 'total used free')
    monkeypatch.setattr(disk_space.shutil, 'disk_usage', lambda path: usage(10**9, 0, free))


def test_short_disk_warns_once_before_the_first_save(tmp_path, monkeypatch, caplog):
    _fake_free(monkeypatch, 1000)
    with caplog.at_level(logging.WARNING, logger='mecefo_jax.host.disk_space'):
        with checkpoint.Checkpointer(str(tmp_path / 'run'), save_every=1) as ckpt:
            ckpt.maybe_save(1, _state(), {})
            ckpt.maybe_save(2, _state(), {})
    warnings = [r.getMessage() for r in caplog.records if 'may not fit' in r.getMessage()]
    assert len(warnings) == 1
    assert str(tmp_path / 'run') in warnings[0] and '0.0 MiB is free' in warnings[0]


def test_enough_space_warns_nothing(tmp_path, monkeypatch, caplog):
    _fake_free(monkeypatch, 10**9)
    with caplog.at_level(logging.WARNING, logger='mecefo_jax.host.disk_space'):
        with checkpoint.Checkpointer(str(tmp_path / 'run'), save_every=1) as ckpt:
            ckpt.maybe_save(1, _state(), {})
    assert not [r for r in caplog.records if 'may not fit' in r.getMessage()]


@pytest.mark.parametrize('async_save', [True, False])
def test_failed_save_is_explained_cleaned_and_keeps_previous_step(tmp_path, monkeypatch,
                                                                    async_save):
    directory = str(tmp_path / 'run')
    with checkpoint.Checkpointer(directory, save_every=1, keep=1, async_save=async_save) as ckpt:
        ckpt.maybe_save(1, _state(), {'position': 1})
        ckpt.wait()

        async def no_space(self, *args, **kwargs):
            raise OSError(errno.ENOSPC, 'No space left on device (injected)')

        # The data item's write is where Orbax touches the filesystem; an
        # async save fails there in the background and surfaces on wait().
        monkeypatch.setattr(ocp.JsonCheckpointHandler, '_save_fn', no_space)
        with pytest.raises(disk_space.CheckpointSaveError) as e:
            ckpt.maybe_save(2, _state(), {'position': 2})
            ckpt.wait()
        monkeypatch.undo()
        message = str(e.value)
        assert e.value.errno == errno.ENOSPC and isinstance(e.value, OSError)
        assert directory in message and 'ran out of disk space' in message
        needed = disk_space.bytes_needed(_state()) / 2**20
        assert f'needs about {needed:.1f} MiB' in message and 'MiB free' in message
        assert 'step 1 stays the resume point' in message
        assert os.listdir(directory) == ['1']  # no *.orbax-checkpoint-tmp* left behind
        assert ckpt.latest_step() == 1
        _, data_state = ckpt.restore(_target())
        assert data_state == {'position': 1}


def test_non_filesystem_errors_pass_through_unchanged(tmp_path):
    error = TypeError('not a disk problem')
    assert disk_space.explain_failed_save(str(tmp_path), error, 10, 1) is error
