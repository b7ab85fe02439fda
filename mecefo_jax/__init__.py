"""mecefo_jax: fault-tolerant LLM pretraining in JAX (MeCeFO, with REFT's in-memory snapshots).

| package or module | what it owns |
|---|---|
| `main` | `python -m mecefo_jax.main`: the flags, then `run` |
| `run` | `run()`: the one way to train, fault-free or under failures |
| `failure_schedule` | which replicas are down at which step: `fault.events`, regimes, the random process |
| `config/` | every field declared once; a ConfigDict resolved into the checked `Config` |
| `host/` | what knows nothing of models: files, processes, the workdir lock, agreement |
| `data/` | documents, the tokenizer, the Grain pipeline of sharded batches |
| `model/` | the Flax LLaMA with its neighbour mode, the chunked loss, AdamW |
| `neighbour/` | MeCeFO's approximate backward, the layout of rows and roles, the combination |
| `parallel/` | meshes, the train state, the jitted steps, topologies, the program cache |
| `training/` | the loop, the controller contract, resuming, metrics, observers, preemption |
| `faults/` | simulated failures: strategies, the planner, the fault controllers |
| `checkpointing/` | Orbax checkpoints with the data position; damaged steps moved aside |
| `snapshot/` | in-memory snapshots in keeper processes (REFT): slots, parity, restore, cadence |
| `launch/` | the launcher on Ray that survives real crashes |
"""
