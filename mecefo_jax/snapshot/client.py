"""The worker's side of a keeper: requests, writing snapshots, reading them; no jax.

`KeeperClient` is one session with one keeper (a `KeeperHandle` or a `LocalKeeper`).
`SnapshotWriter` copies and checksums into a slot's shared memory (`blob.fill`),
publishes, then pushes parity. A `Snapshot` pins one published step while open and reads
it as read-only views verified in place, never copied: `ShmSnapshot` from the own
keeper's shared memory, `RemoteSnapshot` through any keeper's actor, `BlobSnapshot` from
bytes here (e.g. rebuilt by parity). Arrays read from a `ShmSnapshot` are views of the
keeper's slot, valid until it is closed: a restore places copies (`jax_io`), so closing
unpins at once and the keeper can reuse the slot.
"""
from __future__ import annotations

import abc
import dataclasses
import logging
import threading
import time
from collections.abc import Sequence

import numpy as np

from mecefo_jax.snapshot import blob, shm
from mecefo_jax.snapshot.keeper_actor import KeeperError, KeeperHandle, KeeperUnreachable, LocalKeeper, new_session

Keeper = KeeperHandle | LocalKeeper  # whatever a client can reach a keeper through

log = logging.getLogger(__name__)


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

    def request(self, op: str, payload=None, **fields) -> tuple[dict, list[np.ndarray]]:
        """The reply and its byte arrays (one per range or buffer the keeper sent)."""
        with self._lock:
            reply, data = self.keeper.call(self.session, {'op': op, **fields}, payload,
                                           timeout=self.timeout)
        if not reply.get('ok'):
            raise KeeperError(reply.get('error', f'keeper refused {op!r}'))
        return reply, data or []

    def hello(self) -> dict:
        return self.request('hello')[0]

    def snapshots(self) -> list[SnapshotRecord]:
        """Published snapshots, newest first."""
        return [SnapshotRecord.from_reply(r) for r in self.request('list')[0]['snapshots']]

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

    def read_ranges(self, step: int, ranges: Sequence[tuple[int, int]]) -> list[np.ndarray]:
        """The byte ranges [offset, offset + n) of a published step, one read-only array each."""
        return self.request('read', step=int(step), ranges=[[int(o), int(n)] for o, n in ranges])[1]

    def read(self, step: int, ranges: Sequence[tuple[int, int]]) -> np.ndarray:
        """The concatenated byte ranges [offset, offset + n) of a published step."""
        parts = self.read_ranges(step, ranges)
        return parts[0] if len(parts) == 1 else np.concatenate([np.zeros(0, np.uint8), *parts])

    def parity_put(self, chunk, **fields) -> bool:
        return self.request('parity_put', np.frombuffer(chunk, np.uint8), **fields)[0]['complete']

    def parity_list(self, group: str) -> list[dict]:
        return self.request('parity_list', group=group)[0]['stripes']

    def parity_get(self, group: str, step: int) -> tuple[dict, np.ndarray]:
        reply, data = self.request('parity_get', group=group, step=int(step))
        return reply['info'], data[0] if data else np.zeros(0, np.uint8)

    def segment(self, name: str, slot: int = -1):
        """The keeper's segment `name` (of `slot`), mapped into this process once (`shm.mapped`)."""
        return shm.mapped(str(self.keeper), slot, name)

    def close(self) -> None:
        """End the session (its pins go); the mappings stay for the process's next use."""
        self.keeper.close_session(self.session)

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
    copy_sec: float  # begin (slot allocation, if it grows) + copy + checksum into shared memory
    publish_sec: float
    parity_sec: float
    parity_bytes: int
    parity_error: str | None = None  # a group member's keeper was gone: this step has no parity


