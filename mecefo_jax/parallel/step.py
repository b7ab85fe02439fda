"""Jitted train, eval and projection-refresh steps over a ("data", "model") mesh.

A layout with one normal program (fault-free, drop, elastic, checkpoint/restart,
ndb_naive) runs a plain GSPMD data-parallel step, so fault-free training costs what plain
data parallelism costs. Otherwise `shard_map` over 'data': each device picks its program
with `lax.switch` and runs ONE forward/backward over its joined rows (no gradient
accumulator), returning gradient *sums* and token counts, `psum`med and divided afterwards
(the combination rule, docs/algorithm.md section 4). 'model' stays automatic in both.
Every batch carries its step: a non-finite step leaves the state untouched, and so does
every later one, so a loop reading metrics every few steps still stops at the bad step.
"""
import functools
import math

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import PartitionSpec as P

from mecefo_jax.model import optim
from mecefo_jax.model.llama import Llama
from mecefo_jax.neighbour import projections as proj_lib
from mecefo_jax.neighbour.combination import combine, scale_cotangents, trust_tree
from mecefo_jax.neighbour.contract import PROJECTIONS, is_attention_branch
from mecefo_jax.neighbour.layout import ROLE_NORMAL
from mecefo_jax.parallel import sharding

DATA = sharding.DATA_AXIS


def token_loss_sum(model: Llama, params, projections, tokens_pt, weights_p, *,
                   neighbour: bool):
    """Sum of next-token cross-entropies over the weighted examples (chunked loss)."""
    variables = {'params': params, PROJECTIONS: projections}
    return model.apply(variables, tokens_pt[:, :-1], neighbour=neighbour,
                       targets_bl=tokens_pt[:, 1:], weights_b=weights_p)


def _token_count(tokens_pt, weights_p):
    return jnp.sum(weights_p) * (tokens_pt.shape[-1] - 1)


def _plain_grads(model: Llama, params, projections, batch):
    """Exact mean gradient over the whole batch; GSPMD partitions it over 'data'."""
    tokens_nt, weights_n = batch['tokens'], batch['weights']
    count = _token_count(tokens_nt, weights_n)

    def mean_loss(p):
        return token_loss_sum(model, p, projections, tokens_nt, weights_n,
                              neighbour=False) / jnp.maximum(count, 1.0)

    loss, grads = jax.value_and_grad(mean_loss)(params)
    return grads, {'loss': loss, 'tokens': count, 'attn_tokens': count}


def _program_grads(model: Llama, program, params, projections, tokens_ct, weights_c):
    """(gradient sum, loss sum, exact tokens, neighbour tokens) of one device program: its first
    `exact_rows` exactly, the rest in neighbour mode, weighted by their trust (combination.py)."""
    exact = program.exact_rows
    parts = [(start, stop, neighbour) for start, stop, neighbour in
             ((0, exact, False), (exact, program.rows, True)) if stop > start]
    trust = _trust(model, params)

    def loss_sum(p):
        return sum(token_loss_sum(model, scale_cotangents(p, trust) if neighbour else p,
                                  projections, tokens_ct[start:stop], weights_c[start:stop],
                                  neighbour=neighbour)
                   for start, stop, neighbour in parts)

    loss, grads = jax.value_and_grad(loss_sum)(params)
    return (grads, loss, _token_count(tokens_ct[:exact], weights_c[:exact]),
            _token_count(tokens_ct[exact:program.rows], weights_c[exact:program.rows]))


def _trust(model: Llama, params):
    return trust_tree(model.rules, model.cfg.num_layers, params)


def _combined(model: Llama, params, grad_sums, loss_sum, exact_tokens, neighbour_tokens):
    """(gradients, stats) from a step's sums; `attn_tokens`: rows that gave an attention gradient."""
    grads = combine(grad_sums, exact_tokens, neighbour_tokens, _trust(model, params),
                    model.rules.skip_attention)
    tokens = exact_tokens + neighbour_tokens
    skipped = model.rules.skip_attention and not model.rules.attention_top_blocks
    attn = exact_tokens if skipped else tokens
    return grads, {'loss': loss_sum / jnp.maximum(tokens, 1.0), 'tokens': tokens, 'attn_tokens': attn}


