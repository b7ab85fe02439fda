"""Compile ahead: the survivors' programs of every single-worker loss, before any failure.

After a worker dies the survivors are relaunched as a new `jax.distributed` job of one
process fewer, with new programs to compile on the way back. After generation 0's first
step, a background thread runs one job per survivable single-worker loss: `CompileMember`
actors numbered as a relaunch numbers them, niced, that build the relaunch's run and
fault controller and compile, from abstract inputs, what its first prepare and eval ask
for, into the program cache the relaunch reads. Their seconds go to
`launch/compile_ahead.json`; the first failure stops them.
"""
from __future__ import annotations

import json
import os
import resource
import threading
import time

from mecefo_jax.host import files
from mecefo_jax.launch import placement as placement_lib

REPORT = 'compile_ahead.json'


def survivor_sets(placement) -> list[tuple[int, list[int]]]:
    """(lost worker, survivors in process order) for every loss the survivors outlive."""
    workers = range(placement.workers)
    sets = [(lost, [w for w in workers if w != lost]) for lost in workers]
    return [(lost, members) for lost, members in sets if placement.survives(members)]


class CompileMember:
    """One process of a compile-ahead job (`ray.remote(CompileMember)`)."""

    def __init__(self, env: dict):
        placement_lib.enter(env)

    def free_port(self) -> str:
        """host:port free on this node, for the job's coordinator."""
        import socket

        import ray
        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((ip, 0))
            return f'{ip}:{s.getsockname()[1]}'

    def cpu_sec(self) -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def pid(self) -> int:
        return os.getpid()

    def compile(self, cfg, workdir: str, placement, lost: int, coordinator: str,
                process_id: int, nice: int) -> dict:
        os.nice(nice)  # this thread, and the compile threads it starts: training comes first
        out = compile_for_survivors(cfg, workdir, placement, lost, coordinator, process_id)
        return dict(out, cpu_sec=self.cpu_sec())


def drive(cfg, workdir: str, placement, *, losses=None, nice: int = 19,
          stop: threading.Event | None = None, running: threading.Event | None = None,
          log=print) -> dict:
    """Compile for every survivor set in turn, one jax.distributed job each; the report.

    When `stop` is set, the running job's members report their CPU seconds
    and are killed (`stopped`: true), and no further set starts. `running`
    is set once a job's members are up and compiling (for callers that stop
    it on purpose).
    """
    import ray
    stop = stop or threading.Event()
    env = placement_lib.actor_env(cfg.launch.local_devices)
    member_cls = ray.remote(CompileMember)
    path = os.path.join(workdir, 'launch', REPORT)
    report = {'sets': [], 'cpu_sec': 0.0, 'wall_sec': 0.0, 'done': False, 'stopped': False}
    for lost, members in survivor_sets(placement):
        if losses is not None and lost not in losses:
            continue
        if stop.is_set():
            report['stopped'] = True
            break
        start = time.perf_counter()
        handles = [member_cls.options(**placement_lib.actor_options(concurrency=2)).remote(env)
                   for _ in members]
        coordinator = ray.get(handles[0].free_port.remote())
        refs = [h.compile.remote(cfg, workdir, placement, lost, coordinator, p, nice)
                for p, h in enumerate(handles)]
        row = {'lost_worker': lost, 'members': members,
               'pids': ray.get([h.pid.remote() for h in handles])}
        if running is not None:
            running.set()
        row['ok'], row['cpu_sec'] = _await(refs, handles, stop)
        report['stopped'] = stop.is_set() and not row['ok']
        for h in handles:
            ray.kill(h)
        ray.wait(refs, num_returns=len(refs), timeout=30)  # gone before the next set starts
        row['wall_sec'] = time.perf_counter() - start
        report['sets'].append(row)
        report['cpu_sec'] += row['cpu_sec']
        report['wall_sec'] += row['wall_sec']
        files.write_json(path, report)
        log(f'[compile ahead] loss of worker {lost}: members {members} '
            f"{'compiled' if row['ok'] else 'FAILED or stopped'} in {row['wall_sec']:.1f} s "
            f"({row['cpu_sec']:.1f} CPU s)")
        if report['stopped']:
            return report
    report['done'] = not report['stopped']
    files.write_json(path, report)
    return report


