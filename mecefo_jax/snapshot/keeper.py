"""The keeper's state: one worker's snapshot slots in shared memory, and its peers' parity.

`Keeper` answers requests and does no I/O (`keeper_actor` is the process). Anyone Ray
admits can call a keeper, so `check_request` vets every request (op, field types,
payload size) first. A writer `begin`s a slot holding neither the newest nor a pinned
snapshot, fills it and `publish`es it; publish checks the preamble and header checksum,
so no step is listed before its bytes are whole (the Orbax emergency-checkpoint pitfall,
maxtext issue 5260). Two slots restore one process; a multi-process job that must agree
on one step, or uses parity, needs three, so that s-1 survives everywhere while s+1 is
written. A killed keeper's segments are left to `shm.remove_stale`.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable

import numpy as np

from mecefo_jax.snapshot import blob, shm

# The only payload is a parity chunk, 1/(g-1) of a worker's snapshot (snapshots go
# through shared memory); a job with larger snapshots raises it with `max_payload`.
MAX_PAYLOAD_BYTES = 16 << 30
# A `read` asks for one range per shard; more than this is not a request of ours.
MAX_READ_RANGES = 1 << 16
MAX_TEXT = 256  # group names, codes, session ids


class RequestError(Exception):
    """A request the keeper refuses; the message goes back to the client."""


class PayloadTooLarge(RequestError):
    """A payload over the keeper's `max_payload`."""


# Every request: its op and the type of each field it must carry.
_INT, _TEXT = 'int', 'text'
REQUESTS = {
    'hello': {},
    'list': {},
    'begin': {'nbytes': _INT},
    'publish': {'slot': _INT, 'token': _INT, 'step': _INT, 'nbytes': _INT, 'checksum': _INT,
                'header_offset': _INT, 'header_len': _INT},
    'pin': {'step': _INT},
    'unpin': {'slot': _INT},
    'read': {'step': _INT, 'ranges': 'ranges'},
    'parity_put': {'group': _TEXT, 'step': _INT, 'stripe': _INT, 'members': _INT,
                   'member': _INT, 'chunk_index': _INT, 'offset': _INT, 'length': _INT,
                   'chunk_crc': _INT, 'blob_nbytes': _INT, 'blob_checksum': _INT,
                   'code': _TEXT, 'generation': _INT},
    'parity_list': {'group': _TEXT},
    'parity_get': {'group': _TEXT, 'step': _INT},
}


def _well_typed(kind: str, value) -> bool:
    if kind == _INT:  # bool is an int subclass: refused too
        return type(value) is int and value >= 0
    if kind == _TEXT:
        return type(value) is str and len(value) <= MAX_TEXT
    return (isinstance(value, list) and len(value) <= MAX_READ_RANGES  # ranges
            and all(isinstance(r, list | tuple) and len(r) == 2
                    and all(_well_typed(_INT, x) for x in r) for r in value))


def _payload_size(payload) -> int:
    """Bytes in a payload (None, bytes-like or a list of them); -1 if it is none of those."""
    if payload is None:
        return 0
    parts = payload if isinstance(payload, list | tuple) else [payload]
    try:
        return sum(memoryview(p).nbytes for p in parts)
    except TypeError:
        return -1


def check_request(msg, payload, max_payload: int = MAX_PAYLOAD_BYTES) -> None:
    """Raise a RequestError unless `msg` is a request of this protocol with fields of the
    right types, and `payload` is bytes-like within `max_payload`."""
    if not isinstance(msg, dict) or msg.get('op') not in REQUESTS:
        op = msg.get('op') if isinstance(msg, dict) else None
        raise RequestError(f'Not a keeper request (op {op!r}; expected one of {sorted(REQUESTS)}).')
    for name, kind in REQUESTS[msg['op']].items():
        if not _well_typed(kind, msg.get(name)):
            raise RequestError(f"Keeper request {msg['op']!r}: field {name!r} is "
                               f'{msg.get(name)!r:.80}, not a valid {kind}.')
    size = _payload_size(payload)
    if size < 0:
        raise RequestError(f'A keeper payload must be bytes-like, not {type(payload).__name__}.')
    if size > max_payload:
        raise PayloadTooLarge(f"A payload of {size} bytes is over the keeper's limit of "
                              f'{max_payload} bytes; raise max_payload if the job needs it.')