class SnapshotWriter:
    """Writes snapshots into one keeper's slots and publishes them; `parity` (a
    `parity.ParityPusher`) then sends this member's parity chunks to the group."""

    def __init__(self, client, *, parity=None):
        self.client = client
        self.parity = parity

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
        self.client.publish(slot['slot'], slot['token'], step=step, nbytes=nbytes, checksum=checksum,
                            header_offset=h_off, header_len=nbytes - h_off)
        t2 = time.perf_counter()
        parity_bytes, parity_error = 0, None
        if self.parity is not None:
            # The slot stays intact until this writer's next begin().
            try:
                parity_bytes = self.parity.push(step, buf[:nbytes], checksum)
            except KeeperUnreachable as e:
                # A peer's keeper died, which its own worker meets: this step stands without parity.
                parity_error = str(e)
            except KeeperError as e:
                raise KeeperError(f'Step {step} is published, but pushing its parity failed: {e}') from e
        return WriteInfo(step=step, nbytes=nbytes, checksum=checksum, copy_sec=t1 - t0,
                         publish_sec=t2 - t1, parity_sec=time.perf_counter() - t2,
                         parity_bytes=parity_bytes, parity_error=parity_error)

    def write_blob(self, raw):
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
        """The given entries' arrays: read-only views of the bytes, each checked in place."""
        raws = self._raw(entries)
        blob.check_entries(raws, entries, self.header.chunk, self.source)
        return [blob.entry_array(raw, e) for raw, e in zip(raws, entries)]

    def verify(self) -> None:
        """Check every shard's checksum without keeping the bytes."""
        blob.check_entries(self._raw(self.entries), self.entries, self.header.chunk, self.source)

    @abc.abstractmethod
    def _raw(self, entries: Sequence[blob.Entry]) -> list:
        """Each entry's bytes, read-only."""

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
        self._buf = memoryview(raw).toreadonly()
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

    def close(self) -> None:
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
    """A snapshot of a keeper on this node, read in place from its shared memory."""

    def _open(self):
        self.source = f'shm:{self.source}'
        seg = self._client.segment(self.record.shm, self.record.slot)
        self._base = np.frombuffer(seg.buf, np.uint8, count=self.record.nbytes)
        self._base.flags.writeable = False
        self.header = blob.parse(self._base, self.record.checksum)

    def _raw(self, entries):
        return [self._base[e.offset:e.offset + e.nbytes] for e in entries]

    def close(self):
        """Unpin: the slot may be overwritten from here on, views read from it with it."""
        self.__dict__.pop('_base', None)
        super().close()


# Entries fetched after the ones asked for, up to this many bytes, in the same call: a
# restore asks leaf by leaf, and each call pays Ray's per-object cost (a real train state
# has hundreds of tiny leaves). A peer heal may fetch up to this much that it does not use.
READ_AHEAD_BYTES = 32 << 20


class RemoteSnapshot(_KeeperSnapshot):
    """A snapshot of any keeper (another node's too), fetched range by range through it."""

    def _open(self):
        self.source = f'peer:{self.source}'
        r = self.record
        (raw,) = self._client.read_ranges(r.step, [(r.header_offset, r.header_len)])
        self.header = blob.parse_header(raw, r.checksum, r.nbytes)
        self._order = {e.key: i for i, e in enumerate(self.header.entries)}
        self._ahead: dict[blob.ShardKey, np.ndarray] = {}  # fetched, not yet read

    def _raw(self, entries):
        fetch = list({e.key: e for e in entries if e.key not in self._ahead}.values())
        if fetch:
            fetch += self._after(fetch)
            parts = self._client.read_ranges(self.step, [(e.offset, e.nbytes) for e in fetch])
            self._ahead.update((e.key, raw) for e, raw in zip(fetch, parts))
        out = [self._ahead[e.key] for e in entries]
        for e in entries:
            self._ahead.pop(e.key, None)
        return out

    def _after(self, fetch: list[blob.Entry]) -> list[blob.Entry]:
        """Entries after the last one fetched, not yet fetched, within READ_AHEAD_BYTES."""
        asked, out, total = {e.key for e in fetch}, [], 0
        for e in self.header.entries[max(self._order[e.key] for e in fetch) + 1:]:
            if e.key in asked or e.key in self._ahead:
                continue
            total += e.nbytes
            if total > READ_AHEAD_BYTES:
                break
            out.append(e)
        return out

    def close(self):
        self.__dict__.pop('_ahead', None)
        super().close()


def open_snapshots(keeper: Keeper, *, via: str = 'remote', timeout: float = 120.0) -> list[Snapshot]:
    """Every snapshot a keeper holds, newest first; `via` 'shm' works only on the keeper's node.
    A step overwritten between listing and pinning is skipped."""
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
    """The own keeper's snapshots, then every reachable peer's: the preference `jax_io.restore`
    follows. Unreachable keepers are skipped with a warning (after a failure some are
    expected to be gone); `restore` names whatever that leaves missing."""
    out = []
    for keeper, via in ([(own, own_via)] if own is not None else []) + [(p, 'remote') for p in peers]:
        try:
            out.extend(open_snapshots(keeper, via=via, timeout=timeout))
        except KeeperError as e:
            log.warning('Skipping keeper %s: %s', keeper, e)
    return out
