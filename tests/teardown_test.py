"""The launcher's teardown waits for its killed workers' processes to exit (no Ray here)."""
import subprocess
import threading

import pytest

from mecefo_jax.host import processes
from mecefo_jax.launch.generation import wait_exited


def spawn(title: str) -> subprocess.Popen:
    """A process whose command line starts with `title`, as a Ray worker's process title does."""
    return subprocess.Popen(['bash', '-c', f"exec -a '{title}' sleep 600"])


def wait_exited_within(pids, timeout, limit=30.0) -> bool:
    """Whether wait_exited(pids, timeout) returned within `limit` seconds."""
    waiter = threading.Thread(target=wait_exited, args=(pids, timeout), daemon=True)
    waiter.start()
    waiter.join(limit)
    return not waiter.is_alive()


@pytest.mark.subprocess  # stand-in processes
def test_a_worker_still_there_after_the_timeout_is_killed():
    worker = spawn('ray::Worker.run')
    try:
        assert wait_exited_within([worker.pid], 0.2)
        assert not processes.alive(worker.pid)
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.subprocess  # stand-in processes
def test_a_reused_pid_is_neither_killed_nor_waited_for():
    # The worker's pid now names another process: the worker has exited.
    other = spawn('not-a-ray-worker')
    try:
        assert wait_exited_within([other.pid], 0.2)
        assert processes.alive(other.pid)
    finally:
        other.kill()
        other.wait()


@pytest.mark.subprocess  # stand-in processes
def test_exited_processes_need_no_wait():
    gone = spawn('ray::Worker.run')
    gone.kill()
    gone.wait()
    assert wait_exited_within([gone.pid], 60.0, limit=5.0)


def test_a_node_the_launcher_killed_is_a_lost_node_whichever_report_comes_first():
    """Ray may report the actor's death before the node's: the cause of a worker whose node
    the launcher killed is still a lost node (the recovery moves it off that node), and a
    signalled worker's cause names the signal."""
    from mecefo_jax.launch.chaos import NODE_LOSS_INJECTED
    from mecefo_jax.launch.generation import NODE_DIED, crash_cause
    actor_first = RuntimeError('The actor died unexpectedly before finishing this task.')
    assert crash_cause(actor_first, NODE_LOSS_INJECTED) == NODE_DIED
    assert crash_cause(RuntimeError('its node has died'), None) == NODE_DIED
    assert crash_cause(actor_first, 'SIGKILL') == 'killed by SIGKILL'
    assert crash_cause(actor_first, None) == 'its process died'


def test_a_process_that_exits_while_it_is_looked_at_is_dead(monkeypatch):
    """The teardown polls its workers with `shm.alive`: a process that exits between the
    signal-0 probe and the read of /proc/PID/stat makes the read raise ESRCH, which is a
    dead process, not an error (a fresh clone's suite once failed the hung-worker test on it)."""
    import builtins
    import os
    real_open = builtins.open

    def vanished(path, *args, **kwargs):
        if str(path).startswith('/proc/'):
            raise ProcessLookupError(3, 'No such process')
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(builtins, 'open', vanished)
    assert processes.alive(os.getpid()) is False
