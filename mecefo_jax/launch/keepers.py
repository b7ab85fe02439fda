"""The keepers of one job: one detached, named Ray actor per worker slot, on that worker's node.

A keeper is `keeper<w>` in the job's namespace, so a rerun finds the live ones
(`find`); a lost one is replaced by an empty one on its worker's next node (`start`),
and that worker heals from its peers or from parity.
"""
from __future__ import annotations

import time

from mecefo_jax.snapshot import KeeperClient, KeeperError, KeeperHandle, shm
from mecefo_jax.snapshot.keeper_actor import find_keeper, start_keepers, stop_keeper

_TIMEOUT = 30.0  # a launcher request to a live keeper answers in milliseconds


class JobKeepers:
    """worker -> KeeperHandle for the keepers of one job; None-free for live ones."""

    def __init__(self, namespace: str, workers: int, *, slots: int):
        self.namespace, self.workers, self.slots = namespace, workers, slots
        self.handles: dict[int, KeeperHandle] = {}

    @staticmethod
    def name(worker: int) -> str:
        return f'keeper{worker}'

    def find(self) -> dict[int, KeeperHandle]:
        """The job's keepers still alive from an earlier launcher (adopted), by worker."""
        for w in range(self.workers):
            handle = find_keeper(self.name(w), self.namespace)
            if handle is not None:
                self.handles[w] = handle
        return dict(self.handles)

    def strays(self, beyond: int = 64) -> list[int]:
        """Workers >= `workers` that still have a keeper (an earlier run with more workers)."""
        return [w for w in range(self.workers, self.workers + beyond)
                if find_keeper(self.name(w), self.namespace, timeout=5.0) is not None]

    def start(self, nodes: dict[int, str]) -> None:
        """A keeper for each worker of `nodes` (worker -> node id), their start-ups overlapping."""
        if nodes:
            started = start_keepers({self.name(w): node for w, node in nodes.items()},
                                    namespace=self.namespace, slots=self.slots)
            self.handles.update({w: started[self.name(w)] for w in nodes})

    def alive(self, worker: int) -> bool:
        handle = self.handles.get(worker)
        if handle is None:
            return False
        try:
            with KeeperClient(handle, timeout=_TIMEOUT) as client:
                client.hello()
            return True
        except KeeperError:
            return False

    def as_list(self) -> list:
        """Each worker's keeper, None where it has none or it is gone (what workers are given)."""
        return [self.handles[w] if self.alive(w) else None for w in range(self.workers)]

    def node_of(self, worker: int) -> str | None:
        handle = self.handles.get(worker)
        return handle.node_id if handle is not None and self.alive(worker) else None

    def steps(self, worker: int) -> set:
        """The steps a worker's keeper has published (none if it is gone)."""
        if not self.alive(worker):
            return set()
        with KeeperClient(self.handles[worker], timeout=_TIMEOUT) as client:
            return {r.step for r in client.snapshots()}

    def newest(self, worker: int) -> int:
        """The newest step a worker's keeper has published (0: none, or no keeper)."""
        return max(self.steps(worker), default=0)

    def common_step(self, workers) -> int:
        """The newest step every one of `workers`' keepers holds (0 if none)."""
        steps = [self.steps(w) for w in workers]
        return max(set.intersection(*steps) if steps else set(), default=0)

    def held_bytes(self, worker: int) -> dict:
        """Every snapshot a keeper holds, as bytes: {step: raw}."""
        with KeeperClient(self.handles[worker], timeout=_TIMEOUT) as client:
            return {r.step: bytes(client.read(r.step, [(0, r.nbytes)]))
                    for r in client.snapshots()}

    def kill(self, worker: int) -> None:
        """Kill a keeper (its memory is lost), as a crash would, and free its segments here."""
        import ray
        handle = self.handles.get(worker)
        if handle is None:
            return
        ray.kill(handle.actor)
        deadline = time.monotonic() + _TIMEOUT
        while self.alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        shm.remove_stale(self.namespace)

    def end_sessions(self) -> None:
        """Release the pins of a torn-down generation's workers (a killed worker closes nothing)."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError
        live = [h for w, h in self.handles.items() if self.alive(w)]
        try:
            ray.get([h.actor.end_sessions.remote() for h in live], timeout=_TIMEOUT)
        except (RayActorError, GetTimeoutError):
            pass  # one died meanwhile: its pins died with it

    def rejected(self) -> int:
        """Requests the live keepers refused as malformed or oversized."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError
        total = 0
        for w, h in self.handles.items():
            if self.alive(w):
                try:
                    info = ray.get(h.actor.info.remote(), timeout=_TIMEOUT)
                    total += info['rejected'] + info['refused']
                except (RayActorError, GetTimeoutError):
                    pass
        return total

    def stop(self, workers) -> None:
        """End the keepers of `workers` (those this launcher started), unlinking their memory."""
        for worker in sorted(workers):
            handle = self.handles.pop(worker, None)
            if handle is not None:
                stop_keeper(handle)

    def stop_all(self) -> None:
        """End every keeper of the job, unlinking its shared memory; and any left by dead ones."""
        for handle in self.handles.values():
            stop_keeper(handle)
        self.handles.clear()
        shm.remove_stale(self.namespace)


def job_snapshots(workdir: str, address: str | None = None) -> list:
    """Every snapshot the live keepers of the job in `workdir` hold, read through Ray (the job's
    cluster at `address`, else its local one); [] where none is alive. The caller closes them."""
    from mecefo_jax.launch import cluster
    from mecefo_jax.snapshot import open_sources
    if cluster.join(address, workdir, start=False, log=lambda _: None) is None:
        return []
    return open_sources(None, cluster.live_keepers(cluster.namespace_of(workdir)))
