"""One training worker of a launcher job: a Ray actor on one host, one `jax.distributed` process.

`run(WorkerArgs)` joins the generation's `jax.distributed` job (its coordinator bound to
the one address the launcher chose), restores the state where the launcher said
(`worker_state`), trains through `run.run` with the absent workers' replicas down, and
returns the end record; an exception in it is a program error. Other threads of the
actor answer `progress()` (steps dispatched and completed, read without blocking, so a
worker blocked in a dead peer's collective keeps answering), `request_stop()` and
`signal()` (injected failures). Under `<workdir>/launch/` it writes its log
`g<G>_w<W>.log`, its start record once its first step ran (what the way back cost), its
end record, and (process 0) `provenance.jsonl` and, for a complete run, `final_params.npz`.
"""
from __future__ import annotations

import atexit
import collections
import dataclasses
import hashlib
import json
import os
import socket
import statistics
import sys
import threading
import time

from mecefo_jax.host import files, processes
from mecefo_jax.launch import placement as placement_lib
from mecefo_jax.training.observers import Observer  # pure Python: no jax before the actor is up
from mecefo_jax.training.resume import Tier


@dataclasses.dataclass(frozen=True)
class WorkerArgs:
    """What one worker of one generation runs (sent by the launcher to its actor)."""
    cfg: object  # the job's resolved `Config`: one resolution for every worker of every generation
    workdir: str
    placement: placement_lib.Placement  # the job's workers and replicas, checked by the launcher
    coordinator: str  # host:port of the jax.distributed coordinator (process 0)
    members: tuple  # worker ids of this generation, in process order
    worker: int  # this worker (stable across relaunches)
    generation: int = 0
    resume: Tier = Tier.FRESH
    resume_step: int = 0  # Tier.MEMORY: the snapshot step every member restores
    stop_at: int = 0  # stop after this step (0: train.steps)
    own_run: bool = False  # the workdir's run is this job's: with nothing saved, start over
    keepers: tuple = ()  # each worker's KeeperHandle, None where it has none
    fault_points: object = None  # chaos.FaultPoints: where an injected failure lands, or None
    observed_failures_per_hour: float = 0.0  # the job's failures so far / its hours so far

    @property
    def process_id(self) -> int:
        return self.members.index(self.worker)

    @property
    def out_dir(self) -> str:
        return os.path.join(self.workdir, 'launch')

    @property
    def tag(self) -> str:
        return f'g{self.generation}_w{self.worker}'


class Progress:
    """How far the worker has got: steps dispatched and steps completed (a failed step is not)."""

    def __init__(self):
        self.dispatched = 0
        self.completed = 0
        self._pending: collections.deque = collections.deque()  # (steps done, output array)
        self._lock = threading.Lock()

    def dispatched_step(self, steps_done: int, output) -> None:
        """The loop dispatched step `steps_done - 1`; `output` becomes ready when it ends."""
        with self._lock:
            self.dispatched = steps_done
            self._pending.append((steps_done, output))

    def report(self) -> dict:
        with self._lock:
            try:
                while self._pending and self._pending[0][1].is_ready():
                    # Ready includes failed (a collective a dead peer broke): reading a
                    # ready output returns at once, or raises for a step that never completed.
                    self._pending[0][1].block_until_ready()
                    self.completed = self._pending.popleft()[0]
            except Exception:  # noqa: BLE001 (a failed step, or arrays a torn-down job deleted)
                pass
            return {'dispatched': self.dispatched, 'completed': self.completed}

    @staticmethod
    def parse(value) -> dict | None:
        """A report as the launcher receives it, or None if it is not one (never trusted
        blindly, never fatal); `held` is where an injected failure holds the worker."""
        if not isinstance(value, dict):
            return None
        for name in ('dispatched', 'completed'):
            if type(value.get(name)) is not int or value[name] < 0:  # bool is refused too
                return None
        held = value.get('held')
        if held is not None and not (isinstance(held, dict) and held.get('kind') in ('publish', 'snapshot')
                                     and type(held.get('step')) is int):
            return None
        return {'dispatched': value['dispatched'], 'completed': value['completed'], 'held': held}


