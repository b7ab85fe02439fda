"""chaos_verify's leak check tells a worker that is still there from a reused pid.

A 100-kill soak starts tens of thousands of processes and threads, so pid_max
(32768 here) wraps within the run: seed 0's first full check reported two
workers of generation 86 as left behind, whose numbers the check's own
in-process simulation had since taken for its threads.
"""
import json
import os
import subprocess
import sys

from mecefo_jax.host import processes
from tests.drills import chaos_verify


def _record(launch_dir, generation: int, worker: int, pid: int, start_ticks) -> None:
    record = {'generation': generation, 'worker': worker, 'pid': pid, 'start_ticks': start_ticks}
    with open(launch_dir / f'g{generation}_w{worker}_start.json', 'w') as f:
        json.dump(record, f)


def test_a_live_worker_is_a_leak_and_a_reused_pid_is_not(tmp_path):
    launch_dir = tmp_path / 'launch'
    launch_dir.mkdir()
    # A process held at a known point: alive until the test ends it.
    held = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'],
                            stdin=subprocess.PIPE)
    try:
        ticks = processes.start_ticks(held.pid)
        assert ticks is not None and ticks >= 0
        _record(launch_dir, 3, 0, held.pid, ticks)       # the worker itself, still running
        _record(launch_dir, 3, 1, held.pid, ticks - 1)   # its pid, once another process's
        _record(launch_dir, 4, 0, os.getpid(), None)     # no start time recorded: the pid is trusted
        left = chaos_verify.leaks(str(tmp_path), 'no-such-namespace', [])
        assert sorted(left) == sorted([f'worker process {held.pid} (g3 w0)',
                                       f'worker process {os.getpid()} (g4 w0)'])
        # A cluster process likewise: named by its pid and its start time, read while it ran.
        cluster = chaos_verify.leaks(str(tmp_path), 'no-such-namespace',
                                     [(held.pid, ticks), (held.pid, ticks - 1)])
        assert cluster.count(f'cluster process {held.pid}') == 1
    finally:
        held.stdin.close()
        held.wait(timeout=30)
    assert chaos_verify.leaks(str(tmp_path), 'no-such-namespace', []) == [
        f'worker process {os.getpid()} (g4 w0)']
