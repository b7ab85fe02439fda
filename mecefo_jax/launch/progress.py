"""How far a worker has got: steps dispatched and completed, and where a drill holds it.

The launcher asks every worker actor for its report (`Worker.progress`) a
few times a second. The answer comes from a thread of the actor, so it keeps
coming while the training loop is blocked in a collective that a dead peer
will never finish; a stopped (`SIGSTOP`) or hung process stops answering,
and silence beyond `launch.heartbeat_timeout_sec` is a failure. Ray itself
reports a dead actor or node, but not a stopped one.

Completion is read without blocking from the step outputs the loop hands
over (`jax.Array.is_ready`; a failed step is not a completed one). Standard
library only.
"""
from __future__ import annotations

import collections
import threading

HOLD_KINDS = ('publish', 'snapshot')


class Progress:
    """The worker's side: steps dispatched, steps completed, and a drill's hold."""

    def __init__(self):
        self.dispatched = 0
        self.completed = 0
        self.held: dict | None = None  # {'kind': 'publish'|'snapshot', 'step': s} while held
        self._pending: collections.deque = collections.deque()  # (steps done, output array)
        self._lock = threading.Lock()

    def dispatched_step(self, steps_done: int, output) -> None:
        """The loop dispatched step `steps_done - 1`; `output` becomes ready when it ends."""
        with self._lock:
            self.dispatched = steps_done
            self._pending.append((steps_done, output))

    def hold(self, kind: str, step: int) -> None:
        """A drill holds the worker here (`launch.kill ...:publish|snapshot`) until its signal."""
        self.held = {'kind': kind, 'step': int(step)}

    def report(self) -> dict:
        with self._lock:
            try:
                while self._pending and self._pending[0][1].is_ready():
                    # Ready includes failed (a collective a dead peer broke): reading a
                    # ready output returns at once, or raises for a step that never completed.
                    self._pending[0][1].block_until_ready()
                    self.completed = self._pending.popleft()[0]
            except Exception:  # noqa: BLE001 (a failed step, or arrays a torn-down job deleted)
                pass
            return {'dispatched': self.dispatched, 'completed': self.completed, 'held': self.held}


def parse_report(value) -> dict | None:
    """The report, or None if it is not one (never trusted blindly, never fatal)."""
    if not isinstance(value, dict):
        return None
    for name in ('dispatched', 'completed'):
        if type(value.get(name)) is not int or value[name] < 0:  # bool is refused too
            return None
    held = value.get('held')
    if held is not None and not (isinstance(held, dict) and held.get('kind') in HOLD_KINDS
                                 and type(held.get('step')) is int):
        return None
    return {'dispatched': value['dispatched'], 'completed': value['completed'], 'held': held}
