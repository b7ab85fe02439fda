"""The byte format of one snapshot, independent of where the bytes live.

The same bytes sit in a keeper's shared memory, travel to a peer and are rebuilt by
parity, so every reader goes through `parse` and `check_entry` here.

    [0, 64)                      preamble: magic, step, header offset/length, header checksum, format
    [64, header_offset)          each shard's raw bytes, 64-byte aligned
    [header_offset, nbytes)      JSON header: step, data_state, meta, checksum chunk, manifest

The header comes after the data because it records each shard's checksum, known only
once the bytes are copied; the preamble is written last. The header's checksum pins
every byte a reader uses, while each shard's hash list (`checksum.sums`) lets a peer
verify the few shards it fetches. Format 1 (crc32s) is refused by name. No jax here.
"""
from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from mecefo_jax.snapshot import checksum as checksums

MAGIC = b'MCFSNAP1'
# 2: xxh3_64 hash lists instead of crc32s, and the format in the preamble.
FORMAT = 2
PREAMBLE_BYTES = 64
ALIGN = 64
# magic, step, header_offset, header_len, header checksum, format (format 1
# wrote a crc32 and nothing after it: zeros there)
_PREAMBLE = struct.Struct('<8sqQQQI')
# The widest value a checksum can print as; used to bound the header size
# before the checksums are known.
_MAX_CHECKSUM = (1 << 64) - 1

Index = tuple[tuple[int, int], ...]
ShardKey = tuple[str, Index]


class SnapshotCorruptError(ValueError):
    """Bytes that do not form a complete snapshot, or fail their checksum."""


@dataclasses.dataclass(frozen=True)
class HostShard:
    """One unique shard of one leaf, in host memory.

    `index` is the shard's (start, stop) per dimension inside the global
    array of shape `shape`; `data` has shape `stop - start` per dimension.
    """
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
    chunk: int = checksums.CHUNK  # the bytes behind each digest of an entry's hash list


def dtype_from_name(name: str) -> np.dtype:
    """numpy dtype for a stored name; bfloat16 and friends come from ml_dtypes."""
    try:
        return np.dtype(name)
    except TypeError:
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
           'chunk': checksums.CHUNK, 'entries': [e.to_json() for e in entries]}
    return json.dumps(doc, separators=(',', ':'), allow_nan=False).encode()


def header_bound(step: int, data_state: dict, entries: Sequence[Entry], meta: dict | None = None) -> int:
    """An upper bound on the header's length before the checksums are known."""
    widest = [dataclasses.replace(e, checksum=_MAX_CHECKSUM) for e in entries]
    return len(header_bytes(step, data_state, widest, meta))


def write_preamble(buf, step: int, header_offset: int, header_len: int, header_checksum: int) -> None:
    _PREAMBLE.pack_into(buf, 0, MAGIC, int(step), header_offset, header_len, header_checksum, FORMAT)


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
    got = checksums.digest(raw)
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
    for e, got in zip(entries, checksums.sums(raws, chunk), strict=True):
        if got != e.checksum:
            raise SnapshotCorruptError(f'{source}: shard {e.path} {list(e.index)} has checksum '
                                       f'{got:#018x}, recorded {e.checksum:#018x}.')


def fill(buf, shards: Sequence[HostShard], entries: Sequence[Entry], step: int,
         data_state: dict, meta: dict | None = None) -> tuple[int, int, int]:
    """Write `shards` at `entries`' offsets, then header and preamble.

    Returns (nbytes, checksum, header_offset). `buf` must hold at least the
    data end plus `header_bound(...)` bytes. The bytes are copied and
    checksummed chunk by chunk on a few threads (`checksum.copy_and_sum`),
    each chunk's checksum taken over what was just written into `buf`
    (still in cache): it covers what a reader will see, not the source.
    """
    out = checksums.flat_bytes(buf)
    sums = checksums.copy_and_sum([checksums.flat_bytes(s.data) for s in shards],
                                  [out[e.offset:e.offset + e.nbytes] for e in entries])
    del out  # release the export on buf before anyone closes it
    final = [dataclasses.replace(e, checksum=c) for e, c in zip(entries, sums, strict=True)]
    h_off = _aligned(final[-1].offset + final[-1].nbytes) if final else PREAMBLE_BYTES
    raw = header_bytes(step, data_state, final, meta)
    if h_off + len(raw) > len(buf):
        raise ValueError(f'Snapshot needs {h_off + len(raw)} bytes, buffer has {len(buf)}.')
    memoryview(buf)[h_off:h_off + len(raw)] = raw
    checksum = checksums.digest(raw)
    write_preamble(buf, step, h_off, len(raw), checksum)
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
