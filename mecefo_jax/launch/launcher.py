"""The launcher: a job's generations on Ray, each one's end judged, relaunches, each recovery reported.

A job runs in *generations*: `Worker` actors over the workers that are up, one
`jax.distributed` job. A worker's end comes from Ray (a crash: its actor or node
died; a program error: its code raised) or from its silence (a stopped or hung one:
`launch.heartbeat_timeout_sec`). A failure tears the generation down (a JAX collective
cannot finish without the dead process) and `recovery` plans the next one: under
`launch.recovery=memory` the survivors relaunched from the keepers' snapshots with the
failed workers' replicas down, so `fault.strategy` absorbs their shards (REFT, arXiv
2310.12670); under `disk` every worker from the Orbax checkpoint. A program error stops
the job at once with the end of the worker's log. A generation that completes no step
within `launch.start_timeout_sec`, or none for `launch.stall_timeout_sec` after its
first (a collective that never finishes), is relaunched on the same workers.

Keepers are detached, named actors: they outlive a worker and the launcher, whose
rerun finds them and resumes from their memory; a job that ends ends its keepers. Each
recovery is a row of `launch/recoveries.jsonl`; docs/launch.md describes all of it.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

from mecefo_jax.config import record as config_record
from mecefo_jax.config.defaults import Config
from mecefo_jax.config.resolve import updated
from mecefo_jax.host import files
from mecefo_jax.launch import cluster, generation, recovery
from mecefo_jax.launch import placement as placement_lib
from mecefo_jax.launch.chaos import Injector, parse_kills
from mecefo_jax.launch.compile_ahead import CompileAhead
from mecefo_jax.launch.generation import ABORTED_BY_JAX, CRASH, Generation, WorkerProgramError
from mecefo_jax.launch.keepers import JobKeepers
from mecefo_jax.launch.placement import WHOLE_SNAPSHOTS, Placement, assign_nodes, node_loss_plan
from mecefo_jax.launch.recovery import JobState
from mecefo_jax.training.resume import Tier
from mecefo_jax.training.summaries import LAUNCH_RUN, Summaries, recovery_scalars, run_dir

_POLL_SEC = 0.05


class GaveUp(RuntimeError):
    """The job failed more than `launch.max_relaunches` times in a row of relaunches."""


class Launcher:
    """Runs one job to completion through failures (see the module docstring).

    Call it with this process connected to the job's Ray cluster
    (`ray_cluster.join`; `joined`, what that returned, is reported: Ray's
    start-up is not part of any recovery). `node_killer(node_id)`, from
    whoever owns a simulated cluster, makes node losses injectable (`launch.kill`).
    """

    def __init__(self, cfg: Config, workdir: str, nprocs: int, *, log=print, node_killer=None,
                 joined=None):
        self.joined = joined
        self.workdir = os.path.realpath(workdir)
        self.dir = os.path.join(self.workdir, 'launch')
        placement = Placement(nprocs, cfg.launch.local_devices, cfg.mesh.model)
        placement.check_mesh(cfg.mesh, cfg.data.global_batch_size)
        if cfg.launch.recovery == 'disk' and cfg.train.checkpoint_every < 1:
            raise ValueError('launch.recovery=disk needs train.checkpoint_every >= 1; '
                             'set --config.train.checkpoint_every=10.')
        kills = parse_kills(cfg.launch.kill, placement.workers)
        if cfg.snapshot.every == 0 and any(k.after_snapshot for k in kills):
            raise ValueError(f'launch.kill={cfg.launch.kill!r}: a kill after a snapshot needs '
                             "snapshots; set --config.snapshot.every=auto or drop ':snapshot'.")
        keepers = JobKeepers(cluster.namespace_of(self.workdir), placement.workers, slots=cfg.snapshot.slots)
        nodes: dict[int, str] = {}
        injector = Injector(kills, keepers=keepers, nodes=nodes, out_dir=self.dir, log=log,
                            node_killer=node_killer)
        self.timeout = cfg.launch.heartbeat_timeout_sec
        self.recoveries: list[dict] = []
        self.summaries = Summaries(run_dir(self.workdir, LAUNCH_RUN)) if cfg.train.tensorboard else None
        self.started_at, self.failures_seen = time.time(), 0  # observed failure rate (cadence)
        self._generation: Generation | None = None
        self._progress_rejected = 0
        self._pending: dict | None = None  # recorded once its generation started: a launcher killed later keeps it
        # What the recovery planner reads and changes between generations.
        self.job = JobState(cfg, placement, keepers, nodes, injector,
                            CompileAhead(cfg, self.workdir, placement, log=log), log,
                            workdir=self.workdir)
        self.adopted: dict = {}  # the keepers an earlier launcher left, found at the start
        self.stepped = False  # a generation of this launcher completed a step
        self.stopped_keepers = False  # the job's keepers were ended with it

    # ------------------------------------------------------------------ run

    def run(self) -> dict:
        """Run the job to its end; the summary (also `launch/summary.json`)."""
        import ray
        if not ray.is_initialized():
            raise RuntimeError('The launcher needs a Ray cluster: connect first '
                               '(mecefo_jax.launch.cluster.join).')
        os.makedirs(self.dir, exist_ok=True)
        warning = cluster.node_loss_warning(cluster.health_check(), self.timeout)
        if warning:
            self.job.log(warning)
        started = self.started_at = time.time()
        handlers = self._catch_stop_signals()
        error, outcome, gen, rejected = None, None, None, 0
        try:
            gen, pending = self._first_generation(started)
            self._keep(*recovery.record_left(self.dir))  # a killed launcher's open row
            first = gen.number
            while True:
                unborn, late = self._spawn(gen)
                if pending is not None:
                    pending.update(relaunched_at=gen.started, next_generation=gen.number)
                self._pending = pending
                recovery.hold(self.dir, pending)
                outcome = (Outcome('failed', unborn, 'its actor died before it started',
                                   gen.started, time.time(), gen.resume_step) if unborn
                           else start_timed_out(self.job, gen, time.time()) if late
                           else self._watch(gen))
                self._progress_rejected += gen.rejected
                self._finish_pending()  # if no first step completed it sooner
                if outcome.kind in ('finished', 'preempted'):
                    break
                if outcome.kind == 'error':
                    error = self._program_error(gen, outcome)
                    break
                pending, gen = recovery.plan_next(self.job, gen, outcome)
                self.failures_seen += pending['kind'] == 'failure'
                if gen.number - first > self.job.cfg.launch.max_relaunches:
                    error = self._gave_up(gen, pending)
                    break
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            self.job.ahead.close()
            generation.stop(self._generation)
            if gen is not None and self.job.uses_keepers:
                rejected = self.job.keepers.rejected()
                self._end_keepers()
            if self.summaries is not None:
                self.summaries.close()
        summary = self._summary(gen, outcome, error, rejected)
        files.write_json(os.path.join(self.dir, 'summary.json'), summary)  # never half a file
        if error is not None:
            raise error
        return summary

    def _end_keepers(self) -> None:
        """Stop the job's keepers once it ran, else leave the ones it found as they were.

        A rerun that fails before its first step (a config that does not fit
        their snapshots, say) must not cost the memory tier that the next,
        corrected, rerun resumes from; only the keepers it started go.
        """
        if self.stepped or not self.adopted:
            self.job.keepers.stop_all()  # only once every worker has saved
            self.stopped_keepers = True
        else:
            self.job.keepers.stop(set(self.job.keepers.handles) - set(self.adopted))

    def _summary(self, gen: Generation, outcome, error, rejected: int) -> dict:
        return {'generations': gen.number - self._first_number + 1,
                'last_generation': gen.number, 'recoveries': self.recoveries,
                'final_members': gen.members, 'compile_ahead': self.job.ahead.report(),
                'preempted_at': (outcome.completed_steps if outcome.kind == 'preempted'
                                 else None),
                'unsaved_workers': outcome.unsaved,
                'program_error': {'workers': error.workers, 'message': str(error)}
                if isinstance(error, WorkerProgramError) else None,
                'gave_up': str(error) if isinstance(error, GaveUp) else None,
                'nodes': {str(w): n for w, n in sorted(self.job.nodes.items())},
                'lost_nodes': self.job.lost_nodes,
                'keeper_requests_rejected': rejected,
                'progress_reports_rejected': self._progress_rejected,
                'ray': cluster.describe(self.joined)}

    def _gave_up(self, gen: Generation, row: dict) -> GaveUp:
        """Too many relaunches: the row records the last failure, and the job stops."""
        row.update(kind='gave_up', next_generation=None)
        self._keep(recovery.append(self.dir, row))
        error = GaveUp(f'Gave up after {gen.number - 1 - self._first_number} relaunches '
                       '(launch.max_relaunches).')
        self.job.log(f'[launch] {error}')
        return error

    def _program_error(self, gen: Generation, outcome: Outcome) -> WorkerProgramError:
        """Stop the job on a program error: record it, never relaunch it."""
        generation.stop(gen)
        error = WorkerProgramError(outcome.deaths, self.dir, gen.number,
                                   note=None if self.stepped or not self.adopted
                                   else config_record.refusal_note(self.workdir, self.job.cfg))
        row = {'kind': 'program_error', 'ended_generation': gen.number,
               'failed_workers': outcome.failed, 'cause': outcome.cause,
               'failed_at': outcome.failed_at, 'completed_steps': outcome.completed_steps,
               'error': str(error)}
        self._keep(recovery.append(self.dir, row))
        self.job.log(f'[launch] {error}')
        return error

    # -------------------------------------------------------------- placement

    def _first_generation(self, started: float) -> tuple[Generation, dict | None]:
        """Generation 0 of this launcher: fresh, or from the keepers an earlier one left."""
        workers = list(range(self.job.placement.workers))
        self._first_number = recovery.next_generation_number(self.dir)
        adopted = self.adopted = self.job.keepers.find() if self.job.uses_keepers else {}
        strays = self.job.keepers.strays() if adopted else []
        if strays:
            raise ValueError(f"This workdir's job left keepers for workers {strays}, beyond --nprocs="
                             f'{self.job.placement.workers}: rerun with the --nprocs it ran with (--nprocs='
                             f'{max(strays) + 1}), or remove them with --cleanup (the rerun then resumes '
                             'from the newest disk checkpoint). They were left as they were.')
        self._place(workers, keep={w: h.node_id for w, h in adopted.items()})
        self._check_node_loss()
        resume_step = recovery.rerun_step(self.job.keepers, adopted, self.dir) if adopted else 0
        if self.job.uses_keepers:
            self.job.keepers.start({w: self.job.nodes[w] for w in workers if w not in adopted})
        gen = Generation(self._first_number, workers, Tier.MEMORY if resume_step else Tier.FRESH, 0,
                         resume_step)
        if resume_step:
            self.job.log(f'[launch] found the keepers of workers {sorted(adopted)} alive: '
                         f'resuming from their step {resume_step}')
        return gen, recovery.launcher_restart_row(self.dir, gen, started, sorted(adopted),
                                                  cluster.describe(self.joined))

    def _place(self, members, keep: dict) -> None:
        """Put `members` on live nodes (`keep`ing those whose keeper lives there)."""
        live = [n.node_id for n in cluster.alive_nodes()]
        self.job.nodes.update(assign_nodes(members, live, keep))

    def _check_node_loss(self) -> None:
        """Refuse a placement that losing one node would end, unless the user accepts it."""
        if len(set(self.job.nodes.values())) < 2:
            self.job.log('[launch] every worker runs on one node: losing it loses the keepers too '
                         '(the disk checkpoint remains)')
            return
        problems, shard = node_loss_plan(self.job.placement, self.job.nodes, self.job.cfg.snapshot)
        if shard != self.job.cfg.snapshot.shard:
            self.job.cfg = updated(self.job.cfg, {'snapshot.shard': shard})
            self.job.log(f'[launch] {WHOLE_SNAPSHOTS}')
        if problems and not self.job.cfg.launch.accept_node_loss:
            raise ValueError('launch: losing one node would lose the only copy of part of the '
                             f"state: {'; '.join(problems)}. Fix: run on more nodes, use "
                             '--config.snapshot.parity=xor with groups spread over nodes, or set '
                             '--config.launch.accept_node_loss=True (a lost node then means a '
                             'restart from the disk checkpoint).')
        for problem in problems:
            self.job.log(f'[launch] accepted (launch.accept_node_loss): {problem}')

    # ------------------------------------------------------------- generations

    def worker_args(self, gen: Generation, keepers: tuple = ()) -> dict:
        """Each member's `WorkerArgs` fields but its place in the job: one resolved config
        (overrides included) and one checked placement for every worker of every generation;
        `own_run` past the job's first generation where the workdir's config record fits."""
        base = dict(cfg=self.job.cfg, workdir=self.workdir, placement=self.job.placement,
                    generation=gen.number, resume=gen.resume, resume_step=gen.resume_step,
                    stop_at=gen.stop_at, keepers=keepers,
                    own_run=gen.number > 0 and config_record.fits_record(self.workdir, self.job.cfg),
                    observed_failures_per_hour=self.observed_failures_per_hour())
        return {w: dict(base, fault_points=self.job.injector.fault_points(w)) for w in gen.members}

    def observed_failures_per_hour(self) -> float:
        """This launcher's failures (not planned rejoins) per hour of its run so far."""
        hours = (time.time() - self.started_at) / 3600.0
        return self.failures_seen / hours if self.failures_seen and hours > 0 else 0.0

    def _spawn(self, gen: Generation) -> tuple[list, list]:
        """Start `gen`; the workers whose actor died before it started, and those whose
        actor did not answer within the start timeout (both [] normally)."""
        self._generation = gen
        keepers = tuple(self.job.keepers.as_list()) if self.job.uses_keepers else ()
        gpus, env = self._actor_resources(gen.members)
        unborn, late = generation.spawn(
            gen, args=self.worker_args(gen, keepers), nodes=self.job.nodes, env=env, gpus=gpus,
            timeout=self.job.cfg.launch.start_timeout_sec)
        self.job.log(f'[launch] generation {gen.number}: workers {gen.members} '
                     f'({gen.resume}{f", stop at step {gen.stop_at}" if gen.stop_at else ""})')
        return unborn, late

    def _actor_resources(self, workers) -> tuple[dict, dict]:
        """(GPUs per worker, the workers' environment): a node's GPUs where it has them."""
        gpus = {w: self.job.cfg.launch.local_devices if placement_lib.node_has_gpus(self.job.nodes[w]) else 0
                for w in workers}
        return gpus, placement_lib.actor_env(self.job.cfg.launch.local_devices, gpus=any(gpus.values()))

    def _watch(self, gen: Generation) -> Outcome:
        deaths: list = []
        first_seen = None  # time.time() the first death was seen
        progress, progressed_at = -1, time.monotonic()
        while True:
            time.sleep(_POLL_SEC)
            generation.poll_progress(gen)
            if self._stop_requested and not self._stop_forwarded:
                self._forward_stop(gen)
            if self._stop_forwarded:  # stopping on purpose: wait for every worker's save
                outcome = preempted(self.job, gen, time.monotonic() - self._stop_forwarded_at)
                if outcome is not None:
                    return outcome
                continue
            # Reports come from a thread: a hang that blocks every worker's
            # training loop (a collective that never completes) keeps them
            # answering. Steps completing is the other sign of life; the
            # stall clock starts at the generation's first completed step.
            completed = gen.completed()
            self.stepped = self.stepped or completed >= 1
            if completed >= 1 and self._pending and recovery.started(self._pending, self.dir):
                self._finish_pending()
            self.job.injector.inject(gen)  # after the records a launcher killed here must leave
            now_mono, now = time.monotonic(), time.time()
            self.job.ahead.maybe_start(gen.number, completed)
            if completed > progress:
                progress, progressed_at = completed, now_mono
            hang = hung(self.job, gen, progress, now_mono - progressed_at, now)
            if hang is not None:
                return hang
            deaths += generation.exits(gen, now, self.job.injector.injected, self.dir)
            if not deaths and len(gen.ends) == len(gen.members):
                finished = all(e.get('finished') for e in gen.ends.values())
                return Outcome('finished' if finished else 'stopped', failed_at=now,
                               detected_at=now,
                               completed_steps=max(e.get('final_step', 0) for e in gen.ends.values()))
            deaths += generation.silent(gen, deaths, self.timeout, now, now_mono)
            if deaths and first_seen is None:
                first_seen = now
            if decided(self.job, gen, deaths, now):
                return failed(self.job, gen, deaths, first_seen)

    # ------------------------------------------------------------- stopping

    def _catch_stop_signals(self) -> dict:
        """SIGTERM or a first Ctrl-C: workers save a step and stop; a second Ctrl-C aborts."""
        self._stop_requested = self._stop_forwarded = False
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, self._on_stop_signal)
                for sig in (signal.SIGTERM, signal.SIGINT)}

    def _on_stop_signal(self, signum, frame) -> None:
        if signum == signal.SIGINT and self._stop_requested:
            raise KeyboardInterrupt  # the second Ctrl-C: tear down without saving
        self._stop_requested = True
        self.job.log(f'[launch] {signal.Signals(signum).name}: the workers save a step and stop '
                     '(Ctrl-C again to abort without saving)')

    def _forward_stop(self, gen: Generation) -> None:
        """Pass the stop to every worker: JAX's preemption sync point picks one step for all."""
        self._stop_forwarded, self._stop_forwarded_at = True, time.monotonic()
        for actor in gen.actors.values():
            actor.request_stop.remote()

    # ------------------------------------------------------------- recovery

    def _keep(self, *rows: dict) -> None:
        """Recorded recovery rows: into the summary, and TensorBoard's `launch` run."""
        self.recoveries += rows
        for row in rows if self.summaries is not None else ():
            self.summaries.write(*recovery_scalars(row))

    def _finish_pending(self) -> None:
        """The open recovery row, completed from its generation's start records and recorded."""
        row, self._pending = self._pending, None
        if row is not None:
            self._keep(recovery.record(self.dir, row))
            self.job.log(f"[launch] recovery ({row['kind']}): {row.get('recovery_sec', float('nan')):.2f} s, "
                         f"resumed at step {row.get('resume_step')}, {row.get('redone_steps')} step(s) redone")


