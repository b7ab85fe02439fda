"""`state.StateLayout`: one trace of the init gives the state's shapes and its shardings on
every mesh, the same as deriving them on each mesh from the boxed params; a launcher's
relaunched process reads the layout from the program cache and traces nothing."""
import flax
import jax
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from configs import tiny
from mecefo_jax.config.resolve import resolve, updated
from mecefo_jax.model.llama import build_model, init_params
from mecefo_jax.model.optim import make_optimizer
from mecefo_jax.neighbour.projections import compute_projections
from mecefo_jax.parallel import program_cache, sharding, state


def _derived_on(model, optimizer, mesh, rank) -> state.TrainState:
    """The shardings derived on `mesh` itself: the params' from their logical names fitted to
    it, optax states mirroring them, each projection V [..., n, r] split like its kernel's
    input axis, the rest replicated."""
    boxed = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
    params_sh = sharding.logical_shardings(boxed, mesh)
    params = flax.linen.unbox(boxed)
    opt_sh = optax.tree_map_params(optimizer, lambda _, s: s, jax.eval_shape(optimizer.init, params),
                                   params_sh, transform_non_params=lambda _: sharding.replicated(mesh))

    def projection(path, v):
        kernel = params_sh
        for key in path:
            kernel = kernel[key.key]
        axes = tuple(kernel.spec) + (None,) * (v.ndim - len(kernel.spec))
        return NamedSharding(mesh, P(*axes[:-1], None))
    projections = jax.tree_util.tree_map_with_path(
        projection, jax.eval_shape(lambda p: compute_projections(p, rank), params))
    return state.TrainState(step=sharding.replicated(mesh), params=params_sh, opt_state=opt_sh,
                            projections=projections)


def _meshes():
    devices = np.asarray(jax.devices()[:8])
    return [Mesh(devices.reshape(8, 1), ('data', 'model')), Mesh(devices.reshape(2, 4), ('data', 'model')),
            Mesh(devices[:3].reshape(1, 3), ('data', 'model'))]  # 3 divides no dimension: replicated


@pytest.mark.parametrize('changes', [{}, {'train.flat_optimizer': True, 'train.grad_clip': 0.0},
                                     {'mecefo.rank': 0.5}])
def test_one_trace_gives_every_meshs_shardings_and_the_init_shapes(changes):
    cfg = updated(resolve(tiny.get_config()), changes)
    model, optimizer, rank = build_model(cfg), make_optimizer(cfg.train), cfg.mecefo.rank
    layout = state.trace_layout(model, optimizer, rank)
    for mesh in _meshes():
        got, want = layout.shardings(mesh), _derived_on(model, optimizer, mesh, rank)
        assert jax.tree.structure(got) == jax.tree.structure(want)
        assert jax.tree.leaves(got) == jax.tree.leaves(want), mesh.shape
    # The shapes are the init's: the state a seed creates has them leaf for leaf.
    mesh = _meshes()[1]
    created, _ = state.create_train_state(model, optimizer, mesh, seed=1, rank=rank)
    assert jax.tree.structure(created) == jax.tree.structure(layout.abstract)
    assert [(a.shape, a.dtype) for a in jax.tree.leaves(created)] == [
        (a.shape, a.dtype) for a in jax.tree.leaves(layout.abstract)]
    assert any(s.spec != P() for s in jax.tree.leaves(layout.shardings(mesh).params))  # split somewhere


def test_a_relaunched_process_reads_the_layout_instead_of_tracing(tmp_path, monkeypatch):
    cfg = resolve(tiny.get_config())
    model, optimizer = build_model(cfg), make_optimizer(cfg.train)
    traced, trace = [], state.trace_layout

    def counting(*args):
        traced.append(1)
        return trace(*args)
    monkeypatch.setattr(state, 'trace_layout', counting)
    program_cache.enable(str(tmp_path), program_cache.program_context(cfg))
    try:
        first = state.layout(model, optimizer, cfg.mecefo.rank)
        again = state.layout(model, optimizer, cfg.mecefo.rank)
        other_rank = state.layout(model, optimizer, 0.5)
    finally:
        program_cache.enable('')
    assert len(traced) == 2  # the first call and the other rank's, not the second
    mesh = _meshes()[1]
    assert jax.tree.leaves(again.shardings(mesh)) == jax.tree.leaves(first.shardings(mesh))
    assert jax.tree.leaves(again.abstract) == jax.tree.leaves(first.abstract)
    assert jax.tree.leaves(other_rank.abstract) != jax.tree.leaves(first.abstract)
    # With the cache off, every call traces.
    state.layout(model, optimizer, cfg.mecefo.rank)
    assert len(traced) == 3
