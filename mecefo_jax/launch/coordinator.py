"""Joining a launcher's `jax.distributed` job.

JAX's coordinator service (on process 0) binds every interface by default
(`[::]:port`), so on a shared host any process could reach it. A launcher
chooses the coordinator's address (process 0's node); the service binds
only that address.

The other processes connect once the service listens. A client that tries
before gRPC's first reconnect backoff (about a second) waits it out in full:
a relaunch's `jax.distributed` start took 0.01 s or 1.2 s depending on
which process got there first.
"""
from __future__ import annotations

import socket
import time

_PROBE_SEC = 0.01


def wait_listening(address: str, timeout: float) -> bool:
    """Whether something accepts connections on host:port within `timeout` seconds."""
    host, port = address.rsplit(':', 1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(_PROBE_SEC)


def join(coordinator: str, num_processes: int, process_id: int, *, timeout: float = 300.0) -> None:
    """`jax.distributed.initialize`, with the coordinator bound to `coordinator` only.

    Processes other than 0 wait (at most `timeout`) for the service to listen;
    past that, `initialize` reports what is wrong.
    """
    import jax
    if process_id != 0:
        wait_listening(coordinator, timeout)
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id, coordinator_bind_address=coordinator)
