"""Tests for the snapshot keeper's lifecycle: it never outlives its job or leaks /dev/shm.

Each test starts a real keeper, makes it allocate segments, ends it one way
(request, SIGTERM, its parent's SIGKILL, its own SIGKILL) and checks that
the process and every segment it created are gone.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from multiprocessing import resource_tracker, shared_memory

import numpy as np
import pytest

from mecefo_jax.snapshot import blob, shm
from mecefo_jax.snapshot.client import KeeperClient, KeeperError, ShmSnapshot, SnapshotWriter
from mecefo_jax.snapshot.keeper import start_keeper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = [pytest.mark.subprocess,  # spawns keepers
              pytest.mark.skipif(not os.path.isdir(shm.SHM_DIR), reason='needs /dev/shm (Linux)')]


def _fill(address, steps=(1, 2)):
    """Publish a few snapshots so that both slots hold a segment."""
    shard = blob.HostShard('x', (1000,), ((0, 1000),), np.arange(1000, dtype=np.float32))
    with KeeperClient(address) as c:
        for step in steps:
            SnapshotWriter(c).write(step, [shard], {'step': step})


def _wait_gone(pid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not shm.alive(pid) and not shm.listed(pid):
            return True
        time.sleep(0.05)
    return False


def _assert_cleaned_up_itself(k, stderr_path):
    assert _wait_gone(k.pid)
    # Python's resource tracker would also unlink leftovers, but it warns when
    # it has to: the keeper must have unlinked its segments itself.
    with open(stderr_path) as f:
        assert 'leaked' not in f.read()


def test_shutdown_request_unlinks_segments(tmp_path):
    with open(tmp_path / 'stderr', 'w') as err:
        k = start_keeper('t-req', stderr=err)
    _fill(k.address)
    assert len(shm.listed(k.pid)) == 2
    with KeeperClient(k.address) as c:
        c.shutdown()
    assert k.proc.wait(10) == 0
    _assert_cleaned_up_itself(k, tmp_path / 'stderr')


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGINT])
def test_signal_unlinks_segments(sig, tmp_path):
    with open(tmp_path / 'stderr', 'w') as err:
        k = start_keeper('t-sig', stderr=err)
    _fill(k.address)
    os.kill(k.pid, sig)
    assert k.proc.wait(10) == 0
    _assert_cleaned_up_itself(k, tmp_path / 'stderr')


_LAUNCHER = textwrap.dedent("""
    import time
    from mecefo_jax.snapshot.keeper import start_keeper
    k = start_keeper("orphan")
    print(k.pid, k.port, flush=True)
    time.sleep(120)
""")


def test_keeper_exits_when_its_launcher_is_killed():
    launcher = subprocess.Popen([sys.executable, '-c', _LAUNCHER], stdout=subprocess.PIPE, text=True,
                                cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        pid, port = map(int, launcher.stdout.readline().split())
        _fill(('127.0.0.1', port))
        assert len(shm.listed(pid)) == 2
    finally:
        launcher.kill()
        launcher.wait()
        launcher.stdout.close()
    gone = _wait_gone(pid)
    if not gone and shm.alive(pid):
        os.kill(pid, signal.SIGTERM)  # never leave an orphan keeper behind a failed test
    assert gone, f'keeper {pid} outlived its launcher'


def test_a_killed_keepers_segments_are_unlinked_by_its_tracker():
    k = start_keeper('t-kill')
    _fill(k.address)
    os.kill(k.pid, signal.SIGKILL)
    k.proc.wait(10)
    assert _wait_gone(k.pid)


def test_worker_exit_does_not_unlink_the_keepers_segments():
    # A worker attaches to its keeper's segment and then exits (or is
    # killed); Python's resource tracker must not take the segment with it.
    with start_keeper('t-attach') as k:
        _fill(k.address)
        names = shm.listed(k.pid)
        code = f'from mecefo_jax.snapshot import shm; s = shm.attach({names[0]!r}); print(bytes(s.buf[:8]))'
        out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True,
                             cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
        assert blob.MAGIC.decode() in out.stdout
        assert 'leaked' not in out.stderr
        assert shm.listed(k.pid) == names


def test_remove_stale_unlinks_segments_of_dead_keepers():
    dead = subprocess.Popen([sys.executable, '-c', 'pass'])
    dead.wait()
    seg = shared_memory.SharedMemory(name=f'{shm.prefix(dead.pid)}test', create=True, size=4096)
    resource_tracker.unregister(seg._name, 'shared_memory')  # left behind, as by a SIGKILLed keeper
    seg.close()
    assert shm.remove_stale() == [f'{shm.prefix(dead.pid)}test']
    assert shm.listed(dead.pid) == []


def test_a_pinned_snapshot_is_never_overwritten():
    with start_keeper('t-pin', pin_timeout=0.3) as k, KeeperClient(k.address) as c:
        _fill(k.address, steps=(1, 2))
        reader = ShmSnapshot(k.address, 1, timeout=10)  # pins step 1, the slot the next write wants
        with pytest.raises(KeeperError, match='pinned by a reader'):
            c.begin(100)
        (entry,) = reader.entries
        np.testing.assert_array_equal(reader.read([entry])[0], np.arange(1000, dtype=np.float32))
        reader.close()  # closing the connection drops the pin
        _fill(k.address, steps=(3,))
        assert [r.step for r in c.snapshots()] == [3, 2]


def test_cli_ready_file_names_the_port(tmp_path):
    ready = tmp_path / 'ready.json'
    proc = subprocess.Popen([sys.executable, '-m', 'mecefo_jax.snapshot.keeper', '--name', 'cli',
                             '--ready-file', str(ready)], stdout=subprocess.DEVNULL, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        assert info['pid'] == proc.pid
        with KeeperClient((info['host'], info['port'])) as c:
            assert c.hello()['name'] == 'cli'
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


def test_a_message_claiming_too_many_bytes_is_refused_and_the_keeper_serves_others():
    """Lengths come from the peer: a header or payload over the keeper's bound is
    refused before anything is allocated, that connection closed, the keeper kept."""
    import socket
    import struct

    from mecefo_jax.snapshot import wire
    bound = 1 << 20
    with start_keeper('bounded', max_payload_bytes=bound) as k:
        _fill(k.address)
        for json_len, payload_len in ((16, bound + 1), (wire.MAX_JSON_BYTES + 1, 0),
                                      (16, 1 << 62)):
            with socket.create_connection(k.address, timeout=10) as sock:
                sock.sendall(struct.pack('!IQ', json_len, payload_len) + b'{"op":"hello"}  ')
                reply, _ = wire.recv(sock)
                assert not reply['ok'] and 'bytes' in reply['error'], reply
                assert sock.recv(1) == b''  # closed: its unread bytes cannot be resynced
        # Within the bound, a parity chunk's payload is still taken.
        with socket.create_connection(k.address, timeout=10) as sock:
            wire.send(sock, {'op': 'hello'}, [b'x' * bound])
            assert wire.recv(sock)[0]['ok']
        with KeeperClient(k.address) as c:
            assert [r.step for r in c.snapshots()] == [2, 1]
