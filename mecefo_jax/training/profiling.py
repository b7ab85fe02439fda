"""`train.profile_steps`: a jax.profiler trace of chosen steps of a run, where TensorBoard and Perfetto find it.

The trace goes under TensorBoard's `train` run (`<workdir>/tensorboard/train/plugins/
profile/<session>/`: `<host>.xplane.pb` for the profile plugin, `perfetto_trace.json.gz`
for ui.perfetto.dev), so `tensorboard --logdir <workdir>` lists it beside the scalars.
Process 0 traces (one trace file per host name; processes of one host would share it).
The trace starts before the first chosen step is dispatched and stops once the last one
has finished on the device, so it holds their device time, not only their dispatch.
"""
from __future__ import annotations

import jax

from mecefo_jax.training.observers import Observer
from mecefo_jax.training.summaries import TRAIN_RUN, run_dir


class ProfileSteps(Observer):
    """Traces steps `start` to `stop - 1` (`train.profile_steps='START:STOP'`) once per process."""

    def __init__(self, workdir: str, start: int, stop: int, *, process_index: int | None = None):
        self.logdir = run_dir(workdir, TRAIN_RUN)
        self.start, self.stop = start, stop
        self.active = (jax.process_index() if process_index is None else process_index) == 0
        self.tracing = self.traced = False

    def on_plan(self, planned) -> None:
        if self.active and not (self.tracing or self.traced) and self.start <= planned.step < self.stop:
            jax.profiler.start_trace(self.logdir, create_perfetto_trace=True)
            self.tracing = True

    def on_step(self, done) -> None:
        if self.tracing and done.step >= self.stop - 1:
            jax.block_until_ready(done.state)
            self.close()

    def close(self) -> None:
        """Stop a trace still open (a run that ended or stopped inside the window)."""
        if self.tracing:
            jax.profiler.stop_trace()
            self.tracing, self.traced = False, True
