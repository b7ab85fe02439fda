"""The worker's side of a keeper: requests, writing snapshots, reading them.

`KeeperClient` speaks the keeper protocol (`keeper_requests.REQUESTS`) to one
keeper, a Ray actor (`KeeperHandle`) or one in this process
(`LocalKeeper`), as one session. `SnapshotWriter` turns host shards into a
published snapshot: begin a slot, copy and checksum into shared memory,
publish, then (optionally) push parity to the group. `Snapshot`s read one
published step back, verified shard by shard:

* `ShmSnapshot`: the own keeper's, mapped from shared memory on its node
  (no transfer, no intermediate bytes object);
* `RemoteSnapshot`: any keeper's, through its actor, fetching only the
  shards asked for (a peer healing a few missing shards);
* `BlobSnapshot`: bytes already in this process (e.g. rebuilt by parity).

A `Snapshot` from a keeper pins its step in its own session, so the keeper
cannot reuse that slot while it is open; close it when done. `read`
returns private copies: restored device arrays must never alias memory a
keeper may overwrite or unmap.

No jax here (see `jax_io` for pytrees).
"""
from __future__ import annotations

import abc
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from mecefo_jax.snapshot import blob, shm
from mecefo_jax.snapshot.keeper_actor import KeeperError, KeeperHandle, new_session
from mecefo_jax.snapshot.keeper_sessions import LocalKeeper

Keeper = KeeperHandle | LocalKeeper  # whatever a client can reach a keeper through

log = logging.getLogger(__name__)

__all__ = ['BlobSnapshot', 'Keeper', 'KeeperClient', 'KeeperError', 'RemoteSnapshot',
           'ShmSnapshot', 'Snapshot', 'SnapshotRecord', 'SnapshotWriter', 'WriteInfo',
           'open_snapshots', 'open_sources']


@dataclasses.dataclass(frozen=True)
class SnapshotRecord:
    """What a keeper says about one published snapshot."""
    step: int
    slot: int
    shm: str
    nbytes: int
    checksum: int
    header_offset: int
    header_len: int

    @classmethod
    def from_reply(cls, d: dict) -> SnapshotRecord:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})


class KeeperClient:
    """One session with one keeper; requests are serialised by a lock."""

    def __init__(self, keeper: Keeper, *, timeout: float = 120.0):
        self.keeper = keeper
        self.timeout = timeout
        self.session = new_session()
        self._lock = threading.Lock()
        self._segments: dict[int, object] = {}  # slot -> SharedMemory

    def request(self, op: str, payload=None, **fields) -> tuple[dict, np.ndarray | None]:
        with self._lock:
            reply, data = self.keeper.call(self.session, {'op': op, **fields}, payload,
                                           timeout=self.timeout)
        if not reply.get('ok'):
            raise KeeperError(reply.get('error', f'keeper refused {op!r}'))
        return reply, data

    # --------------------------------------------------------------- requests

    def hello(self) -> dict:
        return self.request('hello')[0]

    def snapshots(self) -> list[SnapshotRecord]:
        """Published snapshots, newest first."""
        return [SnapshotRecord.from_reply(r) for r in self.request('list')[0]['snapshots']]

    def latest(self) -> SnapshotRecord | None:
        records = self.snapshots()
        return records[0] if records else None

    def begin(self, nbytes: int) -> dict:
        return self.request('begin', nbytes=int(nbytes))[0]

    def publish(self, slot: int, token: int, *, step: int, nbytes: int, checksum: int,
                header_offset: int, header_len: int) -> SnapshotRecord:
        reply, _ = self.request('publish', slot=slot, token=token, step=int(step), nbytes=nbytes,
                                checksum=checksum, header_offset=header_offset, header_len=header_len)
        return SnapshotRecord.from_reply(reply['record'])

    def pin(self, step: int) -> SnapshotRecord:
        return SnapshotRecord.from_reply(self.request('pin', step=int(step))[0]['record'])

    def unpin(self, record: SnapshotRecord) -> None:
        self.request('unpin', slot=record.slot)

    def read(self, step: int, ranges: Sequence[tuple[int, int]]) -> np.ndarray:
        """The concatenated byte ranges [offset, offset + n) of a published step."""
        _, data = self.request('read', step=int(step), ranges=[[int(o), int(n)] for o, n in ranges])
        return data if data is not None else np.zeros(0, np.uint8)

    def parity_put(self, chunk, **fields) -> bool:
        return self.request('parity_put', np.frombuffer(chunk, np.uint8), **fields)[0]['complete']

    def parity_list(self, group: str) -> list[dict]:
        return self.request('parity_list', group=group)[0]['stripes']

    def parity_get(self, group: str, step: int) -> tuple[dict, np.ndarray]:
        reply, data = self.request('parity_get', group=group, step=int(step))
        return reply['info'], data if data is not None else np.zeros(0, np.uint8)

    # ------------------------------------------------------------ shared memory

    def segment(self, name: str, slot: int = -1):
        """The keeper's segment `name` (of `slot`), mapped into this process.

        Mappings stay cached per slot: a fresh mapping page-faults on every
        first touch, which for a large snapshot costs more than the copy.
        """
        cached = self._segments.get(slot)
        if cached is not None and cached.name == name:
            return cached
        if cached is not None:  # the keeper regrew this slot; the old segment is unlinked
            shm.close(cached)
        seg = self._segments[slot] = shm.attach(name)
        return seg

    def close(self) -> None:
        """End the session (its pins go) and unmap the segments."""
        self.keeper.close_session(self.session)
        for seg in self._segments.values():
            shm.close(seg)
        self._segments.clear()

    def __enter__(self) -> KeeperClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -------------------------------------------------------------------- writing

