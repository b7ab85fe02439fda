"""The keeper: holds one worker's snapshots in shared memory and outlives the worker.

One keeper runs beside each worker, on the worker's node, started by the
launcher (not by the worker) as a detached, named Ray actor, so that it
outlives the worker's crash and the launcher's own; the relaunched worker,
or a peer, then restores from it instead of from disk (REFT, DLRover flash
checkpoint, Gemini). This module owns the keeper's state (`Keeper`), its
request protocol, and the two ways to reach one: `KeeperHandle` (the Ray
actor, `start_keeper`) and `LocalKeeper` (in this process, for benchmarks
and tests of the protocol alone).

State: `slots` snapshot slots (POSIX shared memory, grown on demand) and,
per parity group, the XOR parity that peers' writers push to it. A writer
`begin`s a slot that holds neither the newest snapshot nor one a reader has
pinned, fills it, then `publish`es it; only publish makes it visible, and
publish first checks the slot's preamble and header crc, so a step is never
listed before its bytes and checksum are complete (the Orbax
emergency-checkpoint pitfall, maxtext issue 5260). A writer that dies
mid-copy leaves only an unpublished slot behind.

How many slots: with one snapshot in flight per worker, a worker writing
step s+1 may hold only step s complete while a slower peer holds s-1 and
s-2. Two slots are enough to restore one process; a multi-process job
that must agree on one step for everyone (or uses parity) needs three, so
that s-1 survives the write of s+1 everywhere.

Requests are `{'op': ..., fields}` dicts with an optional payload (a
parity chunk), sent as actor calls: Ray's token authentication admits
the caller, and the keeper opens no listener of its own. Snapshot bytes
never cross a socket on the keeper's node: its worker maps the shared
memory directly. A peer on another node reads byte ranges through Ray.
Pins belong to a *session* (one `KeeperClient`); a session's pins go when
it closes, and the launcher ends every session of a generation it tore
down (`end_sessions`), since a killed worker never closes its own.

The keeper unlinks its segments when its owner shuts it down. A keeper
that is killed (its node lost, or SIGKILL) leaves them behind on that
host; `shm.remove_stale` unlinks segments whose keeper process is gone.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Callable

import numpy as np

from mecefo_jax.snapshot import blob, erasure, shm

log = logging.getLogger('mecefo_jax.snapshot.keeper')

# Complete parity steps kept per group: the newest one may be for a step
# some survivor no longer holds (see the module docstring on slots).
_KEEP_PARITY = 2
_MAX_PARITY_STEPS = 6
# The only request with a payload is a parity chunk: 1/(g-1) of one worker's
# snapshot (snapshots themselves go through shared memory). A larger payload
# is refused; a job whose per-worker snapshot exceeds it times (g-1) raises it
# with `max_payload`.
MAX_PAYLOAD_BYTES = 16 << 30
# A `read` asks for one range per shard; more than this is not a request of ours.
MAX_READ_RANGES = 1 << 16
_MAX_TEXT = 256  # group names, codes, session ids


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
        return type(value) is str and len(value) <= _MAX_TEXT
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


class RequestError(Exception):
    """A request the keeper refuses; the message goes back to the client."""


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
    # The job generation the contributions come from: a relaunch that resumed
    # from an older step snapshots this step again, on a new timeline.
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
                 max_payload: int = MAX_PAYLOAD_BYTES):
        if slots < 2:
            raise ValueError(f'A keeper needs at least 2 slots (double buffering), got {slots}.')
        self.name = name
        self.max_payload = max_payload
        self.refused = 0  # requests refused for a payload over max_payload
        self.rejected = 0  # requests refused as malformed (check_request)
        self.pin_timeout = pin_timeout
        self._cond = threading.Condition()
        self._slots = [_Slot(i) for i in range(slots)]
        self._tokens = itertools.count(1)
        self._seq = itertools.count(1)
        self._gen = itertools.count()
        self._parity: dict[str, dict[int, _Stripe]] = {}

    # ------------------------------------------------------------ dispatch

    def dispatch(self, msg, payload, pins: Counter) -> tuple[dict, list, Callable | None]:
        """(reply, reply payload buffers, release callback once they are copied out).

        Anything that is not a well-formed request of this protocol is
        refused with a RequestError and counted (`rejected`, or `refused`
        for an oversized payload): input from other processes is never fatal.
        """
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
        """The slot to overwrite: an unpublished one, else the oldest snapshot; never the newest.

        Unpinned slots first; if all candidates are pinned, begin() waits.
        """
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
                    # Forget the old snapshot first: if the new allocation fails,
                    # nothing may point at the unlinked segment.
                    shm.unlink(slot.seg)
                    slot.seg, slot.capacity, slot.state, slot.step = None, 0, 'free', None
                # Headroom so that slowly growing headers do not reallocate every step.
                capacity = max(nbytes + nbytes // 16, 1 << 20)
                name = f'{shm.prefix(os.getpid())}s{slot.index}_g{next(self._gen)}'
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
                # A snapshot of a step at or after this one belongs to a timeline
                # that was rolled back (the job restored an older step).
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
            p_step, p_off, p_len, p_crc = blob.read_preamble(buf[:h_off + h_len])
            header_crc = zlib.crc32(buf[h_off:h_off + h_len])
        except blob.SnapshotCorruptError as e:
            raise RequestError(f'Keeper {self.name}: refusing to publish step {step}: {e}') from None
        if (p_step, p_off, p_len, p_crc, header_crc) != (step, h_off, h_len, checksum, checksum):
            raise RequestError(
                f"Keeper {self.name}: refusing to publish step {step}: the slot's preamble says step "
                f"{p_step}, header {p_off}+{p_len}, crc {p_crc:#010x}; the header's crc is "
                f"{header_crc:#010x}; publish claimed crc {checksum:#010x}. Write the whole "
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
            erasure.get_code(code).accumulate([acc.buf], chunk, member)
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
            # A complete stripe takes no more contributions, so its buffer is
            # not written while it is sent.
            return {'info': acc.info(step)}, [acc.buf], None




# ------------------------------------------------------------------ sessions

class _Sessions:
    """Pins per session: a session's pins are released when it closes or is ended."""

    def __init__(self, keeper: Keeper):
        self.keeper = keeper
        self._lock = threading.Lock()
        self._pins: dict[str, Counter] = {}

    def request(self, session, msg, payload) -> tuple[dict, np.ndarray | None]:
        """The reply ({'ok': ...}) and its payload copied out of shared memory, if any."""
        if type(session) is not str or len(session) > _MAX_TEXT:
            self.keeper.rejected += 1
            return {'ok': False, 'error': 'A keeper session id must be a short string.'}, None
        with self._lock:
            pins = self._pins.setdefault(session, Counter())
        try:
            reply, out, release = self.keeper.dispatch(msg, payload, pins)
        except RequestError as e:
            return {'ok': False, 'error': str(e)}, None
        except Exception as e:  # a bug here must not kill the keeper
            log.exception('Request %r failed', msg.get('op'))
            return {'ok': False, 'error': f'{type(e).__name__}: {e}'}, None
        try:
            data = (np.concatenate([np.frombuffer(v, np.uint8) for v in out]) if out else None)
        finally:
            if release is not None:
                release()
        return {'ok': True, **reply}, data

    def close(self, session: str) -> None:
        with self._lock:
            pins = self._pins.pop(session, None)
        if pins:
            self.keeper.release_pins(pins)

    def end_all(self) -> int:
        """Release every session's pins (their clients are gone); how many sessions held pins."""
        with self._lock:
            sessions, self._pins = self._pins, {}
        held = [p for p in sessions.values() if p]
        for pins in held:
            self.keeper.release_pins(pins)
        return len(held)


