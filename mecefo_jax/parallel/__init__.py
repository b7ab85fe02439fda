"""The data-parallel step over a `("data", "model")` mesh, and what it is compiled for.

| module | what it owns |
|---|---|
| `sharding` | meshes from replica rows, the one table from logical axis names to mesh axes, abstract inputs |
| `state` | the train state pytree: its layout, its sharded creation, its move to another mesh |
| `step` | the jitted train, eval and projection-refresh steps; each replica's role under `shard_map` |
| `topology` | one mesh and everything compiled for it, cached so no topology is built twice |
| `program_cache` | the persistent cache of compiled programs every process shares |
"""
