"""The train state pytree and its sharded creation on a mesh."""
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mecefo_jax.model.llama import Llama, init_params
from mecefo_jax.neighbour import projections as proj_lib
from mecefo_jax.parallel import program_cache, sharding


@flax.struct.dataclass
class TrainState:
    """Everything a step reads and writes, as one pytree.

    `projections` holds the SVD bases V of every FFN kernel: state, not
    parameters, so the optimizer never sees them. Under
    `mecefo.projection='gradient'` nothing reads them (the neighbour projects
    on its batch's own gradient) and nothing refreshes them; they stay in the
    state all the same, so that the state, its shardings and its checkpoints
    have one form whatever the rule.
    """
    step: jax.Array
    params: Any
    opt_state: Any
    projections: Any


def _projection_shardings(param_shardings, abstract_projections):
    """V [..., n, r] is split like its kernel [..., n, m], the output axis replicated."""
    def for_path(path, v):
        kernel_sharding = param_shardings
        for key in path:
            kernel_sharding = kernel_sharding[key.key]
        spec = tuple(kernel_sharding.spec) + (None,) * (v.ndim - len(kernel_sharding.spec))
        return NamedSharding(kernel_sharding.mesh, P(*spec[:-1], None))
    return jax.tree_util.tree_map_with_path(for_path, abstract_projections)


def state_shardings(model: Llama, optimizer: optax.GradientTransformation, mesh, rank):
    """NamedShardings of the whole state, derived from the params' logical names."""
    boxed = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
    param_sh = sharding.logical_shardings(boxed, mesh)
    params_abs = flax.linen.unbox(boxed)
    opt_abs = jax.eval_shape(optimizer.init, params_abs)
    # optax states mirror the params tree; anything else (counts) is replicated.
    opt_sh = optax.tree_map_params(optimizer, lambda _, s: s, opt_abs, param_sh,
                                   transform_non_params=lambda _: sharding.replicated(mesh))
    proj_abs = jax.eval_shape(lambda p: proj_lib.compute_projections(p, rank), params_abs)
    return TrainState(step=sharding.replicated(mesh), params=param_sh, opt_state=opt_sh,
                      projections=_projection_shardings(param_sh, proj_abs))


def _init_fn(model: Llama, optimizer, seed: int, rank):
    def init():
        # JAX's default threefry key. (The 'rbg' key once saved compile time
        # over unrolled layers; under nn.scan on several CPU devices its init
        # program deadlocks at run time on jax 0.10.2, and scanning removed
        # the per-layer compile cost it saved.)
        key = jax.random.key(seed)
        params = flax.linen.unbox(init_params(model, key))
        return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                          opt_state=optimizer.init(params),
                          projections=proj_lib.compute_projections(params, rank))
    return init


def abstract_train_state(model: Llama, optimizer, *, rank):
    """Shapes and dtypes of the state without materialising it (restore targets)."""
    return jax.eval_shape(_init_fn(model, optimizer, 0, rank))


def create_train_state(model: Llama, optimizer, mesh, *, seed: int, rank, shardings=None):
    """Initialise parameters, optimizer state and projections directly sharded.

    `shardings` are `state_shardings`' on `mesh` where the caller has them. The init
    program goes through `program_cache` (a plain compile while it is off); with it on
    (a launcher's workers) it is found before tracing, so a fresh generation's workers
    skip tracing and lowering it again.
    """
    shardings = state_shardings(model, optimizer, mesh, rank) if shardings is None else shardings
    init = jax.jit(_init_fn(model, optimizer, seed, rank), out_shardings=shardings)
    compiled = program_cache.load_or_compile(init, (), mesh.devices.flat, 'init',
                                             identity=f'seed={seed} rank={rank!r}')
    return compiled(), shardings
