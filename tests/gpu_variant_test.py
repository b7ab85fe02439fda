"""configs/llama_*.py's GPU variant (`--config configs/llama_350m.py:gpu`): the GPU sweep's
winners, set only there, so every CPU default stays as it is.

`CPU_SPEED_FIELDS` records what each config sets today, with no variant, for the
fields a GPU variant may change; a sweep's winners belong in the config's `GPU`
settings, never in these.
"""
import glob
import importlib.util
import os

import pytest

from mecefo_jax.config.defaults import GPU_VARIANT_FIELDS, with_variant
from mecefo_jax.config.resolve import resolve

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMAS = sorted(glob.glob(os.path.join(ROOT, 'configs', 'llama_*.py')))
_CPU = {'model.attention': 'auto', 'model.remat_policy': 'none', 'model.scan_layers': True,
        'model.loss_chunk_tokens': 4096, 'train.flat_optimizer': False}
CPU_SPEED_FIELDS = {'llama_60m': _CPU, 'llama_130m': _CPU, 'llama_350m': _CPU, 'llama_1b': _CPU,
                    'llama_7b': dict(_CPU, **{'model.remat_policy': 'full'})}


def _module(path):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fields(cfg) -> dict:
    return {f'{section}.{name}': value for section, fields in cfg.to_dict().items()
            for name, value in fields.items()}


def test_every_llama_config_is_listed():
    assert sorted(CPU_SPEED_FIELDS) == [os.path.basename(p)[:-3] for p in LLAMAS]


@pytest.mark.parametrize('path', LLAMAS, ids=os.path.basename)
def test_the_gpu_variant_changes_only_its_gpu_settings(path):
    module = _module(path)
    cpu, gpu = resolve(module.get_config()), resolve(module.get_config('gpu'))
    name = os.path.basename(path)[:-3]
    assert {f: _fields(cpu)[f] for f in GPU_VARIANT_FIELDS} == CPU_SPEED_FIELDS[name]
    changed = {k: v for k, v in _fields(gpu).items() if _fields(cpu)[k] != v}
    assert set(changed) <= set(module.GPU) <= set(GPU_VARIANT_FIELDS)
    assert all(_fields(gpu)[k] == v for k, v in module.GPU.items())


def test_a_variant_is_gpu_or_none_and_sets_speed_fields_only():
    module = _module(LLAMAS[0])
    with pytest.raises(ValueError, match="variant 'tpu'"):
        module.get_config('tpu')
    with pytest.raises(ValueError, match=r"\['train.learning_rate'\]"):
        with_variant(module.get_config(), 'gpu', {'train.learning_rate': 1.0})
