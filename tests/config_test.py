"""The config: configs/*.py, `--config.a.b=v` overrides, `config_resolve.resolve` and its errors."""
import dataclasses
import glob
import json
import os
import signal
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from configs.tiny import get_config
from mecefo_jax.config import defaults as settings
from mecefo_jax.config import resolve as config_resolve
from mecefo_jax.config.resolve import updated
from mecefo_jax.launch.chaos import LAUNCHER, Kill, parse_kills
from mecefo_jax.launch.launcher import Launcher
from mecefo_jax.parallel.sharding import mesh_shape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, 'configs', 'tiny.py')


def parse(*args):
    """The ConfigDict a command line gives, through absl and config_flags as every entry point."""
    flag_values = flags.FlagValues()
    holder = config_flags.DEFINE_config_file('config', None, 'config', flag_values=flag_values,
                                             lock_config=True)
    argv = ['prog', f'--config={TINY}', *args]
    saved, sys.argv = sys.argv, argv  # config_flags reads the overrides from sys.argv
    try:
        flag_values(argv)
    finally:
        sys.argv = saved
    return holder.value


def tiny(**fields):
    cfg = get_config()
    for dotted, value in fields.items():
        section, name = dotted.split('__')
        cfg[section][name] = value
    return cfg


@pytest.mark.parametrize('path', sorted(glob.glob(os.path.join(ROOT, 'configs', '*.py'))))
def test_every_config_resolves_and_serialises_as_its_configdict(path):
    flag_values = flags.FlagValues()
    holder = config_flags.DEFINE_config_file('config', None, 'config', flag_values=flag_values)
    flag_values(['prog', f'--config={path}'])
    cfg = config_resolve.resolve(holder.value)
    # The workdir's config.json keeps the content ml_collections wrote.
    assert cfg.to_json() == holder.value.to_json_best_effort(indent=2)


def test_overrides_round_trip_through_resolve_typed():
    cfg = config_resolve.resolve(parse(
        '--config.model.d_model=48', '--config.mecefo.rank=128', '--config.mecefo.remat_ffn=true',
        '--config.model.dtype', 'bfloat16', '--config.train.learning_rate=1e-3',
        '--config.fault.events=5:1:10'))
    assert cfg.model.d_model == 48 and isinstance(cfg.model.d_model, int)
    # A float field stays a float: resolve_rank reads 128.0 as absolute.
    assert cfg.mecefo.rank == 128.0 and isinstance(cfg.mecefo.rank, float)
    assert cfg.mecefo.remat_ffn is True  # the default is False
    assert cfg.model.dtype == 'bfloat16' and cfg.train.learning_rate == 1e-3
    assert cfg.fault.events == '5:1:10'
    assert config_resolve.resolve(json.loads(cfg.to_json())) == cfg
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.steps = 3


@pytest.mark.parametrize('override, message', [
    ('--config.model.d_modle=48', 'd_modle'),
    ('--config.model.d_model=4.5', 'model.d_model'),
    ('--config.mecefo.remat_ffn=maybe', 'mecefo.remat_ffn'),
])
def test_bad_override_is_refused_naming_the_field(override, message):
    # config_flags' own errors: an unknown field is an AttributeError with a suggestion.
    with pytest.raises((flags.Error, AttributeError), match=message):
        parse(override)