@dataclasses.dataclass(frozen=True)
class WriteInfo:
    step: int
    nbytes: int
    checksum: int
    copy_sec: float  # begin (slot allocation, if it grows) + copy + crc into shared memory
    publish_sec: float
    parity_sec: float
    parity_bytes: int


class SnapshotWriter:
    """Writes snapshots into one keeper's slots and publishes them.

    `parity` (a `parity.ParityPusher`) sends this member's parity chunks to
    the group after each publish. `before_publish(step)` runs after the
    bytes are written and before publish (tests use it to die there).
    """

    def __init__(self, client: KeeperClient, *, parity=None,
                 before_publish: Callable[[int], None] | None = None):
        self.client = client
        self.parity = parity
        self.before_publish = before_publish

    def write(self, step: int, shards: Sequence[blob.HostShard], data_state: dict,
              meta: dict | None = None) -> WriteInfo:
        step = int(step)
        data_state = blob.normalise_data_state(data_state, step)
        entries, data_end = blob.layout(shards)
        bound = data_end + blob.header_bound(step, data_state, entries, meta)
        t0 = time.perf_counter()
        slot = self.client.begin(bound)
        buf = self.client.segment(slot['shm'], slot['slot']).buf
        nbytes, checksum, h_off = blob.fill(buf, shards, entries, step, data_state, meta)
        t1 = time.perf_counter()
        if self.before_publish is not None:
            self.before_publish(step)
        self.client.publish(slot['slot'], slot['token'], step=step, nbytes=nbytes, checksum=checksum,
                            header_offset=h_off, header_len=nbytes - h_off)
        t2 = time.perf_counter()
        parity_bytes = 0
        if self.parity is not None:
            # The slot stays intact until this writer's next begin().
            try:
                parity_bytes = self.parity.push(step, buf[:nbytes], checksum)
            except KeeperError as e:
                raise KeeperError(f'Step {step} is published, but pushing its parity failed: {e}') from e
        return WriteInfo(step=step, nbytes=nbytes, checksum=checksum, copy_sec=t1 - t0,
                         publish_sec=t2 - t1, parity_sec=time.perf_counter() - t2,
                         parity_bytes=parity_bytes)

    def write_blob(self, raw) -> SnapshotRecord:
        """Publish a complete blob as is (e.g. one rebuilt from parity)."""
        header = blob.parse(raw)
        slot = self.client.begin(header.nbytes)
        self.client.segment(slot['shm'], slot['slot']).buf[:header.nbytes] = memoryview(raw)[:header.nbytes]
        _, h_off, h_len, _ = blob.read_preamble(raw)
        return self.client.publish(slot['slot'], slot['token'], step=header.step, nbytes=header.nbytes,
                                   checksum=header.checksum, header_offset=h_off, header_len=h_len)


# -------------------------------------------------------------------- reading

class Snapshot(abc.ABC):
    """One published step of one member's state, verified on every read."""

    source: str
    header: blob.Header

    @property
    def step(self) -> int:
        return self.header.step

    @property
    def data_state(self) -> dict:
        return self.header.data_state

    @property
    def entries(self) -> tuple[blob.Entry, ...]:
        return self.header.entries

    def read(self, entries: Sequence[blob.Entry]) -> list[np.ndarray]:
        """Private, crc-checked copies of the given entries' arrays."""
        out = []
        for e, raw in zip(entries, self._raw(entries), strict=True):
            arr = blob.entry_array(raw, e)
            if self._shared:
                arr = arr.copy()
            # Checked after the copy: what is returned is what was verified.
            blob.check_entry(arr.reshape(-1).view(np.uint8), e, self.source)
            out.append(arr)
        return out

    def verify(self) -> None:
        """Check every shard's crc without keeping copies."""
        for e, raw in zip(self.entries, self._raw(self.entries), strict=True):
            blob.check_entry(raw, e, self.source)

    # True where the raw bytes live in memory that someone else may reuse.
    _shared = True

    @abc.abstractmethod
    def _raw(self, entries: Sequence[blob.Entry]) -> list:
        """Each entry's bytes."""

    def close(self) -> None:  # noqa: B027  (optional: most sources hold nothing)
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f'{type(self).__name__}(step={self.step}, source={self.source!r})'