# ------------------------------------------------------------------ how a generation ended

# A worker's exception may only be its peer's death seen first (a collective
# that fails when a node goes): wait this long for a crash before calling it
# a program error. Node losses are reported within a few seconds (ray_host).
_ERROR_GRACE_SEC = 5.0
_SETTLE_SEC = 0.5  # after a first crash, for the others of the same event


@dataclasses.dataclass
class Outcome:
    kind: str  # 'finished' | 'stopped' | 'preempted' | 'failed' (a crash) | 'error' (a program error)
    failed: list = dataclasses.field(default_factory=list)
    cause: str = ''
    failed_at: float = 0.0  # time.time() the failure happened (kill sent / last report)
    detected_at: float = 0.0
    completed_steps: int = 0  # the most steps any worker had completed
    unsaved: list = dataclasses.field(default_factory=list)  # a stop: workers that never saved
    deaths: list = dataclasses.field(default_factory=list)  # exits.Death of every dead worker
    # A crash's echoes: workers whose code raised because a peer died under them
    # (a collective that failed); they survive, their errors are recorded.
    echoes: dict = dataclasses.field(default_factory=dict)


def hung(job: JobState, gen: Generation, progress: int, stalled: float, now: float) -> Outcome | None:
    """A generation that completes no step: within the start timeout, or for the stall timeout.

    After its last step a generation saves and ends, which no step marks:
    `launch.stop_timeout_sec` bounds that phase instead of the stall timeout
    (a slow final save is not a stuck collective).
    """
    running = len(gen.ends) < len(gen.members)
    if progress >= (gen.stop_at or int(job.cfg.train.steps)):
        limit = job.cfg.launch.stop_timeout_sec
        if stalled > limit and running:
            job.log(f'[launch] no end {stalled:.0f} s after the last step '
                    '(launch.stop_timeout_sec): the generation hangs')
            return Outcome('failed', [], f'no end within {limit:.1f} s of the last step',
                           now - stalled, now, progress)
        return None
    if progress <= 0 and now - gen.started > job.cfg.launch.start_timeout_sec and running:
        return start_timed_out(job, gen, now)
    if progress > 0 and stalled > job.cfg.launch.stall_timeout_sec and running:
        job.log(f'[launch] no step completed for {stalled:.0f} s: the job is stuck')
        return Outcome('failed', [], f'no step completed for {stalled:.1f} s',
                       now - stalled, now, progress)
    return None