def _device_grads(model: Llama, programs, ordered_reduction: bool, params, projections, tokens_ct,
                  weights_c, program_1):
    """One device's gradient sum over its joined rows, in its own program only."""
    # Mark the replicated state as varying over 'data' first: otherwise the
    # transpose of the implicit broadcast psums the parameter gradients
    # inside each branch, mixing devices that took different branches.
    params, projections = lax.pcast((params, projections), DATA, to='varying')
    branches = [functools.partial(_program_grads, model, p, params, projections, tokens_ct,
                                  weights_c) for p in programs]
    # Rows past a program are padding (weight 0): they count nowhere.
    out = branches[0]() if len(branches) == 1 else lax.switch(program_1[0], branches)
    if ordered_reduction:
        # Every replica's sums gathered (data movement only), then added in replica order:
        # the same bits whatever the collective's own summation order.
        return jax.tree.map(lambda x: jnp.sum(lax.all_gather(x, DATA, to='invarying'), axis=0),
                            out)
    return lax.psum(out, DATA)


def attention_mask(params):
    """Params-shaped Python bools: True on the attention branch (MHA and its norm)."""
    return jax.tree_util.tree_map_with_path(lambda path, _: is_attention_branch(path), params)


def make_grad_fn(model: Llama, mesh, programs, *, ordered_reduction: bool):
    """fn(params, projections, batch) -> (grads, stats) for a layout's programs;
    `ordered_reduction` is train.ordered_reduction."""
    programs = tuple(programs)
    plain = len(programs) == 1 and programs[0].role == ROLE_NORMAL
    if plain and not (ordered_reduction and mesh.shape[DATA] > 1):
        return lambda params, projections, batch: _plain_grads(model, params, projections,
                                                               batch)
    if mesh.shape[DATA] == 1:
        # One replica, one program: no shard_map, since the psum would be the identity and XLA
        # rejects a psum over a one-device manual axis beside an automatic 'model' axis.
        (program,) = programs

        def single_replica_grad_fn(params, projections, batch):
            return _combined(model, params, *_program_grads(
                model, program, params, projections, batch['tokens'], batch['weights']))
        return single_replica_grad_fn
    device_grads = jax.shard_map(
        lambda p, v, tok, w, prog: _device_grads(model, programs, ordered_reduction, p, v, tok,
                                                 w, prog),
        mesh=mesh, in_specs=(P(), P(), P(DATA), P(DATA), P(DATA)),
        out_specs=P(), axis_names={DATA})

    def grad_fn(params, projections, batch):
        return _combined(model, params, *device_grads(
            params, projections, batch['tokens'], batch['weights'], batch['programs']))

    return grad_fn


def make_train_step(model: Llama, optimizer, mesh, state_shardings, programs, *,
                    ordered_reduction: bool):
    """Pure `train_step(state, batch) -> (state, metrics)`, jitted and donating state."""
    programs = tuple(programs)
    grad_fn = make_grad_fn(model, mesh, programs, ordered_reduction=ordered_reduction)
    has_neighbour = any(p.exact_rows < p.rows for p in programs)

    def train_step(state, batch):
        grads, stats = grad_fn(state.params, state.projections, batch)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if has_neighbour:
            params, opt_state = optim.hold_where(
                optimizer, stats['attn_tokens'] == 0, attention_mask(state.params),
                new=(params, opt_state), old=(state.params, state.opt_state))
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(stats['loss']) & jnp.isfinite(grad_norm)
        applied = finite & (state.step == batch['step'])
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
        # A cond, not a select per leaf: XLA would otherwise keep the old and
        # the new state side by side (measured: 461 MB more at 350M).
        new_state = lax.cond(applied, lambda: new_state, lambda: state)
        return new_state, dict(stats, grad_norm=grad_norm, finite=finite, applied=applied)

    return jax.jit(train_step,
                   in_shardings=(state_shardings, sharding.batch_shardings(mesh)),
                   out_shardings=(state_shardings, sharding.replicated(mesh)),
                   donate_argnums=0)


