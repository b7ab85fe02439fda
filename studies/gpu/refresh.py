"""Report section `refresh`: the projection refresh at the 1B and 7B FFN shapes.

Each distinct FFN kernel shape of a config ([d, h] for w_gate and w_up,
[h, d] for w_down) goes through `studies/refresh_bench.py`'s `bench_shape`,
the one measurement of the refresh, on one device. The whole model's refresh
is extrapolated as (2 t[d,h] + t[h,d]) x layers, one matrix after another as
`compute_projections` does. `cheap_energy_ratio` is the cold-started
refresh's energy on random weights (`energy_ratio_cold`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from mecefo_jax.neighbour import projections
from studies import refresh_bench
from studies.gpu import configs

MODELS = {'full': ('llama_1b', 'llama_7b'), 'smoke': ('tiny',)}
REPEATS = {'full': 1, 'smoke': 2}  # full SVDs: a 7B-shaped one can take seconds on a GPU
CHEAP_REPEATS = 5


def one_model(name: str, repeats: int, ctx) -> dict:
    cfg = configs.load(name)
    d, h, layers = cfg.model.d_model, cfg.model.ffn_hidden, cfg.model.num_layers
    rows = {}
    for label, (n, m) in (('d_h', (d, h)), ('h_d', (h, d))):
        bench = refresh_bench.bench_shape(
            label, n, m, projections.resolve_rank(cfg.mecefo.rank, n, m),
            iterations=cfg.mecefo.refresh_iters, seed=0, full_repeats=repeats,
            cheap_repeats=CHEAP_REPEATS, drift_std=cfg.train.learning_rate * cfg.mecefo.tau ** 0.5,
            log=ctx.log)
        rows[label] = dict(bench, svd_sec=bench['full_sec'],
                           svd_compile_sec=bench['full_compile_sec'],
                           cheap_energy_ratio=bench['energy_ratio_cold'])
    per_layer = {key: 2 * rows['d_h'][f'{key}_sec'] + rows['h_d'][f'{key}_sec']
                 for key in ('svd', 'cheap')}
    return {'d_model': d, 'ffn_hidden': h, 'num_layers': layers, 'matrices': 3 * layers,
            'shapes': rows, 'svd_model_sec': per_layer['svd'] * layers,
            'cheap_model_sec': per_layer['cheap'] * layers}


def run(ctx) -> dict:
    kind = 'smoke' if ctx.smoke else 'full'
    out = {'device': str(jax.devices()[0].device_kind), 'dtype': 'float32',
           'cheap_refresh': 'projections.subspace_iteration, mecefo.refresh_iters iterations, '
                            'warm-started from the pre-drift V',
           'extrapolation': '(2 t[d,h] + t[h,d]) x num_layers, matrices one after another',
           'models': {}}
    # Untimed: the first SVD call of a process sets up the solver library.
    jax.block_until_ready(projections.top_singular_vectors(jnp.eye(64, dtype=jnp.float32), 8))
    for name in MODELS[kind]:
        out['models'][name] = one_model(name, REPEATS[kind], ctx)
        ctx.partial(out)
    return out
