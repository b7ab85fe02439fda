"""The byte format of one snapshot, its checksums, and XOR parity over byte blocks; no jax.

Every copy of a snapshot (in a keeper's shared memory, read by a peer, rebuilt from
parity) is read through `parse` and `check_entries`.

    [0, 64)                      preamble: magic, step, header offset/length, header checksum, format
    [64, header_offset)          each shard's raw bytes, 64-byte aligned
    [header_offset, nbytes)      JSON header: step, data_state, meta, checksum chunk, manifest

The header follows the data because it records the shards' checksums; the preamble is
written last, and its header checksum pins every byte a reader uses. A shard's checksum
is xxh3_64 over its `CHUNK`-byte chunks' xxh3_64 digests (a hash list), each taken right
after the chunk's copy, in cache, on a few threads: a large leaf spreads over them and a
peer verifies any shard alone. Why xxh3, not format 1's crc32: docs/launch.md, "Snapshots".
"""
from __future__ import annotations

import dataclasses
import json
import os
import queue
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import xxhash

from mecefo_jax.host.processes import DaemonQueue

# A chunk and its copy's source fit in a core's L2 (1 MiB on the EPYC measured:
# 256 and 512 KiB chunks kept 0.86 to 0.91x of the copy's speed, 1 MiB 0.4 to 0.8x).
CHUNK = 512 << 10
# Bytes per task handed to a thread: enough that handing it out costs little.
_TASK_BYTES = 8 << 20
_THREADS = max(1, min(4, os.cpu_count() or 1))

MAGIC = b'MCFSNAP1'
# 2: xxh3_64 hash lists instead of crc32s, and the format in the preamble.
FORMAT = 2
PREAMBLE_BYTES = 64
ALIGN = 64
# magic, step, header_offset, header_len, header checksum, format (0 in format 1)
_PREAMBLE = struct.Struct('<8sqQQQI')
# The widest checksum as printed: bounds the header's length before the checksums are known.
_MAX_CHECKSUM = (1 << 64) - 1

Index = tuple[tuple[int, int], ...]
ShardKey = tuple[str, Index]


class SnapshotCorruptError(ValueError):
    """Bytes that do not form a complete snapshot, or fail their checksum."""


@dataclasses.dataclass(frozen=True)
class HostShard:
    """One unique shard of one leaf in host memory; `index` is its (start, stop) per dimension of `shape`."""
    path: str
    shape: tuple[int, ...]
    index: Index
    data: np.ndarray

    @property
    def key(self) -> ShardKey:
        return (self.path, self.index)


@dataclasses.dataclass(frozen=True)
class Entry:
    """Where one shard's bytes are in a blob, and what they are."""
    path: str
    shape: tuple[int, ...]
    dtype: str
    index: Index
    offset: int
    nbytes: int
    checksum: int = 0

    @property
    def key(self) -> ShardKey:
        return (self.path, self.index)

    @property
    def local_shape(self) -> tuple[int, ...]:
        return tuple(stop - start for start, stop in self.index)

    def to_json(self) -> dict:
        return {'path': self.path, 'shape': list(self.shape), 'dtype': self.dtype,
                'index': [list(b) for b in self.index], 'offset': self.offset,
                'nbytes': self.nbytes, 'checksum': self.checksum}

    @classmethod
    def from_json(cls, d: dict) -> Entry:
        return cls(path=d['path'], shape=tuple(d['shape']), dtype=d['dtype'],
                   index=tuple((int(a), int(b)) for a, b in d['index']),
                   offset=int(d['offset']), nbytes=int(d['nbytes']), checksum=int(d['checksum']))


@dataclasses.dataclass(frozen=True)
class Header:
    """A parsed, checksum-verified header."""
    step: int
    data_state: dict
    meta: dict
    entries: tuple[Entry, ...]
    checksum: int
    nbytes: int
    chunk: int = CHUNK  # the bytes behind each digest of an entry's hash list


