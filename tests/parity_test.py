"""Tests for mecefo_jax.snapshot.parity and blob.XorCode: XOR parity across keepers.

Real keeper actors (three slots each, as parity needs) on one local Ray
cluster; snapshots are built from numpy shards, so no jax is involved.
"""
import ml_dtypes
import numpy as np
import pytest
from process_waits import wait_gone

from mecefo_jax.snapshot import blob, parity
from mecefo_jax.snapshot.client import KeeperClient, SnapshotWriter
from mecefo_jax.snapshot.keeper_actor import start_keeper, stop_keeper

pytestmark = [pytest.mark.subprocess, pytest.mark.ray]  # keepers are Ray actors

GROUP = 'g0'
# Unequal snapshot sizes, one smaller than the number of chunks.
SIZES = [10_000, 3, 70_001, 5_000]


def _shards(member, step, nbytes, generation=0):
    rng = np.random.default_rng(1000 * member + step + 100_000 * generation)
    return [blob.HostShard('raw', (nbytes,), ((0, nbytes),), rng.integers(0, 256, nbytes, dtype=np.uint8)),
            blob.HostShard('w', (4,), ((0, 4),), rng.standard_normal(4).astype(ml_dtypes.bfloat16))]


@pytest.fixture(scope='module')
def cluster(ray_cluster):
    return ray_cluster  # the session's shared cluster (tests/conftest.py)


def _keeper(name):
    return start_keeper(name, namespace='parity_test', slots=3, detached=False)


def _start_group(n, prefix):
    keepers = []
    try:
        for m in range(n):
            keepers.append(_keeper(f'{prefix}{m}'))
    except BaseException:
        _stop(keepers)
        raise
    return keepers


def _stop(keepers):
    for k in keepers:
        stop_keeper(k)


@pytest.fixture(scope='module')
def group(cluster):
    keepers = _start_group(len(SIZES), 'p')
    yield keepers
    _stop(keepers)


def _write(keepers, member, step, nbytes, *, push=True, generation=0):
    """Publish member's snapshot of `step` (and push its parity); return the blob bytes."""
    client = KeeperClient(keepers[member])
    pusher = (parity.ParityPusher(GROUP, member, keepers, generation=generation)
              if push else None)
    try:
        info = SnapshotWriter(client, parity=pusher).write(
            step, _shards(member, step, nbytes, generation), {'step': step})
        return bytes(client.read(step, [(0, info.nbytes)]))
    finally:
        client.close()
        if pusher:
            pusher.close()


def _write_all(keepers, step, sizes):
    return [_write(keepers, m, step, n) for m, n in enumerate(sizes)]


def test_xor_code_rebuilds_any_one_block_of_unequal_lengths():
    rng = np.random.default_rng(0)
    blocks = [rng.integers(0, 256, n, dtype=np.uint8) for n in (17, 0, 64, 5)]
    code = blob.XorCode()
    (p,) = code.encode(blocks)
    assert len(p) == 64
    for lost in range(len(blocks)):
        holed = [None if i == lost else b for i, b in enumerate(blocks)]
        out = code.decode(holed, [p], [len(b) for b in blocks])
        np.testing.assert_array_equal(out[lost], blocks[lost])
    with pytest.raises(blob.TooManyLostError):
        code.decode([None, None, blocks[2], blocks[3]], [p], [len(b) for b in blocks])


def test_chunk_plan_covers_each_blob_once_and_skips_own_stripe():
    for members in (2, 3, 4):
        for member in range(members):
            for nbytes in (0, 1, 2, 7, 100):
                chunks = parity.chunk_plan(member, nbytes, members)
                assert [c.stripe for c in chunks] == [p for p in range(members) if p != member]
                covered = np.zeros(nbytes, int)
                for c in chunks:
                    covered[c.offset:c.offset + c.length] += 1
                assert (covered == 1).all()


