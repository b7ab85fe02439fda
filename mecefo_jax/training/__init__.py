"""The training loop and what it drives or reports to.

| module | what it owns |
|---|---|
| `loop` | `train()`: data, step, metrics, exact evaluations, checkpoints, progress, profiles |
| `run_setup` | `Run` and `build_run`: the model, data, caches and sinks one run needs |
| `controller` | the controller-to-loop contract (`Plan`) and the fault-free `StaticController` |
| `resume` | where a run starts: restored from memory or disk, or fresh |
| `metrics` | `<workdir>/metrics.jsonl` |
| `summaries` | TensorBoard's scalars under `<workdir>/tensorboard`: the metrics rows and the fault story |
| `export` | a run's model out as a Hugging Face LLaMA, from its checkpoint or its keepers' snapshots |
| `observers` | what measures a run, kept apart from what trains it |
| `preemption` | SIGTERM ends the run after a saved step |
"""
