"""The worker's side of in-memory snapshots: take them after each step, restore after a relaunch.

`SnapshotHook` is an observer of the training loop (mecefo_jax/training/observers.py).
Right after step k is dispatched it asks for a copy of this process's shards
of the step's output state in pinned host memory (device-local
`jax.device_put`s that return at once; each copy is ordered before the next
step, which donates the state, reuses its buffers), then hands them to an
`AsyncSnapshotter` that writes it into this worker's keeper in a background
thread and publishes it as step k + 1 together with the data position after
batch k. At most one snapshot is in flight; a second waits for the first
(that wait is the overhead the trainer sees, and is measured).

`disk_restore` is the old way, timed the same way: the latest Orbax checkpoint.

`keeper_restore` is a `train(restore=...)` callback: it opens this worker's
keeper (shared memory) and rebuilds the state on the current mesh at the
step the launcher chose (`WorkerArgs.resume_step`), reading peer keepers
(through Ray, whichever node they are on) only to heal what the own keeper
lacks (REFT, arXiv 2310.12670). Without a chosen
step the processes agree on the newest step every one of them can assemble,
and all open the peers when some process cannot assemble the newest.
"""
from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from mecefo_jax.checkpointing import checkpoint as ckpt_lib
from mecefo_jax.config import record as config_record
from mecefo_jax.host import multihost
from mecefo_jax.snapshot import (
    AsyncSnapshotter,
    KeeperClient,
    ParityPusher,
    SnapshotMissingError,
    SnapshotWriter,
    feasible_steps,
    open_sources,
    pinned_local_copies,
    restore,
)
from mecefo_jax.snapshot.cadence import MAX_INTERVAL, AutoCadence
from mecefo_jax.snapshot.jax_io import SnapshotMismatchError, newest_writer_only
from mecefo_jax.training.observers import Observer


