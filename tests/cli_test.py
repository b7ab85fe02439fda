"""Tests for mecefo_jax.cli (config files and overrides) and the ConfigDict fallback."""
import argparse
import copy
import json
import os
import subprocess
import sys

import pytest

from mecefo_jax import cli
from mecefo_jax.configdict import MinimalConfigDict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, 'configs', 'tiny.py')


def _parser():
    parser = argparse.ArgumentParser()
    parser.add_argument('--config', required=True)
    parser.add_argument('--iters', type=int, default=5)
    return parser


def test_overrides_are_coerced_to_the_fields_type():
    args, cfg = cli.parse(_parser(), [
        '--config', TINY, '--iters', '0', '--config.model.d_model=48',
        '--config.mecefo.rank=128', '--config.mecefo.remat_ffn=true',
        '--config.model.dtype', 'bfloat16', '--config.train.learning_rate=1e-3'])
    assert args.iters == 0
    assert cfg.model.d_model == 48 and isinstance(cfg.model.d_model, int)
    # A float field stays a float: resolve_rank reads 128.0 as absolute.
    assert cfg.mecefo.rank == 128.0 and isinstance(cfg.mecefo.rank, float)
    assert cfg.mecefo.remat_ffn is True  # the default is False
    assert cfg.model.dtype == 'bfloat16'
    assert cfg.train.learning_rate == 1e-3


@pytest.mark.parametrize('override, message', [
    ('--config.model.d_modle=48', "model has no field 'd_modle'"),
    ('--config.modle.d_model=48', "no section 'modle'"),
    ('--config.model.d_model=4.5', 'model.d_model is of type int'),
    ('--config.mecefo.remat_ffn=maybe', 'mecefo.remat_ffn is of type bool'),
    ('--config.model=3', 'is a section'),
])
def test_bad_overrides_name_the_field(override, message, capsys):
    with pytest.raises(SystemExit):
        cli.parse(_parser(), ['--config', TINY, override])
    assert message in capsys.readouterr().err


def test_loaded_config_is_locked():
    cfg = cli.load_config(TINY)
    with pytest.raises(AttributeError):
        cfg.model.new_field = 1
    with pytest.raises(FileNotFoundError, match='--config=nope.py'):
        cli.load_config('nope.py')


def test_minimal_configdict_behaves_like_ml_collections():
    cfg = MinimalConfigDict()
    cfg.model = {'d_model': 64, 'rate': 0.5, 'name': 'x'}
    cfg.flag = True
    assert isinstance(cfg.model, MinimalConfigDict)
    assert cfg['model']['d_model'] == cfg.model.d_model == 64
    assert cfg.get('missing', 7) == 7 and 'flag' in cfg
    cfg.model.rate = 2  # int into a float field: widened, as ml_collections does
    assert cfg.model.rate == 2.0 and isinstance(cfg.model.rate, float)
    with pytest.raises(TypeError, match="field 'd_model'"):
        cfg.model.d_model = 'wide'
    clone = copy.deepcopy(cfg)
    clone.model.d_model = 128
    assert cfg.model.d_model == 64
    cfg.lock()
    with pytest.raises(AttributeError, match='locked'):
        cfg.model.extra = 1
    cfg.model.d_model = 96  # existing fields can still change
    with cfg.unlocked():
        cfg.model.extra = 1
    assert cfg.is_locked and cfg.model.extra == 1
    assert json.loads(cfg.to_json_best_effort()) == {
        'model': {'d_model': 96, 'rate': 2.0, 'name': 'x', 'extra': 1}, 'flag': True}
    with pytest.raises(AttributeError, match="'nope' is not a field"):
        _ = cfg.nope


@pytest.mark.subprocess
def test_config_module_falls_back_without_ml_collections():
    # In a fresh interpreter where `import ml_collections` fails, the base
    # config is built from the fallback and equals the ml_collections one.
    code = ('import sys, json; sys.modules["ml_collections"] = None\n'
            'from mecefo_jax import config, configdict\n'
            'assert not configdict.HAVE_ML_COLLECTIONS\n'
            'cfg = config.llama_config(d_model=8, num_layers=1, num_heads=2, ffn_hidden=16, '
            'learning_rate=1e-3)\n'
            'assert type(cfg).__name__ == "MinimalConfigDict"\n'
            'print(json.dumps(cfg.to_dict()))\n')
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    from mecefo_jax import config
    real = config.llama_config(d_model=8, num_layers=1, num_heads=2, ffn_hidden=16,
                               learning_rate=1e-3)
    assert json.loads(proc.stdout) == json.loads(real.to_json_best_effort())
