"""The launcher: workers and keepers on Ray, failures detected, relaunches, each recovery reported.

A job runs in *generations*. Each generation is a set of `Worker` actors
(one `jax.distributed` job) over the workers that are up, each on its
keeper's node. The launcher learns of a worker's end from Ray (a crash: the
actor or its node died; a program error: its code raised) and of a stopped
or hung one from its silence (`launch.heartbeat_timeout_sec`, see
`generation`). On a failure it tears the generation down (a JAX collective
cannot finish without the dead process) and starts the next one:

* `launch.recovery=memory` (default): the survivors are relaunched with the failed
  workers' replicas marked down, so the fault controller absorbs their shards under
  `fault.strategy` (`drop` by default; MeCeFO pins them on live ring neighbours), and
  the state comes from the keepers' in-memory snapshots (REFT, arXiv 2310.12670; each
  keeper holds its worker's part, `snapshot.shard`), not from disk. With
  `launch.return_after_steps` the failed workers rejoin that many steps later, on their
  node or on another: the survivors stop at that step and all workers are relaunched.
  When the survivors no longer hold a whole replica (`mesh.data=1` with `mesh.model`
  spanning workers) the failed worker is replaced at once; if its keeper died with it,
  its snapshot is rebuilt from the parity group (`snapshot.parity=xor`).
* `launch.recovery=disk`: the old way, every worker restarts from the latest
  Orbax checkpoint (`train.checkpoint_every`).

A program error stops the job at once with the worker's log's end. A
generation that completes no step within `launch.start_timeout_sec` of its
start has failed; one whose workers all answer but complete no step for
`launch.stall_timeout_sec` (a collective that never finishes) is torn down
and relaunched on the same workers.

Keepers are detached, named actors (`keepers`): they outlive a worker's crash and the
launcher's own. A launcher started again on the same workdir finds them and resumes
from their memory (a job that saved nothing yet starts over at step 0, its config
record fitting); a job that ends (finished, stopped, failed for good) ends its
keepers. Each recovery is one row of `launch/recoveries.jsonl`.

This module runs the loop; `outcome` judges how a generation ended, and
`recovery_plan` plans the next one from the `JobState` the launcher owns.
"""
from __future__ import annotations

import os
import signal
import threading
import time

