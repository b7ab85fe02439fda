"""Snapshots written in a background thread while training goes on.

The worker `submit`s the 'pinned_host' copy it just started (`jax.device_put` returns at
once, and the copy keeps step k's values though the next step donates the device buffers).
One snapshot is in flight: `submit` blocks for the previous one (`stats.blocked_sec`), or
with `wait=False` replaces the next in line (`stats.dropped`; docs/launch.md, "Snapshots").
A background error surfaces once, on the next `submit` (which then queues nothing) or
`wait`. The worker briefly holds two host copies; `wait()` before `device_put` caps it at one.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import numpy as np

from mecefo_jax.snapshot import blob
from mecefo_jax.snapshot.client import SnapshotWriter
from mecefo_jax.snapshot.jax_io import ShareCopy, host_shards
from mecefo_jax.snapshot.keeper_actor import KeeperLost, KeeperUnreachable


class SnapshotError(RuntimeError):
    """A background snapshot failed; the step named was not published."""


@dataclasses.dataclass
class SnapshotStats:
    submitted: int = 0
    published: int = 0
    failed: int = 0
    dropped: int = 0  # snapshots skipped because the previous one was still being written
    parity_missed: int = 0  # published without parity: a group member's keeper was gone
    last_published_step: int | None = None
    blocked_sec: float = 0.0  # caller time spent in submit/wait
    write_sec: float = 0.0  # background: materialise + copy + publish + parity
    materialize_sec: float = 0.0  # background: waiting for the host arrays
    bytes: int = 0  # snapshot bytes published
    parity_bytes: int = 0


def _materialize(job) -> list[blob.HostShard]:
    """Host shards with numpy data, from a tree of arrays or `jax_io.pinned_local_copies`'
    list, whose copies this waits for (a `ShareCopy` gives only this process's part)."""
    if isinstance(job, list) and all(isinstance(s, ShareCopy) for s in job):
        return [s.materialize() for s in job]
    if isinstance(job, list) and all(isinstance(s, blob.HostShard) for s in job):
        return [dataclasses.replace(s, data=np.asarray(s.data)) for s in job]
    return host_shards(job)


class AsyncSnapshotter:
    """One background writer thread; `submit` hands it a host tree per step."""

    def __init__(self, writer: SnapshotWriter, *, meta: dict | None = None):
        self.writer = writer
        self.meta = meta
        self.stats = SnapshotStats()
        self._cond = threading.Condition()
        self._job: tuple | None = None  # (step, tree, data_state) being written
        self._next: tuple | None = None  # the one to write after it (wait=False)
        self._error: tuple[int, BaseException] | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name='snapshot-writer', daemon=True)
        self._thread.start()

    def submit(self, step: int, host_tree: Any, data_state: dict, *, wait: bool = True) -> float:
        """Queue step's snapshot. With `wait`, block while the previous one is in flight;
        without, hold it as the next one (module docstring). Returns seconds blocked."""
        start = time.perf_counter()
        data_state = blob.normalise_data_state(data_state, step)  # fail here, not in the thread
        with self._cond:
            if self._closed:
                raise RuntimeError('AsyncSnapshotter is closed.')
            if wait:
                self._cond.wait_for(self._idle)
            self._raise_pending()
            job = (int(step), host_tree, data_state)
            if self._job is None:
                self._job = job
            else:
                self.stats.dropped += self._next is not None
                self._next = job
            self.stats.submitted += 1
            self._cond.notify_all()
        return self._blocked(start)

    def _idle(self) -> bool:
        return self._job is None and self._next is None

    def wait(self) -> float:
        """Block until nothing is in flight; raise a background error. Returns seconds blocked."""
        start = time.perf_counter()
        with self._cond:
            self._cond.wait_for(self._idle)
            self._raise_pending()
        return self._blocked(start)

    def close(self) -> None:
        """Finish the snapshot in flight, stop the thread, raise its error if any."""
        with self._cond:
            if self._closed:
                return
            self._cond.wait_for(self._idle)
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        with self._cond:
            self._raise_pending()

    def __enter__(self) -> AsyncSnapshotter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----------------------------------------------------------------- thread

    def _blocked(self, start: float) -> float:
        sec = time.perf_counter() - start
        self.stats.blocked_sec += sec
        return sec

    def _raise_pending(self) -> None:
        if self._error is not None:
            step, err = self._error
            self._error = None
            why = f'{type(err).__name__}: {err}'
            if isinstance(err, KeeperUnreachable):
                raise KeeperLost(f'The keeper died before the snapshot of step {step}: {why}') from err
            raise SnapshotError(f'Snapshot of step {step} failed in the background: {why}') from err

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._job is not None or self._closed)
                if self._job is None:
                    return
                step, tree, data_state = self._job
            start = time.perf_counter()
            try:
                shards = _materialize(tree)
                materialized = time.perf_counter()
                info = self.writer.write(step, shards, data_state, self.meta)
            except BaseException as e:  # surfaced to the caller on its next call
                with self._cond:
                    self._error = (step, e)
                    self.stats.failed += 1
                    self._job, self._next = self._next, None
                    self._cond.notify_all()
                continue
            del shards, tree
            with self._cond:
                s = self.stats
                s.published += 1
                s.last_published_step = step
                s.write_sec += time.perf_counter() - start
                s.materialize_sec += materialized - start
                s.bytes += info.nbytes
                s.parity_bytes += info.parity_bytes
                s.parity_missed += info.parity_error is not None
                self._job, self._next = self._next, None
                self._cond.notify_all()