# Every documented bad input: (fields, the field named, the fix offered).
BAD = [
    ({'mecefo__tau': 0}, 'mecefo.tau=0', '--config.mecefo.tau=100'),
    ({'fault__events': 'garbage'}, 'fault.events', '--config.fault.events='),
    ({'fault__events': '40:1:2'}, 'run has only 40 steps', '--config.fault.events='),
    ({'fault__events': '2:3:4,4:3:2'}, 'replica 3 fails again', '--config.fault.events='),
    ({'fault__regime': 'bogus'}, "fault.regime='bogus'", "--config.fault.regime=''"),
    ({'fault__strategy': 'pray'}, "fault.strategy='pray'", '--config.fault.strategy=mecefo'),
    ({'fault__mtbf_hours': -1.0, 'fault__mttr_hours': 1.0}, 'fault.mtbf_hours=-1.0: must be >= 0',
     '--config.fault.mtbf_hours=0.0'),
    ({'fault__regime_replicas': -1}, 'fault.regime_replicas=-1: must be >= 0',
     '--config.fault.regime_replicas=0'),
    ({'fault__max_neighbour_rows': -1}, 'fault.max_neighbour_rows=-1: must be >= 0',
     '--config.fault.max_neighbour_rows=0'),
    ({'fault__max_neighbour_rows': 8}, 'fault.max_neighbour_rows=8: caps the plans of '
     'fault.strategy=mecefo_planned only', '--config.fault.max_neighbour_rows=0'),
    ({'fault__mtbf_hours': 2.0}, 'fault.mttr_hours', '--config.fault.mttr_hours='),
    ({'fault__mttr_hours': 2.0}, 'fault.mtbf_hours=0.0', '--config.fault.mttr_hours='),
    ({'fault__step_time_sec': 0.0}, 'fault.step_time_sec=0.0', '--config.fault.step_time_sec=60'),
    ({'snapshot__parity': 'raid'}, "snapshot.parity='raid'", "--config.snapshot.parity=''"),
    ({'train__profile_steps': '5'}, "train.profile_steps='5': must be '' or 'START:STOP'",
     "--config.train.profile_steps=''"),
    ({'train__profile_steps': '30:50'}, 'must end by train.steps=40', "--config.train.profile_steps='30:40'"),
    ({'snapshot__slots': 1}, 'snapshot.slots=1', '--config.snapshot.slots=3'),
    ({'mesh__data': 0}, 'mesh.data=0', '--config.mesh.data=-1'),
    ({'mesh__data': 3}, 'must be a multiple of mesh.data=3', '--config.data.global_batch_size='),
    ({'model__num_heads': 3}, 'model.num_heads=3', '--config.model.num_heads='),
    ({'model__dtype': 'float16'}, "model.dtype='float16'", '--config.model.dtype=float32'),
    ({'model__remat_policy': 'some'}, "model.remat_policy='some'", '--config.model.remat_policy='),
    ({'data__val_fraction': 1.0}, 'data.val_fraction=1.0', '--config.data.val_fraction=0.05'),
    ({'data__source': 'web'}, "data.source='web'", '--config.data.source=embedded'),
    ({'train__steps': 0}, 'train.steps=0', '--config.train.steps=200'),
    ({'train__grad_clip': -1.0}, 'train.grad_clip=-1.0', '--config.train.grad_clip=1.0'),
    ({'mecefo__rank': 0.0}, 'mecefo.rank=0.0', '--config.mecefo.rank=0.25'),
    ({'mecefo__rank': 2.5}, 'mecefo.rank=2.5', '--config.mecefo.rank=0.25'),
    ({'mecefo__projection': 'svd'}, "mecefo.projection='svd': must be one of 'weights', "
     "'gradient'", '--config.mecefo.projection=weights'),
    ({'launch__recovery': 'tape'}, "launch.recovery='tape'", '--config.launch.recovery=memory'),
]


@pytest.mark.parametrize('fields, named, fix', BAD, ids=[str(b[0]) for b in BAD])
def test_bad_input_is_an_error_naming_the_field_and_the_fix(fields, named, fix):
    with pytest.raises(settings.ConfigError) as error:
        config_resolve.resolve(tiny(**fields))
    assert named in str(error.value) and fix in str(error.value)


def test_tau_zero_is_an_error_without_failures_too():
    # It used to be checked only by the fault controller.
    cfg = tiny(mecefo__tau=0)
    assert not cfg.fault.events and not cfg.fault.regime
    with pytest.raises(settings.ConfigError, match='mecefo.tau=0'):
        config_resolve.resolve(cfg)


def test_unknown_missing_and_mistyped_fields_are_named():
    values = config_resolve.resolve(get_config()).to_dict()
    values['model']['width'] = 3
    with pytest.raises(settings.ConfigError, match='model.width: no such config field'):
        config_resolve.resolve(values)
    del values['model']['width'], values['train']['steps']
    with pytest.raises(settings.ConfigError, match='train.steps: missing'):
        config_resolve.resolve(values)
    values['train']['steps'] = '40'
    with pytest.raises(settings.ConfigError, match="train.steps='40': must be an int"):
        config_resolve.resolve(values)


def test_updated_is_validated_and_leaves_the_original():
    cfg = config_resolve.resolve(get_config())
    seeded = updated(cfg, {'fault.seed': 3, 'train.eval_every': 0})
    assert (seeded.fault.seed, seeded.train.eval_every) == (3, 0)
    assert cfg.fault.seed == 0 and cfg.train.eval_every == 20
    with pytest.raises(settings.ConfigError, match='mecefo.tau=0'):
        updated(cfg, {'mecefo.tau': 0})
    with pytest.raises(settings.ConfigError, match='train.stepz'):
        updated(cfg, {'train.stepz': 1})


