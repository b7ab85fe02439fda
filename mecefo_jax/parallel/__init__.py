"""The data-parallel step over a `("data", "model")` mesh, and what it is compiled for.

| module | what it owns |
|---|---|
| `sharding` | the mesh, and the one table from logical axis names to mesh axes |
| `state` | the train state pytree, created sharded |
| `step` | the jitted train and eval steps; each replica's role under `shard_map` |
| `refresh` | the jitted projection refresh, split over the mesh where kernels are large |
| `topology` | one mesh and everything compiled for it, cached so no topology compiles twice |
| `transfer` | moving the train state onto another mesh |
| `aot` | abstract step inputs, so a program compiles without data |
| `program_cache` | the persistent cache of compiled programs every process shares |
"""
