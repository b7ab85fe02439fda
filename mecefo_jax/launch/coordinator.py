"""Joining a launcher's `jax.distributed` job.

JAX's coordinator service (on process 0) binds every interface by default
(`[::]:port`), so on a shared host any process could reach it. A launcher
chooses the coordinator's address (process 0's node); the service binds
only that address.

The other processes connect once the service listens. A client that tries
before gRPC's first reconnect backoff (about a second) waits it out in full:
a relaunch's `jax.distributed` start took 0.01 s or 1.2 s depending on
which process got there first.

A process that exits while still in the job (its run failed because a peer
died, or Ray tears its actor down) skips JAX's shutdown: the client's
shutdown barrier waits for peers that may be dead, until the coordination
service's heartbeat timeout aborts the process (SIGABRT, 100 s later by
default). A worker left behind that long outlives the launcher's teardown.
"""
from __future__ import annotations

import atexit
import os
import socket
import sys
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
    atexit.register(_exit_without_barrier)


def leave(tag: str) -> None:
    """Leave the job with every peer: wait until all reach `tag`, then JAX's shutdown.

    A process that shuts down while a peer still talks to the coordination
    service can make that peer abort (SIGABRT) at a planned stop.
    """
    import jax
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(tag)
    jax.distributed.shutdown()
    atexit.unregister(_exit_without_barrier)


def _exit_without_barrier() -> None:
    """At exit, still in the job: end the process here, before JAX's client is torn down."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
