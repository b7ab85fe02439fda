"""AdamW with the paper's settings and its learning-rate schedule."""
import jax
import optax


def learning_rate_schedule(train_cfg) -> optax.Schedule:
    """Linear warmup over `warmup_fraction` of the run, cosine to `final_lr_fraction`."""
    steps = int(train_cfg.steps)
    if steps < 1:
        raise ValueError(f'train.steps={steps} must be >= 1.')
    peak = float(train_cfg.learning_rate)
    warmup = max(1, int(round(float(train_cfg.warmup_fraction) * steps)))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=peak, warmup_steps=warmup,
        decay_steps=max(steps, warmup + 1),
        end_value=peak * float(train_cfg.final_lr_fraction))


def _decay_mask(params):
    # Norm scales (1-D) are not decayed, as is usual for LLaMA pretraining.
    return jax.tree.map(lambda p: p.ndim > 1, params)


def make_optimizer(train_cfg) -> optax.GradientTransformation:
    adamw = optax.adamw(
        learning_rate_schedule(train_cfg), b1=float(train_cfg.b1),
        b2=float(train_cfg.b2), eps=float(train_cfg.eps),
        weight_decay=float(train_cfg.weight_decay), mask=_decay_mask)
    clip = float(train_cfg.grad_clip)
    if clip < 0:
        raise ValueError(f'train.grad_clip={clip} must be >= 0 (0 disables clipping).')
    return optax.chain(optax.clip_by_global_norm(clip), adamw) if clip > 0 else adamw
