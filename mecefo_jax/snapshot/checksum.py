"""Snapshot checksums: xxh3_64 over cache-sized chunks, fused with the copy, on a few threads.

Why xxh3_64: zlib's crc32 ran slower than the copy it checked, so checksumming cost
more than copying; xxh3 runs faster than a copy and releases the GIL on buffers over
64 KiB (measurements: docs/launch.md, "Snapshots"). Why chunks: each is checksummed
right after it is copied, while still in the core's cache, so every byte crosses
memory once. An entry's checksum is xxh3_64 over its chunks' digests (a hash list),
so a large leaf is split over threads and a reader still verifies any entry on its
own. `CHUNK` is part of the byte format (`blob.FORMAT`).
"""
from __future__ import annotations

import os
import queue
from collections.abc import Sequence

import numpy as np
import xxhash

from mecefo_jax.host.processes import DaemonQueue

# A chunk and its copy's source fit in a core's L2 (1 MiB on the EPYC measured:
# 256 and 512 KiB chunks kept 0.86 to 0.91x of the copy's speed, 1 MiB 0.4 to 0.8x).
CHUNK = 512 << 10
# Bytes per task handed to a thread: enough that handing it out costs little.
_TASK_BYTES = 8 << 20
_THREADS = max(1, min(4, os.cpu_count() or 1))


def digest(raw) -> int:
    """xxh3_64 of one buffer in one call (the header's checksum)."""
    return xxhash.xxh3_64_intdigest(raw)


def flat_bytes(raw) -> np.ndarray:
    """A buffer or array as a flat uint8 array over the same memory (copied only if not contiguous)."""
    if isinstance(raw, np.ndarray):
        return np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    return np.frombuffer(raw, np.uint8)


def copy_and_sum(srcs: Sequence[np.ndarray], dsts: Sequence[np.ndarray], chunk: int = CHUNK) -> list[int]:
    """Copy each flat uint8 `srcs[i]` into `dsts[i]`; the checksum of each destination.

    Each checksum is taken over the destination's bytes right after they
    are written (still in cache): it covers what a reader will see.
    """
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
    errors = []
    for _ in tasks:
        i, ok, value = done.get()
        results[i] = value
        if not ok:
            errors.append(value)
    if errors:
        raise errors[0]
    return results


def _serve(work: queue.SimpleQueue) -> None:
    """One checksum thread. Not a ThreadPoolExecutor: its worker still holds a task's
    arguments for a moment after handing back the result, and those are views of a
    keeper's mapping, which cannot be unmapped while a view lives; here a worker drops
    the task before it reports."""
    while True:
        i, task, srcs, dsts, done = work.get()
        try:
            value, ok = _run(task, srcs, dsts), True
        except BaseException as e:  # noqa: BLE001 (raised in the caller)
            value, ok = e, False
        del task, srcs, dsts
        done.put((i, ok, value))
        del done, value


_THREADS_QUEUE = DaemonQueue(_serve, threads=_THREADS, name='snapshot-checksum')
