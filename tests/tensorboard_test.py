"""TensorBoard for a run of the main job, read back from the real `tensorboard` server, and its profiler trace.

A tiny run under a failure (replica 1 down at steps 2 and 3, MeCeFO's neighbour), with a
trace of steps 2 and 3, loses its newest checkpoint and resumes from the one before: the
steps it redoes must show once, with the rerun's values, as metrics.jsonl holds them.
"""
import os
import shutil

import pytest
from tensorboard_server import assert_every_metric_once, serve

from configs.tiny import get_config
from mecefo_jax.config.resolve import resolve, updated
from mecefo_jax.training.metrics import read_metrics
from mecefo_jax.training.summaries import TRAIN_RUN, run_dir

pytestmark = pytest.mark.subprocess  # the tensorboard server

STEPS, RUN = 10, f'tensorboard/{TRAIN_RUN}'  # the run's name under --logdir <workdir>


@pytest.fixture(scope='module')
def workdir(tmp_path_factory, tokenizer_cache):
    from mecefo_jax.run import run
    workdir = str(tmp_path_factory.mktemp('watched'))
    cfg = updated(resolve(get_config()), {
        'train.steps': STEPS, 'train.log_every': 1, 'train.eval_every': 5, 'train.checkpoint_every': 4,
        'train.profile_steps': '2:4', 'fault.strategy': 'mecefo', 'fault.events': '2:1:2',
        'data.cache_dir': tokenizer_cache})
    run(cfg, workdir)
    shutil.rmtree(os.path.join(workdir, 'checkpoints', str(STEPS)))  # lost: the rerun redoes 9 and 10
    run(cfg, workdir)
    return workdir


def test_every_logged_step_shows_once_with_its_value_after_a_rollback(workdir):
    rows = read_metrics(workdir)
    assert [r['step'] for r in rows if r.get('event') == 'resumed'] == [8]
    with serve(workdir, wait_for_run=RUN) as server:
        scalars = server.scalars(RUN)
    assert assert_every_metric_once(workdir, scalars) >= 7 * STEPS  # 7 fields in each loss row
    # The loss, the evaluations and the fault story, each on the step axis.
    assert [s for s, _ in sorted(scalars['train/loss'])] == list(range(1, STEPS + 1))
    assert [s for s, _ in sorted(scalars['eval/val_loss'])] == [5, 10]
    assert {'train/learning_rate', 'train/step_sec', 'train/tokens_per_sec', 'train/grad_norm',
            'cost/checkpoint_sec', 'events/failure/compile_sec', 'events/recovery/first_step_sec'} <= set(scalars)
    assert dict(scalars['fault/replicas'])[3] == 7  # replica 1 down at steps 2 and 3: 7 of 8 live
    assert dict(scalars['fault/neighbour_rows'])[3] > 0 == dict(scalars['fault/neighbour_rows'])[5]


def test_the_profile_plugin_lists_the_trace_of_the_chosen_steps(workdir):
    sessions = os.listdir(os.path.join(run_dir(workdir, TRAIN_RUN), 'plugins', 'profile'))
    assert len(sessions) == 1  # the rerun started past the window
    files = os.listdir(os.path.join(run_dir(workdir, TRAIN_RUN), 'plugins', 'profile', sessions[0]))
    assert 'perfetto_trace.json.gz' in files and any(f.endswith('.xplane.pb') for f in files)
    with serve(workdir, wait_for_run=RUN) as server:
        assert server.get('/data/plugin/profile/runs') == [f'{RUN}/{sessions[0]}']


def test_tensorboard_off_writes_nothing(tmp_path, tokenizer_cache):
    from mecefo_jax.run import run
    run(updated(resolve(get_config()), {'train.steps': 1, 'train.tensorboard': False, 'train.checkpoint_every': 0,
                                        'train.eval_every': 0, 'data.cache_dir': tokenizer_cache}), str(tmp_path))
    assert read_metrics(str(tmp_path)) and not os.path.exists(tmp_path / 'tensorboard')
