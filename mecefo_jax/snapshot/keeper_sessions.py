"""A keeper served to sessions: each session's pins, and replies instead of exceptions.

`Sessions` stands between a transport and the keeper's state: a session
(one `KeeperClient`) pins slots, its pins go when it closes or is ended,
and a refused or failed request becomes an error reply, never the
keeper's death. `LocalKeeper` serves one in this process; `keeper_actor`
serves one as a Ray actor.
"""
from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable

import numpy as np

from mecefo_jax.snapshot.keeper import Keeper
from mecefo_jax.snapshot.keeper_requests import MAX_PAYLOAD_BYTES, MAX_TEXT, RequestError

log = logging.getLogger('mecefo_jax.snapshot.keeper')


def copied(views: list) -> list[np.ndarray]:
    """Private copies of a reply's views: once its pin goes, the keeper may reuse their slot."""
    return [np.frombuffer(v, np.uint8).copy() for v in views]


class Sessions:
    """Pins per session: a session's pins are released when it closes or is ended.

    `pack(views)` turns a reply's views of shared memory into what the
    transport sends, while the slot is still pinned (`copied` in process;
    the actor puts them into Ray's object store).
    """

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
    """A keeper in this process: the protocol without a process boundary.

    For benchmarks of the write path and for tests of the protocol; a
    worker's snapshots must live in a keeper that outlives it (`start_keeper`).
    """

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
