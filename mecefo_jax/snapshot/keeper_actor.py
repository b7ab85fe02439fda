"""The keeper as a process: its sessions, the Ray actor, and how workers and the launcher reach one.

A detached, named Ray actor on its worker's node (`start_keeper`) outlives the worker and
the launcher, which finds it again by name (`find_keeper`). Requests are actor calls that
Ray's token authentication admits: the keeper opens no listener. Pins belong to a session;
the launcher ends a torn-down generation's sessions (`end_sessions`), since a killed
worker never closes its own.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import uuid
from collections import Counter
from collections.abc import Callable

import numpy as np

from mecefo_jax.snapshot import shm
from mecefo_jax.snapshot.keeper import MAX_PAYLOAD_BYTES, MAX_TEXT, Keeper, RequestError

log = logging.getLogger('mecefo_jax.snapshot.keeper')


def copied(views: list) -> list[np.ndarray]:
    """Private copies of a reply's views: once its pin goes, the keeper may reuse their slot."""
    return [np.frombuffer(v, np.uint8).copy() for v in views]


class Sessions:
    """Pins per session, released when it closes or is ended. `pack` turns a reply's views of
    shared memory into what the transport sends while their slot is still pinned."""

    def __init__(self, keeper: Keeper, pack: Callable[[list], object] = copied):
        self.keeper = keeper
        self._pack = pack
        self._lock = threading.Lock()
        self._pins: dict[str, Counter] = {}

    def request(self, session, msg, payload) -> tuple[dict, object]:
        """The reply ({'ok': ...}) and its payload packed out of shared memory, if any."""
        if type(session) is not str or len(session) > MAX_TEXT:
            self.keeper.rejected += 1
            return {'ok': False, 'error': 'A keeper session id must be a short string.'}, None
        with self._lock:
            pins = self._pins.setdefault(session, Counter())
        try:
            reply, out, release = self.keeper.dispatch(msg, payload, pins)
        except RequestError as e:
            return {'ok': False, 'error': str(e)}, None
        except Exception as e:  # a bug here must not kill the keeper
            log.exception('Request %r failed', msg.get('op'))
            return {'ok': False, 'error': f'{type(e).__name__}: {e}'}, None
        try:
            data = self._pack(out) if out else None
        finally:
            if release is not None:
                release()
        return {'ok': True, **reply}, data

    def close(self, session: str) -> None:
        with self._lock:
            pins = self._pins.pop(session, None)
        if pins:
            self.keeper.release_pins(pins)

    def end_all(self) -> int:
        """Release every session's pins (their clients are gone); how many sessions held pins."""
        with self._lock:
            sessions, self._pins = self._pins, {}
        held = [p for p in sessions.values() if p]
        for pins in held:
            self.keeper.release_pins(pins)
        return len(held)


class LocalKeeper:
    """The keeper protocol in this process, for benchmarks and tests; a worker's snapshots must
    live in a keeper that outlives it (`start_keeper`)."""

    def __init__(self, name: str, *, slots: int = 2, pin_timeout: float = 60.0,
                 max_payload: int = MAX_PAYLOAD_BYTES):
        self.name = name
        self.keeper = Keeper(name, slots=slots, pin_timeout=pin_timeout, max_payload=max_payload)
        self._sessions = Sessions(self.keeper)

    def call(self, session: str, msg: dict, payload=None, timeout: float | None = None):
        return self._sessions.request(session, msg, payload)

    def close_session(self, session: str) -> None:
        self._sessions.close(session)

    def stop(self) -> None:
        self._sessions.end_all()
        self.keeper.cleanup()

    def __enter__(self) -> LocalKeeper:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# Replies up to this size go back inline with the call; larger ones through the object store.
_INLINE_BYTES = 1 << 20


def _put(views: list):
    """A reply's views, copied once into Ray's object store while their slot is pinned; as a
    reference, they cross nodes in Ray's chunked transfer, not pickled into the reply, and
    the caller reads them in place, read-only, in its node's object store."""
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
    """A worker's keeper died under it: a crash of the memory tier, not of the program, so the
    launcher treats the worker as lost and goes on from peers' keepers (a program error stops the job)."""


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
    """Start keeper actor `name` in `namespace` and wait for it; pinned to `node_id` where
    given, since its worker maps its shared memory."""
    return start_keepers({name: node_id}, namespace=namespace, slots=slots, pin_timeout=pin_timeout,
                         max_payload=max_payload, detached=detached, ready_timeout=ready_timeout)[name]


def start_keepers(nodes: dict[str, str | None], *, namespace: str | None = None, slots: int = 2,
                  pin_timeout: float = 60.0, max_payload: int = MAX_PAYLOAD_BYTES,
                  detached: bool = True, ready_timeout: float = 120.0) -> dict[str, KeeperHandle]:
    """`start_keeper` for each name of `nodes` (name -> node id or None), all started before
    any is waited for: each is a process of its own, and their start-ups overlap."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    actors = {}
    for name, node_id in nodes.items():
        options = {'name': name, 'num_cpus': 0, 'max_concurrency': 16, 'max_restarts': 0}
        if namespace is not None:
            options['namespace'] = namespace
        if detached:
            options['lifetime'] = 'detached'
        if node_id is not None:
            options['scheduling_strategy'] = NodeAffinitySchedulingStrategy(node_id, soft=False)
        actors[name] = ray.remote(KeeperActor).options(**options).remote(
            name, slots, pin_timeout, max_payload, namespace or '')
    infos = ray.get([actor.info.remote() for actor in actors.values()], timeout=ready_timeout)
    return {name: KeeperHandle(actor, name, info['node_id'], info['pid'])
            for (name, actor), info in zip(actors.items(), infos)}


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
