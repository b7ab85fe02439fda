"""POSIX shared-memory segments: who creates, who attaches, who unlinks.

Python's `multiprocessing.resource_tracker` (3.8-3.12) unlinks every `SharedMemory` its
process created or attached when that process exits: a worker would delete its keeper's
segment just when it is needed. So the keeper creates segments and keeps them registered
(its tracker unlinks them if it is SIGKILLed), and everyone else maps /dev/shm/<name>
(`attach`). Names start with `prefix(keeper_pid, job)`, so a launcher removes its own
job's leaked segments (`remove_stale(job)`), never another job's.
"""
from __future__ import annotations

import logging
import mmap
import os
import sys
import threading
from multiprocessing import resource_tracker, shared_memory

from mecefo_jax.host import processes

log = logging.getLogger(__name__)

SHM_DIR = '/dev/shm'


def prefix(pid: int, job: str = '') -> str:
    """The start of keeper `pid`'s segment names; with `job` (its Ray namespace), of that job's."""
    return f'mcf{pid}_{job}_' if job else f'mcf{pid}_'


def create(name: str, size: int) -> shared_memory.SharedMemory:
    """A new segment with all its pages allocated now: in a sparse tmpfs file a full /dev/shm
    shows up later as SIGBUS in the worker, mid-copy, and every page's first write pays a fault."""
    seg = shared_memory.SharedMemory(name=name, create=True, size=size)
    fd = getattr(seg, '_fd', -1)
    if fd >= 0 and hasattr(os, 'posix_fallocate'):
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            unlink(seg)
            free = _free_bytes()
            raise MemoryError(
                f'Cannot allocate {size / 2**20:.0f} MiB of shared memory for segment {name} ({e}); '
                f'{free / 2**20:.0f} MiB free in {SHM_DIR}. Fix: enlarge {SHM_DIR} (e.g. docker '
                '--shm-size), run keepers with fewer --slots, or snapshot less state.') from e
    return seg


def _free_bytes() -> float:
    try:
        st = os.statvfs(SHM_DIR)
        return st.f_bavail * st.f_frsize
    except OSError:
        return float('nan')


class Attached:
    """A read-write mapping of an existing segment (`.name`, `.buf`, `.close()`)."""

    def __init__(self, name: str):
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
        try:
            self._mmap = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)  # the mapping keeps the segment
        self.name = name
        self.buf = memoryview(self._mmap)

    def close(self) -> None:
        self.buf.release()
        self._mmap.close()


def attach(name: str):
    """Map an existing segment without ever unlinking it from this process."""
    if os.path.isdir(SHM_DIR):
        return Attached(name)
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    seg = shared_memory.SharedMemory(name=name)
    resource_tracker.unregister(seg._name, 'shared_memory')  # noqa: SLF001 (no public API before 3.13)
    return seg


# This process's mappings, one per (keeper, slot): see `mapped`.
_MAPPED: dict[tuple[str, int], object] = {}
_MAPPED_LOCK = threading.Lock()


def mapped(keeper: str, slot: int, name: str):
    """Segment `name` (slot `slot` of `keeper`), mapped once in this process and kept: a fresh
    mapping's first touches cost more than the copy. A regrown slot replaces its mapping;
    mappings of segments unlinked since are dropped."""
    with _MAPPED_LOCK:
        seg = _MAPPED.get((keeper, slot))
        if seg is not None and seg.name == name:
            return seg
        if seg is not None:
            close(_MAPPED.pop((keeper, slot)))
        if os.path.isdir(SHM_DIR):
            for key in [k for k, s in _MAPPED.items() if not os.path.exists(os.path.join(SHM_DIR, s.name))]:
                close(_MAPPED.pop(key))
        seg = _MAPPED[(keeper, slot)] = attach(name)
        return seg


def unmap_all() -> None:
    """Forget this process's mappings (`mapped`): the next use maps afresh, as a new process would."""
    with _MAPPED_LOCK:
        for seg in _MAPPED.values():
            close(seg)
        _MAPPED.clear()


def close(seg) -> None:
    """Unmap; tolerate live numpy views (the mapping then dies with them)."""
    try:
        seg.close()
    except BufferError:
        log.debug('Segment %s still has exported views; leaving it mapped.', seg.name)


def unlink(seg: shared_memory.SharedMemory) -> None:
    try:
        seg.unlink()
    except FileNotFoundError:
        pass
    close(seg)


def listed(pid: int) -> list[str]:
    """Names in /dev/shm created by keeper `pid` (Linux; [] elsewhere)."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(prefix(pid)))


def remove_stale(job: str | None = None) -> list[str]:
    """Unlink segments whose keeper process is gone (of `job`'s keepers only, when given);
    returns their names."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    removed = []
    for n in names:
        head = n.split('_', 1)[0]
        if not (head.startswith('mcf') and head[3:].isdigit()):
            continue
        if job is not None and not n.startswith(prefix(int(head[3:]), job)):
            continue
        if not processes.alive(int(head[3:])):
            try:
                os.unlink(os.path.join(SHM_DIR, n))
                removed.append(n)
            except FileNotFoundError:
                pass
    return removed
