"""The snapshot's byte path without Ray: the format, its checksums, the fused copy, in-place reads.

Keepers here are `LocalKeeper`s (this process), so these tests are fast;
tests/snapshot_test.py runs the same paths through keeper actors.
"""
import struct
import zlib

import ml_dtypes
import numpy as np
import pytest
import xxhash

from mecefo_jax.snapshot import blob
from mecefo_jax.snapshot.client import (
    BlobSnapshot,
    KeeperClient,
    RemoteSnapshot,
    ShmSnapshot,
    SnapshotWriter,
)
from mecefo_jax.snapshot.keeper_actor import LocalKeeper


def _shard(path, data):
    return blob.HostShard(path, data.shape, tuple((0, n) for n in data.shape), data)


def _assorted(seed=0):
    """Leaves of every awkward kind: empty, one byte, unaligned, bfloat16, over one chunk and over
    one thread task, non-contiguous, and many tiny ones."""
    rng = np.random.default_rng(seed)
    big = blob.CHUNK * 3 + 17
    leaves = {
        'empty': np.zeros((0, 4), np.float32),
        'one_byte': np.array([7], np.uint8),
        'scalar': np.asarray(3, np.int32),
        'unaligned': rng.integers(0, 256, 1_000_003, dtype=np.uint8),
        'bf16': rng.standard_normal((33, 65)).astype(ml_dtypes.bfloat16),
        'chunks': rng.standard_normal(big // 4 + 1).astype(np.float32),
        'tasks': rng.integers(0, 256, (9 << 20) + 5, dtype=np.uint8),  # over one task: threads
        'transposed': rng.standard_normal((40, 30)).astype(np.float32).T,
    }
    leaves.update({f'tiny{i}': rng.integers(0, 256, 1 + i % 40, dtype=np.uint8) for i in range(300)})
    return [_shard(k, v) for k, v in leaves.items()]


def _bytes(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _hash_list(data: bytes, chunk: int) -> int:
    """The entry checksum as the format defines it, written out plainly."""
    pieces = [data[i:i + chunk] for i in range(0, len(data), chunk)]
    return xxhash.xxh3_64_intdigest(b''.join(xxhash.xxh3_64_digest(p) for p in pieces))


def test_the_fused_chunked_copy_writes_exactly_the_source_bytes():
    shards = _assorted()
    raw = blob.encode(5, shards, {'pos': 5})
    header = blob.parse(raw)
    assert header.chunk == blob.CHUNK and len(header.entries) == len(shards)
    for s, e in zip(shards, header.entries):
        assert e.nbytes == s.data.nbytes, s.path
        assert bytes(raw[e.offset:e.offset + e.nbytes]) == _bytes(s.data).tobytes(), s.path
        assert e.checksum == _hash_list(_bytes(s.data).tobytes(), header.chunk), s.path
    for s, got in zip(shards, BlobSnapshot(raw).read(header.entries)):
        assert got.dtype == s.data.dtype and got.shape == s.data.shape, s.path
        np.testing.assert_array_equal(_bytes(got), _bytes(s.data), err_msg=s.path)


def test_copy_and_sum_over_small_chunks_matches_the_hash_list_and_refuses_a_size_mismatch():
    rng = np.random.default_rng(1)
    srcs = [rng.integers(0, 256, n, dtype=np.uint8) for n in (0, 1, 4095, 4096, 4097, 70_000)]
    dsts = [np.empty_like(s) for s in srcs]
    sums = blob.copy_and_sum(srcs, dsts, chunk=4096)
    for s, d, got in zip(srcs, dsts, sums):
        np.testing.assert_array_equal(d, s)
        assert got == _hash_list(s.tobytes(), 4096)
    assert blob.sums(srcs, chunk=4096) == sums
    with pytest.raises(ValueError, match='Copy of 3 bytes into 4'):
        blob.copy_and_sum([np.zeros(3, np.uint8)], [np.zeros(4, np.uint8)])


@pytest.mark.parametrize('where', ['first', 'middle', 'last'])
def test_a_flipped_byte_in_any_entry_is_caught_and_named(where):
    shards = _assorted(2)
    raw = blob.encode(6, shards, {})
    entries = [e for e in blob.parse(raw).entries if e.nbytes]
    snap = BlobSnapshot(raw)  # reads `raw` in place; the header stays intact
    for e in entries:
        pos = e.offset + {'first': 0, 'middle': e.nbytes // 2, 'last': e.nbytes - 1}[where]
        raw[pos] ^= 0x01
        with pytest.raises(blob.SnapshotCorruptError, match=rf'shard {e.path} .* has checksum'):
            snap.read([e])
        with pytest.raises(blob.SnapshotCorruptError, match=e.path):
            snap.verify()
        snap.read([o for o in entries if o.path != e.path][:3])  # the rest still reads
        raw[pos] ^= 0x01
    snap.verify()


def test_a_flipped_byte_in_the_header_or_preamble_is_caught():
    raw = blob.encode(7, _assorted(3)[:5], {'pos': 7})
    _, h_off, h_len, _ = blob.read_preamble(raw)
    for pos in (h_off, h_off + h_len // 2, h_off + h_len - 1):
        bad = bytearray(raw)
        bad[pos] ^= 0x20
        with pytest.raises(blob.SnapshotCorruptError, match='header checksum'):
            blob.parse(bad)
    bad = bytearray(raw)
    bad[32] ^= 0x01  # the header checksum recorded in the preamble
    with pytest.raises(blob.SnapshotCorruptError, match='header checksum'):
        blob.parse(bad)
    with pytest.raises(blob.SnapshotCorruptError, match='names checksum'):
        blob.parse(raw, expect_checksum=blob.parse(raw).checksum ^ 1)


def _format1_blob(step=3):
    """A blob as format 1 wrote it: crc32s, and a preamble that ends with the header's crc32."""
    data = np.arange(10, dtype=np.float32)
    entry = {'path': 'w', 'shape': [10], 'dtype': 'float32', 'index': [[0, 10]], 'offset': 64,
             'nbytes': 40, 'crc': zlib.crc32(data.tobytes())}
    header = f'{{"format":1,"step":{step},"data_state":{{}},"meta":{{}},"entries":['.encode()
    header += str(entry).replace("'", '"').replace(' ', '').encode() + b']}'
    raw = bytearray(128 + len(header))
    raw[64:104] = data.tobytes()
    raw[128:] = header
    struct.pack_into('<8sqQQI', raw, 0, blob.MAGIC, step, 128, len(header), zlib.crc32(header))
    return raw


def test_old_format_blobs_are_refused_with_a_clear_error():
    with pytest.raises(blob.SnapshotCorruptError, match=r'format 1 is not 2; it was written by another version'):
        blob.parse(_format1_blob())
    with pytest.raises(blob.SnapshotCorruptError, match='format 1 is not 2'):
        BlobSnapshot(_format1_blob())
    newer = bytearray(blob.encode(1, [], {}))
    struct.pack_into('<I', newer, 40, 3)  # a later format
    with pytest.raises(blob.SnapshotCorruptError, match='format 3 is not 2'):
        blob.parse(newer)


def _write(keeper, steps, shards):
    with KeeperClient(keeper) as c:
        for step in steps:
            SnapshotWriter(c).write(step, shards, {'pos': step})


def test_shm_reads_are_verified_views_of_the_keepers_memory():
    shards = _assorted(4)
    with LocalKeeper('zero-copy', slots=2) as keeper:
        _write(keeper, (1,), shards)
        snap = ShmSnapshot(keeper, 1, timeout=10)
        mapping = np.frombuffer(snap._client.segment(snap.record.shm, snap.record.slot).buf, np.uint8)
        arrays = snap.read(snap.entries)
        for s, a in zip(shards, arrays):
            np.testing.assert_array_equal(_bytes(a), _bytes(s.data), err_msg=s.path)
            assert not a.flags.writeable, s.path
            if a.nbytes:
                assert np.shares_memory(a, mapping), s.path  # no copy: the keeper's bytes themselves
        blob_arrays = BlobSnapshot(raw := blob.encode(1, shards, {})).read(blob.parse(raw).entries)
        assert np.shares_memory(blob_arrays[3], np.frombuffer(raw, np.uint8))
        del mapping, arrays, blob_arrays
        snap.close()


class _SameName(LocalKeeper):
    def __str__(self):  # what clients key their mappings by: two objects at one address
        return 'same'


def test_a_keeper_made_after_another_closed_never_reuses_its_segment_names():
    """Clients of one process share mappings, keyed by keeper, slot and segment name. A
    keeper that named its first segment as a closed one did (both numbered from 0) was
    handed that one's unlinked mapping: its first publish found zeros ("Bad snapshot
    magic"), as a fresh keeper at a freed keeper's address did in the suite."""
    for _ in range(2):
        with _SameName('same', slots=2) as keeper:
            _write(keeper, (1,), _assorted(2))
            with ShmSnapshot(keeper, 1, timeout=10) as snap:
                assert snap.step == 1


def _pins(keeper):
    return [s.pins for s in keeper.keeper._slots]


def test_a_restore_from_shared_memory_unpins_at_close_and_owns_its_arrays():
    """Closing an shm snapshot unpins its slot at once, even where the restore's arrays
    live on: on CPU `device_put` would alias an aligned host view of the slot, so the
    restore places copies. Overwriting the slot (two more snapshots into a two-slot
    keeper) then leaves the restored values as they were."""
    import jax
    from jax.sharding import SingleDeviceSharding

    from mecefo_jax.snapshot import jax_io
    values = {'w': np.arange(4096, dtype=np.float32).reshape(64, 64)}
    sharding = SingleDeviceSharding(jax.devices()[0])
    abstract = {'w': jax.ShapeDtypeStruct((64, 64), np.float32, sharding=sharding)}
    with LocalKeeper('pins', slots=2) as keeper:
        _write(keeper, (1,), [_shard('w', values['w'])])
        with ShmSnapshot(keeper, 1, timeout=10) as snap:
            restored, _, _ = jax_io.restore(abstract, [snap], step=1)
        assert sum(_pins(keeper)) == 0  # no wait: nothing of the slot lives on
        _write(keeper, (2, 3), [_shard('w', -values['w'])])  # step 3 reuses step 1's slot
        np.testing.assert_array_equal(np.asarray(restored['w']), values['w'])


class _Counting(LocalKeeper):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.reads = 0

    def call(self, session, msg, payload=None, timeout=None):
        self.reads += msg.get('op') == 'read'
        return super().call(session, msg, payload, timeout)


def test_a_remote_read_of_many_tiny_leaves_takes_few_calls():
    shards = _assorted(6)
    with _Counting('ahead', slots=2) as keeper:
        _write(keeper, (1,), shards)
        with RemoteSnapshot(keeper, 1, timeout=10) as snap:
            before = keeper.reads
            for s, e in zip(shards, snap.entries):  # leaf by leaf, as jax_io.restore asks
                (got,) = snap.read([e])
                np.testing.assert_array_equal(_bytes(got), _bytes(s.data), err_msg=s.path)
            # 308 leaves: the large ones one call each, the 300 tiny ones a few calls.
            assert keeper.reads - before <= 8
            assert not snap._ahead
