"""One training worker of a launcher job: a Ray actor on one host, one `jax.distributed` process.

The launcher creates a `Worker` actor per worker and generation, on the
node of that worker's keeper, and calls `run(WorkerArgs)`: the worker joins
the generation's `jax.distributed` job, restores the state (from the
keepers' in-memory snapshots, the Orbax checkpoint, or a fresh init), and
trains through `main.run` under the fault controller, with the replicas of
absent workers marked down, so the strategy (MeCeFO by default) places
their shards on live neighbours. It snapshots the state into its keeper
after every `snapshot.every` steps and stops at `stop_at` when the
launcher plans a rejoin. `run` returns the end record; an exception in it
is a program error, which the launcher shows and does not relaunch.

While `run` trains, other threads of the actor answer `progress()` (the
launcher's watchdog), `request_stop()` (a stop: the workers save the step
JAX's preemption sync picks) and `signal()` (injected failures).

It writes, under `<workdir>/launch/`: its log `g<G>_w<W>.log` (from `run`
on),
`g<G>_w<W>_start.json` once its first step has run (how long joining,
restoring, compiling and the first step took), `g<G>_w<W>_end.json` when it
finishes, and (process 0) `provenance.jsonl` (per step: the global batch's
hash and which examples of which shard were computed) and, when the run is
complete, `final_params.npz`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import statistics
import sys
import threading
import time

from mecefo_jax import atomic_file
from mecefo_jax.launch.progress import Progress
from mecefo_jax.observers import Observer  # pure Python: no jax before the actor is up


def this_host() -> str:
    """This machine, by name and boot: a pid names a process only on its own machine."""
    try:
        with open('/proc/sys/kernel/random/boot_id') as f:
            boot = f.read().strip()
    except OSError:
        boot = ''
    return f'{socket.gethostname()}/{boot}'


@dataclasses.dataclass(frozen=True)
class WorkerArgs:
    """What one worker of one generation runs (sent by the launcher to its actor)."""
    config_json: str  # the job's resolved config (Config.to_json): one resolution for every worker
    workdir: str
    coordinator: str  # host:port of the jax.distributed coordinator (process 0)
    members: tuple  # worker ids of this generation, in process order
    worker: int  # this worker (stable across relaunches)
    workers: int  # workers of the full job
    generation: int = 0
    resume: str = 'fresh'  # 'fresh' | 'memory' | 'disk'
    resume_step: int = 0  # memory: the snapshot step to restore (0: the processes agree)
    stop_at: int = 0  # stop after this step (0: train.steps)
    keepers: tuple = ()  # each worker's KeeperHandle, None where it has none
    hold_in_publish: int = 0  # drills: hold inside the publish of this snapshot step (0: never)
    hold_after_snapshot: int = 0  # drills: hold after the first snapshot at or after this step

    @property
    def process_id(self) -> int:
        return self.members.index(self.worker)

    @property
    def out_dir(self) -> str:
        return os.path.join(self.workdir, 'launch')

    @property
    def tag(self) -> str:
        return f'g{self.generation}_w{self.worker}'


class Worker:
    """The actor (`ray.remote(Worker)`): one process of one generation.

    Created ahead as a *standby* (`launch/standby.py`) it imports jax and the
    training stack in a thread at the lowest OS priority (Linux niceness is
    per thread), so that a relaunch finds a warm process without the warm-up
    slowing the generation that trains meanwhile. Only a warm one is taken:
    on a loaded machine a thread at that priority holds the GIL and the import
    lock for seconds at a time, and the actor would not answer.
    """

    def __init__(self, warm: bool = True):
        self.created = time.time()
        self.warmed = None  # time.time() the imports were done
        self.progress_ = Progress()
        self.guard = None  # the PreemptionGuard while training
        self._stop_pending = False
        self._lock = threading.Lock()
        if warm:
            threading.Thread(target=self._warm, name='warm-up', daemon=True).start()

    def _warm(self) -> None:
        os.nice(19)  # this thread only
        import jax  # noqa: F401  (no backend starts here: XLA_FLAGS still apply)

        from mecefo_jax import main, train  # noqa: F401
        from mecefo_jax.launch import worker_state  # noqa: F401
        self.warmed = time.time()

    def is_warm(self) -> bool:
        """Whether the warm-up imports are done (a standby still in them is not taken)."""
        return self.warmed is not None

    def info(self) -> dict:
        import ray
        context = ray.get_runtime_context()
        return {'pid': os.getpid(), 'node_id': context.get_node_id(),
                'ip': ray.util.get_node_ip_address(), 'host': this_host()}

    def free_port(self) -> int:
        """A free port on this node for the coordinator (process 0 binds it next)."""
        import ray
        with socket.socket() as s:
            s.bind((ray.util.get_node_ip_address(), 0))
            return s.getsockname()[1]

    def progress(self) -> dict:
        return self.progress_.report()

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
        self.started = time.time()
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
    from mecefo_jax.config_resolve import loads_json
    cfg = loads_json(args.config_json)
    import jax
    from absl import logging
    logging.set_verbosity(logging.WARNING)
    # Shared by every worker, generation and compile-ahead job: a program
    # compiled once loads on every process after a relaunch.
    from mecefo_jax import program_cache
    program_cache.configure(cfg.launch.compilation_cache, args.workdir,
                            program_cache.program_context(cfg))
    t0 = time.perf_counter()
    from mecefo_jax.launch.coordinator import join
    join(args.coordinator, len(args.members), args.process_id)
    distributed_init_sec = time.perf_counter() - t0

    from mecefo_jax import train as train_lib
    from mecefo_jax.launch import placement as placement_lib
    placement = placement_lib.Placement(args.workers, cfg.launch.local_devices, cfg.mesh.model)
    placement.check_mesh(cfg.mesh)
    rows = placement_lib.replica_rows(placement, list(args.members), jax.devices())
    # Orbax checkpoints every train.checkpoint_every steps in either mode: the
    # disk tier under the keepers' memory tier (REFT and Orbax's emergency
    # checkpointing keep both), so losing the launcher or a node loses at most
    # the steps since the last save.
    run = train_lib.build_run(cfg, args.workdir, replica_rows=rows)

    info: dict = {}
    restore = _restore_fn(args, info)
    snapshot_hook = _snapshot_hook(cfg, args, actor.progress_)
    provenance = (os.path.join(args.out_dir, 'provenance.jsonl')
                  if jax.process_index() == 0 else None)
    start_record = dict(worker=args.worker, generation=args.generation, pid=os.getpid(),
                        process_start=actor.started, actor_created=actor.created,
                        actor_warm_sec=(actor.warmed or time.time()) - actor.created,
                        distributed_init_sec=distributed_init_sec, resume=args.resume)
    step_log = _StepLog(actor.progress_, provenance,
                        os.path.join(args.out_dir, f'{args.tag}_start.json'), start_record, info)
    observers = [step_log] + ([snapshot_hook] if snapshot_hook is not None else [])
    summary, preempted = _train(cfg, args, run, restore, observers, actor)
    if snapshot_hook is not None:
        snapshot_hook.close()  # the keeper holds the last snapshot before the launcher goes on
    if preempted is None:
        end = _end_record(cfg, args, summary, snapshot_hook,
                          median_step_sec=step_log.median_step_sec())
    else:
        end = {'worker': args.worker, 'generation': args.generation, 'final_step': preempted,
               'finished': False, 'preempted': True}
    atomic_file.write_json(os.path.join(args.out_dir, f'{args.tag}_end.json'), end, default=str)
    if step_log.provenance is not None:
        step_log.provenance.close()
    from mecefo_jax.launch.coordinator import leave
    leave(f'end of generation {args.generation}')
    return end


def _restore_fn(args: WorkerArgs, info: dict):
    """`resume`'s restore callback; None for 'fresh'.

    'fresh' restores the newest intact disk checkpoint if the workdir has one
    (a rerun after the launcher and its keepers were lost), else starts a new run.
    """
    from mecefo_jax.launch import worker_state
    if args.resume == 'memory':
        return worker_state.keeper_restore(list(args.keepers), args.worker, info,
                                           step=args.resume_step or None)
    if args.resume == 'disk':
        return worker_state.disk_restore(info)
    return None


def _train(cfg, args: WorkerArgs, run, restore, observers, actor: Worker):
    """(summary, None), or (None, the saved step) when the launcher asked the job to stop."""
    from mecefo_jax.main import run as train_run
    from mecefo_jax.preemption import Preempted, PreemptionGuard
    with PreemptionGuard() as preemption:  # JAX's preemption sync picks one step for all
        actor._guarding(preemption)  # noqa: SLF001 (its own actor)
        try:
            return train_run(cfg, args.workdir, run=run, restore=restore, observers=observers,
                             stop_at=args.stop_at or None, elastic=True,
                             preemption=preemption), None
        except Preempted as stopped:
            return None, stopped.step


def _end_record(cfg, args: WorkerArgs, summary: dict, snapshot_hook, *,
                median_step_sec: float | None) -> dict:
    """The end record (and, for a complete run, the final parameters from process 0)."""
    import jax
    import numpy as np

    from mecefo_jax import program_cache
    state = summary.pop('state')
    end = {'worker': args.worker, 'generation': args.generation,
           'params_sha256': _local_params_sha256(state.params),
           'final_step': summary['final_step'], 'finished': summary['final_step'] >= cfg.train.steps,
           'final_loss': summary['final_loss'], 'final_val_loss': summary['final_val_loss'],
           'snapshot_blocked_sec': snapshot_hook.blocked_sec if snapshot_hook else 0.0,
           'snapshots': snapshot_hook.submitted if snapshot_hook else 0,
           'programs_compiled': program_cache.stats.misses,
           'programs_cached': program_cache.stats.hits,
           'median_step_sec': median_step_sec,
           'snapshot_cadence': (snapshot_hook.cadence.history
                                if snapshot_hook and snapshot_hook.cadence else None)}
    if end['finished']:
        from jax.experimental import multihost_utils
        params = multihost_utils.process_allgather(state.params, tiled=True)
        if jax.process_index() == 0:
            flat = {jax.tree_util.keystr(p): np.asarray(v)
                    for p, v in jax.tree_util.tree_leaves_with_path(params)}
            np.savez(os.path.join(args.out_dir, 'final_params.npz'), **flat)
    return end


class _StepLog(Observer):
    """The worker's observer: progress and provenance per step, the start record once.

    The start record times the way back: everything up to the end of the
    first step, with the compile and refresh seconds of the events (a
    relaunch's failure) reported before it.
    """

    def __init__(self, progress: Progress, provenance_path, start_path: str, record: dict,
                 info: dict):
        self.progress, self.provenance_path = progress, provenance_path
        self.provenance = None  # opened at the first step, once the resumed step is known
        self.start_path, self.record, self.info = start_path, record, info
        self.events = []
        self.train_start = time.perf_counter()
        self.first_done = False
        self.dispatched: list[float] = []  # each step's dispatch time (perf_counter)

    def median_step_sec(self, settle: int = 2) -> float | None:
        """This generation's median step, dispatch to dispatch, past its first `settle` steps.

        The loop dispatches a step once the previous one's outputs can be
        read, so the interval is a step's wall time, snapshot blocking included.
        """
        times = self.dispatched[settle:]
        gaps = [b - a for a, b in zip(times, times[1:])]
        return statistics.median(gaps) if gaps else None

    def on_event(self, event) -> None:
        self.events.append(event)

    def on_step(self, done) -> None:
        import jax
        import numpy as np

        from mecefo_jax.metrics import truncate_rows_after
        self.progress.dispatched_step(done.step + 1, done.loss)
        self.dispatched.append(done.dispatched)
        if self.provenance is None and self.provenance_path is not None:
            # Steps past the resumed one were recorded by a run that did not
            # keep them: this run records them again, once.
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
        from mecefo_jax import program_cache
        events = [e for e in self.events if e.step == done.step]
        restored = self.info.get('restore')
        atomic_file.write_json(self.start_path, dict(
            resume_step=done.step, first_step_done=time.time(),
            compile_sec=done.compile_sec + sum(e.compile_sec for e in events),
            programs_compiled=program_cache.stats.misses,
            programs_cached=program_cache.stats.hits,
            programs_load_sec=program_cache.stats.load_sec,
            programs_found_untraced=program_cache.stats.untraced_hits,
            refresh_sec=sum(e.refresh_sec for e in events),
            train_start_to_first_step_sec=time.perf_counter() - self.train_start,
            **self.record, restore_sec=restored.seconds if restored else None,
            restore_bytes=restored.bytes_by_source if restored else None,
            restore_phases=restored.phases if restored else None,
            healed_bytes=restored.healed_bytes if restored else None), default=str)


def _local_params_sha256(params) -> str:
    """Hash of this process's parameter shards, after checking its copies of each agree.

    Replicas of one shard index must be bit-identical on every device; the
    hash then lets the launcher's caller compare processes.
    """
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


def _held_forever(progress: Progress, kind: str, step: int, tag: str) -> None:
    """Report the hold and wait there for the launcher's signal (it never returns)."""
    progress.hold(kind, step)
    print(f'[{tag}] held ({kind}) at step {step}', flush=True)
    threading.Event().wait()


def _snapshot_hook(cfg, args: WorkerArgs, progress: Progress):
    """This worker's snapshot observer, or None when snapshots are off or it has no keeper.

    Drills hold the worker at a known point (`launch.kill ...:publish` or
    `...:snapshot`): the writer thread inside the publish of a step (bytes
    copied, not published), or the training loop after the first published
    snapshot at or after a step. The launcher sees the hold in the progress
    report and signals the process there.
    """
    from mecefo_jax.launch import worker_state
    keepers = args.keepers
    if cfg.snapshot.every == 0 or not keepers or keepers[args.worker] is None:
        return None
    before_publish = on_hold = None
    if args.hold_in_publish:
        def before_publish(step: int) -> None:
            if step == args.hold_in_publish:
                _held_forever(progress, 'publish', step, args.tag)
    if args.hold_after_snapshot:
        def on_hold(step: int) -> None:
            _held_forever(progress, 'snapshot', step, args.tag)
    parity = _parity_pusher(cfg, args) if cfg.snapshot.parity else None
    return worker_state.SnapshotHook(
        keepers[args.worker], cfg.snapshot.every, parity=parity, before_publish=before_publish,
        stop_at=args.stop_at or None, hold_after=args.hold_after_snapshot or None,
        on_hold=on_hold, budget_pct=cfg.snapshot.overhead_budget_pct,
        log=lambda msg: print(f'[worker {args.worker}] {msg}', flush=True))


def _parity_pusher(cfg, args: WorkerArgs):
    """The pusher of this worker's parity group (groups of snapshot.parity_group workers)."""
    from mecefo_jax.snapshot import ParityPusher
    size = cfg.snapshot.parity_group  # snapshot.parity is 'xor': checked at resolve
    first = args.worker - args.worker % size
    group = list(range(first, min(first + size, len(args.keepers))))
    return ParityPusher(f'workers{first}-{group[-1]}', args.worker - first,
                        [args.keepers[w] for w in group], generation=args.generation)
