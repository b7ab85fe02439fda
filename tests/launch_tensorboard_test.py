"""TensorBoard for a launcher job that loses a worker, read back from the real `tensorboard` server.

Worker 1 is SIGKILLed around step 7 with snapshots every 5 steps and checkpoints every
2 (tests/launch_test.py's plain kill): the relaunched job redoes the steps past the tier
it resumes from. Its `train` run must hold every metrics.jsonl step once, with the
values of the generation that finished it; the launcher's `launch` run the failure's
series at the step it hit.
"""
import numpy as np
import pytest
from launch_jobs import launch, overrides
from tensorboard_server import assert_every_metric_once, serve

from mecefo_jax.training.summaries import LAUNCH_RUN, TRAIN_RUN

pytestmark = [pytest.mark.subprocess, pytest.mark.ray]  # Ray's processes and workers; the server

STEPS = 12


def test_a_job_that_loses_a_worker_shows_each_step_once_and_the_recovery(cluster, launcher_caches, tmp_path):
    workdir = str(tmp_path)
    summary = launch(overrides(launcher_caches, **{'launch.kill': '7:1', 'snapshot.every': 5,
                                                   'train.checkpoint_every': 2, 'train.steps': STEPS,
                                                   'train.log_every': 1}), workdir)
    (failure,) = summary['recoveries']
    assert failure['kind'] == 'failure' and failure['redone_steps'] >= 1
    with serve(workdir, wait_for_run=f'tensorboard/{LAUNCH_RUN}') as server:
        train = server.scalars(f'tensorboard/{TRAIN_RUN}')
        recovery = server.scalars(f'tensorboard/{LAUNCH_RUN}')
    assert_every_metric_once(workdir, train)
    assert [s for s, _ in sorted(train['train/loss'])] == list(range(1, STEPS + 1))
    assert dict(train['fault/replicas'])[STEPS] == 2  # worker 1's two replicas stay down
    assert 'cost/snapshot_block_sec' in train
    at = failure['completed_steps']
    for key in ('recovery_sec', 'detect_sec', 'restore_sec', 'compile_sec', 'redone_steps', 'resume_step'):
        ((step, value),) = recovery[f'launch/failure/{key}']
        assert step == at and np.float32(value) == np.float32(failure[key]), key
    assert recovery['launch/failure/failed_workers'] == [(at, 1.0)]
    assert recovery['launch/live_workers'] == [(at, 1.0)]  # the survivor, relaunched
