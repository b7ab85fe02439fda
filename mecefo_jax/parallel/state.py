"""The train state pytree: its layout on a mesh, its sharded creation, its move to another mesh."""
import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mecefo_jax.model.llama import Llama, init_params
from mecefo_jax.neighbour import contract
from mecefo_jax.neighbour import projections as proj_lib
from mecefo_jax.parallel import program_cache, sharding


@flax.struct.dataclass
class TrainState:
    """Everything a step reads and writes, as one pytree.

    `projections` holds the bases V of every FFN kernel: state, not parameters, so the
    optimizer never sees them. Under `mecefo.projection='gradient'` nothing reads them, but
    they stay so the state, its shardings and its checkpoints have one form whatever the rule.
    """
    step: jax.Array
    params: Any
    opt_state: Any
    projections: Any


def _projection_specs(param_specs, abstract_projections):
    """V [..., n, r] is split like its kernel [..., n, m], the output axis replicated."""
    def for_path(path, v):
        kernel_spec = param_specs
        for key in path:
            kernel_spec = kernel_spec[key.key]
        spec = tuple(kernel_spec) + (None,) * (v.ndim - len(kernel_spec))
        return P(*spec[:-1], None)
    return jax.tree_util.tree_map_with_path(for_path, abstract_projections)


@dataclasses.dataclass(frozen=True)
class StateLayout:
    """The train state's shapes (restore targets) and each leaf's mesh axes, from one trace of
    its init; it pickles, so relaunched workers find it in the program cache (`layout`)."""
    abstract: TrainState  # ShapeDtypeStructs
    specs: TrainState  # PartitionSpecs, before fitting to a mesh

    def shardings(self, mesh) -> TrainState:
        """NamedShardings on `mesh`: a mesh axis that does not divide its dimension replicates."""
        def on_mesh(spec, leaf):
            fitted = tuple(sharding.fit_spec(spec, leaf.shape, mesh))
            return NamedSharding(mesh, P(*fitted[:len(tuple(spec))]))  # P() stays P()
        return jax.tree.map(on_mesh, self.specs, self.abstract, is_leaf=lambda x: isinstance(x, P))


def trace_layout(model: Llama, optimizer: optax.GradientTransformation, rank) -> StateLayout:
    """`StateLayout` traced: the params' logical names mapped to mesh axes, optax states
    mirroring the params (anything else, such as counts, replicated)."""
    boxed = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
    params = flax.linen.unbox(boxed)
    contract.check(params)  # the names the neighbour's rules read, before anything trains
    param_specs = jax.tree.map(lambda spec, p: P(*spec, *(None,) * (p.ndim - len(tuple(spec)))),
                               sharding.mesh_specs(boxed), params, is_leaf=lambda x: isinstance(x, P))
    opt_state = jax.eval_shape(optimizer.init, params)
    opt_specs = optax.tree_map_params(optimizer, lambda _, spec: spec, opt_state, param_specs,
                                      transform_non_params=lambda _: P(),
                                      is_leaf=lambda x: isinstance(x, P))
    projections = jax.eval_shape(lambda p: proj_lib.compute_projections(p, rank), params)
    abstract = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params,
                          opt_state=opt_state, projections=projections)
    specs = TrainState(step=P(), params=param_specs, opt_state=opt_specs,
                       projections=_projection_specs(param_specs, projections))
    return StateLayout(abstract=abstract, specs=specs)


def layout(model: Llama, optimizer: optax.GradientTransformation, rank) -> StateLayout:
    """`trace_layout`, through the program cache where it is on (a launcher's workers)."""
    return program_cache.load_or_compute('state_layout', f'rank={rank!r}',
                                         lambda: trace_layout(model, optimizer, rank))


def state_shardings(model: Llama, optimizer: optax.GradientTransformation, mesh, rank):
    """NamedShardings of the whole state on `mesh`, derived from the params' logical names."""
    return trace_layout(model, optimizer, rank).shardings(mesh)


def _fresh(params, optimizer, rank) -> TrainState:
    """Step 0 around `params`: a new optimizer state, the projections of these weights."""
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
                      projections=proj_lib.compute_projections(params, rank))


def _init_fn(model: Llama, optimizer, seed: int, rank):
    def init():
        # JAX's default threefry key: under nn.scan on several CPU devices an 'rbg' key's init
        # deadlocks at run time (jax 0.10.2), and scanning removed the compile cost it saved.
        key = jax.random.key(seed)
        return _fresh(flax.linen.unbox(init_params(model, key)), optimizer, rank)
    return init


def create_train_state(model: Llama, optimizer, mesh, *, seed: int, rank, shardings=None):
    """Parameters, optimizer state and projections, created sharded (`shardings`:
    `state_shardings` on `mesh`, where the caller has them) by an init program that goes
    through `program_cache`, so a fresh generation's workers skip tracing it."""
    shardings = state_shardings(model, optimizer, mesh, rank) if shardings is None else shardings
    init = jax.jit(_init_fn(model, optimizer, seed, rank), out_shardings=shardings)
    compiled = program_cache.load_or_compile(init, (), mesh.devices.flat, 'init',
                                             identity=f'seed={seed} rank={rank!r}')
    return compiled(), shardings


def train_state_from(params, optimizer, shardings, *, rank):
    """A fresh train state around given host parameters (`train.init_from`), placed by
    `shardings` (every process passes the same values; each places its own shards)."""
    if jax.tree.structure(params) != jax.tree.structure(shardings.params):
        raise ValueError("train.init_from: the imported parameters do not have this model's tree; "
                         'check model.scan_layers and the shape fields against its config.json.')
    placed = jax.tree.map(lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: x[i]),
                          params, shardings.params)
    return jax.jit(lambda p: _fresh(p, optimizer, rank), out_shardings=shardings)(placed)


def move_state(state, shardings):
    """Place `state` on new shardings, possibly another mesh. Multi-process, each process builds
    its new shards from its own old ones of the same index (replicas along 'data' are copies),
    so no process needs another's memory."""
    if jax.process_count() == 1:
        return jax.device_put(state, shardings)

    def move(x, new_sharding):
        local = {}
        for shard in x.addressable_shards:
            local.setdefault(_index_key(shard.index, x.shape), shard.data)

        def fetch(index):
            return np.asarray(local[_index_key(index, x.shape)])
        return jax.make_array_from_callback(x.shape, new_sharding, fetch)
    return jax.tree.map(move, state, shardings)


def _index_key(index, shape):
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))