class SnapshotHook(Observer):
    """Snapshot the train state into this worker's keeper: every `every` steps, or 'auto'.

    With `every='auto'` an `AutoCadence` picks the interval from the measured
    step time and snapshot cost within `budget_pct` of the step time (shorter
    where `failures_per_sec` makes that cheaper in expectation, at most
    `max_interval`), agreed across processes, and measures again after every
    topology change.
    """

    def __init__(self, keeper, every, *, parity: ParityPusher | None = None,
                 before_publish=None, stop_at: int | None = None, budget_pct: float = 2.0,
                 log=None, hold_after: int | None = None, on_hold=None,
                 failures_per_sec: float = 0.0, max_interval: int = MAX_INTERVAL,
                 shard: bool = False, generation: int = 0, latest_wins: bool | None = None):
        self._client = KeeperClient(keeper)
        # The generation tells a restore which writer's parts of a redone step belong together.
        self._snapshotter = AsyncSnapshotter(
            SnapshotWriter(self._client, parity=parity, before_publish=before_publish),
            meta={'generation': int(generation), 'sharded': bool(shard)})
        self.shard = shard  # write only this process's part of each replicated box
        # Never stall the step for a write (the newest snapshot waits its turn): None does
        # so under auto's chosen interval only (see `_snapshot`).
        self.latest_wins = latest_wins
        self.cadence = None
        if every == 'auto':
            # On the CPU backend the snapshot's work runs on the cores the step uses.
            self.cadence = AutoCadence(budget_pct, flush=self._flush,
                                       agree=multihost.process_zero_int, log=log,
                                       shares_cores=jax.default_backend() == 'cpu',
                                       failures_per_sec=failures_per_sec,
                                       max_interval=max_interval)
            self.every = None
        elif isinstance(every, int) and every >= 1:
            self.every = every
        else:
            raise ValueError(f"snapshot.every={every!r}: use 'auto', an integer >= 1, "
                             'or 0 to disable snapshots.')
        # A planned stop (a rejoin) resumes from this step: always snapshot it,
        # whatever the cadence, so the way back redoes nothing.
        self.stop_at = stop_at
        # Crash drills: after the first snapshot at or after `hold_after` is
        # published, `on_hold(step)` is called from the training loop (it never
        # returns), at the next step's plan: that step's metrics row is written by then.
        self.hold_after, self._on_hold = hold_after, on_hold
        self._hold_at: int | None = None
        self.blocked_sec = 0.0  # time the training loop waited for the previous snapshot
        self.submitted = 0
        self._window_start: float | None = None  # auto: when the previous window ended

    @property
    def interval(self) -> int | None:
        """Steps between snapshots now (None while 'auto' is still measuring)."""
        return self.every if self.cadence is None else self.cadence.interval

    def _flush(self) -> tuple[float, int, float]:
        """Background writes so far: (seconds, count, seconds waiting for the step's output)."""
        self.blocked_sec += self._snapshotter.wait()
        stats = self._snapshotter.stats
        return stats.write_sec, stats.published, stats.materialize_sec

    def _due(self, step: int, done) -> bool:
        if self.cadence is None:
            return step % self.every == 0 or step == self.stop_at
        # Always asked, so that auto counts every step.
        return self.cadence.due(step, done.layout.signature) or step == self.stop_at

    def on_step(self, done) -> None:
        step = done.step + 1  # the output state is the state entering step + 1
        if self._due(step, done):
            self._snapshot(done, step)
        if self.cadence is not None and self.cadence.window_ends:
            # A window times its steps, the snapshot's stall of them included (a device
            # copy the next step's donation waits for), up to its last step's output. The
            # write's tail is awaited between windows, untimed: a write longer than the
            # window would hide that stall, and the model charges it as back-pressure.
            jax.block_until_ready(done.loss)
            now = time.perf_counter()
            self.cadence.record_window(now - (self._window_start or now))
            self.blocked_sec += self._snapshotter.wait()  # the next window starts clean
            self._window_start = time.perf_counter()

    def _snapshot(self, done, step: int) -> None:
        # Under auto's chosen interval the step never waits for a slow write: the newest
        # snapshot waits its turn and replaces an older waiting one (counted as dropped).
        # A fixed interval, auto's measuring windows and the steps the way back needs are
        # each written, waiting for the previous one if need be.
        must = step == self.stop_at or (self.hold_after is not None and step >= self.hold_after)
        chosen = self.cadence is not None and self.cadence.interval is not None
        latest_wins = not must and (chosen if self.latest_wins is None else self.latest_wins)
        start = time.perf_counter()
        copies = pinned_local_copies(done.state, shard_over_replicas=self.shard)
        self._snapshotter.submit(step, copies, done.data_position, wait=not latest_wins)
        blocked = time.perf_counter() - start
        self.blocked_sec += blocked
        self.submitted += 1
        if self.cadence is not None:
            self.cadence.record_blocked(blocked)
        if self.hold_after is not None and step >= self.hold_after and self._hold_at is None:
            self._snapshotter.wait()  # published, so its keeper holds it
            self._hold_at = step

    def on_plan(self, planned) -> None:
        if self._hold_at is not None:
            self._on_hold(self._hold_at)

    @property
    def stats(self):
        return self._snapshotter.stats

    def close(self) -> None:
        """Wait for the last snapshot to be published, then let go of the keeper."""
        self._snapshotter.close()
        self._client.close()


@dataclasses.dataclass
class RestoreInfo:
    step: int
    seconds: float
    bytes_by_source: dict  # e.g. {'shm:keeper0': n, 'peer:keeper1': m, 'disk': k}
    phases: dict = dataclasses.field(default_factory=dict)  # seconds per part of `seconds`

    @property
    def healed_bytes(self) -> int:
        """Bytes read from peer keepers rather than the own keeper or disk."""
        return sum(n for source, n in self.bytes_by_source.items() if source.startswith('peer:'))


def _newest_writers(snaps: list) -> list:
    """`jax_io.newest_writer_only`, closing the snapshots it leaves out (they pin a slot)."""
    kept = newest_writer_only(snaps)
    for s in snaps:
        if all(s is not k for k in kept):
            s.close()
    return kept


