"""One generation of a job: its worker actors, how far they got, how each ended, its teardown.

A worker's `run` ends in a result (finished, or stopped as planned), a Python exception
(a program error: a relaunch would fail the same way) or Ray's report that its actor or
node died (a crash). A stopped or hung worker is caught by its silence: the launcher
asks every `PROGRESS_SEC` how far it got (Ray does not notice a stopped process). A
worker that JAX's runtime ended because a peer died is that death's echo, not a failure.
"""
from __future__ import annotations

import dataclasses
import os
import signal as signal_lib
import time

from mecefo_jax.host import processes
from mecefo_jax.launch import placement as placement_lib
from mecefo_jax.launch.chaos import NODE_LOSS_INJECTED
from mecefo_jax.launch.worker import Progress, Worker, WorkerArgs
from mecefo_jax.snapshot.keeper_actor import KeeperLost
from mecefo_jax.training.resume import Tier

PROGRESS_SEC = 0.2  # how often each worker is asked how far it got
_TEARDOWN_SEC = 30.0  # Ray kills a worker within this (SIGKILL from its raylet)
_EXIT_POLL_SEC = 0.02
_FINAL_REPORT_SEC = 2.0  # a survivor answers from a thread within milliseconds

CRASH, PROGRAM_ERROR = 'crash', 'program_error'
NODE_DIED = 'its node died'  # the cause of a worker whose node was lost
_TAIL_LINES = 20
# What a healthy process prints when JAX's distributed runtime ends it because
# another process died (the coordinator, or a peer it was waiting on).
JAX_ABORT_MARKER = 'the JAX distributed service detected fatal errors'
# What one prints when the CPU collectives' transport (gloo) fails on a message cut
# off by a peer's death: an exception its own thread cannot raise ends the process.
GLOO_ABORT_MARKER = 'Unhandled exception: N4gloo'
ABORTED_BY_JAX = "ended by JAX's runtime after a peer died"
_ABORT_TAIL_BYTES = 64 * 1024


def aborted_by_jax(log_path: str) -> bool:
    """Whether a dead worker's log ends with JAX's runtime terminating it for another
    process's death (its distributed service, or its collectives' transport).

    Such a worker is healthy: it is an echo of the death that caused it, relaunched as a
    survivor with its own keeper's snapshots, not a failure.
    """
    try:
        with open(log_path, 'rb') as f:
            f.seek(max(0, os.path.getsize(log_path) - _ABORT_TAIL_BYTES))
            tail = f.read().decode(errors='replace')
    except OSError:
        return False
    return JAX_ABORT_MARKER in tail or GLOO_ABORT_MARKER in tail


@dataclasses.dataclass(frozen=True)
class Death:
    """One dead worker of a generation."""
    worker: int
    cause: str  # 'killed by SIGKILL', 'its node died', 'no heartbeat for 3.1 s', ...
    kind: str  # CRASH | PROGRAM_ERROR
    failed_at: float  # time.time()


def log_tail(path: str, lines: int = _TAIL_LINES) -> str:
    """The last `lines` lines of a worker's log, from its last traceback if it has one."""
    try:
        with open(path, errors='replace') as f:
            text = f.read()
    except OSError as e:
        return f'(no log: {e})'
    rows = text.rstrip('\n').splitlines()
    start = max((i for i, r in enumerate(rows) if r.startswith('Traceback')), default=0)
    return '\n'.join(rows[max(start, len(rows) - lines):])


class WorkerProgramError(RuntimeError):
    """A worker failed in its own code: relaunching it would fail again."""

    def __init__(self, deaths: list, log_dir: str, generation: int, *, note: str | None = None):
        parts = []
        for d in deaths:
            path = os.path.join(log_dir, f'g{generation}_w{d.worker}.log')
            parts.append(f'Worker {d.worker} stopped with a program error ({d.cause}), not a '
                         f'crash, so it is not relaunched. The end of {path}:\n'
                         f'{log_tail(path)}')
        super().__init__('\n\n'.join(parts) + '\nFix the error and rerun the same command.'
                         + (f'\n{note}' if note else ''))
        self.workers = [d.worker for d in deaths]


