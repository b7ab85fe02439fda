"""Report section `attention`: cuDNN's fused attention against XLA's, forward and backward.

At the `step` section's shapes (batch, sequence, heads, head dim, bf16) it
times `jax.nn.dot_product_attention` (causal, the model's call) with
`implementation='cudnn'` and `'xla'`: the forward alone and forward +
backward (the gradient of a fixed random projection of the output with
respect to q, k and v), and their agreement: max |cudnn - xla| of the
output and of each gradient, beside the largest |xla| value for scale.
Without a GPU, cuDNN is unavailable: the XLA figures are kept and the
section is `skipped`.
"""
from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

from studies.gpu import configs
from studies.gpu.child import Skipped
from studies.gpu.step import SHAPES as STEP_SHAPES

REPEATS = {'full': 20, 'smoke': 3}


def attention_fns(impl: str, scale: float):
    def forward(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                            implementation=impl)

    def loss(q, k, v, probe):
        return jnp.sum(forward(q, k, v).astype(jnp.float32) * probe)
    return jax.jit(forward), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def median_ms(fn, args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - start) * 1e3)
    return float(statistics.median(times))


def inputs(cfg, batch: int):
    m = cfg.model
    head_dim = m.d_model // m.num_heads
    dtype = jnp.dtype(m.dtype)
    keys = jax.random.split(jax.random.key(0), 4)
    seq = cfg.data.seq_len
    q = jax.random.normal(keys[0], (batch, seq, m.num_heads, head_dim), dtype)
    k, v = (jax.random.normal(key, (batch, seq, m.num_kv_heads, head_dim), dtype)
            for key in keys[1:3])
    probe = jax.random.normal(keys[3], q.shape, jnp.float32)
    return (q, k, v, probe), head_dim ** -0.5


def measure(impl: str, args, scale: float, repeats: int) -> tuple[dict, tuple]:
    forward, grad = attention_fns(impl, scale)
    figures = {'forward_ms': median_ms(forward, args[:3], repeats),
               'forward_backward_ms': median_ms(grad, args, repeats)}
    return figures, (forward(*args[:3]), *grad(*args))


def max_abs(a, b) -> float:
    return float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))


def run(ctx) -> dict:
    kind = 'smoke' if ctx.smoke else 'full'
    shape = STEP_SHAPES['step'][kind]
    cfg = configs.load(shape['config'], shape['overrides'])
    args, scale = inputs(cfg, shape['batch'])
    q = args[0]
    out = {'shape_blhe': list(q.shape), 'kv_heads': args[1].shape[2], 'dtype': str(q.dtype),
           'causal': True, 'repeats': REPEATS[kind]}
    xla, xla_values = measure('xla', args, scale, REPEATS[kind])
    out['xla'] = xla
    ctx.log(f'xla: forward {xla["forward_ms"]:.3f} ms, fwd+bwd {xla["forward_backward_ms"]:.3f} ms')
    ctx.partial(out)
    backend = jax.default_backend()
    if backend != 'gpu':
        raise Skipped(f'cuDNN attention needs a GPU (this backend is {backend})', out)
    cudnn, cudnn_values = measure('cudnn', args, scale, REPEATS[kind])
    out['cudnn'] = cudnn
    names = ('output', 'grad_q', 'grad_k', 'grad_v')
    out['max_abs_diff'] = {n: max_abs(a, b) for n, a, b in zip(names, cudnn_values, xla_values)}
    out['max_abs_xla'] = {n: float(jnp.max(jnp.abs(b.astype(jnp.float32))))
                          for n, b in zip(names, xla_values)}
    out['speedup'] = {k: xla[k] / cudnn[k] for k in xla}
    ctx.log(f'cudnn: forward {cudnn["forward_ms"]:.3f} ms, '
            f'fwd+bwd {cudnn["forward_backward_ms"]:.3f} ms; max |diff| {out["max_abs_diff"]}')
    return out