class LocalKeeper:
    """A keeper in this process: the protocol without a process boundary.

    For benchmarks of the write path and for tests of the protocol; a
    worker's snapshots must live in a keeper that outlives it (`start_keeper`).
    """

    def __init__(self, name: str, *, slots: int = 2, pin_timeout: float = 60.0,
                 max_payload: int = MAX_PAYLOAD_BYTES):
        self.name = name
        self.keeper = Keeper(name, slots=slots, pin_timeout=pin_timeout, max_payload=max_payload)
        self._sessions = _Sessions(self.keeper)

    def call(self, session: str, msg: dict, payload=None, timeout: float | None = None):
        return self._sessions.request(session, msg, payload)

    def close_session(self, session: str) -> None:
        self._sessions.close(session)

    def stop(self) -> None:
        self._sessions.end_all()
        self.keeper.cleanup()

    def __enter__(self) -> LocalKeeper:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class KeeperActor:
    """The keeper as a Ray actor: `start_keeper` creates it (detached, named, on a node)."""

    def __init__(self, name: str, slots: int, pin_timeout: float, max_payload: int):
        self.name = name
        self.keeper = Keeper(name, slots=slots, pin_timeout=pin_timeout, max_payload=max_payload)
        self._sessions = _Sessions(self.keeper)

    def request(self, session, msg, payload=None):
        return self._sessions.request(session, msg, payload)

    def close_session(self, session) -> None:
        if type(session) is str:
            self._sessions.close(session)

    def end_sessions(self) -> int:
        return self._sessions.end_all()

    def info(self) -> dict:
        import ray
        with self.keeper._cond:  # noqa: SLF001 (its own state)
            held = [s.step for s in self.keeper._published()]  # noqa: SLF001
        return {'name': self.name, 'pid': os.getpid(), 'node_id': ray.get_runtime_context().get_node_id(),
                'held': held, 'rejected': self.keeper.rejected, 'refused': self.keeper.refused,
                'segments': shm.listed(os.getpid())}

    def shutdown(self) -> list[str]:
        """Unlink every segment (the caller then kills the actor); the names unlinked."""
        names = shm.listed(os.getpid())
        self._sessions.end_all()
        self.keeper.cleanup()
        return names


