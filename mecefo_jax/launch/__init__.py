"""Surviving real crashes: a launcher on Ray that relaunches on the survivors and carries on under `fault.strategy`.

| module | owns |
|---|---|
| `__main__` | the command line: `python -m mecefo_jax.launch --nprocs N --config CFG --workdir DIR [--address A]` |
| `ray_cluster`, `ray_host` | the Ray cluster the launcher joins, or the local one it starts and that outlives it |
| `supervisor` | the launcher: generations, failure detection, stops, the run's summary |
| `job_state` | what the launcher and its recovery planner share: nodes, keepers, lost nodes (`JobState`) |
| `generation` | one generation's worker actors: spawn, progress, how each ended, teardown |
| `recovery_plan`, `recovery_report` | the next generation after a failure; each recovery's row |
| `outcome`, `exits`, `kills` | how a generation ended, by which rules; crash or program error; injected failures |
| `keepers` | the job's keeper actors, one per worker, found again by name after a launcher's death |
| `placement` | which worker holds which data-parallel replica, and which node each worker runs on |
| `actors` | the environment and placement options of the launcher's actors |
| `worker`, `progress` | one training process (a Ray actor); how far it got |
| `worker_args` | what the launcher hands one worker of one generation (`WorkerArgs`) |
| `worker_records` | the worker's start and end records, provenance per step |
| `worker_snapshots` | the worker's snapshot observer and restore callback, from its args and the config |
| `worker_state` | the worker's train state: snapshot after each step, restore from keepers (heal from peers) or disk |
| `compile_ahead` | the survivors' programs of every single-worker loss, compiled before any failure |
| `coordinator` | joining the generation's `jax.distributed` job, its coordinator bound to one address |

The keepers that hold the in-memory snapshots are `mecefo_jax.snapshot`.
"""
