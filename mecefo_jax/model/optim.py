"""AdamW with the paper's settings and its learning-rate schedule."""
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from mecefo_jax.config.defaults import TrainSection


def schedule_steps(train_cfg: TrainSection) -> int:
    """The steps the schedule spans: `lr_schedule_steps`, or the run's `steps` when 0."""
    return train_cfg.lr_schedule_steps or train_cfg.steps


def learning_rate_schedule(train_cfg: TrainSection) -> optax.Schedule:
    """Linear warmup over `warmup_fraction` of the schedule's steps, cosine to
    `final_lr_fraction` at its last one, then held there (optax clips the cosine's
    count), so steps past it continue the same run at the final LR."""
    steps, peak = schedule_steps(train_cfg), train_cfg.learning_rate
    warmup = max(1, int(round(train_cfg.warmup_fraction * steps)))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=peak, warmup_steps=warmup,
        decay_steps=max(steps, warmup + 1),
        end_value=peak * train_cfg.final_lr_fraction)


def _decay_mask(params):
    # Norm scales are not decayed, as is usual for LLaMA pretraining. Decided
    # by name: scanned layers stack the 1-D scales into [layers, d].
    return jax.tree_util.tree_map_with_path(
        lambda path, _: getattr(path[-1], 'key', None) != 'scale', params)


class FlatMoments(NamedTuple):
    """The state of `flat(inner)`: `inner`'s, over one vector of every parameter."""
    inner: optax.OptState


def flat(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """`optax.flatten(inner)`, its state marked `FlatMoments`. `optax.tree_map_params` probes a
    state's form by calling `init` on placeholder params: they get the flat state's form, whose
    vectors read as non-params (replicated, and held by `hold_where` itself)."""
    flattened = optax.flatten(inner)

    def init(params):
        leaves = jax.tree.leaves(params)
        if not leaves or not all(hasattr(leaf, 'shape') for leaf in leaves):
            return FlatMoments(inner.init(jnp.zeros((0,), jnp.float32)))
        return FlatMoments(flattened.init(params))

    def update(updates, state, params=None):
        updates, inner_state = flattened.update(updates, state.inner, params)
        return updates, FlatMoments(inner_state)
    return optax.GradientTransformation(init, update)


def make_optimizer(train_cfg: TrainSection) -> optax.GradientTransformation:
    """AdamW (+ global-norm clipping), under the name scope 'optimizer' for profiles; with
    `train.flat_optimizer` `optax.adamw`'s own chain with `scale_by_adam` flattened (the same
    arithmetic per element, so the same updates)."""
    t = train_cfg
    if t.flat_optimizer:
        adamw = optax.chain(flat(optax.scale_by_adam(b1=t.b1, b2=t.b2, eps=t.eps)),
                            optax.add_decayed_weights(t.weight_decay, _decay_mask),
                            optax.scale_by_learning_rate(learning_rate_schedule(t)))
    else:
        adamw = optax.adamw(learning_rate_schedule(t), b1=t.b1, b2=t.b2, eps=t.eps,
                            weight_decay=t.weight_decay, mask=_decay_mask)
    optimizer = optax.chain(optax.clip_by_global_norm(t.grad_clip), adamw) if t.grad_clip > 0 else adamw

    def update(updates, state, params=None):
        with jax.named_scope('optimizer'):
            return optimizer.update(updates, state, params)
    return optax.GradientTransformation(optimizer.init, update)


def hold_where(optimizer: optax.GradientTransformation, hold, mask, new, old):
    """(params, opt_state) with the leaves under the params-shaped bool `mask` kept at `old` when
    the traced `hold`: parameters a step gave no gradient (attention, when every live replica is
    a neighbour) must not move, though AdamW would apply momentum and weight decay. Adam's step
    count still advances."""
    new_params, new_opt = new
    old_params, old_opt = old
    opt_mask = optax.tree_map_params(optimizer, lambda _, m: m, new_opt, mask,
                                     transform_non_params=lambda _: False)

    def pick(m, n, o):
        return jnp.where(hold, o, n) if m else n
    opt_state = jax.tree.map(pick, opt_mask, new_opt, old_opt)
    return (jax.tree.map(pick, mask, new_params, old_params),
            _hold_flat(hold, mask, new_params, opt_state, old_opt))


def _hold_flat(hold, mask, params, new_opt, old_opt):
    """`new_opt` with every `FlatMoments` vector kept at `old_opt` where `mask` is True."""
    sizes = [int(np.prod(p.shape)) for p in jax.tree.leaves(params)]
    ends = np.cumsum(sizes)
    stretches = []  # (start, stop) of runs of masked leaves, in optax.flatten's order
    for masked, end, size in zip(jax.tree.leaves(mask), ends, sizes):
        if masked and stretches and stretches[-1][1] == end - size:
            stretches[-1] = (stretches[-1][0], int(end))
        elif masked:
            stretches.append((int(end - size), int(end)))

    def hold_vector(n, o):
        if n.ndim != 1 or n.shape[0] != (ends[-1] if sizes else 0):
            return n  # Adam's count
        for start, stop in stretches:
            n = lax.dynamic_update_slice(n, jnp.where(hold, o[start:stop], n[start:stop]), (start,))
        return n

    def visit(n, o):
        return (FlatMoments(jax.tree.map(hold_vector, n.inner, o.inner))
                if isinstance(n, FlatMoments) else n)
    return jax.tree.map(visit, new_opt, old_opt, is_leaf=lambda x: isinstance(x, FlatMoments))
