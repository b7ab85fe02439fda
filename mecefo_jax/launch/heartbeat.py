"""Worker heartbeats over UDP: liveness, and how far each worker has got.

The sender is a daemon thread started before the worker imports jax, so the
launcher hears from a worker within a fraction of a second of its start, and
keeps hearing from it while its main thread is blocked in a collective that a
dead peer will never finish. It also ends the worker when the launcher dies. A stopped (SIGSTOP) or killed process stops
sending: silence beyond `launch.heartbeat_timeout_sec` is a failure.

Each beat reports the steps dispatched and the steps completed; completion
is read without blocking from the step outputs the loop hands over
(`jax.Array.is_ready`). Standard library only.
"""
from __future__ import annotations

import collections
import json
import os
import socket
import threading
import time

# A worker whose launcher is gone ends itself with this code (a crash, not a program error).
EXIT_ORPHANED = 70


class HeartbeatSender:
    """Sends `{worker, generation, pid, dispatched, completed}` every `interval` s."""

    def __init__(self, address: tuple[str, int], worker: int, generation: int,
                 interval: float = 0.2, *, launcher_pid: int | None = None):
        self._address, self._interval = address, interval
        self._fields = {'worker': worker, 'generation': generation, 'pid': os.getpid()}
        # The launcher's pid as it says, not as we find it: a launcher killed
        # before this line ran would leave us adopted already, and never orphaned.
        self._parent = os.getppid() if launcher_pid is None else launcher_pid
        self.dispatched = 0
        self.completed = 0
        self._pending: collections.deque = collections.deque()  # (steps done, output array)
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._thread = threading.Thread(target=self._run, name='heartbeat', daemon=True)
        self._thread.start()

    def dispatched_step(self, steps_done: int, output) -> None:
        """The loop dispatched step `steps_done - 1`; `output` becomes ready when it ends."""
        with self._lock:
            self.dispatched = steps_done
            self._pending.append((steps_done, output))

    def _refresh_completed(self) -> None:
        with self._lock:
            while self._pending and self._pending[0][1].is_ready():
                self.completed = self._pending.popleft()[0]

    def _run(self) -> None:
        while True:
            if os.getppid() != self._parent:
                os._exit(EXIT_ORPHANED)  # the launcher is gone: nobody tears us down
            try:
                self._refresh_completed()
            except Exception:  # a deleted array after the job tore down: keep beating
                pass
            beat = dict(self._fields, dispatched=self.dispatched, completed=self.completed,
                        time=time.time())
            try:
                self._sock.sendto(json.dumps(beat).encode(), self._address)
            except OSError:
                pass  # the launcher is gone; it will also have killed us
            time.sleep(self._interval)


# A beat is ~150 bytes of JSON; anything much larger is not one of ours.
MAX_BEAT_BYTES = 1024
_INT_FIELDS = ('worker', 'generation', 'completed')


def parse_beat(data: bytes, workers: int | None = None) -> dict | None:
    """The beat in a datagram, or None if it is not a well-formed beat of this job.

    The socket takes datagrams from anyone on the host: junk must never be
    fatal (an unguarded `json.loads` once killed the launcher).
    """
    if len(data) > MAX_BEAT_BYTES:
        return None
    try:
        beat = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(beat, dict):
        return None
    for name in _INT_FIELDS:
        value = beat.get(name)
        if type(value) is not int or value < 0:  # bool is an int subclass: refused too
            return None
    if workers is not None and beat['worker'] >= workers:
        return None
    return beat


class HeartbeatMonitor:
    """The launcher's end: the latest beat of every worker of every generation.

    `rejected` counts datagrams that were not a well-formed beat (`parse_beat`).
    """

    def __init__(self, host: str = '127.0.0.1', workers: int | None = None):
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((host, 0))
        self._sock.setblocking(False)
        self.address = self._sock.getsockname()
        self.workers = workers
        self.rejected = 0
        self.latest: dict[tuple[int, int], dict] = {}  # (generation, worker) -> beat

    def poll(self) -> None:
        while True:
            try:
                data, _ = self._sock.recvfrom(MAX_BEAT_BYTES + 1)  # longer ones arrive cut
            except BlockingIOError:
                return
            beat = parse_beat(data, self.workers)
            if beat is None:
                self.rejected += 1
                continue
            beat['received'] = time.monotonic()
            self.latest[(beat['generation'], beat['worker'])] = beat

    def beat(self, generation: int, worker: int) -> dict | None:
        return self.latest.get((generation, worker))

    def close(self) -> None:
        self._sock.close()
