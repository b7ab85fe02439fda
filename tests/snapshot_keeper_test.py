"""The keeper as a Ray actor: its shared memory, its sessions, and input it must refuse.

The session's shared Ray cluster (`ray_cluster`, tests/conftest.py); each test
starts its own keeper actors and ends them. Keepers are reached only as Ray
actors (token authentication on), never through a listener of their own.
"""
import os
import subprocess
import sys
from multiprocessing import resource_tracker, shared_memory

import numpy as np
import pytest
from process_waits import wait_gone

from mecefo_jax.snapshot import blob, shm
from mecefo_jax.snapshot.client import KeeperClient, KeeperError, ShmSnapshot, SnapshotWriter
from mecefo_jax.snapshot.keeper import check_request
from mecefo_jax.snapshot.keeper_actor import LocalKeeper, start_keeper, stop_keeper

pytestmark = [pytest.mark.subprocess, pytest.mark.ray,  # Ray's processes
              pytest.mark.skipif(not os.path.isdir(shm.SHM_DIR), reason='needs /dev/shm (Linux)')]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMESPACE = 'snapshot_keeper_test'


@pytest.fixture(scope='module', autouse=True)
def cluster(ray_cluster):
    return ray_cluster  # the session's shared cluster (tests/conftest.py)


def keeper(name, **kw):
    return start_keeper(name, namespace=NAMESPACE, detached=False, **kw)


def _fill(handle, steps=(1, 2)):
    """Publish a few snapshots so that both slots hold a segment."""
    shard = blob.HostShard('x', (1000,), ((0, 1000),), np.arange(1000, dtype=np.float32))
    with KeeperClient(handle) as c:
        for step in steps:
            SnapshotWriter(c).write(step, [shard], {'step': step})


def test_stopping_a_keeper_unlinks_its_segments():
    k = keeper('t-stop')
    _fill(k)
    names = shm.listed(k.pid)
    assert len(names) == 2
    assert sorted(stop_keeper(k)) == names
    assert shm.listed(k.pid) == []


def test_a_killed_keepers_segments_are_removed_as_stale():
    """A keeper lost with its node (or SIGKILLed) cleans up nothing itself; on a real
    host the memory dies with it, here `shm.remove_stale` unlinks what it left."""
    import ray
    k = keeper('t-kill')
    _fill(k)
    names = shm.listed(k.pid)
    ray.kill(k.actor)
    wait_gone([k.pid], 'a killed keeper is still running')
    assert sorted(set(names) & set(shm.remove_stale())) == names
    assert shm.listed(k.pid) == []


def test_worker_exit_does_not_unlink_the_keepers_segments():
    # A worker attaches to its keeper's segment and then exits (or is
    # killed); Python's resource tracker must not take the segment with it.
    k = keeper('t-attach')
    try:
        _fill(k)
        names = shm.listed(k.pid)
        code = f'from mecefo_jax.snapshot import shm; s = shm.attach({names[0]!r}); print(bytes(s.buf[:8]))'
        out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True,
                             cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
        assert blob.MAGIC.decode() in out.stdout
        assert 'leaked' not in out.stderr
        assert shm.listed(k.pid) == names
    finally:
        stop_keeper(k)


def test_remove_stale_unlinks_segments_of_dead_keepers():
    dead = subprocess.Popen([sys.executable, '-c', 'pass'])
    dead.wait()
    seg = shared_memory.SharedMemory(name=f'{shm.prefix(dead.pid)}test', create=True, size=4096)
    resource_tracker.unregister(seg._name, 'shared_memory')  # left behind, as by a SIGKILLed keeper
    seg.close()
    assert shm.remove_stale() == [f'{shm.prefix(dead.pid)}test']
    assert shm.listed(dead.pid) == []


def test_a_job_removes_its_own_dead_keepers_segments_and_never_another_jobs():
    """--cleanup of one workdir once unlinked every dead keeper's segments, another job's too."""
    dead = subprocess.Popen([sys.executable, '-c', 'pass'])
    dead.wait()
    names = [f'{shm.prefix(dead.pid, job)}s0_g0' for job in ('mecefo-aaaa', 'mecefo-bbbb')]
    for name in names:
        seg = shared_memory.SharedMemory(name=name, create=True, size=4096)
        resource_tracker.unregister(seg._name, 'shared_memory')
        seg.close()
    assert shm.remove_stale('mecefo-aaaa') == names[:1]
    assert shm.listed(dead.pid) == names[1:]  # the other job's, for its own cleanup
    assert shm.remove_stale('mecefo-bbbb') == names[1:]


