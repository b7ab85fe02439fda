"""Holding a test until processes have ended: Ray's kills return before the processes do."""
import time

from mecefo_jax.snapshot import shm


def wait_gone(pids, what: str, limit: float = 30.0, poll: float = 0.05) -> None:
    """Hold until none of `pids` runs on this machine; fail with `what` after `limit` seconds."""
    deadline = time.monotonic() + limit
    while [p for p in pids if shm.alive(p)]:
        assert time.monotonic() < deadline, what
        time.sleep(poll)
