"""The launcher: start workers and keepers, detect failures, relaunch, report each recovery.

A job runs in *generations*. Each generation is a set of worker processes
(one `jax.distributed` job) over the workers that are up. The launcher watches
every worker: its process exit, and its heartbeat (silence beyond
`launch.heartbeat_timeout_sec` is a failure, so a hung or SIGSTOPped worker
counts). On a failure it tears the generation down (a JAX collective cannot
finish without the dead process) and starts the next one:

* `launch.recovery=memory` (default): the survivors are relaunched with the
  failed workers' replicas marked down, so the fault controller pins their
  shards on live ring neighbours (`fault.strategy`, MeCeFO by default), and
  the state comes from the keepers' in-memory snapshots (REFT, arXiv
  2310.12670), not from disk. With `launch.return_after_steps` the failed
  workers rejoin that many steps later: the survivors stop at that step and
  all workers are relaunched, the returning one healing its state from its
  peers' keepers. When the survivors no longer hold a whole replica
  (`mesh.data=1` with `mesh.model` spanning workers) the failed worker is
  replaced at once; if its keeper died with it, its snapshot is rebuilt from
  the parity group (`snapshot.parity=xor`).
* `launch.recovery=disk`: the old way, every worker restarts from the latest
  Orbax checkpoint (`train.checkpoint_every`).

A worker that exits with a Python exception (a program error, not a crash:
`exits.py`) stops the job at once with its log's end. A generation that
completes no step within `launch.start_timeout_sec` of its start has failed.
A job whose workers all keep beating but complete no step for
`launch.stall_timeout_sec` (a collective that never finishes) is torn down
and relaunched on the same workers.

Each recovery is one row of `<workdir>/launch/recoveries.jsonl`, split into
the badput kinds of ml-goodput-measurement (detection and teardown:
infrastructure recovery; relaunch: program startup; `jax.distributed` init:
accelerator initialisation; restore; compile: training preparation; the
first step; redone steps: wasted progress).

Keepers are started by the launcher, not by workers, so they outlive a
worker's crash; they and the workers exit when the launcher does, also on
Ctrl-C or when the launcher is killed.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time

from mecefo_jax.launch.compile_ahead import CompileAhead, worker_env
from mecefo_jax.launch.exits import CRASH, Death, WorkerProgramError, exit_kind
from mecefo_jax.launch.heartbeat import HeartbeatMonitor
from mecefo_jax.launch.kills import Kill, held_after_snapshot_marker, held_in_publish_marker, parse_kills
from mecefo_jax.launch.placement import Placement
from mecefo_jax.settings import Config

_POLL_SEC = 0.05


@dataclasses.dataclass
class _Proc:
    worker: int
    popen: subprocess.Popen
    spawned: float  # time.time()


@dataclasses.dataclass
class Generation:
    number: int
    members: list
    resume: str
    stop_at: int
    resume_step: int = 0  # memory resumes: the snapshot step to restore (0: workers agree)
    procs: dict = dataclasses.field(default_factory=dict)  # worker -> _Proc
    started: float = 0.0


@dataclasses.dataclass
class Outcome:
    kind: str  # 'finished' | 'stopped' | 'preempted' | 'failed' (a crash) | 'error' (a program error)
    failed: list = dataclasses.field(default_factory=list)
    cause: str = ''
    failed_at: float = 0.0  # time.time() the failure happened (kill sent / last beat)
    detected_at: float = 0.0
    completed_steps: int = 0  # the most steps any worker had completed
    unsaved: list = dataclasses.field(default_factory=list)  # a stop: workers that never saved
    deaths: list = dataclasses.field(default_factory=list)  # exits.Death of every dead worker


def _signal_live(gen: Generation, send, sig) -> None:
    """`send(pid, sig)` (os.kill, or os.killpg for a whole session) to every live process of `gen`."""
    for proc in gen.procs.values():
        if proc.popen.poll() is None:
            try:
                send(proc.popen.pid, sig)
            except ProcessLookupError:
                pass


def _first_difference(rebuilt: bytes, original: bytes) -> dict:
    """Where a parity rebuild and the killed keeper's copy part: sizes, crc32s, first offset."""
    import zlib

    import numpy as np
    n = min(len(rebuilt), len(original))
    differs = np.flatnonzero(np.frombuffer(rebuilt, np.uint8, n) != np.frombuffer(original, np.uint8, n))
    diff = int(differs[0]) if differs.size else n
    return {'nbytes': [len(rebuilt), len(original)],
            'crc32': [zlib.crc32(rebuilt), zlib.crc32(original)], 'first_diff_offset': diff}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