class Worker:
    """The actor (`ray.remote(Worker)`): one process of one generation."""

    def __init__(self, env: dict):
        placement_lib.enter(env)  # XLA's flags and device count, before anything starts JAX
        self.created = time.time()
        self.progress_ = Progress()
        self.points = None  # this generation's chaos.FaultPoints
        self.guard = None  # the PreemptionGuard while training
        self._stop_pending = False
        self._lock = threading.Lock()

    def info(self) -> dict:
        import ray
        context = ray.get_runtime_context()
        return {'pid': os.getpid(), 'node_id': context.get_node_id(),
                'ip': ray.util.get_node_ip_address(), 'host': processes.this_host()}

    def free_port(self) -> int:
        """A free port on this node for the coordinator (process 0 binds it next)."""
        import ray
        with socket.socket() as s:
            s.bind((ray.util.get_node_ip_address(), 0))
            return s.getsockname()[1]

    def progress(self) -> dict:
        return dict(self.progress_.report(), held=self.points.held if self.points else None)

    def signal(self, signum: int) -> None:
        """An injected failure: the signal into this process."""
        os.kill(os.getpid(), int(signum))

    def request_stop(self) -> None:
        """The launcher's stop (SIGTERM, Ctrl-C): save the step JAX's preemption sync picks."""
        with self._lock:
            if self.guard is None:
                self._stop_pending = True  # still starting: stop at the first step
                return
        self.guard.request('a stop from the launcher')

    def run(self, args: WorkerArgs) -> dict:
        # Everything the process prints from here, Python's and XLA's, goes to this
        # generation's log of the worker.
        fd = os.open(os.path.join(args.out_dir, f'{args.tag}.log'), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                     0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        self.started, self.points = time.time(), args.fault_points
        try:
            return _run(args, self)
        except BaseException:
            import traceback
            traceback.print_exc()  # the launcher shows the end of the log
            sys.stdout.flush()
            sys.stderr.flush()
            raise

    def _guarding(self, guard) -> None:
        """The training loop's guard is active: a stop asked for before it goes through now."""
        with self._lock:
            self.guard, pending = guard, self._stop_pending
        if pending:
            guard.request('a stop from the launcher')


def _run(args: WorkerArgs, actor: Worker) -> dict:
    # The way back up to the training loop, stamped (time.time()) at each phase's end
    # for the start record: imports, jax.distributed, the backend (CUDA on a GPU), the run's setup.
    cfg = args.cfg
    import jax
    from absl import logging

    from mecefo_jax.launch import worker_state
    from mecefo_jax.parallel import program_cache
    from mecefo_jax.training import run_setup
    imported_at = time.time()
    logging.set_verbosity(logging.WARNING)
    # Shared by every worker, generation and compile-ahead job: a program
    # compiled once loads on every process after a relaunch.
    program_cache.configure(cfg.launch.compilation_cache, args.workdir,
                            program_cache.program_context(cfg))
    t0 = time.perf_counter()
    join(args.coordinator, len(args.members), args.process_id)
    distributed_init_sec = time.perf_counter() - t0
    joined_at = time.time()
    devices = jax.devices()  # the backend starts here
    backend_up_at = time.time()
    rows = placement_lib.replica_rows(args.placement, list(args.members), devices)
    # Orbax checkpoints every train.checkpoint_every steps in either tier: the disk tier
    # under the keepers' memory tier (REFT and Orbax's emergency checkpointing keep
    # both), so losing the launcher or a node loses at most the steps since the last save.
    run = run_setup.build_run(cfg, args.workdir, replica_rows=rows)
    restore, restored = worker_state.restore_fn(args)
    snapshots = worker_state.SnapshotObservers.of(args)
    start_record = dict(worker=args.worker, generation=args.generation, pid=os.getpid(),
                        start_ticks=processes.start_ticks(os.getpid()),  # to tell a reused pid
                        process_start=actor.started, actor_created=actor.created,
                        imported_at=imported_at, joined_at=joined_at, backend_up_at=backend_up_at,
                        device_kind=devices[0].device_kind,
                        distributed_init_sec=distributed_init_sec, resume=args.resume)
    provenance = os.path.join(args.out_dir, 'provenance.jsonl') if jax.process_index() == 0 else None
    step_log = StepLog(actor.progress_, provenance, os.path.join(args.out_dir, f'{args.tag}_start.json'),
                       start_record, restored)
    summary, preempted = _train(cfg, args, run, restore, [step_log, *snapshots.observers], actor)
    snapshots.close()  # the keeper holds the last snapshot before the launcher goes on
    if preempted is None:
        end = end_record(cfg, args, summary, snapshots.hook, median_step_sec=step_log.median_step_sec())
    else:
        end = {'worker': args.worker, 'generation': args.generation, 'final_step': preempted,
               'finished': False, 'preempted': True}
    files.write_json(os.path.join(args.out_dir, f'{args.tag}_end.json'), end, default=str)
    step_log.close()
    leave(f'end of generation {args.generation}')
    return end


def _train(cfg, args: WorkerArgs, run, restore, observers, actor: Worker):
    """(summary, None), or (None, the saved step) when the launcher asked the job to stop."""
    from mecefo_jax.run import run as train_run
    from mecefo_jax.training.preemption import Preempted, PreemptionGuard
    with PreemptionGuard() as preemption:  # JAX's preemption sync picks one step for all
        actor._guarding(preemption)  # noqa: SLF001 (its own actor)
        try:
            return train_run(cfg, args.workdir, run=run, restore=restore, observers=observers,
                             stop_at=args.stop_at or None, elastic=True,
                             preemption=preemption), None
        except Preempted as stopped:
            return None, stopped.step


# ------------------------------------------------------------------ the job's coordinator

def join(coordinator: str, num_processes: int, process_id: int, *, timeout: float = 300.0) -> None:
    """`jax.distributed.initialize`, its coordinator bound to `coordinator` only.

    JAX's coordinator service binds every interface by default (`[::]:port`); here only
    the address the launcher chose. The other processes connect once it listens: a
    client that tries before gRPC's first reconnect backoff waits it out in full (a
    relaunch's start took 0.01 s or 1.2 s by which process got there first).
    """
    import jax
    if process_id != 0:
        _wait_listening(coordinator, timeout)
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id, coordinator_bind_address=coordinator)
    atexit.register(_exit_without_barrier)


