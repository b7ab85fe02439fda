"""The host-level fault controller: inject failures, move training, recover.

Before every step the controller compares the schedule's live mask with the
current one (agreed across processes through `multihost_utils`). On a change
it rebuilds the mesh from the live replica rows (data shrinks, model stays),
moves the train state there, re-derives the layout from the strategy, and
precompiles the step for it; a topology seen before is reused, never
recompiled. Under MeCeFO strategies the SVD projections are refreshed at every
failure onset and every `mecefo.tau` steps while a neighbour is active.

`checkpoint_restart` instead restores its latest Orbax checkpoint onto the new
mesh and redoes the steps since; the relaunch a real cluster imposes is added
as a configured, separately reported delay.

Timeline: the schedule is indexed by executed steps (`clock`), which keeps
advancing while rolled-back steps are redone, as wall time would.

Every SVD refresh is waited for and timed (its first call on a topology
includes compiling it) and counted in the measured overhead: on the event
that triggered it, or as a refresh between events every `mecefo.tau` steps.

Modelled time (when a `RoleTimer` is given) uses the same clock as the
schedule: a fault-free step lasts `fault.step_time_sec` of cluster time, the
hours of a failure regime are converted with it, and a step under some
layout lasts that times the measured ratio of its slowest device's program
to a normal device's. Measured controller overheads (detect, rebuild,
compile, restore, blocking checkpoints) and the modelled relaunch delay are
added in seconds. The unscaled sum of raw per-device times is reported too.
"""
import dataclasses
import os
import time

import jax
import numpy as np

from mecefo_jax import checkpoint as ckpt_lib
from mecefo_jax import multihost
from mecefo_jax import projections as proj_lib
from mecefo_jax import train as train_lib
from mecefo_jax.faults import schedule as schedule_lib
from mecefo_jax.faults.planner import config_planner
from mecefo_jax.faults.strategies import AllReplicasDownError, layout_for, validate_strategy
from mecefo_jax.layout import ROLE_NEIGHBOUR, full_layout
from mecefo_jax.topology import move_state


@dataclasses.dataclass
class Event:
    """One failure or recovery, with what handling it cost (seconds)."""
    kind: str  # 'failure' | 'recovery'
    clock: int
    step: int
    replicas: list  # the replicas failing (or, for a recovery, recovering)
    live: int
    recovered: list = dataclasses.field(default_factory=list)  # also back at this step
    detect_sec: float = 0.0
    rebuild_sec: float = 0.0
    compile_sec: float = 0.0
    restore_sec: float = 0.0
    refresh_sec: float = 0.0  # SVD refresh of V at a neighbour onset (first compile included)
    checkpoint_block_sec: float = 0.0
    relaunch_sec_modelled: float = 0.0
    lost_steps: int = 0
    first_step_sec: float | None = None
    relaunch: bool = False  # replicas absent from a relaunched job, down from its first step

    @property
    def measured_overhead_sec(self) -> float:
        return (self.detect_sec + self.rebuild_sec + self.compile_sec + self.restore_sec
                + self.refresh_sec + self.checkpoint_block_sec)