def dtype_from_name(name: str) -> np.dtype:
    """numpy dtype for a stored name; bfloat16 and friends come from ml_dtypes."""
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # half a second to import: a keeper, which never needs it, is spared
        kind = getattr(ml_dtypes, name, None)
        if kind is None:
            raise SnapshotCorruptError(f'Unknown dtype {name!r} in snapshot header.') from None
        return np.dtype(kind)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def layout(shards: Sequence[HostShard]) -> tuple[list[Entry], int]:
    """Entries (checksum still 0) placing each shard's bytes; and where data ends."""
    entries, offset, seen = [], PREAMBLE_BYTES, set()
    for s in shards:
        if s.key in seen:
            raise ValueError(f'Shard {s.path} {list(s.index)} appears twice; '
                             'pass each (path, index) once (see jax_io.host_shards).')
        seen.add(s.key)
        if tuple(s.data.shape) != tuple(b - a for a, b in s.index):
            raise ValueError(f'Shard {s.path}: data shape {s.data.shape} does not match '
                             f'its index {list(s.index)}.')
        nbytes = int(s.data.nbytes)
        entries.append(Entry(path=s.path, shape=tuple(int(d) for d in s.shape),
                             dtype=np.dtype(s.data.dtype).name, index=s.index,
                             offset=offset, nbytes=nbytes))
        offset = _aligned(offset + nbytes)
    return entries, offset


def header_bytes(step: int, data_state: dict, entries: Iterable[Entry], meta: dict | None = None) -> bytes:
    doc = {'format': FORMAT, 'step': int(step), 'data_state': data_state, 'meta': meta or {},
           'chunk': CHUNK, 'entries': [e.to_json() for e in entries]}
    return json.dumps(doc, separators=(',', ':'), allow_nan=False).encode()


def header_bound(step: int, data_state: dict, entries: Sequence[Entry], meta: dict | None = None) -> int:
    """An upper bound on the header's length before the checksums are known."""
    widest = [dataclasses.replace(e, checksum=_MAX_CHECKSUM) for e in entries]
    return len(header_bytes(step, data_state, widest, meta))


def _refuse_format(written) -> None:
    if written != FORMAT:
        raise SnapshotCorruptError(f'Snapshot format {written} is not {FORMAT}; it was written by '
                                   'another version of mecefo_jax.')


def read_preamble(buf) -> tuple[int, int, int, int]:
    """(step, header_offset, header_len, header_checksum) of a blob."""
    if len(buf) < PREAMBLE_BYTES:
        raise SnapshotCorruptError(f'Snapshot of {len(buf)} bytes is shorter than its preamble.')
    magic, step, h_off, h_len, h_sum, written = _PREAMBLE.unpack_from(buf, 0)
    if magic != MAGIC:
        raise SnapshotCorruptError(f'Bad snapshot magic {magic!r} (expected {MAGIC!r}): the '
                                   'slot was never completely written.')
    _refuse_format(written or 1)
    if h_off < PREAMBLE_BYTES or h_off + h_len > len(buf):
        raise SnapshotCorruptError(f'Snapshot header [{h_off}, {h_off + h_len}) lies outside '
                                   f'the {len(buf)} bytes available.')
    return step, h_off, h_len, h_sum


def parse_header(raw, checksum: int, nbytes: int) -> Header:
    """Verify `raw` header bytes against `checksum` and decode them."""
    got = digest(raw)
    if got != checksum:
        raise SnapshotCorruptError(f'Snapshot header checksum {got:#018x} != recorded {checksum:#018x}.')
    doc = json.loads(bytes(raw))
    _refuse_format(doc.get('format'))
    entries = tuple(Entry.from_json(e) for e in doc['entries'])
    for e in entries:
        if e.offset < PREAMBLE_BYTES or e.offset + e.nbytes > nbytes:
            raise SnapshotCorruptError(f"Entry {e.path} lies outside the snapshot's {nbytes} bytes.")
    return Header(step=int(doc['step']), data_state=doc['data_state'], meta=doc['meta'],
                  entries=entries, checksum=checksum, nbytes=nbytes, chunk=int(doc['chunk']))


def parse(buf, expect_checksum: int | None = None) -> Header:
    """Header of a whole blob; `expect_checksum` is the one recorded at publish."""
    step, h_off, h_len, h_sum = read_preamble(buf)
    if expect_checksum is not None and h_sum != expect_checksum:
        raise SnapshotCorruptError(f'Snapshot preamble names checksum {h_sum:#018x}, but '
                                   f'{expect_checksum:#018x} was recorded.')
    header = parse_header(memoryview(buf)[h_off:h_off + h_len], h_sum, h_off + h_len)
    if header.step != step:
        raise SnapshotCorruptError(f'Snapshot preamble says step {step}, header says {header.step}.')
    return header


def entry_array(raw, entry: Entry) -> np.ndarray:
    """`entry`'s bytes (exactly `entry.nbytes` of them) viewed as its array."""
    return np.frombuffer(raw, dtype=dtype_from_name(entry.dtype),
                         count=int(np.prod(entry.local_shape, dtype=np.int64))).reshape(entry.local_shape)