def test_a_pinned_snapshot_is_never_overwritten_and_a_session_end_drops_its_pins():
    import ray
    k = keeper('t-pin', pin_timeout=0.3)
    try:
        _fill(k, steps=(1, 2))
        with KeeperClient(k) as c:
            reader = ShmSnapshot(k, 1, timeout=10)  # pins step 1, the slot the next write wants
            with pytest.raises(KeeperError, match='pinned by a reader'):
                c.begin(100)
            (entry,) = reader.entries
            np.testing.assert_array_equal(reader.read([entry])[0], np.arange(1000, dtype=np.float32))
            reader.close()  # closing the session drops the pin
            _fill(k, steps=(3,))
            assert [r.step for r in c.snapshots()] == [3, 2]
            # A reader killed with its pin never closes its session: the launcher ends it.
            abandoned = KeeperClient(k)
            abandoned.pin(2)
            with pytest.raises(KeeperError, match='pinned by a reader'):
                c.begin(100)
            assert ray.get(k.actor.end_sessions.remote()) == 1
            _fill(k, steps=(4,))
            assert [r.step for r in c.snapshots()] == [4, 3]
    finally:
        stop_keeper(k)


@pytest.mark.parametrize('msg, payload, what', [
    ('not a dict', None, 'Not a keeper request'),
    ({'op': 'shutdown'}, None, 'Not a keeper request'),  # no longer an op anyone may send
    ({'op': 'begin', 'nbytes': -5}, None, "'nbytes'"),
    ({'op': 'begin', 'nbytes': True}, None, "'nbytes'"),
    ({'op': 'pin', 'step': '3'}, None, "'step'"),
    ({'op': 'read', 'step': 1, 'ranges': [[0, 1, 2]]}, None, "'ranges'"),
    ({'op': 'parity_list', 'group': 'g' * 1000}, None, "'group'"),
    ({'op': 'hello'}, object(), 'bytes-like'),
])
def test_malformed_requests_are_refused_by_rule(msg, payload, what):
    with pytest.raises(Exception, match=what):
        check_request(msg, payload)


def test_malformed_and_oversized_input_is_refused_counted_and_never_fatal():
    """Anyone who passes Ray's authentication can call a keeper: what is not a request
    of its protocol is refused and counted, and the keeper keeps serving."""
    import ray
    bound = 1 << 16
    k = keeper('bounded', max_payload=bound)
    try:
        _fill(k)
        junk = [('s', 'not a dict', None), ('s', {'op': 'begin', 'nbytes': 'lots'}, None),
                (12345, {'op': 'hello'}, None), ('s', {'op': 'hello'}, np.zeros(bound + 1, np.uint8))]
        for session, msg, payload in junk:
            reply, data = ray.get(k.actor.request.remote(session, msg, payload))
            assert not reply['ok'] and data is None, reply
        info = ray.get(k.actor.info.remote())
        assert (info['rejected'], info['refused']) == (3, 1)
        # Within the bound a payload is taken; the keeper still serves its snapshots.
        reply, _ = ray.get(k.actor.request.remote('s', {'op': 'hello'}, np.zeros(bound, np.uint8)))
        assert reply['ok']
        with KeeperClient(k) as c:
            assert [r.step for r in c.snapshots()] == [2, 1]
    finally:
        stop_keeper(k)


def _listening_inodes(pid: int) -> set:
    """Inodes of the TCP/UDP sockets `pid` listens on (Linux /proc)."""
    sockets = set()
    for fd in os.listdir(f'/proc/{pid}/fd'):
        try:
            target = os.readlink(f'/proc/{pid}/fd/{fd}')
        except OSError:
            continue
        if target.startswith('socket:['):
            sockets.add(target[8:-1])
    listening = set()
    for table, state in (('tcp', '0A'), ('tcp6', '0A'), ('udp', '07'), ('udp6', '07')):
        with open(f'/proc/net/{table}') as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == state and fields[9] in sockets:
                    listening.add(fields[9])
    return listening


def test_a_keeper_opens_no_listener_beyond_a_plain_ray_actors():
    """Keepers are reached through Ray (token-authenticated) only: the keeper's process
    listens on exactly as many sockets as an actor that does nothing."""
    import ray

    class Plain:
        def pid(self):
            return os.getpid()

    plain = ray.remote(Plain).options(num_cpus=0).remote()
    k = keeper('t-listen')
    try:
        _fill(k)
        baseline = len(_listening_inodes(ray.get(plain.pid.remote())))
        assert len(_listening_inodes(k.pid)) == baseline
    finally:
        stop_keeper(k)
        ray.kill(plain)


def test_an_in_process_keeper_speaks_the_same_protocol():
    with LocalKeeper('local') as k:
        _fill(k)
        with KeeperClient(k) as c:
            assert [r.step for r in c.snapshots()] == [2, 1]
            with pytest.raises(KeeperError, match='Not a keeper request'):
                c.request('no_such_op')