def _wait_listening(address: str, timeout: float) -> bool:
    """Whether something accepts connections on host:port within `timeout` seconds."""
    host, port = address.rsplit(':', 1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)


def leave(tag: str) -> None:
    """Leave the job with every peer: wait until all reach `tag`, then JAX's shutdown (a
    process that shuts down while a peer still talks to the service can abort that peer)."""
    import jax
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(tag)
    jax.distributed.shutdown()
    atexit.unregister(_exit_without_barrier)


def _exit_without_barrier() -> None:
    """At exit, still in the job (its run failed because a peer died, or Ray tears its actor
    down): end here. JAX's shutdown barrier would wait for peers that may be dead until the
    coordination service's heartbeat aborts the process, 100 s later by default."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ------------------------------------------------------------------ what a worker records

class StepLog(Observer):
    """The worker's observer: progress and provenance per step, the start record once.

    The start record times the way back: everything up to the end of the first step,
    with the compile and refresh seconds of the events (a relaunch's failure) reported
    before it, and what the restore read (`restored`, filled by the restore).
    """

    def __init__(self, progress: Progress, provenance_path, start_path: str, record: dict,
                 restored: dict):
        self.progress, self.provenance_path = progress, provenance_path
        self.provenance = None  # opened at the first step, once the resumed step is known
        self.start_path, self.record, self.restored = start_path, record, restored
        self.events = []
        self.train_start, self.train_start_at = time.perf_counter(), time.time()
        self.first_done = False
        self.dispatched: list[float] = []  # each step's dispatch time (perf_counter)

    def median_step_sec(self, settle: int = 2) -> float | None:
        """This generation's median step, dispatch to dispatch, past its first `settle` steps
        (the loop dispatches a step once the previous one's outputs can be read, so the
        interval is a step's wall time, snapshot blocking included)."""
        times = self.dispatched[settle:]
        gaps = [b - a for a, b in zip(times, times[1:])]
        return statistics.median(gaps) if gaps else None

    def on_event(self, event) -> None:
        self.events.append(event)

    def on_step(self, done) -> None:
        import jax
        import numpy as np

        from mecefo_jax.training.metrics import truncate_rows_after
        self.progress.dispatched_step(done.step + 1, done.loss)
        self.dispatched.append(done.dispatched)
        if self.provenance is None and self.provenance_path is not None:
            # Steps past the resumed one were recorded by a run that did not keep them:
            # this run records them again, once.
            if os.path.exists(self.provenance_path):
                truncate_rows_after(self.provenance_path, done.step - 1)
            self.provenance = open(self.provenance_path, 'a')
        if self.provenance is not None:
            self.provenance.write(json.dumps({
                'generation': self.record['generation'], 'step': done.step,
                'batch_sha256': hashlib.sha256(np.ascontiguousarray(done.tokens_nbt)).hexdigest(),
                'covered': {str(k): v for k, v in sorted(done.layout.shards_covered().items())},
                'replicas': list(done.layout.replicas)}) + '\n')
            self.provenance.flush()
        if not self.first_done:
            self.first_done = True
            jax.block_until_ready(done.loss)
            self._write_start(done)

    def _write_start(self, done) -> None:
        from mecefo_jax.parallel import program_cache
        events = [e for e in self.events if e.step == done.step]
        restored = self.restored.get('restore')
        stats = program_cache.stats
        files.write_json(self.start_path, dict(
            resume_step=done.step, first_step_done=time.time(),
            compile_sec=done.compile_sec + sum(e.compile_sec for e in events),
            programs_compiled=stats.misses, programs_cached=stats.hits,
            programs_load_sec=stats.load_sec, programs_found_untraced=stats.untraced_hits,
            refresh_sec=sum(e.refresh_sec for e in events),
            train_start_to_first_step_sec=time.perf_counter() - self.train_start,
            train_start_at=self.train_start_at,
            **self.record, restore_sec=restored.seconds if restored else None,
            restore_bytes=restored.bytes_by_source if restored else None,
            restore_phases=restored.phases if restored else None,
            healed_bytes=restored.healed_bytes if restored else None), default=str)

    def close(self) -> None:
        if self.provenance is not None:
            self.provenance.close()


def end_record(cfg, args: WorkerArgs, summary: dict, hook, *, median_step_sec: float | None) -> dict:
    """The end record (and, for a complete run, the final parameters from process 0)."""
    import jax
    import numpy as np

    from mecefo_jax.parallel import program_cache
    state = summary.pop('state')
    stats = hook.stats if hook else None
    end = {'worker': args.worker, 'generation': args.generation,
           'params_sha256': _local_params_sha256(state.params),
           'final_step': summary['final_step'], 'finished': summary['final_step'] >= cfg.train.steps,
           'final_loss': summary['final_loss'], 'final_val_loss': summary['final_val_loss'],
           'snapshot_blocked_sec': hook.blocked_sec if hook else 0.0,
           'snapshots': hook.submitted if hook else 0,
           'snapshots_dropped': stats.dropped if stats else 0,
           # What this worker wrote per snapshot against its whole state: about 1/n of it
           # where snapshots are sharded over n workers (snapshot.shard).
           'snapshot_bytes': stats.bytes if stats else 0,
           'snapshot_parity_bytes': stats.parity_bytes if stats else 0,
           'snapshots_published': stats.published if stats else 0,
           'state_bytes': int(sum(x.nbytes for x in jax.tree.leaves(state))),
           'programs_compiled': program_cache.stats.misses,
           'programs_cached': program_cache.stats.hits,
           'median_step_sec': median_step_sec,
           'snapshot_cadence': hook.cadence.history if hook and hook.cadence else None}
    if end['finished']:
        from jax.experimental import multihost_utils
        params = multihost_utils.process_allgather(state.params, tiled=True)
        if jax.process_index() == 0:
            flat = {jax.tree_util.keystr(p): np.asarray(v)
                    for p, v in jax.tree_util.tree_leaves_with_path(params)}
            np.savez(os.path.join(args.out_dir, 'final_params.npz'), **flat)
    return end


def _local_params_sha256(params) -> str:
    """Hash of this process's parameter shards, after checking its copies of each agree
    (replicas of one shard index must be bit-identical on every device)."""
    import jax
    import numpy as np
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        copies = {}
        for shard in leaf.addressable_shards:
            key = tuple((s.start, s.stop) for s in shard.index)
            data = np.asarray(shard.data).tobytes()
            if copies.setdefault(key, data) != data:
                raise AssertionError(f'{jax.tree_util.keystr(path)}: local replicas differ')
        for key in sorted(copies, key=str):
            digest.update(repr((jax.tree_util.keystr(path), key)).encode())
            digest.update(copies[key])
    return digest.hexdigest()
