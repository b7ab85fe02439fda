"""Simulated failures inside one running job, and the strategies that answer them.

| module | what it owns |
|---|---|
| `step_clock` | failures on the wall clock: each run meets the trace at its own step times |
| `strategies` | where a failed replica's rows go, per strategy (`REGISTRY`) |
| `planner` | `mecefo_planned`: failed shards split over helpers within one normal step |
| `costs` | what each role's program costs: the FLOP model the planner prices with |
| `controller` | the fault controller that moves training between meshes; checkpoint/restart |

When replicas fail is `mecefo_jax.failure_schedule`'s; real failures are the launcher's
(`mecefo_jax.launch`).
"""
