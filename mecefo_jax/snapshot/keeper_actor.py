"""The keeper as a Ray actor, and how workers and the launcher reach one.

The launcher starts each keeper as a detached, named Ray actor on its worker's node
(`start_keeper`), so it outlives the worker's crash and the launcher's own, which finds
it again by name (`find_keeper`). Requests are actor calls (Ray's token authentication
admits the caller; the keeper opens no listener). Its own worker maps the shared memory
directly; a peer on another node reads byte ranges through Ray. Pins belong to a
session; the launcher ends every session of a generation it tore down (`end_sessions`),
since a killed worker never closes its own.
"""
from __future__ import annotations

import dataclasses
import os
import uuid

import numpy as np

from mecefo_jax.snapshot import shm
from mecefo_jax.snapshot.keeper import Keeper
from mecefo_jax.snapshot.keeper_requests import MAX_PAYLOAD_BYTES
from mecefo_jax.snapshot.keeper_sessions import Sessions, copied

# Replies up to this size go back inline with the call; larger ones through the object store.
_INLINE_BYTES = 1 << 20


def _put(views: list):
    """A reply's views, copied once into Ray's object store while their slot is pinned.

    Returned as a reference, so the bytes cross to the caller's node as one
    object in Ray's own chunked transfer, not pickled into the reply; the
    caller gets them back as read-only arrays over its node's object store.
    """
    if sum(memoryview(v).nbytes for v in views) <= _INLINE_BYTES:
        return copied(views)
    import ray
    return ray.put([np.frombuffer(v, np.uint8) for v in views])


class KeeperActor:
    """The keeper as a Ray actor: `start_keeper` creates it (detached, named, on a node)."""

    def __init__(self, name: str, slots: int, pin_timeout: float, max_payload: int, job: str = ''):
        self.name = name
        self.keeper = Keeper(name, slots=slots, pin_timeout=pin_timeout, max_payload=max_payload,
                             job=job)
        self._sessions = Sessions(self.keeper, pack=_put)

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


class KeeperUnreachable(KeeperError):
    """The keeper could not be reached: it, or its node, is gone."""


class KeeperLost(RuntimeError):
    """A worker's keeper died under it: a crash of the memory tier, not of the program.

    The worker ends with it and the launcher treats it as lost, as it would a
    crashed worker: the job goes on from the peers' keepers, and a new keeper
    takes the slot when the worker comes back. (A program error, by contrast,
    would stop the job: the same code would fail again.)
    """


@dataclasses.dataclass(frozen=True)
class KeeperHandle:
    """A keeper actor, as workers and the launcher address it (picklable, sent to workers)."""
    actor: object  # ray.actor.ActorHandle
    name: str
    node_id: str
    pid: int

    def call(self, session: str, msg: dict, payload=None, timeout: float | None = None):
        import ray
        from ray.exceptions import GetTimeoutError, ObjectLostError, RayActorError
        try:
            reply, data = ray.get(self.actor.request.remote(session, msg, payload), timeout=timeout)
            if isinstance(data, ray.ObjectRef):  # a large reply (`_put`)
                data = ray.get(data, timeout=timeout)
            return reply, data
        except (RayActorError, GetTimeoutError, ObjectLostError) as e:
            raise KeeperUnreachable(f'Keeper {self.name} is unreachable ({type(e).__name__}); it or '
                                    'its node is gone. Fix: restore from another keeper or parity, '
                                    'or from the disk checkpoint.') from None

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
    actor = ray.remote(KeeperActor).options(**options).remote(name, slots, pin_timeout, max_payload,
                                                              namespace or '')
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