def start_timed_out(job: JobState, gen: Generation, now: float) -> Outcome:
    """A generation that completed no step within `launch.start_timeout_sec` of its start
    (its actors too slow to answer count: the start takes them in)."""
    job.log(f'[launch] no step completed {now - gen.started:.0f} s after the start '
            '(launch.start_timeout_sec): the generation hangs')
    return Outcome('failed', [], f'no step completed within '
                   f'{job.cfg.launch.start_timeout_sec:.1f} s of the start', gen.started, now, 0)


def decided(job: JobState, gen: Generation, deaths: list, now: float) -> bool:
    """Whether the deaths so far settle how the generation ended.

    A crash settles it (after a moment for others of the same event). A
    program error alone waits `_ERROR_GRACE_SEC` for a crash it may only
    be the echo of, unless every worker has already ended; so do crashes
    that are all echoes (JAX ending a worker after a peer died): the death
    they echo may be a node's, which Ray reports a second or two later
    than the survivors' aborts (a chaos soak's node loss found it decided
    on the echoes alone, and took the lost node's workers for survivors).
    """
    if not deaths:
        return False
    ended = {d.worker for d in deaths} | set(gen.ends)
    waiting = len(ended) < len(gen.members) and (
        now - min(d.failed_at for d in deaths) <= _ERROR_GRACE_SEC)
    crashes = [d for d in deaths if d.kind == CRASH]
    if crashes and not (waiting and all(d.cause == ABORTED_BY_JAX for d in crashes)):
        if not gen.settled:
            gen.settled = True
            time.sleep(_SETTLE_SEC)
            deaths += generation.exits(gen, now, job.injector.injected, job.injector.out_dir)
        return True
    return not crashes and not waiting


