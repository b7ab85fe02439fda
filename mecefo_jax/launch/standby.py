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

_ASK_SEC = 1.0  # a standby that cannot say it is warm within this is not


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
                _kill(held[1])
            opts = actors.options(node_id=node, gpus=gpus.get(w, 0), concurrency=4)
            self._ready[w] = (node, cls.options(**opts).remote(env))

    def take(self, worker: int, node: str):
        """The standby of `worker` if it waits warm on `node` (taken from the pool), else None.

        One still importing is killed instead: its warm-up thread runs at the
        lowest OS priority and, on a loaded machine, holds the GIL and the
        import lock for seconds while it waits for a CPU, so the worker would
        answer neither `run` nor the launcher's progress requests (a healthy
        worker taken for a silent one). A new actor imports at full priority.
        """
        import ray
        from ray.exceptions import GetTimeoutError, RayError
        held = self._ready.pop(worker, None)
        if held is None:
            return None
        if held[0] == node:
            try:
                if ray.get(held[1].is_warm.remote(), timeout=_ASK_SEC):
                    return held[1]
            except (RayError, GetTimeoutError):
                pass
        _kill(held[1])
        return None

    def close(self) -> None:
        for _, actor in self._ready.values():
            _kill(actor)
        self._ready.clear()


def _kill(actor) -> None:
    import ray
    try:
        ray.kill(actor)
    except Exception:  # noqa: BLE001 (its node is gone already)
        pass
