"""How many data-parallel replicas a config's mesh has on this process's devices.

The time-to-target and verdict studies size their failure traces and layouts
by it before any run is built (`run_setup.build_run` knows it only after).
"""


def num_replicas(cfg) -> int:
    """Data-parallel replicas of the full mesh this config builds."""
    import jax

    from mecefo_jax.parallel.sharding import mesh_shape
    return cfg.mesh.replicas or mesh_shape(cfg.mesh, len(jax.devices()))[0]  # or rows' replicas