# Complete parity steps kept per group: a survivor may no longer hold the newest one's step.
_KEEP_PARITY = 2
# Process-wide: no two keepers of a process name a segment alike (clients cache maps by name).
_SEGMENT_NUMBERS = itertools.count()
_MAX_PARITY_STEPS = 6


@dataclasses.dataclass
class _Slot:
    index: int
    seg: object = None  # shared_memory.SharedMemory
    capacity: int = 0
    state: str = 'free'  # free | writing | published
    token: int = 0
    step: int | None = None
    nbytes: int = 0
    checksum: int = 0
    header_offset: int = 0
    header_len: int = 0
    seq: int = 0  # publish order
    pins: int = 0

    def record(self) -> dict:
        return {'step': self.step, 'slot': self.index, 'shm': self.seg.name, 'nbytes': self.nbytes,
                'checksum': self.checksum, 'header_offset': self.header_offset,
                'header_len': self.header_len}


@dataclasses.dataclass
class _Stripe:
    """Parity of one (group, step) at this keeper, filled as members contribute."""
    stripe: int
    members: int
    code: str
    buf: np.ndarray
    contributions: dict = dataclasses.field(default_factory=dict)  # member -> metadata
    # The contributions' job generation: a relaunch from an older step redoes this one, anew.
    generation: int = 0

    @property
    def complete(self) -> bool:
        return len(self.contributions) == self.members - 1

    def info(self, step: int) -> dict:
        return {'step': step, 'stripe': self.stripe, 'members': self.members, 'code': self.code,
                'length': len(self.buf), 'complete': self.complete,
                'contributions': {str(m): c for m, c in self.contributions.items()}}


