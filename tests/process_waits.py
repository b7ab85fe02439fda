"""Holding a test until processes have ended: Ray's kills return before the processes do."""
import time

from mecefo_jax.host import processes


def _running_pids(pids) -> list:
    return [p for p in pids if processes.alive(p)]


def wait_gone(pids, what: str, limit: float = 30.0, poll: float = 0.05, running=_running_pids) -> None:
    """Hold until none of `pids` runs on this machine (`running(pids)` is empty); fail with
    `what` after `limit` seconds."""
    deadline = time.monotonic() + limit
    while running(pids):
        assert time.monotonic() < deadline, what
        time.sleep(poll)
