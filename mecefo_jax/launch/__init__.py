"""Surviving real crashes: a launcher on Ray that relaunches on the survivors and carries on under `fault.strategy`.

Grouped by the process that runs the code:

| process | module | owns |
|---|---|---|
| the launcher | `__main__` | the command line: `python -m mecefo_jax.launch --nprocs N --config CFG --workdir DIR` |
| | `launcher` | the job's loop: generations, failures detected and judged, stops, the run's summary |
| | `recovery` | after a generation ends: the next one (members, nodes, keepers, tier and step); its row |
| | `generation` | one generation's worker actors: spawn, progress, how each ended, teardown |
| | `placement` | which worker holds which replica, on which node, with what environment |
| | `keepers` | the job's keeper actors, found again by name after a launcher's death |
| | `chaos` | injected failures (`launch.kill`); the one seam (`FaultPoints`) by which they reach a worker |
| | `compile_ahead` | the survivors' programs of every single-worker loss, compiled before any failure |
| | `cluster` | the Ray cluster the launcher joins, or the local one it starts; its token; `--cleanup` |
| the local cluster | `ray_host` | the one-node Ray cluster that outlives a killed launcher |
| a worker | `worker` | one training process (a Ray actor): its arguments, progress, records, `jax.distributed` |
| | `worker_state` | its train state between crashes: snapshots into its keeper, restores from memory or disk |

The keepers that hold the in-memory snapshots are `mecefo_jax.snapshot`.
"""