class FaultController:
    """Drives one strategy under one failure schedule (see module docstring)."""

    def __init__(self, run, schedule: schedule_lib.FailureSchedule, strategy: str, *,
                 timer=None):
        cfg = run.cfg
        self.run, self.schedule = run, schedule
        self.strategy = validate_strategy(strategy)
        self.timer = timer
        self.tau = proj_lib.validate_tau(int(cfg.mecefo.tau))
        self.spread_k = int(cfg.fault.spread_k)
        self.planner = (config_planner(cfg, run.shard_batch)
                        if self.strategy == 'mecefo_planned' else None)
        # A job relaunched without some replicas (launch.py) starts as if they
        # had just failed: the first prepare moves to the present replicas'
        # layout, compiles and refreshes V as for any failure onset.
        self.live = (True,) * run.num_shards
        self._absent = tuple(not present for present in run.present)
        self.topology = run.topologies.get(run.present_rows)
        self.layout = self._layout(run.present)
        self._normal_layout = full_layout(run.num_shards, run.shard_batch)  # the time unit
        self.events: list[Event] = []
        self.refresh_steps: list[int] = []
        self._tau_refresh_sec = 0.0  # refreshes between events (every tau steps)
        self.compiles = 0
        self.step_time_sec = float(cfg.fault.step_time_sec)
        self.modelled_compute_sec = 0.0  # cluster seconds (see module docstring)
        self.measured_compute_sec = 0.0  # raw sum of slowest-device program times
        self.step_tokens: dict[int, float] = {}
        self._pending: Event | None = None
        self._restart_ckpt = None
        self._initial_saved = False  # checkpoint_restart needs a step to fall back to
        if self.strategy == 'checkpoint_restart':
            self._restart_ckpt = ckpt_lib.Checkpointer(
                os.path.join(run.workdir, 'restart_checkpoints'),
                save_every=int(cfg.fault.checkpoint_every), keep=2)
        self._ckpt_block_sec = 0.0

    @classmethod
    def factory(cls, cfg, run, *, timer=None):
        """`train(controller_factory=...)` for `cfg.fault`'s schedule and strategy.

        The schedule and strategy are checked here, before any training
        starts, so a bad `fault` config fails at once; the scheduled events
        are logged to metrics.
        """
        validate_strategy(cfg.fault.strategy)
        events = schedule_lib.events_from_config(cfg.fault, num_replicas=run.num_shards,
                                                 total_steps=int(cfg.train.steps))
        for e in events:
            run.metrics.write({'event': 'scheduled_failure', 'step': e.step,
                               'replica': e.replica, 'duration_steps': e.duration_steps})
        schedule = schedule_lib.FailureSchedule(events, run.num_shards)
        return lambda r: cls(r, schedule, cfg.fault.strategy, timer=timer)

    @classmethod
    def train(cls, cfg, workdir: str, *, timer=None, run=None, **train_kwargs) -> dict:
        """Build the schedule from `cfg.fault` and train under it."""
        run = run or train_lib.build_run(cfg, workdir)
        return train_lib.train(cfg, workdir, run=run, **train_kwargs,
                               controller_factory=cls.factory(cfg, run, timer=timer))

    # -- the loop's hooks ---------------------------------------------------

    def prepare(self, clock: int, step: int, state):
        data_state = None
        if self._restart_ckpt is not None and not self._initial_saved:
            self._ckpt_block_sec += self._restart_ckpt.maybe_save(
                step, state, self.run.train_data.get_state(), force=True)
            self._initial_saved = True
        start = time.perf_counter()
        scheduled = self.schedule.live_mask(clock)
        desired = multihost.agreed_live_mask([up and not absent for up, absent in
                                    zip(scheduled, self._absent)])
        detect_sec = time.perf_counter() - start
        if desired != self.live:
            state, data_state = self._transition(clock, step, state, desired, detect_sec)
        elif self._neighbour_active() and proj_lib.needs_refresh(
                step, tau=self.tau, failure_onset=False, neighbour_active=True):
            state, seconds = self._refresh(state, step)
            self._tau_refresh_sec += seconds
        return state, train_lib.Plan(self.topology, self.layout, data_state=data_state)

    def observe(self, clock: int, step: int, state, metrics, dispatched: float) -> None:
        """After dispatching a step: account modelled time, useful tokens, first-step times.

        Only the first step after an event is waited for (to time it); every
        other step stays asynchronous (`metrics` are not read here). Useful tokens come from the layout: the
        examples it assigns, times the predicted tokens of each.
        """
        if self.timer is not None:
            slowest = self.timer.step_seconds(self.layout)
            normal = self.timer.step_seconds(self._normal_layout)
            self.measured_compute_sec += slowest
            self.modelled_compute_sec += self.step_time_sec * slowest / normal
        self.step_tokens[step] = float(self.layout.examples() * int(self.run.cfg.data.seq_len))
        if self._pending is not None:
            jax.block_until_ready(state)
            self._pending.first_step_sec = time.perf_counter() - dispatched
            self.run.metrics.write({'event': self._pending.kind, **dataclasses.asdict(self._pending)})
            self._pending = None
        if self._restart_ckpt is not None:
            self._ckpt_block_sec += self._restart_ckpt.maybe_save(
                step + 1, state, self.run.train_data.get_state())

    def summary(self) -> dict:
        events = [dataclasses.asdict(e) for e in self.events]
        overhead = (sum(e.measured_overhead_sec for e in self.events) + self._ckpt_block_sec
                    + self._tau_refresh_sec)
        relaunch = sum(e.relaunch_sec_modelled for e in self.events)
        out = {'strategy': self.strategy, 'events': events,
               'lost_steps': sum(e.lost_steps for e in self.events),
               'refresh_steps': list(self.refresh_steps), 'compiles': self.compiles,
               'refresh_sec': self._tau_refresh_sec + sum(e.refresh_sec for e in self.events),
               'useful_tokens': sum(self.step_tokens.values()),
               'measured_overhead_sec': overhead, 'checkpoint_block_sec': self._ckpt_block_sec,
               'relaunch_sec_modelled': relaunch}
        if self.timer is not None:
            total = self.modelled_compute_sec + overhead + relaunch
            unscaled = self.measured_compute_sec + overhead + relaunch
            out.update(modelled_compute_sec=self.modelled_compute_sec, modelled_sec=total,
                       modeled_tokens_per_sec=out['useful_tokens'] / max(total, 1e-12),
                       unscaled_modelled_sec=unscaled,
                       unscaled_tokens_per_sec=out['useful_tokens'] / max(unscaled, 1e-12),
                       role_seconds=self.timer.table())
        if self._restart_ckpt is not None:
            self._restart_ckpt.close()
        return out

    # -- internals ----------------------------------------------------------

    def _layout(self, live):
        return layout_for(self.strategy, live, self.run.shard_batch, spread_k=self.spread_k,
                          planner=self.planner)

    def _neighbour_active(self) -> bool:
        return ROLE_NEIGHBOUR in self.layout.roles

    def _refresh(self, state, step: int):
        """Recompute V by SVD; (state, seconds), waited for so the cost is charged."""
        self.refresh_steps.append(step)
        start = time.perf_counter()
        state = jax.block_until_ready(self.topology.refresh(state))
        return state, time.perf_counter() - start

    def _transition(self, clock, step, state, desired, detect_sec):
        failing = [r for r, (a, b) in enumerate(zip(self.live, desired)) if a and not b]
        recovering = [r for r, (a, b) in enumerate(zip(self.live, desired)) if b and not a]
        if not any(desired):
            self._stop_all_down(step, state)
        event = Event(kind='failure' if failing else 'recovery', clock=clock, step=step,
                      replicas=failing or recovering, live=sum(desired),
                      recovered=recovering, detect_sec=detect_sec,
                      relaunch=any(self._absent[r] for r in failing))
        start = time.perf_counter()
        rows = [row for row, up in zip(self.run.full_rows, desired) if up]
        topology = self.run.topologies.get(rows)
        data_state = None
        if self._restart_ckpt is not None:
            state, data_state, event = self._restart(topology, step, state, event)
        else:
            state = jax.block_until_ready(move_state(state, topology.state_shardings))
            event.rebuild_sec = time.perf_counter() - start
        self.live, self.topology = desired, topology
        self.layout = self._layout(desired)
        start = time.perf_counter()
        spec = topology.batch_spec(self.layout, int(self.run.cfg.data.seq_len) + 1)
        _, compile_sec = topology.compiled_step(state, spec, self.layout)
        self.compiles += compile_sec > 0
        event.compile_sec = compile_sec
        if self._neighbour_active() and proj_lib.needs_refresh(
                int(state.step), tau=self.tau, failure_onset=bool(failing),
                neighbour_active=True):
            state, event.refresh_sec = self._refresh(state, int(state.step))
        self.events.append(event)
        self._pending = event
        return state, data_state

    def _restart(self, topology, step, state, event):
        """Checkpoint/restart: relaunch on the new mesh from the latest checkpoint."""
        cfg = self.run.cfg
        if event.kind != 'failure':  # growing back: save now, nothing is lost
            self._ckpt_block_sec += self._restart_ckpt.maybe_save(
                step, state, self.run.train_data.get_state(), force=True)
        self._restart_ckpt.wait()
        start = time.perf_counter()
        restored, data_state = train_lib.restore_onto(self.run, self._restart_ckpt, topology)
        event.restore_sec = time.perf_counter() - start
        event.relaunch_sec_modelled = float(cfg.fault.relaunch_delay_sec)
        event.lost_steps = step - int(restored.step)
        return restored, data_state, event

    def _stop_all_down(self, step, state):
        where = 'no checkpointer configured'
        ckpt = self._restart_ckpt or self.run.checkpointer
        if ckpt is not None:
            ckpt.maybe_save(step, state, self.run.train_data.get_state(), force=True)
            ckpt.wait()
            where = f'saved step {step} to {ckpt.directory}'
        raise AllReplicasDownError(
            f'Every one of the {len(self.live)} replicas is down at step {step} ({where}). '
            'Check fault.events / fault.max_concurrent, then resume from the checkpoint.')