@dataclasses.dataclass
class Generation:
    number: int
    members: list
    resume: Tier
    stop_at: int
    resume_step: int = 0  # Tier.MEMORY: the snapshot step every member restores
    started: float = 0.0  # time.time() of the spawn
    actors: dict = dataclasses.field(default_factory=dict)  # worker -> actor handle
    runs: dict = dataclasses.field(default_factory=dict)  # worker -> ObjectRef of run()
    info: dict = dataclasses.field(default_factory=dict)  # worker -> {'pid', 'node_id', 'ip'}
    progress: dict = dataclasses.field(default_factory=dict)  # worker -> latest report
    heard: dict = dataclasses.field(default_factory=dict)  # worker -> monotonic of the last report
    asked: dict = dataclasses.field(default_factory=dict)  # worker -> ObjectRef of progress() unanswered
    asked_at: dict = dataclasses.field(default_factory=dict)  # worker -> monotonic of the last ask
    ends: dict = dataclasses.field(default_factory=dict)  # worker -> end record of a finished run
    dead: set = dataclasses.field(default_factory=set)  # workers whose death was reported
    rejected: int = 0  # progress reports that were not reports
    settled: bool = False  # a crash was seen and its echoes collected

    def completed(self) -> int:
        """The most steps any worker has completed."""
        return max((p['completed'] for p in self.progress.values()), default=0)

    def held(self, worker: int) -> dict | None:
        return (self.progress.get(worker) or {}).get('held')

    def signal(self, worker: int, signum: int) -> None:
        """Send `signum` into a worker (its own thread delivers it: any node, any state but stopped)."""
        self.actors[worker].signal.remote(int(signum))

    def wait_dead(self, worker: int, timeout: float = _TEARDOWN_SEC) -> None:
        import ray
        ray.wait([self.runs[worker]], timeout=timeout)


def spawn(gen: Generation, *, args: dict, nodes: dict, env: dict, gpus: dict,
          timeout: float) -> tuple[list, list]:
    """Start `gen`'s workers on their nodes and their `run`s (`args[w]` are WorkerArgs fields).

    Process 0 chooses the coordinator's port on its node first: the
    coordinator binds only that address (`coordinator.join`). Returns the
    workers whose actor died before it could start (its node went meanwhile)
    and those whose actor did not answer within `timeout` (a loaded host: the
    start timed out, no worker failed); where either is not empty no `run`
    is started.
    """
    import ray
    from ray.exceptions import GetTimeoutError, RayError
    cls = ray.remote(Worker)
    gen.started = time.time()
    for w in gen.members:
        opts = placement_lib.actor_options(node_id=nodes[w], gpus=gpus.get(w, 0), concurrency=4)
        gen.actors[w] = cls.options(**opts).remote(env)
    dead, late = [], []
    for w in gen.members:
        try:
            gen.info[w] = ray.get(gen.actors[w].info.remote(), timeout=timeout)
        except GetTimeoutError:
            late.append(w)
        except RayError:
            dead.append(w)
    if dead or late:
        return dead, late
    first = gen.actors[gen.members[0]]
    coordinator = f"{gen.info[gen.members[0]]['ip']}:{ray.get(first.free_port.remote(), timeout=timeout)}"
    now = time.monotonic()
    for w in gen.members:
        gen.heard[w] = now
        gen.runs[w] = gen.actors[w].run.remote(WorkerArgs(coordinator=coordinator, worker=w,
                                                          members=tuple(gen.members), **args[w]))
    return [], []


def poll_progress(gen: Generation) -> None:
    """Collect the progress reports that arrived; ask the workers that are due again."""
    import ray
    from ray.exceptions import RayError
    now = time.monotonic()
    refs = {ref: w for w, ref in gen.asked.items()}
    if refs:
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        for ref in ready:
            w = refs[ref]
            del gen.asked[w]
            try:
                report = Progress.parse(ray.get(ref))
            except RayError:  # dead: its run() says how
                continue
            if report is None:
                gen.rejected += 1
                continue
            gen.progress[w], gen.heard[w] = report, now
    for w in gen.members:  # one request in flight per worker: a stopped one piles up nothing
        if (w not in gen.asked and w not in gen.ends and w not in gen.dead
                and now - gen.asked_at.get(w, 0.0) >= PROGRESS_SEC):
            gen.asked[w], gen.asked_at[w] = gen.actors[w].progress.remote(), now


def final_progress(gen: Generation, workers, timeout: float = _FINAL_REPORT_SEC) -> int:
    """Ask `workers` how far they got, now, and wait for their answers (up to `timeout`).

    After a death the routine reports can be a step behind: a survivor
    finishes a step whose collectives the dead worker joined before it died,
    after the poll before the death was decided (an echo, whose collective
    failed next, answers too: its actor lives on). Returns `gen.completed()`.
    """
    import ray
    from ray.exceptions import RayError
    refs = {gen.actors[w].progress.remote(): w for w in workers if w in gen.actors}
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout) if refs else ([], [])
    for ref in ready:
        try:
            report = Progress.parse(ray.get(ref))
        except RayError:  # it died meanwhile
            continue
        if report is not None:
            gen.progress[refs[ref]] = report
    return gen.completed()


