"""Report section `attention`: cuDNN's fused attention against XLA's, at the step's shapes.

Forward and forward + backward (median ms), and how far cuDNN's output and
gradients are from XLA's; without a GPU only XLA's (`skipped`).
"""
import statistics
import timeit

import jax
import jax.numpy as jnp

from studies.gpu import configs
from studies.gpu.step import SHAPES

REPEATS = {'full': 20, 'smoke': 3}
NAMES = ('output', 'grad_q', 'grad_k', 'grad_v')


def median_ms(fn, args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # compile and warm up
    return 1e3 * statistics.median(timeit.repeat(lambda: jax.block_until_ready(fn(*args)),
                                                 number=1, repeat=repeats))


def measure(impl: str, args, scale: float, repeats: int) -> tuple[dict, tuple]:
    """Median ms of the forward and of forward + backward, and their values."""
    def forward(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                            implementation=impl)

    def loss(q, k, v, probe):
        return jnp.sum(forward(q, k, v).astype(jnp.float32) * probe)
    fwd, grad = jax.jit(forward), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    return ({'forward_ms': median_ms(fwd, args[:3], repeats),
             'forward_backward_ms': median_ms(grad, args, repeats)},
            tuple(x.astype(jnp.float32) for x in (fwd(*args[:3]), *grad(*args))))


def run(ctx) -> dict:
    kind = 'smoke' if ctx.smoke else 'full'
    cfg = configs.load(SHAPES['step'][kind]['config'], SHAPES['step'][kind]['overrides'])
    m, batch, seq = cfg.model, SHAPES['step'][kind]['batch'], cfg.data.seq_len
    head_dim, dtype = m.d_model // m.num_heads, jnp.dtype(m.dtype)
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (batch, seq, m.num_heads, head_dim), dtype)
    k, v = (jax.random.normal(key, (batch, seq, m.num_kv_heads, head_dim), dtype) for key in keys[1:3])
    args = (q, k, v, jax.random.normal(keys[3], q.shape, jnp.float32))
    out = {'shape_blhe': list(q.shape), 'kv_heads': m.num_kv_heads, 'dtype': str(dtype),
           'repeats': REPEATS[kind]}
    out['xla'], xla = measure('xla', args, head_dim ** -0.5, REPEATS[kind])
    ctx.log(f'xla: {out["xla"]}')
    ctx.partial(out)
    if jax.default_backend() != 'gpu':
        return dict(out, status='skipped', reason=f'cuDNN attention needs a GPU (this backend is '
                                                  f'{jax.default_backend()})')
    out['cudnn'], cudnn = measure('cudnn', args, head_dim ** -0.5, REPEATS[kind])
    out['max_abs_diff'] = {n: float(jnp.max(jnp.abs(a - b))) for n, a, b in zip(NAMES, cudnn, xla)}
    out['max_abs_xla'] = {n: float(jnp.max(jnp.abs(b))) for n, b in zip(NAMES, xla)}
    ctx.log(f'cudnn: {out["cudnn"]}; max |diff| {out["max_abs_diff"]}')
    return out