class Keeper:
    """The keeper's state and request handlers (thread-safe, no I/O of its own)."""

    def __init__(self, name: str, slots: int = 2, pin_timeout: float = 60.0,
                 max_payload: int = MAX_PAYLOAD_BYTES, job: str = ''):
        if slots < 2:
            raise ValueError(f'A keeper needs at least 2 slots (double buffering), got {slots}.')
        self.name = name
        self.job = job  # in its segments' names: a job removes only its own stale ones
        self.max_payload = max_payload
        self.refused = 0  # requests refused for a payload over max_payload
        self.rejected = 0  # requests refused as malformed (check_request)
        self.pin_timeout = pin_timeout
        self._cond = threading.Condition()
        self._slots = [_Slot(i) for i in range(slots)]
        self._tokens = itertools.count(1)
        self._seq = itertools.count(1)
        self._parity: dict[str, dict[int, _Stripe]] = {}

    # ------------------------------------------------------------ dispatch

    def dispatch(self, msg, payload, pins: Counter) -> tuple[dict, list, Callable | None]:
        """(reply, reply buffers, a callback releasing them once copied out). A malformed request
        raises RequestError, counted in `rejected` (`refused` if oversized): never fatal."""
        try:
            check_request(msg, payload, self.max_payload)
        except PayloadTooLarge:
            self.refused += 1
            raise
        except RequestError:
            self.rejected += 1
            raise
        out = getattr(self, f'_op_{msg["op"]}')(msg, payload, pins)
        if isinstance(out, tuple):
            return out
        return out, [], None

    def release_pins(self, pins: Counter) -> None:
        with self._cond:
            for index, count in pins.items():
                self._slots[index].pins -= count
            pins.clear()
            self._cond.notify_all()

    def cleanup(self) -> None:
        """Unlink every segment this keeper created."""
        with self._cond:
            for s in self._slots:
                if s.seg is not None:
                    shm.unlink(s.seg)
                    s.seg, s.state, s.capacity = None, 'free', 0
            self._parity.clear()

    # --------------------------------------------------------------- slots

    def _op_hello(self, msg, payload, pins):
        return {'name': self.name, 'pid': os.getpid(), 'slots': len(self._slots)}

    def _op_list(self, msg, payload, pins):
        with self._cond:
            return {'snapshots': [s.record() for s in self._published()]}

    def _published(self) -> list[_Slot]:
        return sorted((s for s in self._slots if s.state == 'published'), key=lambda s: -s.seq)

    def _choose(self) -> _Slot:
        """The slot to overwrite: an unpublished one, else the oldest snapshot, never the newest;
        an unpinned one first (if every candidate is pinned, begin() waits)."""
        candidates = ([s for s in self._slots if s.state != 'published']
                      + self._published()[1:][::-1])
        return next((s for s in candidates if s.pins == 0), candidates[0])

    def _op_begin(self, msg, payload, pins):
        nbytes = int(msg['nbytes'])
        deadline = time.monotonic() + self.pin_timeout
        with self._cond:
            while True:
                slot = self._choose()
                if slot.pins == 0:
                    break
                if not self._cond.wait(timeout=max(0.0, deadline - time.monotonic())):
                    raise RequestError(
                        f"Keeper {self.name}: the slot holding step {slot.step} has been pinned by a "
                        f"reader for over {self.pin_timeout:.0f} s, so no slot is free to write. Fix: "
                        "close the reader's Snapshot (or its client), or start the keeper with more --slots.")
            if slot.capacity < nbytes:
                if slot.seg is not None:
                    # Forget the old snapshot first: if allocating fails, no slot names the unlinked segment.
                    shm.unlink(slot.seg)
                    slot.seg, slot.capacity, slot.state, slot.step = None, 0, 'free', None
                # Headroom so that slowly growing headers do not reallocate every step.
                capacity = max(nbytes + nbytes // 16, 1 << 20)
                name = f'{shm.prefix(os.getpid(), self.job)}s{slot.index}_g{next(_SEGMENT_NUMBERS)}'
                slot.seg, slot.capacity = shm.create(name, capacity), capacity
            slot.state, slot.step, slot.token = 'writing', None, next(self._tokens)
            return {'slot': slot.index, 'shm': slot.seg.name, 'capacity': slot.capacity,
                    'token': slot.token}

    def _op_publish(self, msg, payload, pins):
        with self._cond:
            slot = self._slots[int(msg['slot'])]
            if slot.state != 'writing' or slot.token != int(msg['token']):
                raise RequestError(f'Keeper {self.name}: slot {slot.index} was not begun with this '
                                   'token (another writer began it since); nothing published.')
            step, nbytes, checksum = int(msg['step']), int(msg['nbytes']), int(msg['checksum'])
            h_off, h_len = int(msg['header_offset']), int(msg['header_len'])
            if h_off + h_len != nbytes or nbytes > slot.capacity:
                raise RequestError(f'Keeper {self.name}: publish of step {step} names {nbytes} bytes '
                                   f'(header at {h_off}+{h_len}) in a slot of {slot.capacity}.')
            self._check_written(slot, step, checksum, h_off, h_len)
            for other in self._published():
                # A step at or after this one is of a rolled-back timeline (an older step restored).
                if other.step >= step:
                    other.state, other.step = 'free', None
            slot.state, slot.step, slot.nbytes, slot.checksum = 'published', step, nbytes, checksum
            slot.header_offset, slot.header_len, slot.seq = h_off, h_len, next(self._seq)
            self._cond.notify_all()
            return {'record': slot.record()}

    def _check_written(self, slot: _Slot, step, checksum, h_off, h_len) -> None:
        """Refuse a slot whose preamble and header do not say what publish claims."""
        buf = slot.seg.buf
        try:
            p_step, p_off, p_len, p_sum = blob.read_preamble(buf[:h_off + h_len])
            header_sum = blob.digest(buf[h_off:h_off + h_len])
        except blob.SnapshotCorruptError as e:
            raise RequestError(f'Keeper {self.name}: refusing to publish step {step}: {e}') from None
        if (p_step, p_off, p_len, p_sum, header_sum) != (step, h_off, h_len, checksum, checksum):
            raise RequestError(
                f"Keeper {self.name}: refusing to publish step {step}: the slot's preamble says step "
                f"{p_step}, header {p_off}+{p_len}, checksum {p_sum:#018x}; the header's checksum is "
                f"{header_sum:#018x}; publish claimed checksum {checksum:#018x}. Write the whole "
                "snapshot (blob.fill) before publishing.")

    def _find(self, step: int) -> _Slot:
        for s in self._slots:
            if s.state == 'published' and s.step == step:
                return s
        held = [s.step for s in self._published()]
        raise RequestError(f'Keeper {self.name} holds no snapshot of step {step} (holds {held}).')

    def _op_pin(self, msg, payload, pins):
        with self._cond:
            slot = self._find(int(msg['step']))
            slot.pins += 1
            pins[slot.index] += 1
            return {'record': slot.record()}

    def _op_unpin(self, msg, payload, pins):
        with self._cond:
            index = int(msg['slot'])
            if not pins.get(index):
                raise RequestError(f'This connection holds no pin on slot {index}.')
            self._slots[index].pins -= 1
            pins[index] -= 1
            if not pins[index]:
                del pins[index]
            self._cond.notify_all()
            return {}

    def _op_read(self, msg, payload, pins):
        """Byte ranges of a published snapshot, sent straight from shared memory."""
        with self._cond:
            slot = self._find(int(msg['step']))
            views = []
            for off, n in msg['ranges']:
                if off < 0 or n < 0 or off + n > slot.nbytes:
                    raise RequestError(f"Range [{off}, {off + n}) is outside step {slot.step}'s "
                                       f"{slot.nbytes} bytes.")
                views.append(slot.seg.buf[off:off + n])
            # Held only while the bytes are sent, so begin() cannot reuse the slot.
            slot.pins += 1

        def release():
            for v in views:
                try:
                    v.release()
                except BufferError:  # still exported somewhere; it dies with its owner
                    pass
            with self._cond:
                slot.pins -= 1
                self._cond.notify_all()
        return {'record': slot.record()}, views, release

    # -------------------------------------------------------------- parity

    def _op_parity_put(self, msg, payload, pins):
        group, step, member = str(msg['group']), int(msg['step']), int(msg['member'])
        stripe, members, code = int(msg['stripe']), int(msg['members']), str(msg['code'])
        chunk = np.frombuffer(b'' if payload is None else payload, np.uint8)
        if len(chunk) != int(msg['length']) or zlib.crc32(chunk) != int(msg['chunk_crc']):
            raise RequestError(f"Parity chunk from member {member} for step {step} arrived damaged "
                               f"({len(chunk)} bytes, expected {msg['length']}).")
        generation = int(msg.get('generation', 0))
        with self._cond:
            steps = self._parity.setdefault(group, {})
            acc = steps.get(step)
            if acc is not None and generation < acc.generation:
                raise RequestError(f'Parity group {group!r} step {step}: a contribution from '
                                   f'generation {generation} arrived after generation '
                                   f'{acc.generation} began this step again; dropped.')
            if acc is None or generation > acc.generation:  # first, or a rolled-back timeline's
                acc = steps[step] = _Stripe(stripe, members, code, np.zeros(len(chunk), np.uint8),
                                            generation=generation)
            if (acc.stripe, acc.members, acc.code) != (stripe, members, code):
                raise RequestError(f'Parity group {group!r} step {step}: this keeper holds stripe '
                                   f'{acc.stripe} of {acc.members} ({acc.code}), the contribution says '
                                   f'stripe {stripe} of {members} ({code}).')
            if member in acc.contributions or member == stripe:
                raise RequestError(f'Member {member} already contributed to group {group!r} step {step} '
                                   '(or contributes to its own stripe); XOR-ing twice would cancel it.')
            if len(chunk) > len(acc.buf):
                acc.buf = np.concatenate([acc.buf, np.zeros(len(chunk) - len(acc.buf), np.uint8)])
            blob.get_code(code).accumulate([acc.buf], chunk, member)
            meta = {k: msg[k] for k in ('chunk_index', 'offset', 'length', 'chunk_crc',
                                        'blob_nbytes', 'blob_checksum')}
            acc.contributions[member] = meta
            self._trim_parity(steps)
            return {'complete': acc.complete}

    @staticmethod
    def _trim_parity(steps: dict[int, _Stripe]) -> None:
        complete = sorted(s for s, a in steps.items() if a.complete)
        keep = set(complete[-_KEEP_PARITY:])
        newest = complete[-1] if complete else None
        for s in list(steps):
            if s in keep:
                continue
            # An incomplete step older than a complete one can never be needed.
            if steps[s].complete or (newest is not None and s < newest):
                del steps[s]
        # Steps that never complete (a member stopped contributing) must not pile up.
        for s in sorted(steps)[:max(0, len(steps) - _MAX_PARITY_STEPS)]:
            del steps[s]

    def _op_parity_list(self, msg, payload, pins):
        with self._cond:
            steps = self._parity.get(str(msg['group']), {})
            return {'stripes': [a.info(s) for s, a in sorted(steps.items(), reverse=True)]}

    def _op_parity_get(self, msg, payload, pins):
        group, step = str(msg['group']), int(msg['step'])
        with self._cond:
            acc = self._parity.get(group, {}).get(step)
            if acc is None or not acc.complete:
                raise RequestError(f'Keeper {self.name} holds no complete parity for group {group!r} '
                                   f'step {step}.')
            # A complete stripe takes no more contributions: its buffer is not written while sent.
            return {'info': acc.info(step)}, [acc.buf], None