class KeeperError(RuntimeError):
    """The keeper refused a request, or could not be reached."""


@dataclasses.dataclass(frozen=True)
class KeeperHandle:
    """A keeper actor, as workers and the launcher address it (picklable, sent to workers)."""
    actor: object  # ray.actor.ActorHandle
    name: str
    node_id: str
    pid: int

    def call(self, session: str, msg: dict, payload=None, timeout: float | None = None):
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError
        try:
            return ray.get(self.actor.request.remote(session, msg, payload), timeout=timeout)
        except (RayActorError, GetTimeoutError) as e:
            raise KeeperError(f'Keeper {self.name} is unreachable ({type(e).__name__}); it or its '
                              'node is gone. Fix: restore from another keeper or parity, or from '
                              'the disk checkpoint.') from None

    def close_session(self, session: str) -> None:
        try:
            self.actor.close_session.remote(session)  # answered or not: a dead keeper holds nothing
        except Exception:  # noqa: BLE001 (Ray shutting down: nothing left to release)
            pass

    def __str__(self) -> str:
        return self.name


def new_session() -> str:
    return f'{os.getpid()}-{uuid.uuid4().hex[:12]}'


def start_keeper(name: str, *, namespace: str | None = None, node_id: str | None = None,
                 slots: int = 2, pin_timeout: float = 60.0, max_payload: int = MAX_PAYLOAD_BYTES,
                 detached: bool = True, ready_timeout: float = 120.0) -> KeeperHandle:
    """Start a keeper actor named `name` (in `namespace`) on node `node_id`, and wait for it.

    Detached, it outlives its worker and the launcher (which finds it again
    by name, `find_keeper`); `stop_keeper` ends it. With a node, it is placed
    there and nowhere else: its worker maps its shared memory.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    options = {'name': name, 'num_cpus': 0, 'max_concurrency': 16, 'max_restarts': 0}
    if namespace is not None:
        options['namespace'] = namespace
    if detached:
        options['lifetime'] = 'detached'
    if node_id is not None:
        options['scheduling_strategy'] = NodeAffinitySchedulingStrategy(node_id, soft=False)
    actor = ray.remote(KeeperActor).options(**options).remote(name, slots, pin_timeout, max_payload)
    info = ray.get(actor.info.remote(), timeout=ready_timeout)
    return KeeperHandle(actor, name, info['node_id'], info['pid'])


def find_keeper(name: str, namespace: str, timeout: float = 30.0) -> KeeperHandle | None:
    """The live keeper actor `name` in `namespace`, or None."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError
    try:
        actor = ray.get_actor(name, namespace=namespace)
        info = ray.get(actor.info.remote(), timeout=timeout)
    except (ValueError, RayActorError, GetTimeoutError):
        return None
    return KeeperHandle(actor, name, info['node_id'], info['pid'])


def stop_keeper(handle: KeeperHandle, timeout: float = 30.0) -> list[str]:
    """Unlink its segments and end the actor; the segment names it unlinked ([] if unreachable)."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError
    try:
        names = ray.get(handle.actor.shutdown.remote(), timeout=timeout)
    except (RayActorError, GetTimeoutError):
        names = []
    try:
        ray.kill(handle.actor)
    except Exception:  # noqa: BLE001 (already gone)
        pass
    return names
