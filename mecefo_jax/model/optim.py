"""AdamW with the paper's settings and its learning-rate schedule."""
import jax
import jax.numpy as jnp
import optax

from mecefo_jax.config.schema import TrainSection


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


def make_optimizer(train_cfg: TrainSection) -> optax.GradientTransformation:
    adamw = optax.adamw(
        learning_rate_schedule(train_cfg), b1=train_cfg.b1, b2=train_cfg.b2,
        eps=train_cfg.eps, weight_decay=train_cfg.weight_decay, mask=_decay_mask)
    clip = train_cfg.grad_clip
    return optax.chain(optax.clip_by_global_norm(clip), adamw) if clip > 0 else adamw


def hold_where(optimizer: optax.GradientTransformation, hold, mask, new, old):
    """(params, opt_state) with the leaves under `mask` kept at `old` when `hold`.

    A step that produced no gradient for some parameters (MeCeFO's attention
    branch when every live replica is a neighbour) must not move them: AdamW
    would otherwise still apply momentum and weight decay, and fold a zero
    gradient into its moments. `mask` is a params-shaped tree of Python bools;
    `new` and `old` are (params, opt_state) pairs; `hold` a traced bool.
    Shared scalars such as Adam's step count still advance.
    """
    new_params, new_opt = new
    old_params, old_opt = old
    opt_mask = optax.tree_map_params(optimizer, lambda _, m: m, new_opt, mask,
                                     transform_non_params=lambda _: False)

    def pick(m, n, o):
        return jnp.where(hold, o, n) if m else n
    return (jax.tree.map(pick, mask, new_params, old_params),
            jax.tree.map(pick, opt_mask, new_opt, old_opt))
