"""The run's config record: atomic writes, and mismatch errors that name the fix."""
import json
import os

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from configs.tiny import get_config
from mecefo_jax.checkpointing import checkpoint
from mecefo_jax.config import record as config_record


def _embedding(cfg, sharding=None):
    shape = (cfg.model.vocab_size, cfg.model.d_model)
    if sharding is None:
        return {'embed': np.zeros(shape, np.float32)}
    return {'embed': jax.ShapeDtypeStruct(shape, np.float32, sharding=sharding)}


def test_mismatched_d_model_names_the_field_and_the_override(tmp_path):
    workdir = str(tmp_path)
    old = get_config()
    with checkpoint.Checkpointer(os.path.join(workdir, 'checkpoints'), save_every=1) as ckpt:
        ckpt.maybe_save(1, _embedding(old), {})
    config_record.write_config_record(workdir, old)
    new = get_config()
    new.model.d_model = 2 * old.model.d_model
    new.train.steps = 80
    sharding = NamedSharding(jax.make_mesh((8, 1), ('data', 'model')), P())
    with checkpoint.Checkpointer(os.path.join(workdir, 'checkpoints'), save_every=1) as ckpt:
        with pytest.raises(checkpoint.CheckpointMismatchError) as e:
            ckpt.restore(_embedding(new, sharding))
    explained = config_record.explain_mismatch(e.value, workdir, new)
    message = str(explained)
    assert isinstance(explained, checkpoint.CheckpointMismatchError)
    assert str(e.value) in message  # Orbax-side detail kept
    assert f'model.d_model: {old.model.d_model} in the run, {new.model.d_model} now' in message
    assert f'--config.model.d_model={old.model.d_model}' in message
    assert f'--config.train.steps={old.train.steps}' in message
    assert '--workdir' in message


def test_record_is_written_atomically_and_round_trips(tmp_path):
    cfg = get_config()
    path = config_record.write_config_record(str(tmp_path), cfg)
    with open(path) as f:
        assert json.load(f) == json.loads(cfg.to_json_best_effort())
    assert config_record.read_config_record(str(tmp_path))['model']['d_model'] == 32
    assert os.listdir(tmp_path) == ['config.json']  # no temporary file left
    assert config_record.config_differences(config_record.read_config_record(str(tmp_path)),
                                            cfg) == []


def test_differences_and_overrides_for_each_kind_of_value():
    recorded = {'a': {'n': 1, 's': 'x y', 'flag': True, 'dims': [2, 4]}, 'gone': 3}
    current = {'a': {'n': 2, 's': 'z', 'flag': False, 'dims': [8]}, 'new': 1}
    diffs = config_record.config_differences(recorded, current)
    assert [d[0] for d in diffs] == ['a.dims', 'a.flag', 'a.n', 'a.s', 'gone', 'new']
    flags = [config_record.override_flag(k, old) for k, old, _ in diffs
             if old is not config_record.ABSENT]
    assert flags == ["'--config.a.dims=(2, 4)'", '--config.a.flag=True', '--config.a.n=1',
                     "'--config.a.s=x y'", '--config.gone=3']


def test_without_a_record_the_message_says_so(tmp_path):
    error = checkpoint.CheckpointMismatchError('shapes differ')
    message = str(config_record.explain_mismatch(error, str(tmp_path), get_config()))
    assert message.startswith('shapes differ') and 'no readable' in message


def test_a_snapshot_mismatch_names_the_config_field_and_its_fix_too(tmp_path):
    """A keeper's snapshot written with d_model=32, restored with 64: the same explanation
    as a checkpoint's, and the same error type (the worker's restore raises it)."""
    from mecefo_jax.snapshot.jax_io import SnapshotMismatchError
    old = get_config()
    config_record.write_config_record(str(tmp_path), old)
    new = get_config()
    new.model.d_model = 2 * old.model.d_model
    error = SnapshotMismatchError('params/embed was saved as float32[256, 32]')
    explained = config_record.explain_mismatch(error, str(tmp_path), new)
    assert isinstance(explained, SnapshotMismatchError)
    assert str(explained).startswith(str(error))
    assert f'--config.model.d_model={old.model.d_model}' in str(explained)