def _await(refs, handles, stop: threading.Event) -> tuple[bool, float]:
    """(every member compiled, their CPU seconds): to the end, or until `stop`."""
    import ray
    from ray.exceptions import RayError
    pending = list(refs)
    while pending and not stop.is_set():
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.2)
    if not pending:
        try:
            return True, sum(r['cpu_sec'] for r in ray.get(refs))
        except RayError:
            pass  # a member failed: what every member spent
    try:  # stopped, or a member failed: what the members spent so far
        return False, sum(ray.get([h.cpu_sec.remote() for h in handles], timeout=5))
    except RayError:
        return False, 0.0


class CompileAhead:
    """The launcher's handle on the background compiles: started once, after generation 0's first step."""

    def __init__(self, cfg, workdir: str, placement, *, log=print):
        self.enabled = (cfg.launch.compile_ahead and cfg.launch.recovery == 'memory'
                        and cfg.launch.compilation_cache
                        and bool(survivor_sets(placement)))
        self._args = (cfg, workdir, placement)
        self._dir = os.path.join(workdir, 'launch')
        self._log = log
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def maybe_start(self, generation: int, completed: int) -> None:
        if self.enabled and self._thread is None and generation == 0 and completed >= 1:
            self._thread = threading.Thread(target=self._run, name='compile-ahead', daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            drive(*self._args, stop=self._stop, log=self._log)
        except Exception as e:  # noqa: BLE001 (an aid, never the job's failure)
            self._log(f'[compile ahead] stopped by an error: {type(e).__name__}: {e}')

    def stop(self) -> None:
        """Stop at once (a failure came first): the running job's members are killed."""
        self._stop.set()

    def close(self) -> None:
        self.stop()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def report(self) -> dict | None:
        """What the compiles wrote (sets compiled, their CPU seconds), None if they never ran."""
        if self._thread is None:
            return None
        try:
            with open(os.path.join(self._dir, REPORT)) as f:
                return json.load(f)
        except FileNotFoundError:
            return None


def compile_for_survivors(cfg, workdir: str, placement, lost: int, coordinator: str,
                          process_id: int) -> dict:
    """Member: join the survivors' job and compile what their relaunch will ask for."""
    import jax

    from mecefo_jax.faults.controller import FaultController
    from mecefo_jax.launch.worker import join, leave
    from mecefo_jax.parallel import program_cache, sharding
    from mecefo_jax.training import run_setup
    placement_members = [w for w in range(placement.workers) if w != lost]
    program_cache.configure(cfg.launch.compilation_cache, workdir,
                            program_cache.program_context(cfg))
    join(coordinator, len(placement_members), process_id)
    rows = placement_lib.replica_rows(placement, placement_members, jax.devices())
    scratch = os.path.join(workdir, 'launch', 'compile_ahead', f'lost{lost}')
    run = run_setup.build_run(cfg, scratch, replica_rows=rows, checkpoint_every=0)
    # The relaunch's controller starts on the present replicas' topology and
    # layout, and its first prepare compiles exactly these (see _transition).
    controller = FaultController.from_config(cfg, run)
    topology, layout = controller.plan.topology, controller.plan.step_layout
    state = sharding.abstract(run.abstract_state, topology.state_shardings)
    _, step_sec = topology.compiled_step(
        state, topology.batch_spec(layout, cfg.data.seq_len + 1), layout)
    if controller.plan.layout.uses_neighbour_mode and controller.uses_projections:
        topology.refresh.compile(state)
    tokens = sharding.abstract_batch(topology.mesh, _eval_rows(run, topology.num_replicas),
                                     cfg.data.seq_len + 1, topology.num_replicas)
    topology.eval_step.compile(state.params, tokens['tokens'], tokens['weights'])
    stats = program_cache.stats
    print(f'[compile ahead] process {process_id}: {stats.misses} compiled, {stats.hits} cached',
          flush=True)
    worker = placement_members[process_id]
    # With an empty cache, train_step_sec is a cold compile (lowering included)
    # of the very program the relaunch's first prepare asks for.
    files.write_json(
        os.path.join(workdir, 'launch', f'compile_ahead_lost{lost}_w{worker}.json'),
        {'lost_worker': lost, 'worker': worker, 'process_id': process_id,
         'train_step_sec': step_sec, 'programs': stats.programs})
    leave('compile ahead done')
    return {'compiled': stats.misses, 'cached': stats.hits, 'train_step_sec': step_sec}


def _eval_rows(run, replicas: int) -> int:
    """Rows of one padded eval batch per replica, as `training.loop.evaluate` builds it."""
    rows = len(next(run.val_data).reshape(-1, run.val_data.seq_len + 1))
    return (rows + -rows % replicas) // replicas
