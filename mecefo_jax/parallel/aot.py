"""Compile without data: abstract step inputs and XLA's cost and memory readers.

Ahead-of-time compilation (`jit(...).lower(abstract).compile()`) gives a
program for a topology before any array exists: the fault controller
precompiles a new topology's step this way, and the benchmarks read XLA's
FLOP count and memory plan of the compiled program.
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


def flops_of(compiled) -> float:
    """FLOPs from `cost_analysis()`, which is a dict, a list of dicts or None."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else None
    if not analysis:
        return float('nan')
    return float(analysis.get('flops', float('nan')))


MEMORY_FIELDS = ('temp_size_in_bytes', 'argument_size_in_bytes', 'output_size_in_bytes',
                 'alias_size_in_bytes', 'generated_code_size_in_bytes', 'peak_memory_in_bytes')


def memory_of(compiled) -> dict[str, int]:
    """`memory_analysis()` byte counts plus `peak_bytes` (args + out + temp - alias)."""
    stats = compiled.memory_analysis()
    if stats is None:
        return {**{f: -1 for f in MEMORY_FIELDS}, 'peak_bytes': -1}
    mem = {f: int(getattr(stats, f, -1)) for f in MEMORY_FIELDS}
    mem['peak_bytes'] = (mem['argument_size_in_bytes'] + mem['output_size_in_bytes']
                         + mem['temp_size_in_bytes'] - mem['alias_size_in_bytes'])
    return mem


def count_while_loops(compiled) -> int:
    """While loops in the compiled HLO (XLA's cost analysis counts a loop body once)."""
    return (compiled.as_text() or '').count(' while(')