class Launcher:
    """Runs one job to completion through failures (see the module docstring)."""

    def __init__(self, cfg: Config, workdir: str, nprocs: int, *, log=print):
        self.cfg, self.log = cfg, log
        self.workdir = os.path.abspath(workdir)
        self.dir = os.path.join(self.workdir, 'launch')
        # The resolved config every worker of every generation loads: one
        # resolution, so command-line overrides reach all of them unchanged.
        self.config_file = os.path.join(self.dir, 'config.json')
        self.placement = Placement(nprocs, cfg.launch.local_devices, cfg.mesh.model)
        self.placement.check_mesh(cfg.mesh)
        self.recovery = cfg.launch.recovery
        if self.recovery == 'disk' and cfg.train.checkpoint_every < 1:
            raise ValueError('launch.recovery=disk needs train.checkpoint_every >= 1; '
                             'set --config.train.checkpoint_every=10.')
        self.kills = parse_kills(cfg.launch.kill, self.placement.workers)
        if cfg.snapshot.every == 0 and any(k.after_snapshot for k in self.kills):
            raise ValueError(f'launch.kill={cfg.launch.kill!r}: a kill after a snapshot needs '
                             "snapshots; set --config.snapshot.every=auto or drop ':snapshot'.")
        self.fired: set = set()
        self.timeout = cfg.launch.heartbeat_timeout_sec
        self.stall_timeout = cfg.launch.stall_timeout_sec
        self.start_timeout = cfg.launch.start_timeout_sec
        self.stop_timeout = cfg.launch.stop_timeout_sec
        self.keepers: dict = {}  # worker -> KeeperProcess
        self.recoveries: list[dict] = []
        self.monitor: HeartbeatMonitor | None = None
        self._generation: Generation | None = None
        self._lost_snapshots: dict = {}  # worker -> {step: bytes} of a keeper killed on purpose
        self.ahead = CompileAhead(cfg, [f'--config_json={self.config_file}'], self.workdir,
                                 self.placement)

    # ------------------------------------------------------------------ run

    def run(self) -> dict:
        self.write_config()
        self.monitor = HeartbeatMonitor(workers=self.placement.workers)
        workers = list(range(self.placement.workers))
        uses_keepers = self.recovery == 'memory' and self.cfg.snapshot.every != 0
        handlers = self._catch_stop_signals()
        error = None
        try:
            if uses_keepers:
                for w in workers:
                    self._start_keeper(w)
            gen = Generation(0, workers, 'fresh', 0)
            pending = None
            while True:
                self._spawn(gen)
                if pending is not None:
                    pending.update(relaunched_at=gen.started, next_generation=gen.number)
                outcome = self._watch(gen)
                if pending is not None:
                    self._finish(pending)
                    pending = None
                if outcome.kind in ('finished', 'preempted'):
                    self._stop_generation(gen)
                    break
                if outcome.kind == 'error':
                    error = self._program_error(gen, outcome)
                    break
                pending, gen = self._next(gen, outcome)
                if gen.number > self.cfg.launch.max_relaunches:
                    raise RuntimeError(f'Gave up after {gen.number - 1} relaunches '
                                       '(launch.max_relaunches).')
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            self.ahead.close()
            self._stop_generation(self._generation)
            for keeper in self.keepers.values():  # only once every worker has saved
                keeper.stop()
            self.monitor.close()
        summary = {'generations': gen.number + 1, 'recoveries': self.recoveries,
                   'final_members': gen.members, 'compile_ahead': self.ahead.report(),
                   'preempted_at': (outcome.completed_steps if outcome.kind == 'preempted'
                                    else None),
                   'unsaved_workers': outcome.unsaved,
                   'program_error': None if error is None else {
                       'workers': error.workers, 'message': str(error)},
                   'heartbeats_rejected': self.monitor.rejected}
        with open(os.path.join(self.dir, 'summary.json'), 'w') as f:
            json.dump(summary, f, indent=2)
        if error is not None:
            raise error
        return summary

    def _program_error(self, gen: Generation, outcome: Outcome) -> WorkerProgramError:
        """Stop the job on a program error: record it, never relaunch it."""
        self._stop_generation(gen)
        error = WorkerProgramError(outcome.deaths, self.dir, gen.number)
        row = {'kind': 'program_error', 'ended_generation': gen.number,
               'failed_workers': outcome.failed, 'cause': outcome.cause,
               'failed_at': outcome.failed_at, 'completed_steps': outcome.completed_steps,
               'error': str(error)}
        self.recoveries.append(row)
        with open(os.path.join(self.dir, 'recoveries.jsonl'), 'a') as f:
            f.write(json.dumps(row) + '\n')
        self.log(f'[launch] {error}')
        return error

    # ------------------------------------------------------------- preemption

    def _catch_stop_signals(self) -> dict:
        """SIGTERM or a first Ctrl-C: workers save a step and stop; a second Ctrl-C aborts."""
        import threading
        self._stop_requested = self._stop_forwarded = False
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, self._on_stop_signal)
                for sig in (signal.SIGTERM, signal.SIGINT)}

    def _on_stop_signal(self, signum, frame) -> None:
        if signum == signal.SIGINT and self._stop_requested:
            raise KeyboardInterrupt  # the second Ctrl-C: tear down without saving
        self._stop_requested = True
        self.log(f'[launch] {signal.Signals(signum).name}: the workers save a step and stop '
                 '(Ctrl-C again to abort without saving)')

    def _forward_stop(self, gen: Generation) -> None:
        """Pass the stop to every worker: JAX's preemption sync point picks one step for all."""
        self._stop_forwarded, self._stop_forwarded_at = True, time.monotonic()
        _signal_live(gen, os.kill, signal.SIGTERM)

    # ------------------------------------------------------------- processes

    def write_config(self) -> str:
        """Write the resolved config every worker loads (`--config_json`), overrides included."""
        os.makedirs(self.dir, exist_ok=True)
        with open(self.config_file, 'w') as f:
            f.write(self.cfg.to_json())
        return self.config_file

    def _start_keeper(self, worker: int):
        from mecefo_jax.snapshot import start_keeper
        name = f'mecefo{os.getpid()}w{worker}'
        self.keepers[worker] = start_keeper(name, slots=self.cfg.snapshot.slots)
        return self.keepers[worker]

    def _keeper_addresses(self) -> list:
        return [list(self.keepers[w].address) if w in self.keepers and self._keeper_alive(w)
                else None for w in range(self.placement.workers)]

    def _keeper_alive(self, worker: int) -> bool:
        keeper = self.keepers.get(worker)
        return keeper is not None and keeper.proc.poll() is None

    def _spawn(self, gen: Generation) -> None:
        self._generation = gen
        port = _free_port()
        gen.started = time.time()
        keepers = json.dumps(self._keeper_addresses())
        env = worker_env()
        host, hb_port = self.monitor.address
        for process_id, worker in enumerate(gen.members):
            cmd = [sys.executable, '-m', 'mecefo_jax.launch.worker',
                   f'--config_json={self.config_file}', f'--workdir={self.workdir}', f'--coordinator=127.0.0.1:{port}',
                   f'--num_processes={len(gen.members)}', f'--process_id={process_id}',
                   f'--worker={worker}', f"--members={','.join(map(str, gen.members))}",
                   f'--workers={self.placement.workers}', f'--generation={gen.number}',
                   f'--resume={gen.resume}', f'--resume_step={gen.resume_step}',
                   f'--stop_at={gen.stop_at}',
                   f'--heartbeat={host}:{hb_port}', f'--launcher_pid={os.getpid()}',
                   f'--keepers={keepers}']
            cmd += [f'--hold_in_publish={kill.step}' for kill in self.kills
                    if kill.in_publish and kill.worker == worker and kill not in self.fired]
            cmd += [f'--hold_after_snapshot={kill.step}' for kill in self.kills
                    if kill.after_snapshot and kill.worker == worker and kill not in self.fired]
            log = open(os.path.join(self.dir, f'g{gen.number}_w{worker}.log'), 'w')
            popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)
            gen.procs[worker] = _Proc(worker, popen, time.time())
        self.log(f'[launch] generation {gen.number}: workers {gen.members} '
                 f'({gen.resume}{f", stop at step {gen.stop_at}" if gen.stop_at else ""})')

    def _stop_generation(self, gen: Generation | None) -> None:
        """Kill every process of the generation (stopped ones too) and reap them."""
        if gen is None:
            return
        _signal_live(gen, os.killpg, signal.SIGKILL)
        for proc in gen.procs.values():
            proc.popen.wait()

    # ------------------------------------------------------------- watching

    def _watch(self, gen: Generation) -> Outcome:
        done: set = set()
        progress, progressed_at = -1, time.monotonic()
        while True:
            time.sleep(_POLL_SEC)
            self.monitor.poll()
            now_mono, now = time.monotonic(), time.time()
            if self._stop_requested and not self._stop_forwarded:
                self._forward_stop(gen)
            if self._stop_forwarded:  # stopping on purpose: wait for every worker's save
                outcome = self._stopped(gen, now_mono - self._stop_forwarded_at)
                if outcome is not None:
                    return outcome
                continue
            self._inject(gen)
            # Heartbeats come from a thread: a hang that blocks every worker's
            # training loop (a collective that never completes) keeps them
            # beating. Steps completing is the other sign of life.
            # The stall clock starts at the generation's first completed step;
            # joining, restoring and compiling before it are bounded together
            # by launch.start_timeout_sec.
            completed = max((self.monitor.beat(gen.number, w) or {}).get('completed', 0)
                            for w in gen.members)
            self.ahead.maybe_start(gen.number, completed)
            if completed > progress:
                progress, progressed_at = completed, now_mono
            elif (progress <= 0 and now - gen.started > self.start_timeout
                  and len(done) < len(gen.procs)):
                self.log(f'[launch] no step completed {now - gen.started:.0f} s after the start '
                         '(launch.start_timeout_sec): the generation hangs')
                return Outcome('failed', [], f'no step completed within {self.start_timeout:.1f} s '
                               'of the start', gen.started, now, 0)
            elif (progress > 0 and now_mono - progressed_at > self.stall_timeout
                  and len(done) < len(gen.procs)):
                stalled = now_mono - progressed_at
                self.log(f'[launch] no step completed for {stalled:.0f} s: the job is stuck')
                return Outcome('failed', [], f'no step completed for {stalled:.1f} s',
                               now - stalled, now, progress)
            deaths = self._exits(gen, done, now)
            if not deaths and len(done) == len(gen.procs):
                ends = [self._read(f'g{gen.number}_w{w}_end.json') or {} for w in gen.members]
                finished = all(e.get('finished') for e in ends)
                return Outcome('finished' if finished else 'stopped', failed_at=now,
                               detected_at=now,
                               completed_steps=max(e.get('final_step', 0) for e in ends))
            deaths += self._silent(gen, done, deaths, now, now_mono)
            if deaths:
                return self._failed(gen, deaths, now)

    def _exits(self, gen: Generation, done: set, now: float) -> list:
        """Every worker that has exited non-zero (those exiting 0 join `done`)."""
        deaths = []
        for worker, proc in gen.procs.items():
            code = proc.popen.poll()
            if code is None or worker in done:
                continue
            if code == 0:
                done.add(worker)
                continue
            deaths.append(Death(worker, f'exit code {code}', exit_kind(code), now))
        return deaths

    def _silent(self, gen: Generation, done: set, deaths: list, now, now_mono) -> list:
        """Every running worker silent beyond `launch.heartbeat_timeout_sec` (a crash)."""
        dead = {d.worker for d in deaths}
        silent_ones = []
        for worker, proc in gen.procs.items():
            if worker in done or worker in dead:
                continue
            beat = self.monitor.beat(gen.number, worker)
            silent = now_mono - (beat['received'] if beat else now_mono - (now - proc.spawned))
            if silent > self.timeout:
                silent_ones.append(Death(worker, f'no heartbeat for {silent:.1f} s', CRASH,
                                         now - silent))
        return silent_ones

    def _stopped(self, gen: Generation, waited: float) -> Outcome | None:
        """Once every worker has exited after a forwarded stop: the step they saved.

        A worker that cannot reach the save (stopped, or stuck starting up)
        would keep the launcher waiting forever: after `launch.stop_timeout_sec`
        the generation is killed, and the rerun resumes from the newest checkpoint.
        """
        running = [w for w, proc in gen.procs.items() if proc.popen.poll() is None]
        if running and waited <= self.stop_timeout:
            return None
        if running:
            self.log(f'[launch] workers {running} did not stop within '
                     f'launch.stop_timeout_sec={self.stop_timeout:g} s of the stop: killing them')
            self._stop_generation(gen)
        ends = {w: self._read(f'g{gen.number}_w{w}_end.json') or {} for w in gen.members}
        unsaved = sorted(w for w, e in ends.items() if not e.get('preempted'))
        saved = min((e.get('final_step', 0) for e in ends.values()), default=0)
        self.log(f'[launch] preempted: workers {unsaved} saved nothing; the rerun resumes from '
                 'the newest checkpoint' if unsaved else
                 f'[launch] preempted: every worker stopped; resume step {saved}')
        now = time.time()
        return Outcome('preempted', failed_at=now, detected_at=now, completed_steps=saved,
                       unsaved=unsaved)

    def _inject(self, gen: Generation) -> None:
        """Fire the kills that are due; kills at one step fire together, once all are due."""
        pending = [k for k in self.kills if k not in self.fired and k.worker in gen.procs]
        due = {k: self._kill_point(gen, k) for k in pending}
        for kill in pending:
            if due[kill] is None or any(due[k] is None for k in pending if k.step == kill.step):
                continue
            self._fire(gen, kill, due[kill])
        for kill in pending:  # a SIGKILLed worker is dead before the next look at exits
            if kill in self.fired and kill.signal == signal.SIGKILL:
                gen.procs[kill.worker].popen.wait()

    def _kill_point(self, gen: Generation, kill: Kill) -> str | None:
        """Where the worker of `kill` is if the kill is due now, else None."""
        if kill.after_snapshot:
            held = self._read(os.path.basename(
                held_after_snapshot_marker(self.dir, gen.number, kill.worker)))
            if held is None or not all(held['step'] in self._held_steps(w) for w in gen.members):
                return None
            return f"held after its snapshot of step {held['step']}, which every keeper holds"
        if kill.in_publish:
            if not os.path.exists(held_in_publish_marker(self.dir, gen.number, kill.worker)):
                return None
            return f'inside its publish of step {kill.step}'
        beat = self.monitor.beat(gen.number, kill.worker)
        if beat is None or beat['completed'] < kill.step:
            return None
        return f'at step {beat["completed"]}'

    def _fire(self, gen: Generation, kill: Kill, where: str) -> None:
        self.fired.add(kill)
        self._kill_time = time.time()
        self.log(f'[launch] injecting {signal.Signals(kill.signal).name} into worker '
                 f'{kill.worker} {where}{" and killing its keeper" if kill.keeper else ""}')
        if kill.keeper and kill.worker in self.keepers:
            # Keep what the keeper held, only to check a parity rebuild bit for bit.
            self._lost_snapshots[kill.worker] = self._held_bytes(kill.worker)
        os.kill(gen.procs[kill.worker].popen.pid, kill.signal)
        if kill.keeper and kill.worker in self.keepers:
            self.keepers[kill.worker].proc.kill()
            self.keepers[kill.worker].proc.wait()

    def _failed(self, gen: Generation, deaths: list, now: float) -> Outcome:
        """Every death at once; a program error only when no worker crashed (exits.py)."""
        injected = getattr(self, '_kill_time', None)
        self._kill_time = None
        crashed = [d for d in deaths if d.kind == CRASH]
        failed_at = injected if injected is not None and crashed else min(
            d.failed_at for d in deaths)
        completed = [(self.monitor.beat(gen.number, w) or {}).get('completed', 0)
                     for w in gen.members]
        cause = (deaths[0].cause if len(deaths) == 1 else
                 '; '.join(f'worker {d.worker}: {d.cause}' for d in deaths))
        workers = sorted(d.worker for d in deaths)
        kind = 'failed' if crashed else 'error'
        self.log(f'[launch] worker(s) {workers} '
                 f"{'failed' if crashed else 'stopped with a program error'} ({cause}); "
                 f'generation {gen.number} at step {max(completed, default=0)}')
        return Outcome(kind, workers, cause, failed_at, now, max(completed, default=0),
                       deaths=deaths)

    # ------------------------------------------------------------- recovery

    def _next(self, gen: Generation, outcome: Outcome):
        """Tear `gen` down and plan the next generation; (pending recovery row, generation)."""
        start = time.time()
        self.ahead.stop()  # it competes with the way back; its sets are moot after a loss
        workers = list(range(self.placement.workers))
        row = {'kind': 'rejoin' if outcome.kind == 'stopped' else 'failure',
               'ended_generation': gen.number, 'failed_workers': outcome.failed,
               'cause': outcome.cause or 'planned rejoin', 'failed_at': outcome.failed_at,
               'deaths': {str(d.worker): d.cause for d in outcome.deaths},
               'completed_steps': outcome.completed_steps}
        if outcome.kind == 'failed':
            row['detect_sec'] = outcome.detected_at - outcome.failed_at
            if self.recovery == 'memory':
                survivors = [w for w in gen.members if w not in outcome.failed]
                row['completed_steps'] = self._await_snapshots(survivors, outcome.completed_steps)
                row['newest_held_by_worker'] = {str(w): self._newest_held(w) for w in workers}
        self._stop_generation(gen)
        row['teardown_sec'] = time.time() - start
        survivors = [w for w in gen.members if w not in outcome.failed]
        returns = 0
        if self.recovery == 'disk':
            members, resume = workers, 'disk'
        elif outcome.kind == 'stopped' or not self.placement.survives(survivors):
            members, resume = workers, 'memory'  # everyone back (rejoin or replacement)
            row['parity_rebuild_sec'] = self._replace_lost_keepers(members, row)
        else:
            members, resume = survivors, 'memory'
            returns = self.cfg.launch.return_after_steps
        row.update(members=members, resume=resume)
        resume_step = 0
        if resume == 'memory':
            # Every worker restores the same step, chosen here from the keepers
            # that were written to until the end (and any rebuilt from parity):
            # no collective on the way back. A rejoining worker's own keeper
            # may be empty or stale; it heals that step from its peers.
            # With no survivor (every worker died at once), every live keeper.
            rebuilt = row.get('parity_rebuilt_workers', [])
            resume_step = self._snapshot_step(
                [w for w in (survivors + rebuilt or members) if self._keeper_alive(w)])
        stop_at = resume_step + returns if returns > 0 else 0
        return row, Generation(gen.number + 1, members, resume, stop_at, resume_step)

    def _snapshot_step(self, workers) -> int:
        """The newest snapshot step every worker's keeper holds (what they will resume from)."""
        from mecefo_jax.snapshot import KeeperClient
        steps = []
        for w in workers:
            with KeeperClient(self.keepers[w].address) as client:
                steps.append({r.step for r in client.snapshots()})
        common = set.intersection(*steps) if steps else set()
        return max(common, default=0)

    def _newest_held(self, worker: int) -> int:
        """The newest snapshot step `worker`'s keeper has published (0: none, or no keeper)."""
        from mecefo_jax.snapshot import KeeperClient
        if not self._keeper_alive(worker):
            return 0
        with KeeperClient(self.keepers[worker].address) as client:
            record = client.latest()
            return record.step if record else 0

    def _await_snapshots(self, survivors, completed: int, *, limit_sec: float = 60.0) -> int:
        """Wait until every survivor's keeper holds the newest step the job completed.

        The job's progress is the newest step any keeper published (the dead
        worker's too) or any heartbeat reported complete, whichever is newer
        (a heartbeat can lag the keepers, or lead them by a write in flight).
        Data-parallel steps complete in lockstep, so every survivor finished
        that step too, and its snapshot writer will publish it: wait for that,
        rather than for a quiet moment, so the teardown never kills a write
        that would have saved the step. Returns the progress, in steps.
        """
        every = self.cfg.snapshot.every
        held = max((self._newest_held(w) for w in range(self.placement.workers)), default=0)
        progress = max(held, completed)
        # A fixed cadence names the step a survivor is still writing; with
        # 'auto' only the steps some keeper already published are known.
        target = progress - progress % every if isinstance(every, int) and every > 0 else held
        deadline = time.monotonic() + limit_sec
        while time.monotonic() < deadline:
            behind = [w for w in survivors if self._newest_held(w) < target]
            if not behind:
                break
            time.sleep(_POLL_SEC)
        else:
            self.log(f'[launch] keepers of workers {behind} still lack step {target} after '
                     f'{limit_sec:.0f} s: resuming from an older snapshot')
        return progress

    def _held_steps(self, worker: int) -> set:
        """The steps a worker's keeper has published."""
        from mecefo_jax.snapshot import KeeperClient
        with KeeperClient(self.keepers[worker].address) as client:
            return {r.step for r in client.snapshots()}

    def _held_bytes(self, worker: int) -> dict:
        """Every snapshot a keeper holds, as bytes: {step: raw}."""
        from mecefo_jax.snapshot import KeeperClient
        with KeeperClient(self.keepers[worker].address) as client:
            return {r.step: bytes(client.read(r.step, [(0, r.nbytes)]))
                    for r in client.snapshots()}

    def _replace_lost_keepers(self, members, row: dict) -> float | None:
        """Start fresh keepers for members whose keeper died; rebuild them from parity."""
        lost = [w for w in members if w not in self.keepers or not self._keeper_alive(w)]
        if not lost or self.cfg.snapshot.every == 0:
            return None
        start = time.time()
        old = self._keeper_addresses()
        for w in lost:
            self._start_keeper(w)
        if not self.cfg.snapshot.parity:
            return None  # the fresh keeper is empty: the worker heals from its peers
        from mecefo_jax.snapshot import KeeperClient, SnapshotWriter, rebuild_member
        size = self.cfg.snapshot.parity_group
        for w in lost:
            first = w - w % size
            group = range(first, min(first + size, self.placement.workers))
            addresses = [None if old[m] is None else tuple(old[m]) for m in group]
            rebuilt = rebuild_member(f'workers{first}-{group[-1]}', addresses, lost=w - first)
            with KeeperClient(self.keepers[w].address) as client:
                SnapshotWriter(client).write_blob(rebuilt.raw)
            self.log(f"[launch] rebuilt worker {w}'s snapshot of step {rebuilt.step} from parity")
            row.setdefault('parity_rebuilt_workers', []).append(w)
            original = self._lost_snapshots.get(w, {}).get(rebuilt.step)
            if original is not None:
                same = bytes(rebuilt.raw) == original
                row.setdefault('parity_rebuild_bitwise', {})[str(w)] = same
                if not same:
                    row.setdefault('parity_rebuild_mismatch', {})[str(w)] = _first_difference(
                        bytes(rebuilt.raw), original)
        return time.time() - start

    def _finish(self, row: dict) -> None:
        """Complete a recovery row from the next generation's start reports."""
        starts = [self._read(f"g{row['next_generation']}_w{w}_start.json") for w in row['members']]
        starts = [s for s in starts if s]
        if starts:
            first_step_done = max(s['first_step_done'] for s in starts)
            row.update(
                relaunch_sec=max(s['process_start'] for s in starts) - row['relaunched_at'],
                distributed_init_sec=max(s['distributed_init_sec'] for s in starts),
                restore_sec=max((s['restore_sec'] or 0.0) for s in starts),
                restore_bytes=max((sum((s['restore_bytes'] or {}).values())) for s in starts),
                healed_bytes=sum((s['healed_bytes'] or 0) for s in starts),
                compile_sec=max(s['compile_sec'] for s in starts),
                compile_sec_by_worker={str(s['worker']): s['compile_sec'] for s in starts},
                programs_compiled_by_worker={str(s['worker']): s.get('programs_compiled')
                                             for s in starts},
                refresh_sec=max(s['refresh_sec'] for s in starts),
                start_to_first_step_sec=max(s['train_start_to_first_step_sec'] for s in starts),
                resume_step=min(s['resume_step'] for s in starts),
                recovery_sec=first_step_done - row['failed_at'])
            row['redone_steps'] = max(0, row['completed_steps'] - row['resume_step'])
            row['badput_sec'] = {
                'infrastructure_recovery_from_disruption': row.get('detect_sec', 0.0)
                + row['teardown_sec'],
                'program_startup': row['relaunch_sec'],
                'accelerator_initialization': row['distributed_init_sec'],
                'unproductive_checkpoint_restore': row['restore_sec']
                + (row.get('parity_rebuild_sec') or 0.0),
                'training_prep': row['compile_sec'] + row['refresh_sec'],
                'first_step': row['start_to_first_step_sec'] - row['compile_sec']
                - row['refresh_sec'],
            }
        self.recoveries.append(row)
        with open(os.path.join(self.dir, 'recoveries.jsonl'), 'a') as f:
            f.write(json.dumps(row) + '\n')
        self.log(f"[launch] recovery ({row['kind']}): {row.get('recovery_sec', float('nan')):.2f} s, "
                 f"resumed at step {row.get('resume_step')}, {row.get('redone_steps')} step(s) redone")

    def _read(self, name: str) -> dict | None:
        try:
            with open(os.path.join(self.dir, name)) as f:
                return json.load(f)
        except FileNotFoundError:
            return None
