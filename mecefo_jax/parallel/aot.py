"""Compile without data: the abstract inputs of a step.

Ahead-of-time compilation (`jit(...).lower(abstract).compile()`) gives a
program for a topology before any array exists: the fault controller
precompiles a new topology's step this way. (What XLA says a compiled
program costs is read by the studies alone: `studies/xla_costs.py`.)
"""
import jax
import jax.numpy as jnp

from mecefo_jax.parallel import sharding


def abstract(tree, shardings):
    """ShapeDtypeStructs carrying `shardings`: compile without materialising."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        tree, shardings)


def abstract_batch(mesh, rows: int, seq: int, num_replicas: int = 1):
    """The step's batch dict as ShapeDtypeStructs ([R*rows, seq] tokens, ...)."""
    sh = sharding.batch_shardings(mesh)
    n = num_replicas * rows
    return {'tokens': jax.ShapeDtypeStruct((n, seq), jnp.int32, sharding=sh['tokens']),
            'weights': jax.ShapeDtypeStruct((n,), jnp.float32, sharding=sh['weights']),
            'programs': jax.ShapeDtypeStruct((num_replicas,), jnp.int32,
                                             sharding=sh['programs']),
            'step': jax.ShapeDtypeStruct((), jnp.int32, sharding=sh['step'])}
