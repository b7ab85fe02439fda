"""Meshes, the one table mapping logical axis names to mesh axes, and abstract step inputs.

Model code names parameter axes logically ('embed', 'mlp', ...); only this module knows
where they land on the ("data", "model") mesh.
"""
import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from mecefo_jax.config.defaults import MeshSection

DATA_AXIS = 'data'
MODEL_AXIS = 'model'

# Logical name -> mesh axis. 'model' is tensor parallelism; 'batch' is data.
LOGICAL_AXIS_RULES = (
    ('batch', DATA_AXIS),
    ('layers', None),  # the stacked-block axis of scanned layers
    ('vocab', MODEL_AXIS),
    ('embed', None),
    ('heads', MODEL_AXIS),
    ('kv_heads', MODEL_AXIS),
    ('head_dim', None),
    ('mlp', MODEL_AXIS),
    ('rank', None),
)


def mesh_shape(mesh_cfg: MeshSection, num_devices: int, *,
               allow_subset: bool = False) -> tuple[int, int]:
    """(data, model) from config; every device used (`mesh.data=3` on 8 devices would train on
    3 without a word), unless `allow_subset` (the step benchmark's 1x1 mesh)."""
    model = mesh_cfg.model
    if model < 1 or num_devices % model:
        raise ValueError(
            f'mesh.model={model} must be >= 1 and divide the {num_devices} '
            'available devices; set --config.mesh.model to a divisor.')
    data = num_devices // model if mesh_cfg.data == -1 else mesh_cfg.data
    if data < 1 or data * model > num_devices:
        raise ValueError(
            f'mesh.data={mesh_cfg.data} x mesh.model={model} needs more than the '
            f'{num_devices} available devices; lower --config.mesh.data or use -1.')
    if data * model < num_devices and not allow_subset:
        raise ValueError(
            f'mesh.data={mesh_cfg.data} x mesh.model={model} uses {data * model} of the '
            f'{num_devices} available devices; set --config.mesh.data=-1 (all of them) or '
            f'{num_devices // model}, or simulate fewer CPU devices with '
            f'--config.mesh.num_cpu_devices={data * model}.')
    return data, model


def device_rows(mesh_cfg: MeshSection, devices=None, *, allow_subset: bool = False) -> list[tuple]:
    """The config's replica rows of `devices` (default: all), in data-axis order: what every
    mesh of a run is built from (`mesh_from_rows`)."""
    devices = list(jax.devices() if devices is None else devices)
    data, model = mesh_shape(mesh_cfg, len(devices), allow_subset=allow_subset)
    return [tuple(devices[r * model:(r + 1) * model]) for r in range(data)]


def make_mesh(mesh_cfg: MeshSection, devices=None, *, allow_subset: bool = False) -> Mesh:
    """The ("data", "model") mesh from config, over `devices` (default: all)."""
    return mesh_from_rows(device_rows(mesh_cfg, devices, allow_subset=allow_subset))


def mesh_from_rows(rows) -> Mesh:
    """A mesh of replica rows, in order along 'data' (the fault controller's live rows)."""
    grid = np.array([list(row) for row in rows], dtype=object)
    return Mesh(grid, (DATA_AXIS, MODEL_AXIS),
                axis_types=(AxisType.Auto, AxisType.Auto))


def fit_spec(spec: P, shape, mesh: Mesh) -> P:
    """Drop mesh axes that do not divide their dimension (replicate instead)."""
    axes = []
    for dim, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        size = mesh.shape[axis] if axis is not None else 1
        axes.append(axis if axis is not None and dim % size == 0 else None)
    return P(*axes)


def mesh_specs(boxed_tree):
    """PartitionSpecs, before fitting to a mesh, for a tree of `nn.LogicallyPartitioned` boxes
    (or arrays); unboxed leaves, non-parameter state, are replicated."""
    return nn.logical_to_mesh(nn.get_partition_spec(boxed_tree), LOGICAL_AXIS_RULES)


def logical_shardings(boxed_tree, mesh: Mesh):
    """NamedShardings on `mesh` for a tree of `nn.LogicallyPartitioned` boxes (or arrays)."""
    shapes = jax.tree.map(lambda x: x.shape, nn.unbox(boxed_tree))
    return jax.tree.map(
        lambda spec, shape: NamedSharding(mesh, fit_spec(spec, shape, mesh)),
        mesh_specs(boxed_tree), shapes, is_leaf=lambda x: isinstance(x, P))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def data_sharded(mesh: Mesh) -> NamedSharding:
    """Leading dimension split over data-parallel replicas."""
    return NamedSharding(mesh, P(DATA_AXIS))


def batch_shardings(mesh: Mesh) -> dict[str, NamedSharding]:
    """Where a step's host batch goes: rows split over `data`, the step number everywhere."""
    data = data_sharded(mesh)
    return {'tokens': data, 'weights': data, 'programs': data, 'step': replicated(mesh)}


def abstract(tree, shardings):
    """ShapeDtypeStructs carrying `shardings`: compile without materialising."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        tree, shardings)


def abstract_batch(mesh, rows: int, seq: int, num_replicas: int = 1):
    """The step's batch dict as ShapeDtypeStructs ([R*rows, seq] tokens, ...)."""
    sh = batch_shardings(mesh)
    n = num_replicas * rows
    return {'tokens': jax.ShapeDtypeStruct((n, seq), jnp.int32, sharding=sh['tokens']),
            'weights': jax.ShapeDtypeStruct((n,), jnp.float32, sharding=sh['weights']),
            'programs': jax.ShapeDtypeStruct((num_replicas,), jnp.int32, sharding=sh['programs']),
            'step': jax.ShapeDtypeStruct((), jnp.int32, sharding=sh['step'])}
