"""Jitted train, eval and projection-refresh steps over a ("data", "model") mesh.

One step serves every layout. Inside `shard_map` over 'data' each device
scans its slots (layout.py), branching once on its role with `lax.cond` so it
runs only its own program: exact for normal devices, MeCeFO's neighbour mode
for a neighbour. Devices return gradient *sums* and token counts; both are
`psum`med and divided afterwards, so attention-branch parameters are averaged
over normal devices' tokens and everything else over all tokens (MeCeFO's
combination rule, docs/algorithm.md section 4). The 'model' axis stays automatic (GSPMD tensor
parallelism) inside the map.
"""
import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import PartitionSpec as P

from mecefo_jax import projections as proj_lib
from mecefo_jax import sharding
from mecefo_jax.layout import ROLE_NEIGHBOUR
from mecefo_jax.model import PROJECTIONS, Llama, is_attention_branch

DATA = sharding.DATA_AXIS


def token_loss_sum(model: Llama, params, projections, tokens_pt, weights_p, *,
                   neighbour: bool):
    """Sum of next-token cross-entropies over the weighted examples of a slot."""
    variables = {'params': params, PROJECTIONS: projections}
    logits_plv = model.apply(variables, tokens_pt[:, :-1], neighbour=neighbour)
    ce_pl = optax.softmax_cross_entropy_with_integer_labels(logits_plv, tokens_pt[:, 1:])
    return jnp.sum(ce_pl * weights_p[:, None])


def _device_grads(model: Llama, params, projections, tokens_spt, weights_sp, role_1):
    """One device's gradient sum over its slots, in its own role only."""
    # Mark the replicated state as varying over 'data' first: otherwise the
    # transpose of the implicit broadcast psums the parameter gradients
    # inside each cond branch, mixing devices that took different branches.
    params, projections = lax.pcast((params, projections), DATA, to='varying')
    zeros = jax.tree.map(jnp.zeros_like, params)

    def accumulate(neighbour: bool):
        grad_fn = jax.value_and_grad(
            lambda p, tok, w: token_loss_sum(model, p, projections, tok, w,
                                             neighbour=neighbour))

        def over_slot(carry, slot):
            grads_acc, loss_acc = carry
            tokens_pt, weights_p = slot
            loss, grads = lax.cond(
                jnp.any(weights_p > 0),
                lambda: grad_fn(params, tokens_pt, weights_p),
                lambda: (jnp.sum(weights_p) * 0.0, zeros))  # padding slot
            return (jax.tree.map(jnp.add, grads_acc, grads), loss_acc + loss), None

        init = (zeros, jnp.sum(weights_sp) * 0.0)
        (grads, loss), _ = lax.scan(over_slot, init, (tokens_spt, weights_sp))
        return grads, loss

    is_neighbour = role_1[0] == ROLE_NEIGHBOUR
    grads, loss_sum = lax.cond(is_neighbour, lambda: accumulate(True),
                               lambda: accumulate(False))
    tokens = jnp.sum(weights_sp) * (tokens_spt.shape[-1] - 1)
    attn_tokens = jnp.where(is_neighbour, 0.0, tokens)
    return lax.psum((grads, loss_sum, tokens, attn_tokens), DATA)


def combine(grad_sums, tokens, attn_tokens):
    """Divide summed gradients by the tokens of the devices that produced them."""
    def average(path, g):
        count = attn_tokens if is_attention_branch(path) else tokens
        # With no normal device left, attention gets no gradient this step.
        return jnp.where(count > 0, g / jnp.maximum(count, 1.0), 0.0).astype(g.dtype)
    return jax.tree_util.tree_map_with_path(average, grad_sums)


def make_grad_fn(model: Llama, mesh):
    """fn(params, projections, batch) -> (grads, stats); batch from layout.assemble."""
    device_grads = jax.shard_map(
        lambda p, v, tok, w, r: _device_grads(model, p, v, tok, w, r),
        mesh=mesh, in_specs=(P(), P(), P(DATA), P(DATA), P(DATA)),
        out_specs=P(), axis_names={DATA})

    def grad_fn(params, projections, batch):
        grad_sums, loss_sum, tokens, attn_tokens = device_grads(
            params, projections, batch['tokens'], batch['weights'], batch['roles'])
        grads = combine(grad_sums, tokens, attn_tokens)
        stats = {'loss': loss_sum / jnp.maximum(tokens, 1.0), 'tokens': tokens,
                 'attn_tokens': attn_tokens}
        return grads, stats

    return grad_fn


def batch_shardings(mesh):
    return {k: sharding.data_sharded(mesh) for k in ('tokens', 'weights', 'roles')}


def make_train_step(model: Llama, optimizer, mesh, state_shardings):
    """Pure `train_step(state, batch) -> (state, metrics)`, jitted and donating state."""
    grad_fn = make_grad_fn(model, mesh)

    def train_step(state, batch):
        grads, stats = grad_fn(state.params, state.projections, batch)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        grad_norm = optax.tree.norm(grads)
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
        # A non-finite loss or gradient leaves the state untouched, so the loop
        # can still checkpoint the last good state although it was donated.
        finite = jnp.isfinite(stats['loss']) & jnp.isfinite(grad_norm)
        new_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_state, state)
        return new_state, dict(stats, grad_norm=grad_norm, finite=finite)

    return jax.jit(train_step,
                   in_shardings=(state_shardings, batch_shardings(mesh)),
                   out_shardings=(state_shardings, sharding.replicated(mesh)),
                   donate_argnums=0)


def make_eval_step(model: Llama, mesh, param_shardings):
    """fn(params, tokens [N, T], weights [N]) -> (loss_sum, token_count), exact."""
    def eval_step(params, tokens_nt, weights_n):
        logits = model.apply({'params': params}, tokens_nt[:, :-1])
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens_nt[:, 1:])
        return jnp.sum(ce * weights_n[:, None]), jnp.sum(weights_n) * (tokens_nt.shape[-1] - 1)

    data = sharding.data_sharded(mesh)
    return jax.jit(eval_step, in_shardings=(param_shardings, data, data),
                   out_shardings=sharding.replicated(mesh))


def make_refresh_fn(rank, state_shardings):
    """Jitted state -> state with every FFN projection V recomputed by SVD."""
    def refresh(state):
        return state.replace(projections=proj_lib.compute_projections(state.params, rank))
    return jax.jit(refresh, in_shardings=(state_shardings,),
                   out_shardings=state_shardings, donate_argnums=0)
