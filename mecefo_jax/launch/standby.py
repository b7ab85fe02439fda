"""Warm standby workers: a relaunch takes a process that is already up, with jax imported.

A relaunched worker would otherwise pay for a new process (Ray starts it
with the worker's environment) and for importing jax and the training stack
before it can even join the new `jax.distributed` job: seconds of every
recovery, on the memory and the disk path alike. Once a generation has
completed its first step the launcher starts one `Worker` actor per worker
slot on that slot's node, which imports everything and waits. The next
generation takes the standby of each worker whose node is unchanged, and
starts fresh only the others; its own standbys are made again after its
first step. Standbys are the launcher's actors: they end with it.
"""
from __future__ import annotations

from mecefo_jax.launch import actors
from mecefo_jax.launch.worker import Worker


class Standbys:
    """worker -> (node, actor) of a warm `Worker` waiting to be taken."""

    def __init__(self):
        self._ready: dict[int, tuple[str, object]] = {}

    def fill(self, nodes: dict, env: dict, gpus: dict) -> None:
        """A standby for every worker slot in `nodes` (worker -> node) that has none there."""
        import ray
        cls = ray.remote(Worker)
        for w, node in nodes.items():
            held = self._ready.get(w)
            if held is not None and held[0] == node:
                continue
            if held is not None:
                ray.kill(held[1])
            opts = actors.options(env=env, node_id=node, gpus=gpus.get(w, 0), concurrency=4)
            self._ready[w] = (node, cls.options(**opts).remote())

    def take(self, worker: int, node: str):
        """The standby of `worker` if it waits on `node` (and is taken from the pool), else None."""
        held = self._ready.get(worker)
        if held is None or held[0] != node:
            return None
        del self._ready[worker]
        return held[1]

    def close(self) -> None:
        import ray
        for _, actor in self._ready.values():
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 (its node is gone already)
                pass
        self._ready.clear()
