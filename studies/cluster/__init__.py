"""Cluster-scale projection of the fault-tolerance strategies (pure numpy, no jax).

| module | owns |
|---|---|
| `traces` | Monte Carlo failure traces and per-live-set loads |
| `recovery` | per-event recovery overheads (in-process, from memory, from disk) |
| `settings` | the strategies, the config, the cost tables (`faults/costs.py`, `faults/refresh_costs.py`) |
| `sim` | the synchronous-step throughput model and the Monte Carlo driver |
| `report` | the JSON, markdown tables and size plot; the figures behind the ordering against the paper |
"""