def failed(job: JobState, gen: Generation, deaths: list, now: float) -> Outcome:
    """Every death at once, detected at `now`. With a crash, the workers that raised are
    its echo, not failed."""
    crashed = [d for d in deaths if d.kind == CRASH]
    # Workers JAX ended because a peer died are that death's echo: relaunched as
    # survivors (unless every crash is such an abort: then the cause is unknown).
    aborted = [d for d in crashed if d.cause == ABORTED_BY_JAX]
    if len(aborted) < len(crashed):
        crashed = [d for d in crashed if d.cause != ABORTED_BY_JAX]
    else:
        aborted = []
    injected = job.injector.kill_time
    job.injector.kill_time = None
    failed_at = injected if injected is not None and crashed else min(
        d.failed_at for d in (crashed or deaths))
    lost = crashed or deaths
    cause = (lost[0].cause if len(lost) == 1 else
             '; '.join(f'worker {d.worker}: {d.cause}' for d in lost))
    workers = sorted({d.worker for d in lost})
    kind = 'failed' if crashed else 'error'
    job.log(f'[launch] worker(s) {workers} '
            f"{'failed' if crashed else 'stopped with a program error'} ({cause}); "
            f'generation {gen.number} at step {gen.completed()}')
    echoes = {str(d.worker): d.cause for d in deaths
              if crashed and (d.kind != CRASH or d in aborted)}
    return Outcome(kind, workers, cause, failed_at, now, gen.completed(), deaths=lost,
                   echoes=echoes)


