"""TensorBoard summaries (`training/summaries.py`) as TensorBoard's own Python loader reads them back.

The server tests (tests/tensorboard_test.py, tests/launch_test.py) read
through TensorBoard's default data server; these read the same files with its Python
`EventAccumulator` (`--load_fast=false`), which purges only at a run's second START.
"""
import os

import pytest

from mecefo_jax.training.metrics import MetricsWriter, read_metrics
from mecefo_jax.training.summaries import LAUNCH_RUN, TRAIN_RUN, Summaries, recovery_scalars, row_scalars, run_dir


def _loaded(logdir: str) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(logdir)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()['scalars']}


def _loss_rows(writer, steps, offset):
    for step in steps:
        writer.write({'step': step, 'loss': float(step + offset), 'replicas': 8})


def test_a_resume_and_a_rollback_leave_each_step_once_with_the_newest_value(tmp_path):
    workdir = str(tmp_path)
    with MetricsWriter(workdir, process_index=0, tensorboard=True) as first:
        first.truncate_after(0)  # a fresh start
        _loss_rows(first, range(1, 7), 0)
    with MetricsWriter(workdir, process_index=0, tensorboard=True) as second:
        second.truncate_after(3)  # resumed at step 3: 4 to 6 are redone
        _loss_rows(second, range(4, 6), 100)
        second.rolled_back(4)  # and, in process, a restart back to 4
        _loss_rows(second, range(5, 8), 200)
    assert len(os.listdir(run_dir(workdir, TRAIN_RUN))) == 3
    loaded = _loaded(run_dir(workdir, TRAIN_RUN))
    assert loaded['train/loss'] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 104.0), (5, 205.0), (6, 206.0), (7, 207.0)]
    assert [s for s, _ in loaded['fault/replicas']] == list(range(1, 8))
    # metrics.jsonl cut the resume alike; an in-process restart keeps both rows there.
    assert [r['step'] for r in read_metrics(workdir)] == [1, 2, 3, 4, 5, 5, 6, 7]


def test_the_launchers_series_are_never_purged(tmp_path):
    """Recovery rows come at any step (a later failure may hit an earlier step after a
    rollback); each is kept, by a relaunched launcher's writer too."""
    logdir = run_dir(str(tmp_path), LAUNCH_RUN)
    for row in ({'kind': 'failure', 'completed_steps': 8, 'recovery_sec': 2.5, 'redone_steps': 3,
                 'failed_at': 1.7e9, 'failed_workers': [1], 'members': [0]},
                {'kind': 'failure', 'completed_steps': 6, 'recovery_sec': 1.5, 'redone_steps': 0,
                 'failed_workers': [0, 1], 'members': [0, 1]}):
        writer = Summaries(logdir)  # a launcher each
        writer.write(*recovery_scalars(row))
        writer.close()
    loaded = _loaded(logdir)
    assert loaded['launch/failure/recovery_sec'] == [(8, 2.5), (6, 1.5)]
    assert loaded['launch/failure/failed_workers'] == [(8, 1.0), (6, 2.0)]
    assert loaded['launch/live_workers'] == [(8, 1.0), (6, 2.0)]
    assert 'launch/failure/failed_at' not in loaded  # a time of day, not a duration


@pytest.mark.parametrize('row, scalars', [
    ({'step': 5, 'loss': 2.0, 'grad_norm': 0.5, 'neighbour_rows': 2}, {'train/loss': 2.0, 'train/grad_norm': 0.5,
                                                                      'fault/neighbour_rows': 2.0}),
    ({'step': 5, 'val_loss': 2.0, 'val_ppl': 7.4}, {'eval/val_loss': 2.0, 'eval/val_ppl': 7.4}),
    ({'event': 'failure', 'step': 3, 'replicas': [1], 'relaunch': False, 'lost_steps': 0, 'compile_sec': 1.5},
     {'events/failure/lost_steps': 0.0, 'events/failure/compile_sec': 1.5}),
    ({'event': 'resumed', 'step': 8, 'source': 'disk'}, {}),
])
def test_each_numeric_field_of_a_row_is_a_scalar_named_by_what_it_measures(row, scalars):
    assert row_scalars(row) == scalars
