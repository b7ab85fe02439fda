"""What TensorBoard reads of a run (`<workdir>/tensorboard`): scalars and the fault story, on one step axis.

`MetricsWriter` hands every row it writes here (process 0 only, `train.tensorboard`), so
TensorBoard's run `train` shows what metrics.jsonl holds, at the same steps: a row's
numeric fields become scalars tagged by what they measure (`tag`); the launcher writes
its recoveries into the run `launch`. A resumed or rolled-back run appends a new event
file that opens with a SessionLog.START at the step after the one it resumes from:
TensorBoard drops what earlier files hold from that step on (the steps redone), as
`MetricsWriter.truncate_after` cuts them from metrics.jsonl. Every file opens so, the
first included: TensorBoard's Python loader takes a run's first START for a plain start.

`train.profile_steps` puts a jax.profiler trace under the same run `train`
(`training/loop.py`'s `ProfileSteps`), so `tensorboard --logdir <workdir>` lists it beside
the scalars.
"""
from __future__ import annotations

import importlib
import itertools
import os
import threading
import time

TENSORBOARD_DIR = 'tensorboard'  # under the workdir; `tensorboard --logdir <workdir>` finds it
TRAIN_RUN, LAUNCH_RUN = 'train', 'launch'  # TensorBoard's runs: the main job's process 0, the launcher


def run_dir(workdir: str, run: str) -> str:
    """Where TensorBoard's `run` of the job in `workdir` lives (a jax.profiler trace of the main
    job goes under its TRAIN_RUN too, where the profile plugin looks)."""
    return os.path.join(os.fspath(workdir), TENSORBOARD_DIR, run)


# What a field of a metrics row measures: its TensorBoard group (others: 'train').
_GROUPS = {'val_loss': 'eval', 'val_ppl': 'eval', 'replicas': 'fault', 'neighbour_rows': 'fault',
           'checkpoint_sec': 'cost', 'snapshot_block_sec': 'cost'}
_NOT_SCALARS = ('step', 'event')
_FILES = itertools.count()  # event files this process opened: with the pid, a name no other writer takes


def tag(key: str, event: str | None = None) -> str:
    """The TensorBoard tag of field `key` of a metrics row: 'events/<event>/<key>' in an event
    row (a failure, a recovery, a resume), else '<group>/<key>'."""
    if event:
        return f'events/{event}/{key}'
    return f"{_GROUPS.get(key, 'train')}/{key}"


def row_scalars(row: dict) -> dict[str, float]:
    """{tag: value} for the numeric fields of a metrics row (not its step; flags and lists aside)."""
    event = row.get('event')
    return {tag(key, event): float(value) for key, value in row.items()
            if key not in _NOT_SCALARS and isinstance(value, (int, float)) and not isinstance(value, bool)}


def recovery_scalars(row: dict) -> tuple[int, dict[str, float]]:
    """(step, {tag: value}) of a launcher's recovery row (`launch/recoveries.jsonl`): at the
    step the job had completed when it failed, its durations, steps and bytes as
    'launch/<kind>/<key>', the failed workers' count and the workers of the next generation."""
    kind = row.get('kind', 'recovery')
    scalars = {f'launch/{kind}/{key}': float(value) for key, value in row.items()
               if key.endswith(('_sec', '_steps', '_step', '_bytes'))
               and isinstance(value, (int, float)) and not isinstance(value, bool)}
    scalars[f'launch/{kind}/failed_workers'] = float(len(row.get('failed_workers') or ()))
    if row.get('members') is not None:
        scalars['launch/live_workers'] = float(len(row['members']))
    return int(row.get('completed_steps') or 0), scalars


class Summaries:
    """One event file at a time in `logdir`, opened at the first scalar after each `purge_from`
    (module docstring). tensorboardX's `EventsWriter` writes in the caller's thread and each
    row is flushed, so a killed process loses none that metrics.jsonl holds."""

    def __init__(self, logdir: str):
        self.logdir = logdir
        self._writer = None
        self._purge_step: int | None = None  # None: a run whose steps are never redone (the launcher's)
        # tensorboardX's import (boto3's and Google Cloud's too, where installed) takes a
        # fraction of a second: begun now, it overlaps the restore and the compile instead
        # of delaying a relaunch's first row, which its recovery time counts.
        threading.Thread(target=importlib.import_module, args=('tensorboardX.summary',), daemon=True).start()

    def purge_from(self, step: int) -> None:
        """The next writer hides what earlier ones wrote at `step` and later (steps redone)."""
        self.close()
        self._purge_step = int(step)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if not scalars:
            return
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar
        writer = self._writer or self._open()
        now = time.time()
        for name, value in scalars.items():
            writer.write_event(Event(wall_time=now, step=int(step), summary=scalar(name, value)))
        writer.flush()

    def _open(self):
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        os.makedirs(self.logdir, exist_ok=True)
        # Names hold the second they were opened: without the pid and the count, a writer
        # opened within the same second would overwrite another's file.
        suffix = f'.{os.getpid()}.{next(_FILES):04d}'
        self._writer = EventsWriter(os.path.join(self.logdir, 'events'), suffix)
        if self._purge_step is not None:
            self._writer.write_event(Event(wall_time=time.time(), step=self._purge_step,
                                           session_log=SessionLog(status=SessionLog.START)))
        return self._writer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
