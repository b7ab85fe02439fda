"""How close the neighbour's gradient is to the exact one, per block, under each ablation switch.

Trains a config fault-free (the library's one training path), keeps its
parameters at a few steps, and on held-out rows (the first validation
batch's first shards: what a neighbour computes, its own shard and the
adopted one) compares, per block and parameter group (`grad_error.by_layer`:
relative error and cosine), the neighbour-mode gradient with the exact one
under each switch of `VARIANTS`:

  mecefo              the paper's rule: attention skipped in backward, low-rank FFN
                      kernel gradients;
  exact_ffn           attention skipped, FFN kernel gradients exact
                      (`mecefo.projection='exact'`): what the skip alone costs;
  attention_backward  attention computed exactly, FFN low-rank
                      (`mecefo.skip_attention=False`): what the projection alone costs;
  exact               both off: the exact gradient (a check: error 0).

The attention group of a skipping variant is 0 by construction (rel error
1, cosine 0): the combination rule averages it over the exact rows only.
"""
from __future__ import annotations

import time

import jax
import numpy as np

from mecefo_jax.config_resolve import updated
from mecefo_jax.neighbour import projections as proj_lib
from studies import grad_error
from studies.rank_fidelity_trained import ParamSnapshots, held_out

VARIANTS = {'mecefo': {}, 'exact_ffn': {'projection': 'exact'},
            'attention_backward': {'skip_attention': False},
            'exact': {'projection': 'exact', 'skip_attention': False}}


def measure(model, params, tokens, rank) -> dict:
    """{variant: grad_error.by_layer} of the neighbour's gradient on `tokens`."""
    projections = proj_lib.compute_projections(params, rank)
    weights = np.ones(len(tokens), np.float32)
    exact = jax.device_get(grad_error.token_grad_fn(model)(params, projections, tokens, weights,
                                                           neighbour=False))
    out = {}
    for name, changes in VARIANTS.items():
        grad_fn = grad_error.token_grad_fn(model.variant(**changes))
        approx = jax.device_get(grad_fn(params, projections, tokens, weights, neighbour=True))
        out[name] = grad_error.by_layer(approx, exact)
    return out


def run(cfg, workdir: str, *, snapshots: int = 4, shards: int = 2, log=print) -> dict:
    """Train `cfg` fault-free, measure at `snapshots` evenly spaced steps (the first at
    initialisation, the last after the final step)."""
    from mecefo_jax.run import run as train_run
    from mecefo_jax.training.run_setup import build_run
    cfg = updated(cfg, {'train.checkpoint_every': 0, 'fault.regime': '', 'fault.events': ''})
    steps = cfg.train.steps
    marks = sorted({round(steps * i / max(snapshots - 1, 1)) for i in range(max(snapshots, 1))})
    run_ = build_run(cfg, workdir)
    snaps = ParamSnapshots(s for s in marks if s < steps)
    start = time.perf_counter()
    outcome = train_run(cfg, workdir, run=run_, observers=[snaps])
    log(f'[fidelity] trained {steps} steps in {time.perf_counter() - start:.0f} s; '
        f'measuring steps {marks}')
    params = {**snaps.params, steps: jax.device_get(outcome['state'].params)}
    tokens = held_out(run_, shards)
    by_step = []
    for step in sorted(params):
        row = measure(run_.model, params[step], tokens, cfg.mecefo.rank)
        by_step.append({'step': step, 'variants': row})
        log(f'[fidelity] step {step}: ' + '; '.join(
            f"{name} FFN cosine by block {[round(b['ffn']['cosine'], 3) for b in v['layers']]}"
            for name, v in row.items()))
    return {'steps': by_step, 'rows': int(len(tokens)), 'rank': cfg.mecefo.rank,
            'num_layers': cfg.model.num_layers, 'final_val_ppl': outcome['final_val_ppl'],
            'variants': {k: v for k, v in VARIANTS.items()}}


def markdown(result: dict, title: str) -> str:
    """One table per measured step: per block, each variant's FFN and FFN-norm cosine."""
    lines = [f'# Neighbour gradient fidelity: {title}', '',
             f"{result['rows']} held-out rows, rank {result['rank']:g}; cosine (relative error) "
             'of the neighbour-mode gradient against the exact one.', '']
    for entry in result['steps']:
        variants = entry['variants']
        lines += [f"## after {entry['step']} steps", '',
                  '| group | ' + ' | '.join(variants) + ' |',
                  '|---|' + '---|' * len(variants)]

        def cell(f):
            return f"{f['cosine']:.3f} ({f['rel_error']:.3f})"
        for layer in range(result['num_layers']):
            for group in ('ffn', 'ffn_norm', 'attention'):
                lines.append(f'| block {layer} {group} | ' + ' | '.join(
                    cell(v['layers'][layer][group]) for v in variants.values()) + ' |')
        for group in ('embedding', 'top'):
            lines.append(f'| {group} | ' + ' | '.join(cell(v[group]) for v in variants.values())
                         + ' |')
        lines.append('')
    return '\n'.join(lines)
