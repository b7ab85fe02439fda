"""Compile ahead: the survivors' programs, compiled before any failure (`launch.compile_ahead`).

After a worker dies, the survivors are relaunched as a new `jax.distributed`
job over one worker fewer (process ids renumbered 0..N-2 in member order),
with the dead worker's replicas marked down: a new topology whose train
step, eval step and projection refresh would be compiled on the way back.
This module compiles them beforehand, into the program cache
(`mecefo_jax.program_cache`) that every process of the relaunch reads.

The launcher starts one *driver* (`python -m mecefo_jax.launch.compile_ahead_job
--workers=N ...`) after the first generation's first step. At the lowest OS
priority (os.nice) it runs, for every single-worker loss that leaves a whole
replica, one `jax.distributed` job of *members*: the survivors' worker ids,
numbered and placed exactly as `Launcher._spawn` numbers a relaunch, each
building the relaunch's run and fault controller and compiling, from
abstract inputs, what its first prepare and first eval will ask for. The
driver records each job's wall and CPU seconds (getrusage of its children)
in `<workdir>/launch/compile_ahead.json`, so the cost is not hidden. The
launcher asks it to stop (SIGTERM: it reaps its job, the CPU seconds still
counted) at the first failure, and kills what is left at the end.
"""
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time

REPORT = 'compile_ahead.json'


def survivor_sets(placement) -> list[tuple[int, list[int]]]:
    """(lost worker, survivors in process order) for every loss the survivors outlive."""
    workers = range(placement.workers)
    sets = [(lost, [w for w in workers if w != lost]) for lost in workers]
    return [(lost, members) for lost, members in sets if placement.survives(members)]


def worker_env() -> dict:
    """The environment of a worker and of a compile-ahead process (its XLA flags enter program keys).

    Each worker is its own host: its own CPU device count, never the
    launcher's. OpenBLAS runs single-threaded unless the user says
    otherwise: XLA already runs one LAPACK call per device at once, and
    OpenBLAS's own threads on top spun against them (a 4-layer projection
    refresh took 1.4 to 5 s on 6 CPU devices of one process, 0.02 s with
    OPENBLAS_NUM_THREADS=1; 16 s in a relaunched survivor).
    """
    env = dict(os.environ)
    env[PARENT_ENV] = str(os.getpid())  # the child checks it is still ours (die_with_parent)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [root, env.get('PYTHONPATH')]))
    env['XLA_FLAGS'] = ' '.join(f for f in env.get('XLA_FLAGS', '').split()
                                if 'xla_force_host_platform_device_count' not in f)
    env.setdefault('OPENBLAS_NUM_THREADS', '1')
    return env


def start(config_args: list[str], workdir: str, workers: int, log_path: str) -> subprocess.Popen:
    """Start the driver in its own process group (the launcher kills the group)."""
    cmd = [sys.executable, '-m', 'mecefo_jax.launch.compile_ahead_job', *config_args,
           f'--workdir={workdir}', f'--workers={workers}']
    with open(log_path, 'w') as log:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=worker_env(),
                                start_new_session=True)


class CompileAhead:
    """The launcher's handle on the driver: started once, after generation 0's first step."""

    def __init__(self, cfg, config_args: list[str], workdir: str, placement):
        self.enabled = (cfg.launch.compile_ahead and cfg.launch.recovery == 'memory'
                        and cfg.launch.compilation_cache
                        and bool(survivor_sets(placement)))
        self._args = (list(config_args), workdir, placement.workers)
        self._dir = os.path.join(workdir, 'launch')
        self._proc: subprocess.Popen | None = None
        self._started = False

    def maybe_start(self, generation: int, completed: int) -> None:
        if self.enabled and not self._started and generation == 0 and completed >= 1:
            self._started = True
            self._proc = start(*self._args, os.path.join(self._dir, 'compile_ahead.log'))

    def stop(self) -> None:
        """Ask a running driver to stop (a failure came first); returns at once.

        On SIGTERM it kills and reaps its job, so its CPU seconds are still
        recorded, at its own low priority, off the way back.
        """
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()

    def close(self) -> None:
        """At the launcher's end: a few seconds to stop, then kill whatever is left."""
        if self._proc is None:
            return
        self.stop()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._proc.wait()

    def report(self) -> dict | None:
        """What the driver wrote (sets compiled, their CPU seconds), None if it never ran."""
        if not self._started:
            return None
        try:
            with open(os.path.join(self._dir, REPORT)) as f:
                return json.load(f)
        except FileNotFoundError:
            return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _cpu_sec() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _write(path: str, report: dict) -> None:
    with open(f'{path}.tmp', 'w') as f:
        json.dump(report, f, indent=2)
    os.replace(f'{path}.tmp', path)