def check_entries(raws: Sequence, entries: Sequence[Entry], chunk: int, source: str = 'snapshot') -> None:
    """Raise unless each of `raws` (an entry's bytes, read in place) matches its recorded checksum."""
    for e, got in zip(entries, sums(raws, chunk), strict=True):
        if got != e.checksum:
            raise SnapshotCorruptError(f'{source}: shard {e.path} {list(e.index)} has checksum '
                                       f'{got:#018x}, recorded {e.checksum:#018x}.')


def fill(buf, shards: Sequence[HostShard], entries: Sequence[Entry], step: int,
         data_state: dict, meta: dict | None = None) -> tuple[int, int, int]:
    """Write `shards` at `entries`' offsets, then header and preamble; (nbytes, checksum, header_offset).

    `buf` holds at least the data end plus `header_bound(...)` bytes.
    """
    out = flat_bytes(buf)
    checksums = copy_and_sum([flat_bytes(s.data) for s in shards],
                             [out[e.offset:e.offset + e.nbytes] for e in entries])
    del out  # release the export on buf before anyone closes it
    final = [dataclasses.replace(e, checksum=c) for e, c in zip(entries, checksums, strict=True)]
    h_off = _aligned(final[-1].offset + final[-1].nbytes) if final else PREAMBLE_BYTES
    raw = header_bytes(step, data_state, final, meta)
    if h_off + len(raw) > len(buf):
        raise ValueError(f'Snapshot needs {h_off + len(raw)} bytes, buffer has {len(buf)}.')
    memoryview(buf)[h_off:h_off + len(raw)] = raw
    checksum = digest(raw)
    _PREAMBLE.pack_into(buf, 0, MAGIC, int(step), h_off, len(raw), checksum, FORMAT)
    return h_off + len(raw), checksum, h_off


def encode(step: int, shards: Sequence[HostShard], data_state: dict,
           meta: dict | None = None) -> bytearray:
    """A whole blob in private memory (tests, republishing, tools)."""
    entries, data_end = layout(shards)
    buf = bytearray(data_end + header_bound(step, data_state, entries, meta))
    nbytes, _, _ = fill(buf, shards, entries, step, data_state, meta)
    del buf[nbytes:]
    return buf


