"""Joining a launcher's `jax.distributed` job.

JAX's coordinator service (on process 0) binds every interface by default
(`[::]:port`), so on a shared host any process could reach it. A launcher
chooses the coordinator's address (`127.0.0.1` on one machine); the service
binds only that address.
"""
from __future__ import annotations


def join(coordinator: str, num_processes: int, process_id: int) -> None:
    """`jax.distributed.initialize`, with the coordinator bound to `coordinator` only."""
    import jax
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id, coordinator_bind_address=coordinator)