def keeper_restore(keepers: list, worker: int, info: dict, *, step: int | None = None):
    """A `train(restore=...)` callback restoring from the keepers' snapshots.

    `keepers[w]` is worker w's keeper (None if it is gone). `step`,
    the launcher's choice, is restored by every process with no collective
    (an error names the fallback if this process cannot assemble it); without
    it the processes agree on the newest common step. Fills `info['restore']`
    with a RestoreInfo. Returns None when no keeper holds anything yet (a
    fresh start).
    """
    peers = [k for w, k in enumerate(keepers) if w != worker and k is not None]

    def restore_fn(run, topology):
        # The state's shapes: traced before the clock starts, as for a disk
        # restore; a relaunched process needs them whatever it restores from.
        abstract = ckpt_lib.abstract_like(run.abstract_state, topology.state_shardings)
        start = time.perf_counter()
        marks = [start]
        snaps = _newest_writers(open_sources(keepers[worker]))
        try:
            marks.append(time.perf_counter())
            if step is not None:
                chosen = step
                if chosen not in feasible_steps(abstract, snaps):
                    # Heal from peers what the own keeper lacks (all of it but its own
                    # part, where snapshots are sharded over the workers).
                    snaps = _newest_writers(snaps + open_sources(None, peers))
                if chosen not in feasible_steps(abstract, snaps):
                    raise SnapshotMissingError(
                        f'Worker {worker} cannot assemble the snapshot of step {chosen} from its '
                        'own keeper or any live peer. Rerun the same launch command: it resumes '
                        'from the newest Orbax checkpoint in the workdir (written every '
                        'train.checkpoint_every steps).')
            else:
                chosen, newest = multihost.agreed_step(set(feasible_steps(abstract, snaps)))
                if chosen is None or chosen < newest:
                    # Some process cannot assemble the newest step from its own
                    # keeper (a rejoined or replaced worker's is empty or stale):
                    # every process got the same pair, so all open the peers'
                    # keepers and agree again.
                    snaps = _newest_writers(snaps + open_sources(None, peers))
                    chosen, _ = multihost.agreed_step(set(feasible_steps(abstract, snaps)))
            marks.append(time.perf_counter())
            if chosen is None:
                if any(s.step for s in snaps):
                    raise SnapshotMissingError(
                        'The keepers hold snapshots, but no step that every process can '
                        'assemble. Rerun the same launch command: it resumes from the newest '
                        'Orbax checkpoint in the workdir (written every train.checkpoint_every '
                        'steps).')
                return None
            try:
                state, data_state, report = restore(abstract, snaps, step=chosen)
            except SnapshotMismatchError as error:  # name the config field and its fix
                raise config_record.explain_mismatch(error, run.workdir, run.cfg) from error
            jax.block_until_ready(state)
        finally:
            for s in snaps:
                s.close()
        marks.append(time.perf_counter())
        phases = dict(zip(('open_own_keeper', 'choose_step', 'read_and_place'),
                          np.diff(marks).tolist()))
        info['restore'] = RestoreInfo(step=chosen, seconds=marks[-1] - start,
                                      bytes_by_source=dict(report.bytes_by_source),
                                      phases=phases)
        return state, data_state, 'memory'
    return restore_fn


def disk_restore(info: dict):
    """A `train(restore=...)` callback restoring the latest Orbax checkpoint, timed."""
    from mecefo_jax.training import resume

    def restore_fn(run, topology):
        if run.checkpointer is None or run.checkpointer.latest_step() is None:
            return None
        _ = run.abstract_state  # traced before the clock starts, as for a keeper restore
        start = time.perf_counter()
        state, data_state = resume.restore_onto(run, run.checkpointer, topology)
        jax.block_until_ready(state)
        nbytes = sum(x.nbytes for x in jax.tree.leaves(state))
        info['restore'] = RestoreInfo(step=int(state.step), seconds=time.perf_counter() - start,
                                      bytes_by_source={'disk': nbytes})
        return state, data_state, 'disk'
    return restore_fn
