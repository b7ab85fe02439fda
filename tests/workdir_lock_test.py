"""One run per workdir: a live holder refuses a second run; a dead one's lock is taken over."""
import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mecefo_jax.host.workdir_lock import LOCK_FILENAME, WorkdirLock, WorkdirLockedError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Takes the lock, says so on stdout, then holds it until stdin closes; with
# 'crash' it exits without releasing, as a SIGKILLed run would.
_HOLDER = """
import os, sys
from mecefo_jax.host.workdir_lock import WorkdirLock
lock = WorkdirLock(sys.argv[1]).acquire()
print('held', flush=True)
if sys.argv[2] == 'crash':
    os._exit(0)
sys.stdin.readline()
lock.release()
"""


def _holder(workdir, mode='hold'):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''))
    proc = subprocess.Popen([sys.executable, '-c', _HOLDER, str(workdir), mode], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == 'held'  # the lock is held from here on
    return proc


@pytest.mark.subprocess  # a Python process holding the lock
def test_second_run_is_refused_naming_the_holder(tmp_path):
    proc = _holder(tmp_path)
    try:
        with pytest.raises(WorkdirLockedError) as e:
            WorkdirLock(tmp_path).acquire()
        message = str(e.value)
        assert f'pid {proc.pid}' in message and socket.gethostname() in message
        assert f'kill {proc.pid}' in message and '--workdir' in message
    finally:
        proc.stdin.close()
        assert proc.wait() == 0
    # Released by the holder on its way out: free again.
    with WorkdirLock(tmp_path) as lock:
        assert json.loads(Path(lock.path).read_text())['pid'] == os.getpid()
    assert not os.path.exists(tmp_path / LOCK_FILENAME)


@pytest.mark.subprocess  # a Python process holding the lock
def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path, caplog):
    proc = _holder(tmp_path, 'crash')
    assert proc.wait() == 0  # dead and reaped, its lock file left behind
    assert json.loads((tmp_path / LOCK_FILENAME).read_text())['pid'] == proc.pid
    with caplog.at_level(logging.WARNING, logger='mecefo_jax.host.workdir_lock'):
        with WorkdirLock(tmp_path):
            assert json.loads((tmp_path / LOCK_FILENAME).read_text())['pid'] == os.getpid()
    assert any('stale lock' in r.getMessage() and str(proc.pid) in r.getMessage()
               for r in caplog.records)


def test_released_on_exceptions(tmp_path):
    with pytest.raises(KeyError):
        with WorkdirLock(tmp_path):
            assert os.path.exists(tmp_path / LOCK_FILENAME)
            raise KeyError('boom')
    assert not os.path.exists(tmp_path / LOCK_FILENAME)


def test_lock_on_another_host_is_not_taken_over(tmp_path):
    record = {'pid': 1, 'host': 'elsewhere-' + socket.gethostname(), 'started': 'then'}
    (tmp_path / LOCK_FILENAME).write_text(json.dumps(record))
    with pytest.raises(WorkdirLockedError, match=f'delete {tmp_path / LOCK_FILENAME}'):
        WorkdirLock(tmp_path).acquire()
    assert json.loads((tmp_path / LOCK_FILENAME).read_text()) == record


def test_inactive_lock_for_other_processes_writes_nothing(tmp_path):
    with WorkdirLock(tmp_path / 'w', active=False):
        assert not os.path.exists(tmp_path / 'w')


@pytest.mark.subprocess  # a Python process holding the lock, and the launcher's --cleanup
def test_cleanup_refuses_a_workdir_whose_job_holds_its_lock(tmp_path):
    """--cleanup once removed a running job's keepers, shared memory and cluster."""
    proc = _holder(tmp_path)
    try:
        done = subprocess.run([sys.executable, '-m', 'mecefo_jax.launch', f'--workdir={tmp_path}',
                               '--cleanup'], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 1, done.stdout + done.stderr
        assert '--cleanup refused: the job is running' in done.stderr
        assert f'pid {proc.pid}' in done.stderr
        assert json.loads((tmp_path / LOCK_FILENAME).read_text())['pid'] == proc.pid  # still its
    finally:
        proc.stdin.close()
        assert proc.wait() == 0

