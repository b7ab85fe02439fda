"""Surviving real crashes: a launcher that relaunches on the survivors and carries on under MeCeFO.

| module | owns |
|---|---|
| `__main__` | the command line: `python -m mecefo_jax.launch --nprocs N --config CFG --workdir DIR` |
| `supervisor` | generations of workers, failure detection and injection, teardown, recovery reports |
| `worker` | one training process: join, restore, train with absent replicas down, snapshot |
| `worker_state` | the worker's train state: snapshot after each step, restore from keepers (heal from peers) or disk |
| `compile_ahead` | the survivors' programs of every single-worker loss, compiled before any failure |
| `compile_ahead_job` | its processes' command line (the driver, or one member) |
| `placement` | which worker holds which data-parallel replica |
| `heartbeat` | UDP heartbeats: liveness and progress |

The keepers that hold the in-memory snapshots are `mecefo_jax.snapshot`.
"""
