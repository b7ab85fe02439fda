"""Report section `refresh`: the projection refresh at the 1B and 7B FFN shapes.

For each distinct FFN kernel shape of a config ([d, h] for w_gate and w_up,
[h, d] for w_down) on one device, float32, random normal weights: the
seconds of `projections.top_singular_vectors` (the full SVD the refresh
runs per matrix) and, where the library has it, of the cheap refresh
`projections.subspace_iteration` with its own defaults, cold started. The
whole model's refresh is extrapolated as (2 t[d,h] + t[h,d]) x layers, one
matrix after another as `compute_projections` does. The cheap refresh's
captured energy ||W^T V||_F^2 is given relative to the exact top-r
subspace's.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from mecefo_jax.neighbour import projections
from studies.gpu import configs

MODELS = {'full': ('llama_1b', 'llama_7b'), 'smoke': ('tiny',)}
REPEATS = {'full': 1, 'smoke': 2}  # a 7B-shaped SVD can take many seconds on a GPU
CHEAP = 'subspace_iteration'


def timed(fn, kernel, repeats: int) -> tuple[float, float, object]:
    """(compile seconds, best of `repeats` run seconds, last output)."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(kernel).compile()
    compile_sec = time.perf_counter() - start
    best, out = float('inf'), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(kernel))
        best = min(best, time.perf_counter() - start)
    return compile_sec, best, out


def energy(kernel_nm, v_nr) -> float:
    return float(jnp.sum((kernel_nm.T @ v_nr) ** 2))


def one_shape(shape, rank: int, repeats: int, cheap) -> dict:
    kernel = jax.random.normal(jax.random.key(0), shape, jnp.float32) * shape[0] ** -0.5
    r = projections.resolve_rank(rank, *shape)
    compile_sec, sec, exact_v = timed(lambda k: projections.top_singular_vectors(k, r), kernel,
                                      repeats)
    row = {'shape': list(shape), 'rank': r, 'svd_sec': sec, 'svd_compile_sec': compile_sec}
    if cheap is not None:
        try:  # called as cheap(kernel, r): another signature is reported, the SVD kept
            compile_sec, sec, cheap_v = timed(lambda k: cheap(k, r), kernel, repeats)
        except Exception as error:  # noqa: BLE001
            row['cheap_error'] = f'{type(error).__name__}: {error}'
        else:
            row.update(cheap_sec=sec, cheap_compile_sec=compile_sec,
                       cheap_energy_ratio=energy(kernel, cheap_v) / energy(kernel, exact_v))
    return row


def one_model(name: str, repeats: int, cheap, ctx) -> dict:
    cfg = configs.load(name)
    d, h, layers = cfg.model.d_model, cfg.model.ffn_hidden, cfg.model.num_layers
    rows = {}
    for label, shape in (('d_h', (d, h)), ('h_d', (h, d))):
        rows[label] = one_shape(shape, cfg.mecefo.rank, repeats, cheap)
        ctx.log(f'{name} {shape}: svd {rows[label]["svd_sec"]:.3f} s'
                + (f', cheap {rows[label]["cheap_sec"]:.4f} s' if 'cheap_sec' in rows[label]
                   else ''))
    out = {'d_model': d, 'ffn_hidden': h, 'num_layers': layers, 'matrices': 3 * layers,
           'shapes': rows}
    for key in ('svd', 'cheap'):
        if f'{key}_sec' in rows['d_h']:
            per_layer = 2 * rows['d_h'][f'{key}_sec'] + rows['h_d'][f'{key}_sec']
            out[f'{key}_model_sec'] = per_layer * layers
    return out


def run(ctx) -> dict:
    kind = 'smoke' if ctx.smoke else 'full'
    cheap = getattr(projections, CHEAP, None)
    out = {'device': str(jax.devices()[0].device_kind), 'dtype': 'float32',
           'cheap_refresh': (f'projections.{CHEAP}' if cheap else
                             f'n/a: mecefo_jax.neighbour.projections has no {CHEAP}'),
           'extrapolation': '(2 t[d,h] + t[h,d]) x num_layers, matrices one after another',
           'models': {}}
    # Untimed: the first SVD call of a process sets up the solver library.
    jax.block_until_ready(projections.top_singular_vectors(jnp.eye(64, dtype=jnp.float32), 8))
    for name in MODELS[kind]:
        out['models'][name] = one_model(name, REPEATS[kind], cheap, ctx)
        ctx.partial(out)
    return out