def preempted(job: JobState, gen: Generation, waited: float) -> Outcome | None:
    """Once every worker has ended after a forwarded stop: the step they saved.

    A worker that cannot reach the save (stopped, or stuck starting up)
    would keep the launcher waiting forever: after `launch.stop_timeout_sec`
    the generation is killed, and the rerun resumes from the newest checkpoint.
    """
    deaths = generation.exits(gen, time.time(), {})
    running = [w for w in gen.members
               if w not in gen.ends and w not in {d.worker for d in deaths}]
    if running and waited <= job.cfg.launch.stop_timeout_sec:
        return None
    if running:
        job.log(f'[launch] workers {running} did not stop within launch.stop_timeout_sec='
                f'{job.cfg.launch.stop_timeout_sec:g} s of the stop: killing them')
        generation.stop(gen)
    unsaved = sorted(w for w in gen.members if not gen.ends.get(w, {}).get('preempted'))
    saved = min((e.get('final_step', 0) for e in gen.ends.values()), default=0)
    job.log(f'[launch] preempted: workers {unsaved} saved nothing; the rerun resumes from '
            'the newest checkpoint' if unsaved else
            f'[launch] preempted: every worker stopped; resume step {saved}')
    now = time.time()
    return Outcome('preempted', failed_at=now, detected_at=now, completed_steps=saved,
                   unsaved=unsaved)
