"""Simulated failures inside one running job, and the strategies that answer them.

| module | what it owns |
|---|---|
| `schedule` | which replicas are down at which step: `fault.events`, regimes, the random process |
| `step_clock` | failures on the wall clock: each run meets the trace at its own step times |
| `strategies` | where a failed replica's rows go, per strategy (`REGISTRY`) |
| `planner` | `mecefo_planned`: failed shards split over helpers within one normal step |
| `costs` | what each role's program costs: the FLOP model the planner prices with |
| `controller` | the fault controller that moves training between meshes; checkpoint/restart |

Real failures are the launcher's (`mecefo_jax.launch`).
"""
