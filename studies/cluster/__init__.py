"""Cluster-scale projection of the fault-tolerance strategies (pure numpy; docs/cluster.md).

| module | what it owns |
|---|---|
| `traces` | seeded failure traces, cut into intervals of constant live set with their loads |
| `sim` | each strategy's throughput under a trace: layouts, refreshes, recoveries |
| `recovery` | what one live-set change costs in no-progress seconds and redone steps |
| `report` | the projection's tables and plots |
"""
