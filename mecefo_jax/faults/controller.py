"""The host-level fault controller: inject failures, move training, recover.

Before every step the schedule's live mask, agreed across processes, is compared with
the current one; on a change the state moves to the live replicas' topology (reused
when seen before) and the step is precompiled. With replicas as rows the mesh never
changes, only the packing (`neighbour/row_packing.py`). The schedule is read at executed
steps (`clock`, which counts redone steps, as wall time would) or, under
`fault.time_model='wall_clock'`, at the run's cluster seconds (`step_clock.py`).
`RestartController` is `checkpoint_restart`. Under `mecefo.projection='weights'` V is
refreshed at every failure onset and every `mecefo.tau` steps while a neighbour is
active, each refresh waited for and timed; an event's seconds reach the observers once
its first step is timed.
"""
import dataclasses
import os
import time

import jax

from mecefo_jax import failure_schedule as schedule_lib
from mecefo_jax.checkpointing import checkpoint as ckpt_lib
from mecefo_jax.faults import step_clock
from mecefo_jax.faults.planner import config_planner
from mecefo_jax.faults.strategies import AllReplicasDownError, Orphans, layout_for, strategy_spec
from mecefo_jax.host import multihost
from mecefo_jax.neighbour import projections as proj_lib
from mecefo_jax.parallel.state import move_state
from mecefo_jax.training import resume
from mecefo_jax.training.controller import Plan


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
    refresh_sec: float = 0.0  # refreshing V at a neighbour onset (its compile is in compile_sec)
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

    def __init__(self, run, schedule: schedule_lib.FailureSchedule, strategy: str):
        cfg = run.cfg
        self.run, self.schedule = run, schedule
        self.strategy = strategy
        self.tau = cfg.mecefo.tau
        # Whether a neighbour reads the held projections V (else they are never refreshed).
        self.uses_projections = cfg.mecefo.projection == 'weights'
        self.planner = (config_planner(cfg, run.shard_batch)
                        if strategy_spec(strategy).orphans is Orphans.PLANNER else None)
        # A job relaunched without some replicas starts as if they had just failed: the
        # first prepare moves, compiles and refreshes V as at any failure onset.
        self.live = (True,) * run.num_shards
        self._absent = tuple(not present for present in run.present)
        self.plan = self._plan(run.present)
        # fault.time_model='wall_clock': the schedule is read at the run's own cluster seconds.
        self.clock = (step_clock.WallClock(cfg.fault.step_time_sec,
                                           step_clock.layout_step_ratio(cfg, run.num_shards))
                      if cfg.fault.time_model == 'wall_clock' else None)
        self.events: list[Event] = []
        self.refresh_steps: list[int] = []
        self._tau_refresh_sec = 0.0  # refreshes between events (every tau steps)
        self.compiles = 0
        self.checkpoint_block_sec = 0.0  # training waiting for a save (checkpoint_restart)
        self.stop_checkpointer = run.checkpointer  # where a stop with every replica down saves
        self._pending: Event | None = None
        self._schedule_logged = False

    @classmethod
    def from_config(cls, cfg, run):
        """The controller for `cfg.fault`, checked here so a bad one fails before training; the
        schedule is logged at the first step, once the metrics are cut back to the resumed step."""
        events = schedule_lib.events_from_config(cfg.fault, num_replicas=run.num_shards,
                                                 total_steps=cfg.train.steps)
        return cls(run, schedule_lib.FailureSchedule(events, run.num_shards), cfg.fault.strategy)

    def _log_schedule(self, clock: int) -> None:
        """The failures still ahead of this run, once (a resumed run logged the earlier ones)."""
        self._schedule_logged = True
        for e in self.schedule.events:
            if e.step >= clock:
                self.run.metrics.write({'event': 'scheduled_failure', 'step': e.step,
                                        'replica': e.replica, 'duration_steps': e.duration_steps})

    def prepare(self, clock: int, step: int, state):
        if not self._schedule_logged:
            self._log_schedule(clock)
        data_state = None
        start = time.perf_counter()
        scheduled = self.schedule.live_mask(self.clock.schedule_step(clock) if self.clock else clock)
        desired = multihost.agreed_live_mask([up and not absent for up, absent in
                                    zip(scheduled, self._absent)])
        detect_sec = time.perf_counter() - start
        if desired != self.live:
            state, data_state = self._transition(clock, step, state, desired, detect_sec)
        elif self._needs_refresh(step, failure_onset=False):
            state, seconds = self._refresh(state, step)
            self._tau_refresh_sec += seconds
        return state, dataclasses.replace(self.plan, data_state=data_state)

    def after_dispatch(self, clock: int, step: int, state, dispatched: float) -> list:
        """The events whose first step this was, now timed: only such a step is waited for."""
        del clock, step
        if self.clock is not None:
            self.clock.advance(self.plan.layout.programs)
        if self._pending is None:
            return []
        event, self._pending = self._pending, None
        jax.block_until_ready(state)
        event.first_step_sec = time.perf_counter() - dispatched
        self.run.metrics.write({'event': event.kind, **dataclasses.asdict(event)})
        return [event]

    def summary(self) -> dict:
        """Strategy, events and what handling them cost (measured seconds)."""
        overhead = (sum(e.measured_overhead_sec for e in self.events)
                    + self.checkpoint_block_sec + self._tau_refresh_sec)
        return {'strategy': self.strategy, 'events': [dataclasses.asdict(e) for e in self.events],
                'lost_steps': sum(e.lost_steps for e in self.events),
                'refresh_steps': list(self.refresh_steps), 'compiles': self.compiles,
                'refresh_sec': self._tau_refresh_sec + sum(e.refresh_sec for e in self.events),
                'measured_overhead_sec': overhead,
                'checkpoint_block_sec': self.checkpoint_block_sec,
                'relaunch_sec_modelled': sum(e.relaunch_sec_modelled for e in self.events),
                'cluster_sec': None if self.clock is None else self.clock.seconds}

    def _plan(self, live) -> Plan:
        """Where steps run while `live` replicas are up: the topology of their rows and the
        strategy's layout (packed onto the devices, where replicas are rows)."""
        layout = layout_for(self.strategy, live, self.run.shard_batch, planner=self.planner)
        return Plan(self.run.topologies.get(self.run.rows_for(live)), layout, tuple(live),
                    packing=self.run.packing(layout))

    def _needs_refresh(self, step: int, failure_onset: bool) -> bool:
        return (self.uses_projections and self.plan.layout.uses_neighbour_mode
                and proj_lib.needs_refresh(step, tau=self.tau, failure_onset=failure_onset,
                                           neighbour_active=True))

    def _refresh(self, state, step: int):
        """Recompute V; (state, seconds), waited for so the cost is charged."""
        self.refresh_steps.append(step)
        start = time.perf_counter()
        state = jax.block_until_ready(self.plan.topology.refresh(state))
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
        plan = self._plan(desired)
        state, data_state = self._recover(plan.topology, step, state, event, start)
        self.live, self.plan = desired, plan
        topology = plan.topology
        spec = topology.batch_spec(plan.step_layout, self.run.cfg.data.seq_len + 1)
        _, compile_sec = topology.compiled_step(state, spec, plan.step_layout)
        self.compiles += compile_sec > 0
        event.compile_sec = compile_sec
        if self._needs_refresh(int(state.step), failure_onset=bool(failing)):
            event.compile_sec += _load_refresh(topology, state)
            state, event.refresh_sec = self._refresh(state, int(state.step))
        self.events.append(event)
        self._pending = event
        return state, data_state

    def _recover(self, topology, step, state, event, started):
        """Move the live state onto `topology`, charging the rebuild from `started`;
        (state, None): nothing is rolled back."""
        del step
        state = jax.block_until_ready(move_state(state, topology.state_shardings))
        event.rebuild_sec = time.perf_counter() - started
        return state, None

    def _stop_all_down(self, step, state):
        where = 'no checkpointer configured'
        ckpt = self.stop_checkpointer
        if ckpt is not None:
            ckpt.maybe_save(step, state, self.run.train_data.get_state(), force=True)
            ckpt.wait()
            where = f'saved step {step} to {ckpt.directory}'
        raise AllReplicasDownError(
            f'Every one of the {len(self.live)} replicas is down at step {step} ({where}). '
            'Check fault.events / fault.max_concurrent, then resume from the checkpoint.')


def _load_refresh(topology, state) -> float:
    """Seconds to load or compile the refresh program, charged to compile_sec so refresh_sec
    times the refresh alone (without the program cache it compiles on first use)."""
    from mecefo_jax.parallel import program_cache
    if not program_cache.enabled() or not hasattr(topology.refresh, 'compile'):
        return 0.0
    start = time.perf_counter()
    topology.refresh.compile(state)
    return time.perf_counter() - start


class RestartController(FaultController):
    """`fault.strategy=checkpoint_restart`: every failure restores the last checkpoint."""

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
