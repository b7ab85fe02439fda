"""What every command line does first, before jax starts: the config, the logs, the devices.

`python -m mecefo_jax.main`, the launcher and every script in `scripts/`
start the same way: the config is resolved and checked once (a bad field
ends the process with its message last, before anything is touched),
absl's INFO logs (Orbax logs every save) are quieted, and XLA is asked for
fake CPU devices. Backends start lazily, so the device count still applies
when jax is already imported; it only affects the CPU platform, and GPUs
are used as they are.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mecefo_jax.config.schema import Config
from mecefo_jax.config_resolve import resolve_or_exit


def start(config: Any, *, cpu_devices: Callable[[Config], int] | None = None) -> Config:
    """The resolved config; fake CPU devices: `cpu_devices(cfg)`, else mesh.num_cpu_devices."""
    from absl import logging

    from mecefo_jax.parallel.sharding import simulate_cpu_devices
    cfg = resolve_or_exit(config)
    logging.set_verbosity(logging.WARNING)
    simulate_cpu_devices(cpu_devices(cfg) if cpu_devices else cfg.mesh.num_cpu_devices)
    return cfg
