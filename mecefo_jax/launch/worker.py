"""One training worker of a launcher job: a Ray actor on one host, one `jax.distributed` process.

The launcher creates a `Worker` actor per worker and generation, on the
node of that worker's keeper, and calls `run(WorkerArgs)`: the worker joins
the generation's `jax.distributed` job, restores the state (from the
keepers' in-memory snapshots, the Orbax checkpoint, or a fresh init), and
trains through `run.run` under the fault controller, with the replicas of
absent workers marked down, so `fault.strategy` absorbs their shards
(`drop` skips them; MeCeFO places them on live neighbours). It snapshots
the state into its keeper after every `snapshot.every` steps and stops at `stop_at` when the
launcher plans a rejoin. `run` returns the end record; an exception in it
is a program error, which the launcher shows and does not relaunch.

While `run` trains, other threads of the actor answer `progress()` (the
launcher's watchdog), `request_stop()` (a stop: the workers save the step
JAX's preemption sync picks) and `signal()` (injected failures).

It writes, under `<workdir>/launch/`: its log `g<G>_w<W>.log` (from `run`
on), `g<G>_w<W>_start.json` once its first step has run (how long joining,
restoring, compiling and the first step took), `g<G>_w<W>_end.json` when it
finishes, and (process 0) `provenance.jsonl` (per step: the global batch's
hash and which examples of which shard were computed) and, when the run is
complete, `final_params.npz`. What they hold is `worker_records`; its
snapshot observer and restore come from `worker_snapshots`.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time

from mecefo_jax.host import files, processes
from mecefo_jax.launch import actors, worker_records, worker_snapshots
from mecefo_jax.launch.progress import Progress
from mecefo_jax.launch.worker_args import WorkerArgs


class Worker:
    """The actor (`ray.remote(Worker)`): one process of one generation.

    Created ahead as a *standby* (`launch/standby.py`) it imports jax and the
    training stack in a thread at the lowest OS priority (Linux niceness is
    per thread), so that a relaunch finds a warm process without the warm-up
    slowing the generation that trains meanwhile. Only a warm one is taken:
    on a loaded machine a thread at that priority holds the GIL and the import
    lock for seconds at a time, and the actor would not answer.
    """

    def __init__(self, env: dict, warm: bool = True):
        actors.enter(env)  # XLA's flags and device count, before anything starts JAX
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

        from mecefo_jax import main  # noqa: F401
        from mecefo_jax.launch import worker_state  # noqa: F401
        from mecefo_jax.training import loop  # noqa: F401
        self.warmed = time.time()

    def is_warm(self) -> bool:
        """Whether the warm-up imports are done (a standby still in them is not taken)."""
        return self.warmed is not None

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
    cfg = args.cfg
    import jax
    from absl import logging
    logging.set_verbosity(logging.WARNING)
    # Shared by every worker, generation and compile-ahead job: a program
    # compiled once loads on every process after a relaunch.
    from mecefo_jax.parallel import program_cache
    program_cache.configure(cfg.launch.compilation_cache, args.workdir,
                            program_cache.program_context(cfg))
    t0 = time.perf_counter()
    from mecefo_jax.launch.coordinator import join
    join(args.coordinator, len(args.members), args.process_id)
    distributed_init_sec = time.perf_counter() - t0

    from mecefo_jax.launch import placement as placement_lib
    from mecefo_jax.training import run_setup
    placement = placement_lib.Placement(args.workers, cfg.launch.local_devices, cfg.mesh.model)
    placement.check_mesh(cfg.mesh, cfg.data.global_batch_size)
    rows = placement_lib.replica_rows(placement, list(args.members), jax.devices())
    # Orbax checkpoints every train.checkpoint_every steps in either mode: the
    # disk tier under the keepers' memory tier (REFT and Orbax's emergency
    # checkpointing keep both), so losing the launcher or a node loses at most
    # the steps since the last save.
    run = run_setup.build_run(cfg, args.workdir, replica_rows=rows)

    info: dict = {}
    restore = worker_snapshots.restore_fn(args, info)
    snapshot_hook = worker_snapshots.snapshot_hook(cfg, args, actor.progress_)
    provenance = (os.path.join(args.out_dir, 'provenance.jsonl')
                  if jax.process_index() == 0 else None)
    start_record = dict(worker=args.worker, generation=args.generation, pid=os.getpid(),
                        start_ticks=processes.start_ticks(os.getpid()),  # to tell a reused pid
                        process_start=actor.started, actor_created=actor.created,
                        actor_warm_sec=(actor.warmed or time.time()) - actor.created,
                        distributed_init_sec=distributed_init_sec, resume=args.resume)
    step_log = worker_records.StepLog(actor.progress_, provenance,
                                      os.path.join(args.out_dir, f'{args.tag}_start.json'), start_record,
                                      info)
    observers = [step_log] + ([snapshot_hook] if snapshot_hook is not None else [])
    summary, preempted = _train(cfg, args, run, restore, observers, actor)
    if snapshot_hook is not None:
        snapshot_hook.close()  # the keeper holds the last snapshot before the launcher goes on
    if preempted is None:
        end = worker_records.end_record(cfg, args, summary, snapshot_hook,
                                        median_step_sec=step_log.median_step_sec())
    else:
        end = {'worker': args.worker, 'generation': args.generation, 'final_step': preempted,
               'finished': False, 'preempted': True}
    files.write_json(os.path.join(args.out_dir, f'{args.tag}_end.json'), end, default=str)
    if step_log.provenance is not None:
        step_log.provenance.close()
    from mecefo_jax.launch.coordinator import leave
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