class BlobSnapshot(Snapshot):
    def __init__(self, raw, source: str = 'blob', expect_checksum: int | None = None):
        self._buf = memoryview(raw)
        self.source = source
        self.header = blob.parse(self._buf, expect_checksum)

    def _raw(self, entries):
        return [self._buf[e.offset:e.offset + e.nbytes] for e in entries]


class _KeeperSnapshot(Snapshot):
    def __init__(self, keeper: Keeper, step: int, timeout: float):
        self._client = KeeperClient(keeper, timeout=timeout)
        try:
            self.record = self._client.pin(step)
            self.source = str(keeper)
            self._open()
        except BaseException:
            self._client.close()
            raise

    def _open(self) -> None:
        raise NotImplementedError

    def close(self) -> None:  # noqa: B027  (optional: most sources hold nothing)
        client = self.__dict__.get('_client')
        if client is None:
            return
        record = self.__dict__.pop('record', None)
        if record is not None:
            try:
                client.unpin(record)  # released before close() returns...
            except KeeperError:
                pass  # ...or, with the keeper gone, with the session
        client.close()


class ShmSnapshot(_KeeperSnapshot):
    """A snapshot of a keeper on this node, mapped from its shared memory."""

    def _open(self):
        self.source = f'shm:{self.source}'
        seg = self._client.segment(self.record.shm, self.record.slot)
        self._buf = seg.buf[:self.record.nbytes]
        self.header = blob.parse(self._buf, self.record.checksum)

    def _raw(self, entries):
        return [self._buf[e.offset:e.offset + e.nbytes] for e in entries]

    def close(self):
        buf = self.__dict__.pop('_buf', None)
        if buf is not None:
            try:
                buf.release()
            except BufferError:  # a caller still holds a view; the map dies with it
                pass
        super().close()

    def __del__(self):
        # Unclosed: release the view before the mapping goes, or
        # SharedMemory.__del__ complains that exports still exist.
        try:
            self.close()
        except Exception:  # at interpreter exit anything may be half torn down
            pass


class RemoteSnapshot(_KeeperSnapshot):
    """A snapshot of any keeper (another node's too), fetched range by range through it."""
    _shared = False  # each read lands in a fresh private buffer

    def _open(self):
        self.source = f'peer:{self.source}'
        r = self.record
        raw = self._client.read(r.step, [(r.header_offset, r.header_len)])
        self.header = blob.parse_header(raw, r.checksum, r.nbytes)

    def _raw(self, entries):
        data = memoryview(self._client.read(self.step, [(e.offset, e.nbytes) for e in entries]))
        out, pos = [], 0
        for e in entries:
            out.append(data[pos:pos + e.nbytes])
            pos += e.nbytes
        return out


def open_snapshots(keeper: Keeper, *, via: str = 'remote', timeout: float = 120.0) -> list[Snapshot]:
    """Every snapshot a keeper holds, newest first; `via` is 'shm' or 'remote'.

    'shm' works only on the keeper's node. A step overwritten between
    listing and pinning is skipped.
    """
    kinds = {'shm': ShmSnapshot, 'remote': RemoteSnapshot}
    if via not in kinds:
        raise ValueError(f"via must be 'shm' or 'remote', got {via!r}.")
    with KeeperClient(keeper, timeout=timeout) as client:
        steps = [r.step for r in client.snapshots()]
    out = []
    for step in steps:
        try:
            out.append(kinds[via](keeper, step, timeout))
        except KeeperError as e:
            if 'holds no snapshot' not in str(e):
                raise
    return out


def open_sources(own: Keeper | None, peers: Sequence[Keeper] = (), *, own_via: str = 'shm',
                 timeout: float = 120.0) -> list[Snapshot]:
    """The own keeper's snapshots (shared memory) then every reachable peer's (remote).

    The order is the preference `jax_io.restore` follows. Unreachable
    keepers are skipped with a warning: after a failure some are expected
    to be gone, and `restore` names whatever that leaves missing.
    """
    out = []
    for keeper, via in ([(own, own_via)] if own is not None else []) + [(p, 'remote') for p in peers]:
        try:
            out.extend(open_snapshots(keeper, via=via, timeout=timeout))
        except KeeperError as e:
            log.warning('Skipping keeper %s: %s', keeper, e)
    return out