def test_a_mesh_must_use_every_device():
    mesh = config_resolve.resolve(tiny(mesh__data=2)).mesh
    with pytest.raises(ValueError, match='mesh.data=2 x mesh.model=1 uses 2 of the 8') as error:
        mesh_shape(mesh, 8)
    assert '--config.mesh.data=-1' in str(error.value)
    assert mesh_shape(mesh, 8, allow_subset=True) == (2, 1)  # the step benchmark's choice
    assert mesh_shape(config_resolve.resolve(get_config()).mesh, 8) == (8, 1)


def test_launcher_hands_its_resolved_config_and_placement_to_every_worker(tmp_path):
    from mecefo_jax.config.record import write_config_record
    from mecefo_jax.launch.generation import Generation
    from mecefo_jax.training.resume import Tier
    cfg = config_resolve.resolve(parse('--config.train.steps=7', '--config.mesh.data=4',
                                 '--config.launch.local_devices=2', '--config.fault.seed=5'))
    launcher = Launcher(cfg, str(tmp_path), 2, log=lambda _: None)
    args = launcher.worker_args(Generation(3, [0, 1], Tier.MEMORY, 0, resume_step=5))
    # Every worker is handed the launcher's config and placement themselves, not a text
    # to resolve and check again.
    for w in (0, 1):
        assert args[w]['cfg'] is cfg and args[w]['placement'] is launcher.job.placement
        assert (args[w]['generation'], args[w]['resume'], args[w]['resume_step']) == (3, 'memory', 5)
    assert args[1]['cfg'].train.steps == 7
    # The workdir's run is the job's own (its workers may start it over when nothing was
    # saved) only where the workdir's config record fits, the launcher's own fields aside:
    # none, or another run's, is not.
    assert not args[0]['own_run']
    write_config_record(str(tmp_path), config_resolve.updated(cfg, {'train.steps': 8}))
    assert not launcher.worker_args(Generation(3, [0, 1], Tier.FRESH, 0))[0]['own_run']
    write_config_record(str(tmp_path), config_resolve.updated(cfg, {'launch.max_relaunches': 3}))
    assert launcher.worker_args(Generation(3, [0, 1], Tier.FRESH, 0))[0]['own_run']
    # The workdir's first generation is no launcher's rerun: a run found there is another's.
    assert not launcher.worker_args(Generation(0, [0, 1], Tier.FRESH, 0))[0]['own_run']


def test_launch_kill_reads_every_form_and_names_the_format_when_it_cannot():
    assert parse_kills('12:1, 8:0:STOP,9:2:KILL:keeper,3:1:KILL:publish,4:0:KILL:snapshot',
                       3) == [
        Kill(12, 1), Kill(8, 0, signal.SIGSTOP), Kill(9, 2, keeper=True),
        Kill(3, 1, in_publish=True), Kill(4, 0, after_snapshot=True)]
    assert parse_kills('5:1:node,6:2:node:snapshot,7:launcher,8:launcher:TERM:snapshot', 3) == [
        Kill(5, 1, node=True), Kill(6, 2, after_snapshot=True, node=True), Kill(7, LAUNCHER),
        Kill(8, LAUNCHER, signal.SIGTERM, after_snapshot=True)]
    for bad in ('3', '3:1:KILL:somewhere', '3:1:NOSUCHSIG', '3:1:KILL:keeper:x',
                '3:launcher:KILL:keeper', '3:launcher:node', '3:1:node:publish'):
        with pytest.raises(ValueError, match='STEP:WORKER'):
            parse_kills(bad, 2)
    with pytest.raises(ValueError, match='worker 5 of 2 workers'):
        parse_kills('3:5', 2)
    with pytest.raises(ValueError, match="host's crash.*'3:1:KILL:keeper'"):
        parse_kills('3:1:TERM:keeper', 2)


@pytest.mark.subprocess  # python -m mecefo_jax.main
def test_bad_config_ends_main_with_the_message_last_and_nothing_written(tmp_path):
    workdir = tmp_path / 'run'
    for override, message in (('--config.fault.events=garbage', 'fault.events'),
                              ('--config.fault.regime=bogus', "fault.regime='bogus'")):
        proc = subprocess.run(
            [sys.executable, '-m', 'mecefo_jax.main', f'--config={TINY}',
             f'--workdir={workdir}', override],
            cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
            timeout=300)
        assert proc.returncode == 1
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith('config error: ') and message in last, proc.stderr[-2000:]
        assert 'cannot schedule new futures' not in proc.stderr
        assert not workdir.exists()
