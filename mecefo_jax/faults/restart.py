"""Checkpoint/restart: the baseline that recovers by relaunching from disk.

Failures are detected as by the fault controller (same schedule, same agreed
live mask, same layouts: every replica normal), but instead of moving the
live state it restores its latest Orbax checkpoint onto the new mesh and
redoes the steps since. It saves every `fault.checkpoint_every` steps, once
before the first step (a step to fall back to) and at every recovery
(growing back loses nothing); the seconds training waits for those saves are
charged as `checkpoint_block_sec`. The relaunch a real cluster imposes is
added as a configured, separately reported delay (`fault.relaunch_delay_sec`
per event), not measured.
"""
import os
import time

from mecefo_jax.checkpointing import checkpoint as ckpt_lib
from mecefo_jax.faults.controller import FaultController
from mecefo_jax.training import resume


class RestartController(FaultController):
    """`fault.strategy=checkpoint_restart` (see module docstring)."""

    def __init__(self, run, schedule, strategy: str):
        super().__init__(run, schedule, strategy)
        self._ckpt = ckpt_lib.Checkpointer(
            os.path.join(run.workdir, 'restart_checkpoints'),
            save_every=run.cfg.fault.checkpoint_every, keep=2)
        self.stop_checkpointer = self._ckpt
        self._initial_saved = False

    def prepare(self, clock: int, step: int, state):
        if not self._initial_saved:
            self.checkpoint_block_sec += self._ckpt.maybe_save(
                step, state, self.run.train_data.get_state(), force=True)
            self._initial_saved = True
        return super().prepare(clock, step, state)

    def after_dispatch(self, clock: int, step: int, state, dispatched: float) -> list:
        events = super().after_dispatch(clock, step, state, dispatched)
        self.checkpoint_block_sec += self._ckpt.maybe_save(
            step + 1, state, self.run.train_data.get_state())
        return events

    def summary(self) -> dict:
        out = super().summary()
        self._ckpt.close()
        return out

    def _recover(self, topology, step, state, event, started):
        """Relaunch on the new mesh from the latest checkpoint; (state, its data state)."""
        del started
        if event.kind != 'failure':  # growing back: save now, nothing is lost
            self.checkpoint_block_sec += self._ckpt.maybe_save(
                step, state, self.run.train_data.get_state(), force=True)
        self._ckpt.wait()
        start = time.perf_counter()
        restored, data_state = resume.restore_onto(self.run, self._ckpt, topology)
        event.restore_sec = time.perf_counter() - start
        event.relaunch_sec_modelled = self.run.cfg.fault.relaunch_delay_sec
        event.lost_steps = step - int(restored.step)
        return restored, data_state
