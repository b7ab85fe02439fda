"""The keeper: a process that holds one worker's snapshots in shared memory.

    python -m mecefo_jax.snapshot.keeper --name w3 [--host 127.0.0.1] [--port 0]
        [--slots 2] [--parent-pid PID] [--ready-file PATH]

One keeper runs beside each worker, started by the launcher (not by the
worker) so that it outlives the worker's SIGKILL; the relaunched worker,
or a peer, then restores from it instead of from disk (REFT, DLRover
flash checkpoint, Gemini). This module owns the keeper's state and its
request protocol, and `start_keeper` for launchers and tests.

State: `--slots` snapshot slots (POSIX shared memory, grown on demand)
and, per parity group, the XOR parity that peers' writers push to it. A
writer `begin`s a slot that holds neither the newest snapshot nor one a
reader has pinned, fills it, then `publish`es it; only publish makes it
visible, and publish first checks the slot's preamble and header crc, so
a step is never listed before its bytes and checksum are complete (the
Orbax emergency-checkpoint pitfall, maxtext issue 5260). A writer that
dies mid-copy leaves only an unpublished slot behind.

How many slots: with one snapshot in flight per worker, a worker writing
step s+1 may hold only step s complete while a slower peer holds s-1 and
s-2. Two slots are enough to restore one process; a multi-process job
that must agree on one step for everyone (or uses parity) needs three, so
that s-1 survives the write of s+1 everywhere.

Requests arrive over TCP (see `wire`), so a peer on another host reads a
snapshot the same way as a local one; the owner's worker maps the shared
memory directly. Pins taken on a connection are dropped when it closes.

The keeper exits and unlinks its segments on a `shutdown` request, on
SIGTERM/SIGINT/SIGHUP, and when the process it watches (its parent by
default) dies. If it is SIGKILLed itself, its resource-tracker process
unlinks the segments (see `shm`); `shm.remove_stale` covers the rest.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import os
import select
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable

import numpy as np

from mecefo_jax.snapshot import blob, erasure, shm, wire

log = logging.getLogger('mecefo_jax.snapshot.keeper')

READY_TAG = 'MECEFO_KEEPER_READY'
_PARENT_POLL_SEC = 0.2
# Complete parity steps kept per group: the newest one may be for a step
# some survivor no longer holds (see the module docstring on slots).
_KEEP_PARITY = 2
_MAX_PARITY_STEPS = 6
# The only request with a payload is a parity chunk: 1/(g-1) of one worker's
# snapshot (snapshots themselves go through shared memory). A claimed length
# above this is refused before anything is allocated; a job whose
# per-worker snapshot exceeds it times (g-1) raises it with --max-payload-bytes.
MAX_PAYLOAD_BYTES = 16 << 30


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
        self.refused = 0  # messages refused as too large (wire.MessageTooLarge)
        self.pin_timeout = pin_timeout
        self.stop = threading.Event()
        self._cond = threading.Condition()
        self._slots = [_Slot(i) for i in range(slots)]
        self._tokens = itertools.count(1)
        self._seq = itertools.count(1)
        self._gen = itertools.count()
        self._parity: dict[str, dict[int, _Stripe]] = {}

    # ------------------------------------------------------------ dispatch

    def dispatch(self, msg: dict, payload, pins: Counter) -> tuple[dict, list, Callable | None]:
        """(reply, reply payload buffers, release callback after sending)."""
        op = msg.get('op')
        handler = getattr(self, f'_op_{op}', None)
        if handler is None:
            raise RequestError(f'Unknown keeper request {op!r}.')
        out = handler(msg, payload, pins)
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

    def _op_shutdown(self, msg, payload, pins):
        self.stop.set()
        return {}

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
        chunk = np.frombuffer(payload or b'', np.uint8)
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


# --------------------------------------------------------------------- server

class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        keeper: Keeper = self.server.keeper
        sock = self.request
        wire.configure(sock)
        pins: Counter = Counter()
        try:
            while True:
                try:
                    msg, payload = wire.recv(sock, max_payload=keeper.max_payload)
                except wire.MessageTooLarge as e:  # its bytes are unread: the stream is lost
                    keeper.refused += 1
                    log.warning('Keeper %s: %s Closing the connection.', keeper.name, e)
                    try:
                        wire.send(sock, {'ok': False, 'error': str(e)})
                    except OSError:
                        pass
                    return
                except (EOFError, OSError, ValueError):  # closed, reset, or not our protocol
                    return
                release = None
                try:
                    reply, out, release = keeper.dispatch(msg, payload, pins)
                    reply = {'ok': True, **reply}
                except RequestError as e:
                    reply, out = {'ok': False, 'error': str(e)}, []
                except Exception as e:  # a bug here must not kill the keeper
                    log.exception('Request %r failed', msg.get('op'))
                    reply, out = {'ok': False, 'error': f'{type(e).__name__}: {e}'}, []
                try:
                    wire.send(sock, reply, out)
                except OSError:
                    return
                finally:
                    if release is not None:
                        release()
        finally:
            keeper.release_pins(pins)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, keeper: Keeper):
        self.keeper = keeper
        super().__init__(address, _Handler)


def serve(keeper: Keeper, host: str, port: int, *, parent_pid: int | None,
          on_ready: Callable[[int], None]) -> None:
    """Serve until `keeper.stop` is set or `parent_pid` dies; always clean up."""
    server = _Server((host, port), keeper)
    thread = threading.Thread(target=server.serve_forever, kwargs={'poll_interval': 0.2},
                              name='keeper-server', daemon=True)
    try:
        thread.start()
        on_ready(server.server_address[1])
        initial_ppid = os.getppid()
        while not keeper.stop.wait(_PARENT_POLL_SEC):
            if parent_pid is not None and (os.getppid() != initial_ppid if parent_pid == initial_ppid
                                           else not shm.alive(parent_pid)):
                log.warning('Keeper %s: parent %d is gone; shutting down.', keeper.name, parent_pid)
                break
    finally:
        server.shutdown()
        server.server_close()
        keeper.cleanup()


def _parse(argv):
    p = argparse.ArgumentParser(prog='python -m mecefo_jax.snapshot.keeper', description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--name', required=True, help='the worker this keeper serves (for messages)')
    p.add_argument('--host', default='127.0.0.1', help='address to listen on; 0.0.0.0 for peers on other hosts')
    p.add_argument('--port', type=int, default=0, help='0 picks a free port (reported when ready)')
    p.add_argument('--slots', type=int, default=2,
                   help='2: double buffering; 3 for multi-process jobs and parity (see above)')
    p.add_argument('--parent-pid', type=int, default=None,
                   help='exit when this process dies (default: the parent); -1 disables')
    p.add_argument('--ready-file', default=None, help='also write the ready JSON here (atomically)')
    p.add_argument('--pin-timeout', type=float, default=60.0,
                   help='seconds a writer waits for readers to release the slot it needs')
    p.add_argument('--max-payload-bytes', type=int, default=MAX_PAYLOAD_BYTES,
                   help='largest request payload (a parity chunk) accepted')
    p.add_argument('--log-level', default='WARNING')
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format='%(asctime)s keeper[%(process)d] %(levelname)s %(message)s')
    keeper = Keeper(args.name, slots=args.slots, pin_timeout=args.pin_timeout,
                    max_payload=args.max_payload_bytes)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: keeper.stop.set())
    parent = os.getppid() if args.parent_pid is None else (None if args.parent_pid < 0 else args.parent_pid)

    def ready(port: int) -> None:
        info = {'name': args.name, 'host': args.host, 'port': port, 'pid': os.getpid()}
        if args.ready_file:
            tmp = f'{args.ready_file}.{os.getpid()}.tmp'
            with open(tmp, 'w') as f:
                json.dump(info, f)
            os.replace(tmp, args.ready_file)
        print(f'{READY_TAG} {json.dumps(info)}', flush=True)
        # Nobody reads stdout after this line; never block on a full pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)

    serve(keeper, args.host, args.port, parent_pid=parent, on_ready=ready)
    return 0


# -------------------------------------------------------------------- launcher

@dataclasses.dataclass
class KeeperProcess:
    """A keeper started by `start_keeper`; `stop()` ends it and waits."""
    name: str
    proc: subprocess.Popen
    host: str
    port: int

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def stop(self, timeout: float = 10.0) -> int:
        """Ask it to shut down; SIGTERM, then SIGKILL, if it does not. Returns its exit code."""
        if self.proc.poll() is None:
            try:
                with socket.create_connection(self.address, timeout=timeout) as sock:
                    wire.send(sock, {'op': 'shutdown'})
                    wire.recv(sock)
            except (OSError, EOFError):
                self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning('Keeper %s (pid %d) ignored shutdown; killing it.', self.name, self.pid)
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> KeeperProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_keeper(name: str, *, host: str = '127.0.0.1', port: int = 0, slots: int = 2,
                 parent_pid: int | None = None, pin_timeout: float = 60.0, ready_timeout: float = 60.0,
                 new_session: bool = True, stderr=None,
                 max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> KeeperProcess:
    """Start a keeper process and wait until it listens.

    It watches `parent_pid` (default: this process) and exits when that
    dies. `new_session` keeps signals aimed at the worker's process group
    away from it.
    """
    watch = os.getpid() if parent_pid is None else parent_pid
    cmd = [sys.executable, '-m', 'mecefo_jax.snapshot.keeper', '--name', name, '--host', host,
           '--port', str(port), '--slots', str(slots), '--parent-pid', str(watch),
           '--pin-timeout', str(pin_timeout), '--max-payload-bytes', str(max_payload_bytes)]
    # The keeper must import this package however the caller found it.
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [root, env.get('PYTHONPATH')]))
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
                            env=env, start_new_session=new_session, text=True)
    deadline = time.monotonic() + ready_timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                raise RuntimeError(f'Keeper {name} did not become ready within {ready_timeout:.0f} s '
                                   f'(exit code {proc.poll()}); see its stderr.')
            if select.select([proc.stdout], [], [], left)[0]:
                line = proc.stdout.readline()
                if line.startswith(READY_TAG):
                    info = json.loads(line[len(READY_TAG):])
                    break
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    proc.stdout.close()
    return KeeperProcess(name=name, proc=proc, host=host, port=int(info['port']))


if __name__ == '__main__':
    sys.exit(main())