# The spawning process's pid, so a child that starts after its parent died notices.
PARENT_ENV = 'MECEFO_COMPILE_AHEAD_PARENT'


def die_with_parent() -> None:
    """Be killed when the parent goes, however it goes (SIGKILL too), even starved of CPU.

    Linux's PR_SET_PDEATHSIG has the kernel deliver the SIGKILL, so a niced
    process on a busy machine need not be scheduled to notice; elsewhere a
    thread polls the parent. A parent that died before this call (the child
    was still importing) is caught by comparing with the pid it passed down
    (`PARENT_ENV`): no preexec_fn, which is unsafe in a multithreaded parent.
    """
    parent = int(os.environ.get(PARENT_ENV, os.getppid()))
    try:
        import ctypes
        if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL) != 0:  # PR_SET_PDEATHSIG
            raise OSError(ctypes.get_errno(), 'prctl')
    except (OSError, AttributeError):
        def watch():
            while os.getppid() == parent:
                time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent:  # gone before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)


class _Stopped(Exception):
    """SIGTERM from the launcher: a failure came first."""


def _raise_stopped(signum, frame):
    raise _Stopped()


def drive(cfg, config_args: list[str], workdir: str, workers: int, losses=None,
          nice: int = 19) -> dict:
    """Compile for every survivor set in turn, one jax.distributed job each; the report.

    On SIGTERM the running job is killed and reaped, so its CPU seconds still
    count (`stopped`: true), and the driver exits.
    """
    from mecefo_jax.launch.placement import Placement
    os.nice(nice)  # children inherit it: training always comes first
    if os.getpgrp() != os.getpid():  # started by a test or the drill: a group of our own
        os.setpgid(0, 0)
    die_with_parent()  # and each member dies with the driver
    signal.signal(signal.SIGTERM, _raise_stopped)
    placement = Placement(workers, cfg.launch.local_devices, cfg.mesh.model)
    path = os.path.join(workdir, 'launch', REPORT)
    report = {'sets': [], 'cpu_sec': 0.0, 'wall_sec': 0.0, 'done': False, 'stopped': False}
    for lost, members in survivor_sets(placement):
        if losses is not None and lost not in losses:
            continue
        start_wall, start_cpu = time.perf_counter(), _cpu_sec()
        procs = []
        row = {'lost_worker': lost, 'members': members}
        try:
            procs += _spawn_members(config_args, workdir, workers, lost, members)
            codes = [p.wait() for p in procs]
            row['ok'] = not any(codes)
        except _Stopped:
            for p in procs:
                p.kill()
                p.wait()
            row['ok'], report['stopped'] = False, True
        row.update(wall_sec=time.perf_counter() - start_wall, cpu_sec=_cpu_sec() - start_cpu)
        report['sets'].append(row)
        report['cpu_sec'] += row['cpu_sec']
        report['wall_sec'] += row['wall_sec']
        _write(path, report)
        print(f'[compile ahead] loss of worker {lost}: members {members} '
              f"{'compiled' if row['ok'] else 'FAILED or stopped'} in {row['wall_sec']:.1f} s "
              f"({row['cpu_sec']:.1f} CPU s)", flush=True)
        if report['stopped']:
            return report
    report['done'] = True
    _write(path, report)
    return report


