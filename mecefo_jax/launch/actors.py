"""How the launcher starts its actors: their environment and where they run.

Workers and compile-ahead members are Ray actors in processes of their own,
started with the same environment (their XLA flags and device count enter
the program cache's keys, so a program compiled ahead is the one a relaunch
asks for). The actor applies it in its own process (`enter`), before JAX
starts a backend, rather than through a Ray `runtime_env`: Ray starts an
actor with a `runtime_env` through a set-up process that imports Ray once
more before the worker's own (twice the start-up CPU of a plain actor,
about 1.1 against 0.55 CPU-s on a 2-core machine). Each worker is its own
host: `launch.local_devices` fake CPU devices on a CPU node, or that many
GPUs where the node has them.
OpenBLAS runs single-threaded unless the user says otherwise: XLA already
runs one LAPACK call per device at once, and OpenBLAS's own threads on top
spun against them (a 4-layer projection refresh took 1.4 to 5 s on 6 CPU
devices of one process, 0.02 s with OPENBLAS_NUM_THREADS=1; 16 s in a
relaunched survivor).
"""
from __future__ import annotations

import os
import sys


def actor_env(local_devices: int, *, gpus: bool = False) -> dict:
    """The environment variables of a worker or compile-ahead actor."""
    flags = [f for f in os.environ.get('XLA_FLAGS', '').split()
             if 'xla_force_host_platform_device_count' not in f]
    if not gpus:
        flags.append(f'--xla_force_host_platform_device_count={local_devices}')
    return {'XLA_FLAGS': ' '.join(flags),
            'OPENBLAS_NUM_THREADS': os.environ.get('OPENBLAS_NUM_THREADS', '1')}


def enter(env: dict) -> None:
    """Apply `actor_env`'s variables in this actor's process, before JAX starts a backend.

    XLA reads its flags when JAX first starts a backend, and the OpenBLAS that
    JAX's LAPACK calls use (SciPy's) its thread count when the first such call
    loads it, so they apply as long as this runs first: in the actor's
    `__init__`. (NumPy's own OpenBLAS, loaded with the actor's module, keeps
    the node's setting; a worker does no NumPy linear algebra.) A process
    whose backend has already started under other flags (one Ray reused after
    it ran JAX) would train on them: refused.
    """
    current = os.environ.get('XLA_FLAGS', '')
    if 'jax' in sys.modules and env.get('XLA_FLAGS', current) != current:
        from jax._src import xla_bridge
        if xla_bridge.backends_are_initialized():
            raise RuntimeError(
                f'this Ray worker process (pid {os.getpid()}) already started JAX with XLA_FLAGS='
                f"{current!r}, not the actor's {env['XLA_FLAGS']!r}: an actor needs a process of its own")
    os.environ.update(env)


def node_has_gpus(node_id: str) -> bool:
    import ray
    return any(n['NodeID'] == node_id and n.get('Resources', {}).get('GPU', 0) > 0
               for n in ray.nodes())


def options(*, node_id: str | None = None, gpus: int = 0, concurrency: int = 1) -> dict:
    """`.options(...)` of a worker or compile-ahead actor: on `node_id` if given, never restarted
    by Ray (the launcher decides what comes back), no CPU reserved (the node's devices are
    what it uses). Its environment is `actor_env`'s, passed to its constructor (`enter`)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    out = {'num_cpus': 0, 'num_gpus': gpus, 'max_restarts': 0, 'max_concurrency': concurrency}
    if node_id is not None:
        out['scheduling_strategy'] = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return out
