"""A worker's train state between crashes: snapshots into its keeper after steps, restores after a relaunch.

`SnapshotHook` (a loop observer) copies this process's shards of a step's output to
pinned host memory right after the step is dispatched (device-local, ordered before the
next step donates them) and hands them to an `AsyncSnapshotter`, which writes them into
the keeper in a background thread and publishes them with the data position; at most
one is in flight, and the wait for it is the overhead measured. After a relaunch the
launcher's tier is restored (`restore_fn`): the keepers' snapshot of its step, read from
the own keeper's shared memory and healed from peers (REFT, arXiv 2310.12670), or the
newest Orbax checkpoint, timed alike.
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
from mecefo_jax.training.resume import Tier


class SnapshotHook(Observer):
    """Snapshot the train state into this worker's keeper: every `every` steps, or 'auto'.

    With `every='auto'` an `AutoCadence` picks the interval from the measured
    step time and snapshot cost within `budget_pct` of the step time (shorter
    where `failures_per_sec` makes that cheaper in expectation, at most
    `max_interval`), agreed across processes, and measures again after every
    topology change.
    """

    def __init__(self, client, every, *, parity: ParityPusher | None = None,
                 stop_at: int | None = None, budget_pct: float = 2.0, log=None,
                 failures_per_sec: float = 0.0, max_interval: int = MAX_INTERVAL,
                 shard: bool = False, generation: int = 0, latest_wins: bool | None = None):
        self._client = client  # a KeeperClient of this worker's keeper
        # The generation tells a restore which writer's parts of a redone step belong together.
        self._snapshotter = AsyncSnapshotter(SnapshotWriter(client, parity=parity),
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
        else:
            self.every = every
        # A planned stop (a rejoin) resumes from this step: always snapshot it,
        # whatever the cadence, so the way back redoes nothing.
        self.stop_at = stop_at
        self.last_submitted: int | None = None  # the newest step handed to the writer
        self.blocked_sec = 0.0  # time the training loop waited for the previous snapshot
        self.submitted = 0
        self._blocked_now: dict = {}  # this step's snapshot wait, for TensorBoard
        self._window_start: float | None = None  # auto: when the previous window ended

    @property
    def interval(self) -> int | None:
        """Steps between snapshots now (None while 'auto' is still measuring)."""
        return self.every if self.cadence is None else self.cadence.interval

    def flush(self) -> None:
        """Wait until every snapshot handed to the writer is published."""
        self.blocked_sec += self._snapshotter.wait()

    def _flush(self) -> tuple[float, int, float]:
        """Background writes so far: (seconds, count, seconds waiting for the step's output)."""
        self.flush()
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
        # A fixed interval, auto's measuring windows and the step the way back needs are
        # each written, waiting for the previous one if need be.
        must = step == self.stop_at
        chosen = self.cadence is not None and self.cadence.interval is not None
        latest_wins = not must and (chosen if self.latest_wins is None else self.latest_wins)
        start = time.perf_counter()
        copies = pinned_local_copies(done.state, shard_over_replicas=self.shard)
        self._snapshotter.submit(step, copies, done.data_position, wait=not latest_wins)
        blocked = time.perf_counter() - start
        self.blocked_sec += blocked
        self._blocked_now = {'snapshot_block_sec': blocked}
        self.submitted += 1
        self.last_submitted = step
        if self.cadence is not None:
            self.cadence.record_blocked(blocked)

    def step_scalars(self) -> dict:
        scalars, self._blocked_now = self._blocked_now, {}
        return scalars

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


def keeper_restore(keepers: list, worker: int, info: dict, *, step: int):
    """A `train(restore=...)` callback restoring the keepers' snapshot of `step`.

    `keepers[w]` is worker w's keeper (None if it is gone); `step` is the launcher's
    choice, restored by every process with no collective, from this worker's own
    keeper's shared memory, healing from its peers' what it lacks (REFT, arXiv
    2310.12670); an error names the fallback if this process cannot assemble it. Fills
    `info['restore']` with a RestoreInfo.
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
            if step not in feasible_steps(abstract, snaps):
                # Heal from peers what the own keeper lacks (all of it but its own part,
                # where snapshots are sharded over the workers).
                snaps = _newest_writers(snaps + open_sources(None, peers))
            if step not in feasible_steps(abstract, snaps):
                raise SnapshotMissingError(
                    f'Worker {worker} cannot assemble the snapshot of step {step} from its own '
                    'keeper or any live peer. Rerun the same launch command: it resumes from the '
                    'newest Orbax checkpoint in the workdir (written every '
                    'train.checkpoint_every steps).')
            marks.append(time.perf_counter())
            try:
                state, data_state, report = restore(abstract, snaps, step=step)
            except SnapshotMismatchError as error:  # name the config field and its fix
                raise config_record.explain_mismatch(error, run.workdir, run.cfg) from error
            jax.block_until_ready(state)
        finally:
            for s in snaps:
                s.close()
        marks.append(time.perf_counter())
        phases = dict(zip(('open_own_keeper', 'choose_step', 'read_and_place'),
                          np.diff(marks).tolist()))
        info['restore'] = RestoreInfo(step=step, seconds=marks[-1] - start,
                                      bytes_by_source=dict(report.bytes_by_source),
                                      phases=phases)
        return state, data_state, Tier.MEMORY
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
        return state, data_state, Tier.DISK
    return restore_fn

# ------------------------------------------------------------------ from a worker's args

def restore_fn(args) -> tuple:
    """(`resume`'s restore callback for the launcher's tier, the dict its RestoreInfo lands in).

    Tier.FRESH restores nothing here (the workdir's newest checkpoint if any, else a new
    run). In the job's own run (`args.own_run`) a tier holding nothing answers
    `START_OVER`: a job killed before its first save starts again at step 0.
    """
    from mecefo_jax.training.resume import START_OVER
    info: dict = {}
    held = (keeper_restore(list(args.keepers), args.worker, info, step=args.resume_step)
            if args.resume is Tier.MEMORY else disk_restore(info) if args.resume is Tier.DISK else None)
    if not args.own_run:
        return held, info
    return (lambda run, topology: (held and held(run, topology)) or START_OVER), info


@dataclasses.dataclass
class SnapshotObservers:
    """A worker's snapshot hook (None where snapshots are off or it has no keeper) and the
    observers the training loop runs for it, an injected failure's hold included."""
    hook: SnapshotHook | None
    observers: list

    @classmethod
    def of(cls, args) -> SnapshotObservers:
        cfg, keepers, points = args.cfg, args.keepers, args.fault_points
        if cfg.snapshot.every == 0 or not keepers or keepers[args.worker] is None:
            return cls(None, [])
        client = KeeperClient(keepers[args.worker])
        hook = SnapshotHook(
            points.client(client, args.tag) if points else client, cfg.snapshot.every,
            parity=_parity_pusher(cfg, args) if cfg.snapshot.parity else None,
            stop_at=args.stop_at or None, **cadence_options(cfg, args.observed_failures_per_hour),
            shard=cfg.snapshot.shard, generation=args.generation,
            log=lambda msg: print(f'[worker {args.worker}] {msg}', flush=True))
        return cls(hook, [hook, *(points.observers(hook, args.tag) if points else [])])

    def close(self) -> None:
        if self.hook is not None:
            self.hook.close()


def cadence_options(cfg, observed_failures_per_hour: float = 0.0) -> dict:
    """What `snapshot.every=auto` weighs besides its measurements: the overhead budget, the
    failure rate (the config's `fault.regime` or `fault.mtbf_hours`, else the one the
    launcher observed in this job so far) and, as its longest interval, the disk
    checkpoint's (`train.checkpoint_every`)."""
    from mecefo_jax.failure_schedule import configured_failures_per_hour
    rate = (configured_failures_per_hour(cfg.fault, int(cfg.mesh.data))
            or observed_failures_per_hour)
    every = cfg.train.checkpoint_every
    return {'budget_pct': cfg.snapshot.overhead_budget_pct, 'failures_per_sec': rate / 3600.0,
            'max_interval': every if every > 0 else MAX_INTERVAL}


def _parity_pusher(cfg, args):
    """The pusher of this worker's parity group (groups of snapshot.parity_group workers)."""
    from mecefo_jax.launch.placement import parity_group
    group = parity_group(args.worker, len(args.keepers), cfg.snapshot.parity_group)
    if not group or any(args.keepers[w] is None for w in group):
        return None  # a single worker, or a member's keeper gone: no parity this generation
    return ParityPusher(f'workers{group[0]}-{group[-1]}', args.worker - group[0],
                        [args.keepers[w] for w in group], generation=args.generation)