from mecefo_jax.config.defaults import Config
from mecefo_jax.config.resolve import updated
from mecefo_jax.host import files
from mecefo_jax.launch import actors, config_record, generation, ray_cluster, recovery_plan, recovery_report
from mecefo_jax.launch.compile_ahead import CompileAhead
from mecefo_jax.launch.exits import WorkerProgramError
from mecefo_jax.launch.generation import Generation
from mecefo_jax.launch.job_state import JobState
from mecefo_jax.launch.keepers import JobKeepers
from mecefo_jax.launch.kills import Injector, parse_kills
from mecefo_jax.launch.outcome import Outcome, decided, failed, hung, preempted, start_timed_out
from mecefo_jax.launch.placement import WHOLE_SNAPSHOTS, Placement, assign_nodes, node_loss_plan
from mecefo_jax.launch.ray_cluster import alive_nodes, namespace_of
from mecefo_jax.launch.standby import Standbys
from mecefo_jax.training.metrics import METRICS_FILENAME, newest_loss_step

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
        keepers = JobKeepers(namespace_of(self.workdir), placement.workers, slots=cfg.snapshot.slots)
        nodes: dict[int, str] = {}
        injector = Injector(kills, keepers=keepers, nodes=nodes, out_dir=self.dir, log=log,
                            node_killer=node_killer)
        self.timeout = cfg.launch.heartbeat_timeout_sec
        self.recoveries: list[dict] = []
        self.started_at, self.failures_seen = time.time(), 0  # observed failure rate (cadence)
        self._generation: Generation | None = None
        self._progress_rejected = 0
        self._pending: dict | None = None  # recorded once its generation started: a launcher killed later keeps it
        # What the recovery planner reads and changes between generations.
        self.job = JobState(cfg, placement, keepers, nodes, injector,
                            CompileAhead(cfg, self.workdir, placement, log=log), log,
                            workdir=self.workdir)
        self.standbys = Standbys()
        self.adopted: dict = {}  # the keepers an earlier launcher left, found at the start
        self.stepped = False  # a generation of this launcher completed a step
        self.stopped_keepers = False  # the job's keepers were ended with it

    # ------------------------------------------------------------------ run

    def run(self) -> dict:
        """Run the job to its end; the summary (also `launch/summary.json`)."""
        import ray
        if not ray.is_initialized():
            raise RuntimeError('The launcher needs a Ray cluster: connect first '
                               '(mecefo_jax.launch.ray_cluster.join).')
        os.makedirs(self.dir, exist_ok=True)
        warning = ray_cluster.node_loss_warning(ray_cluster.health_check(), self.timeout)
        if warning:
            self.job.log(warning)
        started = self.started_at = time.time()
        handlers = self._catch_stop_signals()
        error, outcome, gen, rejected = None, None, None, 0
        try:
            gen, pending = self._first_generation(started)
            self.recoveries += recovery_report.record_left(self.dir)  # a killed launcher's open row
            first = gen.number
            while True:
                unborn, late = self._spawn(gen)
                if pending is not None:
                    pending.update(relaunched_at=gen.started, next_generation=gen.number)
                self._pending = pending
                recovery_report.hold(self.dir, pending)
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
                pending, gen = recovery_plan.plan_next(self.job, gen, outcome)
                self.failures_seen += pending['kind'] == 'failure'
                if gen.number - first > self.job.cfg.launch.max_relaunches:
                    error = self._gave_up(gen, pending)
                    break
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            self.job.ahead.close()
            self.standbys.close()
            generation.stop(self._generation)
            if gen is not None and self.job.uses_keepers:
                rejected = self.job.keepers.rejected()
                self._end_keepers()
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

    def _record_config(self) -> None:
        """`launch/config.json`, once the job ran a step (before a kill injected there: `own_run`)."""
        self.stepped = True
        config_record.write(self.dir, self.job.cfg)

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
                'ray': ray_cluster.describe(self.joined)}

    def _gave_up(self, gen: Generation, row: dict) -> GaveUp:
        """Too many relaunches: the row records the last failure, and the job stops."""
        row.update(kind='gave_up', next_generation=None)
        self.recoveries.append(recovery_report.append(self.dir, row))
        error = GaveUp(f'Gave up after {gen.number - 1 - self._first_number} relaunches '
                       '(launch.max_relaunches).')
        self.job.log(f'[launch] {error}')
        return error

    def _program_error(self, gen: Generation, outcome: Outcome) -> WorkerProgramError:
        """Stop the job on a program error: record it, never relaunch it."""
        generation.stop(gen)
        error = WorkerProgramError(outcome.deaths, self.dir, gen.number,
                                   note=None if self.stepped or not self.adopted
                                   else config_record.refusal_note(self.dir, self.job.cfg))
        row = {'kind': 'program_error', 'ended_generation': gen.number,
               'failed_workers': outcome.failed, 'cause': outcome.cause,
               'failed_at': outcome.failed_at, 'completed_steps': outcome.completed_steps,
               'error': str(error)}
        self.recoveries.append(recovery_report.append(self.dir, row))
        self.job.log(f'[launch] {error}')
        return error

    # -------------------------------------------------------------- placement

    def _first_generation(self, started: float) -> tuple[Generation, dict | None]:
        """Generation 0 of this launcher: fresh, or from the keepers an earlier one left."""
        workers = list(range(self.job.placement.workers))
        self._first_number = recovery_report.next_generation_number(self.dir)
        adopted = self.adopted = self.job.keepers.find() if self.job.uses_keepers else {}
        strays = self.job.keepers.strays() if adopted else []
        if strays:
            raise ValueError(f"This workdir's job left keepers for workers {strays}, beyond --nprocs="
                             f'{self.job.placement.workers}: rerun with the --nprocs it ran with (--nprocs='
                             f'{max(strays) + 1}), or remove them with --cleanup (the rerun then resumes '
                             'from the newest disk checkpoint). They were left as they were.')
        self._place(workers, keep={w: h.node_id for w, h in adopted.items()})
        self._check_node_loss()
        resume_step = recovery_plan.rerun_step(self.job.keepers, adopted, self.dir) if adopted else 0
        for w in workers:
            if self.job.uses_keepers and w not in adopted:
                self.job.keepers.start(w, self.job.nodes[w])
        if self._first_number == 0 and newest_loss_step(os.path.join(self.workdir, METRICS_FILENAME)) is None:
            config_record.write(self.dir, self.job.cfg)  # a new job's: a kill at its first step finds it
        gen = Generation(self._first_number, workers, 'memory' if resume_step else 'fresh', 0,
                         resume_step)
        if resume_step:
            self.job.log(f'[launch] found the keepers of workers {sorted(adopted)} alive: '
                         f'resuming from their step {resume_step}')
        return gen, recovery_plan.launcher_restart_row(self.dir, gen, started, sorted(adopted),
                                                       ray_cluster.describe(self.joined))

    def _place(self, members, keep: dict) -> None:
        """Put `members` on live nodes (`keep`ing those whose keeper lives there)."""
        live = [n.node_id for n in alive_nodes()]
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
        (overrides included) for every worker of every generation; `own_run` past the job's
        first generation where its config record fits."""
        base = dict(cfg=self.job.cfg, workdir=self.workdir,
                    workers=self.job.placement.workers, generation=gen.number, resume=gen.resume,
                    resume_step=gen.resume_step, stop_at=gen.stop_at, keepers=keepers,
                    own_run=gen.number > 0 and config_record.differences(self.dir, self.job.cfg) == [],
                    observed_failures_per_hour=self.observed_failures_per_hour())
        return {w: dict(base, **self.job.injector.holds(w)) for w in gen.members}

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
            standbys=self.standbys, timeout=self.job.cfg.launch.start_timeout_sec)
        self.job.log(f'[launch] generation {gen.number}: workers {gen.members} '
                     f'({gen.resume}{f", stop at step {gen.stop_at}" if gen.stop_at else ""})')
        return unborn, late

    def _actor_resources(self, workers) -> tuple[dict, dict]:
        """(GPUs per worker, the workers' environment): a node's GPUs where it has them."""
        gpus = {w: self.job.cfg.launch.local_devices if actors.node_has_gpus(self.job.nodes[w]) else 0
                for w in workers}
        return gpus, actors.actor_env(self.job.cfg.launch.local_devices, gpus=any(gpus.values()))

    def _warm_standbys(self) -> None:
        """After a generation's first step: a warm process for every worker slot on a live node."""
        if not self.job.cfg.launch.standby_workers:
            return
        live = {n.node_id for n in alive_nodes()}
        nodes = {w: n for w, n in self.job.nodes.items() if n in live}
        gpus, env = self._actor_resources(nodes)
        self.standbys.fill(nodes, env, gpus)

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
            if completed >= 1 and not self.stepped:
                self._record_config()
            if completed >= 1 and self._pending and recovery_report.started(self._pending, self.dir):
                self._finish_pending()
            self.job.injector.inject(gen)  # after the records a launcher killed here must leave
            now_mono, now = time.monotonic(), time.time()
            self.job.ahead.maybe_start(gen.number, completed)
            if completed >= 1 > progress:
                self._warm_standbys()
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

    def _finish_pending(self) -> None:
        """The open recovery row, completed from its generation's start records and recorded."""
        row, self._pending = self._pending, None
        if row is not None:
            self.recoveries.append(recovery_report.record(self.dir, row))
            self.job.log(f"[launch] recovery ({row['kind']}): {row.get('recovery_sec', float('nan')):.2f} s, "
                         f"resumed at step {row.get('resume_step')}, {row.get('redone_steps')} step(s) redone")
