"""Experiments: what measures, compares and projects the library. The library never imports it.

| module | measures |
|---|---|
| `step_cost` | one device's train-step cost per role: FLOPs, memory, time, gradient error |
| `step_modes` | the step cost's modes: which program one device runs in each role, and plain DP |
| `grad_error` | how far MeCeFO's gradient is from the exact one, per parameter group |
| `step_measure` | the step-cost modes compiled on one device (FLOPs, memory) and timed interleaved |
| `step_efficiency` | the fault-free step's overhead against plain DP, and its MFU |
| `step_cost_table` | the step cost's plain-text table |
| `compile_time` | a new failure topology's compile time against depth |
| `memory_plan` | per-device memory plans of the real step, compiled ahead of time |
| `role_timer` | each role program's wall time, for modelled step time |
| `probes` | a run's measuring observers: modelled time, program usage, coverage, gradient error |
| `compare` | every fault strategy side by side on one failure schedule |
| `compare_over_seeds` | the same over several failure seeds: mean, spread, a ranking |
| `quality` | validation perplexity under failures (the paper's Table 3 analogue) |
| `crash_drill`, `crash_drill_nodes` | real crashes, a lost node and a killed launcher, recovered from memory and disk |
| `crash_drill_jobs` | the drill's launcher jobs and what their records say about each recovery |
| `crash_drill_overhead` | the drill's snapshot overhead and restores, timed in one process |
| `crash_drill_report` | the drill's markdown report |
| `snapshot_bench` | the keepers' write, publish and restore paths, and a peer's read from another node |
| `sim_cluster` | several Ray nodes on one machine, one of which can be lost at once (tests and drills) |
| `gpu/` | every GPU figure in one command, each section in its own process (`scripts/gpu_report.py`) |
| `cluster/` | the strategies projected to 8 to 1,024 replicas (numpy Monte Carlo) |
| `report` | number formatting, spreads over seeds and plots shared by the reports |
"""