def test_rebuild_is_bitwise_for_each_lost_member(group):
    _write_all(group, 1, [n + 11 for n in SIZES])
    blobs = _write_all(group, 2, SIZES)
    for lost in range(len(group)):
        holed = [None if m == lost else k for m, k in enumerate(group)]
        rebuilt = parity.rebuild_member(GROUP, holed)
        assert (rebuilt.member, rebuilt.step) == (lost, 2)
        assert bytes(rebuilt.raw) == blobs[lost]
        snap = rebuilt.snapshot()
        (raw_entry,) = [e for e in snap.entries if e.path == 'raw']
        np.testing.assert_array_equal(snap.read([raw_entry])[0], _shards(lost, 2, SIZES[lost])[0].data)


def test_rebuild_falls_back_to_the_newest_step_with_complete_parity(group):
    blobs = _write_all(group, 5, SIZES)
    # Step 6: member 3 publishes but dies before pushing its parity, so no
    # stripe of step 6 completes; member 0 has already begun step 7.
    for m in range(3):
        _write(group, m, 6, SIZES[m])
    _write(group, 3, 6, SIZES[3], push=False)
    with KeeperClient(group[0]) as c:
        c.begin(100)
    holed = list(group[:3]) + [None]
    rebuilt = parity.rebuild_member(GROUP, holed)
    assert rebuilt.step == 5
    assert bytes(rebuilt.raw) == blobs[3]


def test_two_lost_members_name_the_disk_checkpoint_fallback(group):
    holed = [None, None] + list(group[2:])
    with pytest.raises(parity.ParityLossError, match=r'lost members \[0, 1\].*train\.checkpoint_every'):
        parity.rebuild_member(GROUP, holed)


def test_rebuild_after_the_lost_members_keeper_is_killed(cluster):
    import ray
    keepers = _start_group(3, 'k')
    try:
        blobs = _write_all(keepers, 4, [999, 5_000, 12])
        ray.kill(keepers[1].actor)
        # ray.kill returns before the process ends, and a keeper still running answers:
        # the rebuild starts once it is gone. Still listed, it counts as lost because it
        # does not answer.
        wait_gone([keepers[1].pid], 'the killed keeper is still running')
        rebuilt = parity.rebuild_member(GROUP, keepers)
        assert (rebuilt.member, rebuilt.step) == (1, 4)
        assert bytes(rebuilt.raw) == blobs[1]
        # A fresh keeper for member 1 can take the rebuilt snapshot back.
        fresh = _keeper('k1b')
        try:
            with KeeperClient(fresh) as c:
                record = SnapshotWriter(c).write_blob(rebuilt.raw)
                assert (record.step, record.checksum) == (4, rebuilt.checksum)
                assert bytes(c.read(4, [(0, record.nbytes)])) == blobs[1]
        finally:
            stop_keeper(fresh)
    finally:
        _stop(keepers)


def test_a_relaunch_snapshots_a_step_again_and_its_parity_replaces_the_rolled_back_one(cluster):
    """Generation 0 snapshotted step 9 on members 0-2 and died (member 3 never pushed);
    the relaunch resumed from an older step and snapshots 9 again on a new timeline, every
    member contributing a second time. Before, the keepers refused the second contribution
    and the worker stopped with a program error (a crash drill's parity job did)."""
    from mecefo_jax.snapshot.client import KeeperError
    keepers = _start_group(4, 't')
    try:
        for m in range(3):
            _write(keepers, m, 9, SIZES[m], generation=0)
        blobs = [_write(keepers, m, 9, SIZES[m], generation=1) for m in range(4)]
        rebuilt = parity.rebuild_member(GROUP, list(keepers[:3]) + [None])
        assert rebuilt.step == 9 and bytes(rebuilt.raw) == blobs[3]
        # A straggler of the dead generation cannot mix into the new stripes.
        with pytest.raises(KeeperError, match='generation 0 arrived after generation 1'):
            _write(keepers, 0, 9, SIZES[0], generation=0)
    finally:
        _stop(keepers)