def normalise_data_state(data_state: Any, step: int) -> dict:
    """A JSON round trip now, so a bad value fails in the caller, not later."""
    try:
        out = json.loads(json.dumps(data_state, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise TypeError(f'data_state for step {step} is not JSON-serialisable ({e}); convert '
                        'numpy/jax values to Python numbers and keys to str.') from e
    if not isinstance(out, dict):
        raise TypeError(f'data_state must be a dict, got {type(data_state).__name__}.')
    return out


# ------------------------------------------------------------------ checksums

def digest(raw) -> int:
    """xxh3_64 of one buffer in one call (the header's checksum)."""
    return xxhash.xxh3_64_intdigest(raw)


def flat_bytes(raw) -> np.ndarray:
    """A buffer or array as a flat uint8 array over the same memory (copied only if not contiguous)."""
    if isinstance(raw, np.ndarray):
        return np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    return np.frombuffer(raw, np.uint8)


def copy_and_sum(srcs: Sequence[np.ndarray], dsts: Sequence[np.ndarray], chunk: int = CHUNK) -> list[int]:
    """Copy each flat uint8 `srcs[i]` into `dsts[i]`; the checksum of each destination,
    taken chunk by chunk right after the copy (in cache): it covers what a reader sees."""
    for s, d in zip(srcs, dsts, strict=True):
        if s.nbytes != d.nbytes:
            raise ValueError(f'Copy of {s.nbytes} bytes into {d.nbytes}.')
    return _sums(list(srcs), list(dsts), chunk)


def sums(raws: Sequence, chunk: int = CHUNK) -> list[int]:
    """The checksum of each buffer, read in place (a mapping's view is never copied)."""
    return _sums(None, [flat_bytes(r) for r in raws], chunk)


def _sums(srcs, dsts, chunk) -> list[int]:
    if chunk <= 0:
        raise ValueError(f'Checksum chunk must be positive, got {chunk}.')
    tasks = _tasks([d.nbytes for d in dsts], chunk)
    results = _pooled(tasks, srcs, dsts) if len(tasks) > 1 and _THREADS > 1 \
        else [_run(t, srcs, dsts) for t in tasks]
    per = [[] for _ in dsts]
    for task, digests in zip(tasks, results):
        for (j, _, _), d in zip(task, digests):
            per[j].append(d)
    return [xxhash.xxh3_64_intdigest(b''.join(p)) for p in per]


def _tasks(sizes: list[int], chunk: int) -> list[list[tuple[int, int, int]]]:
    """Pieces (buffer, start, stop) of at most `chunk` bytes, grouped into tasks of about
    `_TASK_BYTES`: many tiny leaves share one task, a large one spans several."""
    tasks, task, size = [], [], 0
    for j, n in enumerate(sizes):
        for lo in range(0, n, chunk):
            hi = min(lo + chunk, n)
            task.append((j, lo, hi))
            size += hi - lo
            if size >= _TASK_BYTES:
                tasks.append(task)
                task, size = [], 0
    if task:
        tasks.append(task)
    return tasks


def _run(task, srcs, dsts) -> list[bytes]:
    out = []
    for j, lo, hi in task:
        d = dsts[j][lo:hi]
        if srcs is not None:
            np.copyto(d, srcs[j][lo:hi])
        out.append(xxhash.xxh3_64_digest(d))
    return out


def _pooled(tasks, srcs, dsts) -> list:
    """`_run` of each task on the checksum threads; the results in task order."""
    done: queue.SimpleQueue = queue.SimpleQueue()
    work = _THREADS_QUEUE.get()
    for i, task in enumerate(tasks):
        work.put((i, task, srcs, dsts, done))
    results: list = [None] * len(tasks)
    for _ in tasks:
        i, value = done.get()
        results[i] = value
    for value in results:
        if isinstance(value, BaseException):
            raise value
    return results


def _serve(work: queue.SimpleQueue) -> None:
    """One checksum thread. Not a ThreadPoolExecutor: its worker still holds a task's
    arguments for a moment after handing back the result, and those are views of a
    keeper's mapping, which cannot be unmapped while a view lives; here a worker drops
    the task before it reports."""
    while True:
        i, task, srcs, dsts, done = work.get()
        try:
            value = _run(task, srcs, dsts)
        except BaseException as e:  # noqa: BLE001 (raised in the caller)
            value = e
        del task, srcs, dsts
        done.put((i, value))
        del done, value


_THREADS_QUEUE = DaemonQueue(_serve, threads=_THREADS, name='snapshot-checksum')


# ------------------------------------------------------------------ XOR parity

class TooManyLostError(ValueError):
    """More blocks of a stripe are missing than the code can rebuild."""


def xor_into(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[:len(src)] ^= src, eight bytes at a time where possible."""
    n = len(src)
    if n > len(dst):
        raise ValueError(f'Block of {n} bytes does not fit a parity buffer of {len(dst)}.')
    wide = n // 8 * 8
    if wide:
        np.bitwise_xor(dst[:wide].view(np.uint64), src[:wide].view(np.uint64),
                       out=dst[:wide].view(np.uint64))
    if n > wide:
        np.bitwise_xor(dst[wide:n], src[wide:n], out=dst[wide:n])


class XorCode:
    """RAID-5's single parity over the blocks of a stripe (shorter blocks count as zero-padded);
    `accumulate` folds contributions arriving one member at a time into the parity."""
    name = 'xor'
    parity_blocks = 1

    def encode(self, blocks):
        blocks = [flat_bytes(b) for b in blocks]
        parity = [np.zeros(max((len(b) for b in blocks), default=0), np.uint8)]
        for i, b in enumerate(blocks):
            self.accumulate(parity, b, i)
        return parity

    def accumulate(self, parity, block, position):
        xor_into(parity[0], flat_bytes(block))

    def decode(self, blocks, parity, lengths):
        missing = [i for i, b in enumerate(blocks) if b is None]
        if not missing:
            return [flat_bytes(b) for b in blocks]
        if len(missing) > self.parity_blocks or parity[0] is None:
            raise TooManyLostError(f"XOR parity rebuilds one block per stripe; blocks {missing} "
                                   f"are missing{' and so is the parity' if parity[0] is None else ''}.")
        (lost,) = missing
        out = flat_bytes(parity[0]).copy()
        for i, b in enumerate(blocks):
            if i != lost:
                xor_into(out, flat_bytes(b))
        if lengths[lost] > len(out):
            raise TooManyLostError(f'Block {lost} has {lengths[lost]} bytes but the parity only {len(out)}.')
        rebuilt = [flat_bytes(b) if b is not None else None for b in blocks]
        rebuilt[lost] = out[:lengths[lost]]
        return rebuilt


CODES = {XorCode.name: XorCode()}  # snapshot.parity's codes (a k-of-m code would join here)


def get_code(name: str) -> XorCode:
    try:
        return CODES[name]
    except KeyError:
        raise ValueError(f'Unknown erasure code {name!r}; known: {sorted(CODES)}.') from None
