"""Experiments: what measures, compares and projects the library. The library never imports it.

| module | measures |
|---|---|
| `step_cost` | one device's train-step cost per role: FLOPs, memory, time, gradient error |
| `step_modes` | the step cost's modes and plain DP, model FLOPs per token, one device's setup, interleaved timing |
| `fidelity`, `fidelity_runs` | how far the neighbour's gradient is from the exact one (group, rank, rule, block) |
| `compile_time` | a new failure topology's compile time against depth |
| `memory_plan` | per-device memory plans of the real step, compiled ahead of time |
| `probes` | a run's measuring observers: the neighbour's gradient error, the time-to-target watch |
| `time_to_target`, `time_to_target_report`, `time_to_target_settings` | who reaches the fault-free loss first |
| `runs`, `replay`, `replicas` | one run of a seed (strategy, regime, seeds); the runs derived from another's record |
| `goodput` | modelled cluster time of a run's record, and time to target |
| `verdict_points`, `verdict_report`, `verdict_model`, `verdict_breakeven` | the verdict's points, report and models |
| `verdict_clock`, `verdict_claims` | each cost column's all-reduce share and replays; the prose built from records |
| `intervals` | Student-t intervals on paired per-seed differences, and seeds needed to separate |
| `allreduce` | the exposed gradient all-reduce of a data-parallel step, and its dilution of a slower step |
| `compile_count` | compiled steps per run, one replica per device row against replicas as rows |
| `refresh_bench` | the projection refresh: exact SVD against subspace iteration, time and captured energy |
| `xla_costs` | XLA's FLOP and memory counts of a compiled step (scan bodies times their trip count) |
| `snapshot_bench` | the keepers' write, read and restore paths and the async writer, each against a plain copy |
| `gpu/` | every GPU figure in one command, each section in its own process (`scripts/gpu_report.py`) |
| `cluster/` | the strategies projected to 8 to 1,024 replicas (numpy Monte Carlo) |
| `fault_plan` | every strategy's layout and modelled step for a set of failed replicas |
| `bench_costs`, `refresh_costs` | step costs read from a benchmark; what one projection refresh costs a replica |
| `corpus_export` | the python_docs corpus frozen into files, so a CPU and a GPU train on the same text |
| `verdict_60m` | the verdict's `paper_like_60m` point: `paper_like` at the 60M shape, on a GPU |
| `report` | number formatting, the one markdown table helper, seed lists, JSON and plots |
"""