def make_eval_step(model: Llama, mesh, param_shardings):
    """fn(params, tokens [N, T], weights [N]) -> (loss_sum, token_count), exact."""
    def eval_step(params, tokens_nt, weights_n):
        loss_sum = model.apply({'params': params}, tokens_nt[:, :-1],
                               targets_bl=tokens_nt[:, 1:], weights_b=weights_n)
        return loss_sum, _token_count(tokens_nt, weights_n)

    data = sharding.data_sharded(mesh)
    return jax.jit(eval_step, in_shardings=(param_shardings, data, data),
                   out_shardings=sharding.replicated(mesh))


# ------------------------------------------------------------------ the projection refresh

def data_split_spec(spec: P, shape, mesh_shape) -> P:
    """`spec` with 'data' added on the kernel's long axis (the longer of the last two).

    The kernels are identical on every replica, so each computes 1/data of the refresh's
    products. 'data' goes minor to an axis already split on 'model', so the reshard is a
    local slice. An uneven long axis gives way to an even short one; if neither is even,
    GSPMD pads the long axis (still about 1/data per device).
    """
    axes = list(spec) + [None] * (len(shape) - len(spec))

    def parts(dim):
        current = axes[dim]
        named = () if current is None else (current if isinstance(current, tuple) else (current,))
        return named + (DATA,)

    def even(dim):
        return shape[dim] % math.prod(mesh_shape[a] for a in parts(dim)) == 0

    long_dim, short_dim = (-2, -1) if shape[-2] > shape[-1] else (-1, -2)
    dim = long_dim if even(long_dim) or not even(short_dim) else short_dim
    axes[dim] = parts(dim)
    return P(*axes)


def _refresh_split_for(state_shardings, min_elements: int):
    """path, kernel -> RefreshSplit: the kernel split over 'data' as well, blocks replicated;
    a kernel under `min_elements` per layer stays where the model puts it (no split)."""
    kernels = state_shardings.params
    mesh = getattr(jax.tree.leaves(kernels)[0], 'mesh', None)  # None: not a NamedSharding
    mesh_shape = dict(mesh.shape) if mesh is not None else {}

    def split_for(path, kernel_nm):
        sharding_ = kernels
        for key in path:
            sharding_ = sharding_[key]
        if mesh_shape.get(DATA, 1) == 1 or not isinstance(sharding_, jax.sharding.NamedSharding):
            return proj_lib.RefreshSplit()  # one replica: nothing to split
        if math.prod(kernel_nm.shape[-2:]) < min_elements:
            return proj_lib.RefreshSplit()  # cheaper whole than with two collectives
        spec = tuple(data_split_spec(sharding_.spec, kernel_nm.shape, mesh_shape))
        lead = spec[:-2]

        def place(*axes):
            named = jax.sharding.NamedSharding(mesh, P(*axes))
            return lambda x: lax.with_sharding_constraint(x, named)
        return proj_lib.RefreshSplit(
            kernel=place(*spec), product_m=place(*lead, spec[-1], None),
            product_n=place(*lead, spec[-2], None), block=place())
    return split_for


def make_refresh_fn(rank, state_shardings, *, method: str, iterations: int,
                    split_min_elements: int = 0):
    """Jitted state -> state with every FFN projection V recomputed (neighbour/projections.py):
    'svd' exactly, 'subspace' by `iterations` warm-started from the held V, its products
    split over 'data' (`data_split_spec`) for kernels of `split_min_elements` or more."""
    split_for = _refresh_split_for(state_shardings, split_min_elements)

    def refresh(state):
        return state.replace(projections=proj_lib.refresh_projections(
            state.params, state.projections, rank, method=method, iterations=iterations,
            split_for=split_for))
    return jax.jit(refresh, in_shardings=(state_shardings,),
                   out_shardings=state_shardings, donate_argnums=0)