def _spawn_members(config_args, workdir, workers, lost, members) -> list:
    """The survivors' job: process ids and worker ids exactly as `Launcher._spawn` gives them."""
    port = _free_port()
    procs = []
    for process_id, worker in enumerate(members):
        cmd = [sys.executable, '-m', 'mecefo_jax.launch.compile_ahead_job', *config_args,
               f'--workdir={workdir}', f'--workers={workers}', f'--lost={lost}',
               f'--coordinator=127.0.0.1:{port}', f'--process_id={process_id}']
        log = open(os.path.join(workdir, 'launch', f'compile_ahead_lost{lost}_w{worker}.log'),
                   'w')
        procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                      stderr=subprocess.STDOUT, env=worker_env()))
    return procs


def compile_for_survivors(cfg, workdir: str, workers: int, lost: int, coordinator: str,
                          process_id: int) -> dict:
    """Member: join the survivors' job and compile what their relaunch will ask for."""
    die_with_parent()
    from mecefo_jax.sharding import simulate_cpu_devices
    simulate_cpu_devices(cfg.launch.local_devices)
    import jax

    from mecefo_jax import program_cache
    placement_members = [w for w in range(workers) if w != lost]
    program_cache.configure(cfg.launch.compilation_cache, workdir,
                            program_cache.program_context(cfg))
    from mecefo_jax.launch.coordinator import join
    join(coordinator, len(placement_members), process_id)
    from mecefo_jax import aot
    from mecefo_jax import train as train_lib
    from mecefo_jax.faults.controller import FaultController
    from mecefo_jax.launch import placement as placement_lib
    from mecefo_jax.layout import ROLE_NEIGHBOUR
    placement = placement_lib.Placement(workers, cfg.launch.local_devices,
                                        cfg.mesh.model)
    rows = placement_lib.replica_rows(placement, placement_members, jax.devices())
    scratch = os.path.join(workdir, 'launch', 'compile_ahead', f'lost{lost}')
    run = train_lib.build_run(cfg, scratch, replica_rows=rows, checkpoint_every=0)
    # The relaunch's controller starts on the present replicas' topology and
    # layout, and its first prepare compiles exactly these (see _transition).
    controller = FaultController.from_config(cfg, run)
    topology, layout = controller.topology, controller.layout
    state = aot.abstract(run.abstract_state, topology.state_shardings)
    _, step_sec = topology.compiled_step(
        state, topology.batch_spec(layout, cfg.data.seq_len + 1), layout)
    if ROLE_NEIGHBOUR in layout.roles:
        topology.refresh.compile(state)
    tokens = aot.abstract_batch(topology.mesh, _eval_rows(run, topology.num_replicas),
                                cfg.data.seq_len + 1, topology.num_replicas)
    topology.eval_step.compile(state.params, tokens['tokens'], tokens['weights'])
    stats = program_cache.stats
    print(f'[compile ahead] process {process_id}: {stats.misses} compiled, {stats.hits} cached',
          flush=True)
    worker = placement_members[process_id]
    # With an empty cache, train_step_sec is a cold compile (lowering included)
    # of the very program the relaunch's first prepare asks for.
    _write(os.path.join(workdir, 'launch', f'compile_ahead_lost{lost}_w{worker}.json'),
           {'lost_worker': lost, 'worker': worker, 'process_id': process_id,
            'train_step_sec': step_sec, 'programs': stats.programs})
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices('compile ahead done')
    jax.distributed.shutdown()
    return {'compiled': stats.misses, 'cached': stats.hits, 'train_step_sec': step_sec}


def _eval_rows(run, replicas: int) -> int:
    """Rows of one padded eval batch per replica, as `train.evaluate` builds it."""
    rows = len(next(run.val_data).reshape(-1, run.val_data.seq_len + 1))
    return (rows + -rows % replicas) // replicas