def exits(gen: Generation, now: float, injected: dict, log_dir: str | None = None) -> list[Death]:
    """Every worker whose run ended in an error or a crash (finished runs join `gen.ends`).

    `injected[w]` names a signal the launcher sent worker w, for its cause; a
    worker whose log (in `log_dir`) shows JAX ended it for a peer's death is
    named so (ABORTED_BY_JAX), to be told apart from the death that caused it.
    """
    import ray
    from ray.exceptions import RayActorError, RayError, RayTaskError
    pending = {ref: w for w, ref in gen.runs.items() if w not in gen.ends and w not in gen.dead}
    if not pending:
        return []
    ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
    deaths = []
    for ref in ready:
        w = pending[ref]
        try:
            gen.ends[w] = ray.get(ref)
        except RayTaskError as e:  # its own code raised (RayActorError is a crash)
            if isinstance(e, RayActorError):
                deaths.append(Death(w, _crash_or_abort(e, injected.get(w), log_dir, gen, w),
                                    CRASH, now))
            elif isinstance(e.cause, KeeperLost):  # its keeper died: the memory tier crashed
                deaths.append(Death(w, 'its keeper died', CRASH, now))
            else:
                deaths.append(Death(w, f'{type(e.cause).__name__}: {e.cause}', PROGRAM_ERROR, now))
        except RayError as e:
            deaths.append(Death(w, _crash_or_abort(e, injected.get(w), log_dir, gen, w),
                                CRASH, now))
    gen.dead.update(d.worker for d in deaths)
    return deaths


def _crash_or_abort(error, injected: str | None, log_dir: str | None, gen: Generation,
                    worker: int) -> str:
    """The crash's cause; ABORTED_BY_JAX for an uninjected death that JAX's runtime caused."""
    if injected is None and log_dir is not None and aborted_by_jax(
            os.path.join(log_dir, f'g{gen.number}_w{worker}.log')):
        return ABORTED_BY_JAX
    return crash_cause(error, injected)


def crash_cause(error, injected: str | None) -> str:
    """What Ray says killed the worker, named plainly (a node the launcher killed itself is
    a lost node even when Ray reports the actor's death before the node's)."""
    text = str(error)
    if (injected == NODE_LOSS_INJECTED or 'node has died' in text or 'node died' in text
            or 'NODE_DIED' in text):
        return NODE_DIED
    return f'killed by {injected}' if injected else 'its process died'


def silent(gen: Generation, deaths: list, timeout: float, now: float, now_mono: float) -> list:
    """Every running worker that has not answered a progress request for `timeout` (a crash)."""
    dead = {d.worker for d in deaths} | gen.dead
    out = []
    for w in gen.members:
        if w in gen.ends or w in dead:
            continue
        quiet = now_mono - gen.heard[w]
        if quiet > timeout:
            out.append(Death(w, f'no heartbeat for {quiet:.1f} s', CRASH, now - quiet))
    gen.dead.update(d.worker for d in out)
    return out


def stop(gen: Generation | None) -> None:
    """Kill every worker of the generation (stopped ones too) and wait until they are gone.

    Gone means the process has exited, on this machine: Ray marks a killed
    actor dead before its process ends, and can end it by a graceful exit
    (Python's, atexit included) instead of the kill. A worker blocked in a
    collective, or stopped, never exits gracefully: Ray's raylet SIGKILLs it
    only after `kill_worker_timeout_milliseconds` (5 s by default). The ones
    on this machine are SIGKILLed here at once; the others wait for Ray.
    """
    if gen is None or not gen.actors:
        return
    import ray
    for actor in gen.actors.values():
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 (already dead)
            pass
    here = processes.this_host()
    local = [gen.info[w]['pid'] for w in gen.actors if gen.info.get(w, {}).get('host') == here]
    _kill_ray_workers(local)
    ray.wait(list(gen.runs.values()), num_returns=len(gen.runs), timeout=_TEARDOWN_SEC)
    wait_exited(local, _TEARDOWN_SEC)
    gen.actors.clear()


def _kill_ray_workers(pids: list) -> None:
    """SIGKILL each pid that is still a Ray worker (one that is not has exited: its pid reused)."""
    for p in pids:
        if (processes.cmdline(p) or '').startswith('ray::'):
            try:
                os.kill(p, signal_lib.SIGKILL)
            except ProcessLookupError:
                pass


def wait_exited(pids: list, timeout: float) -> None:
    """Wait until every process in `pids` (Ray workers on this machine) has exited.

    Past `timeout`, the ones still Ray workers are SIGKILLed and waited for;
    one that is not has exited and its pid was reused.
    """
    deadline = time.monotonic() + timeout
    while pids := [p for p in pids if processes.alive(p)]:
        if time.monotonic() > deadline:
            pids = [p for p in pids if (processes.cmdline(p) or '').startswith('ray::')]
            _kill_ray_workers(pids)
            deadline = float('inf')
        time.sleep(_EXIT_POLL_SEC)
