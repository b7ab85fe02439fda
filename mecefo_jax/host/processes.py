"""Processes by pid (alive, its command line, its start time, this machine) and daemon threads.

A pid names a process only on its own machine and only while that process runs: a
long job wraps pid_max, so a recorded pid is checked against its start time too.
Linux's /proc where it exists; elsewhere a pid that answers a signal is trusted.
"""
from __future__ import annotations

import os
import queue
import socket
import threading
from collections.abc import Callable


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (OSError where unreadable)."""
    with open(f'/proc/{pid}/stat', encoding='ascii', errors='replace') as f:
        return f.read().rsplit(')', 1)[1].split()


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return _stat_fields(pid)[0] != 'Z'
    except ProcessLookupError:  # it exited between the signal and the read
        return False
    except (OSError, IndexError):  # no /proc here: trust the signal
        return True


def start_ticks(pid: int) -> int | None:
    """Process start time in clock ticks since boot (Linux), to spot pid reuse; -1: a zombie."""
    try:
        fields = _stat_fields(pid)
    except (OSError, IndexError):
        return None
    return int(fields[19]) if fields[0] != 'Z' else -1


def same_process_alive(pid: int, recorded_ticks: int | None) -> bool:
    """Whether `pid` still runs as the process whose `start_ticks` were recorded, not as one
    that reused its number; an unknown start time on either side trusts the pid."""
    if not alive(pid):
        return False
    ticks = start_ticks(pid)
    return ticks is None or recorded_ticks is None or ticks == recorded_ticks


def cmdline(pid: int) -> str | None:
    """`pid`'s command line (a process title, when it set one), or None where it cannot be read."""
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            return f.read().decode(errors='replace')
    except OSError:
        return None


def this_host() -> str:
    """This machine, by name and boot: a pid names a process only on its own machine."""
    try:
        with open('/proc/sys/kernel/random/boot_id') as f:
            boot = f.read().strip()
    except OSError:
        boot = ''
    return f'{socket.gethostname()}/{boot}'


class DaemonQueue:
    """A queue served by `threads` daemon threads running `serve(queue)`, started on first use
    in each process: threads do not survive a fork."""

    def __init__(self, serve: Callable[[queue.SimpleQueue], None], *, threads: int = 1,
                 name: str = 'daemon'):
        self._serve, self._threads, self._name = serve, threads, name
        self._queue: queue.SimpleQueue | None = None
        self._pid = -1
        self._lock = threading.Lock()

    def get(self) -> queue.SimpleQueue:
        with self._lock:
            if self._pid != os.getpid():
                self._queue, self._pid = queue.SimpleQueue(), os.getpid()
                for n in range(self._threads):
                    threading.Thread(target=self._serve, args=(self._queue,), daemon=True,
                                     name=f'{self._name}-{n}').start()
            return self._queue
