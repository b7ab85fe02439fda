"""Stand-in (b) of the rank-fidelity report: trained weights and real activations at small scale.

Trains a config (at one or several widths, same recipe) through the
library's one training path (`run.run` on `train.build_run`), keeps the
parameters at a few steps, and on a held-out batch (the first validation
batch's first shards: the rows a MeCeFO neighbour computes, its own shard
and the adopted one) measures, per FFN kernel kind and layer, the captured
energy and the low-rank gradient's error at every rank
(`rank_fidelity_curves.kernel_curves` against the exact kernel gradient), at the
config's own rank and at each paper shape's ratio r / n_in, and fits the
power laws stand-in (c) carries to the paper's shapes. Beside the
projection's error alone it measures the neighbour's whole FFN gradient
error (`grad_error.grad_rel_error`: the low-rank projection plus the
attention cotangent a neighbour drops), the figure the quality runs report.
"""
from __future__ import annotations

import time

import jax
import numpy as np

from mecefo_jax.config_resolve import updated
from mecefo_jax.neighbour import projections as proj_lib
from mecefo_jax.training.observers import Observer
from studies import grad_error
from studies.rank_fidelity_curves import (
    FFN_KINDS,
    Curves,
    fit_curves,
    kernel_curves,
    summary,
)


class ParamSnapshots(Observer):
    """Host copies of the parameters entering chosen steps: the spectrum's trend over training."""

    def __init__(self, steps):
        self.steps, self.params = set(steps), {}

    def on_plan(self, planned) -> None:
        if planned.step in self.steps and planned.step not in self.params:
            self.params[planned.step] = jax.device_get(planned.state.params)


def width_config(cfg, width: int):
    """`cfg` at d_model = width with ffn_hidden and mecefo.rank scaled alike (the same h / d
    and r / d), and no checkpoints: only the parameters are read."""
    d, h = cfg.model.d_model, cfg.model.ffn_hidden
    rank = proj_lib.resolve_rank(cfg.mecefo.rank, d, h)
    return updated(cfg, {'model.d_model': width, 'model.ffn_hidden': round(h * width / d),
                         'mecefo.rank': float(max(1, round(rank * width / d))),
                         'train.checkpoint_every': 0})


def ffn_kernel_stacks(tree) -> dict[str, np.ndarray]:
    """{kind: [layers, n, m]} of a params-shaped tree (scanned or looped layers)."""
    found = {kind: [] for kind in FFN_KINDS}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        names = grad_error.path_names(path)
        if len(names) >= 2 and names[-1] == 'kernel' and names[-2] in found:
            leaf = np.asarray(leaf)
            found[names[-2]].extend(leaf if leaf.ndim == 3 else [leaf])
    return {kind: np.stack(layers) for kind, layers in found.items()}


def held_out(run, shards: int) -> np.ndarray:
    """[rows, seq + 1] tokens: the first `shards` shards of the first validation batch."""
    if run.val_start is not None:
        run.val_data.set_state(run.val_start)
    batch = np.asarray(next(run.val_data))
    return batch[:shards].reshape(-1, batch.shape[-1])


def _ranks(n: int, m: int, own: int, paper_n_in: dict, paper_rank: int, kind: str) -> dict:
    """The config's own rank and, per paper model, the rank at its ratio r / n_in for `kind`."""
    ranks = {'own': proj_lib.resolve_rank(own, n, m)}
    for name, n_in in paper_n_in.items():
        ranks[name] = max(1, round(paper_rank * n / n_in[kind]))
    return ranks


def measure(params, tokens, grad_fn, *, rank, paper_n_in: dict, paper_rank: int,
            curve: bool) -> dict:
    """Every FFN kernel's curves on one batch, pooled per kind and fitted, and the
    neighbour's whole gradient error at the config's rank."""
    projections = proj_lib.compute_projections(params, rank)
    weights = np.ones(len(tokens), np.float32)
    exact, approx = (jax.device_get(grad_fn(params, projections, tokens, weights, neighbour=mode))
                     for mode in (False, True))
    kernels, grads = ffn_kernel_stacks(params), ffn_kernel_stacks(exact)
    kinds, residual, total = {}, 0.0, 0.0
    for kind in FFN_KINDS:
        layers = [kernel_curves(k, g) for k, g in zip(kernels[kind], grads[kind])]
        pooled = Curves.pooled(layers)
        ranks = _ranks(*kernels[kind].shape[-2:], rank, paper_n_in, paper_rank, kind)
        kinds[kind] = {'pooled': summary(pooled, ranks, curve=curve), 'fit': fit_curves(pooled),
                       'layer_fits': [fit_curves(c) for c in layers],
                       'layers': [summary(c, ranks) for c in layers]}
        residual += pooled.grad_total - pooled.grad[min(ranks['own'], pooled.k) - 1]
        total += pooled.grad_total
    errors = grad_error.grad_rel_error(approx, exact)
    return {'kinds': kinds, 'projection_ffn_error': float(np.sqrt(max(residual, 0.0) / total)),
            'neighbour_error': {g: errors[g] for g in ('ffn', 'total_non_attention')}}


def train_and_measure(cfg, width: int, *, workdir: str, paper_n_in: dict, paper_rank: int,
                      snapshots: int, shards: int, log=print) -> dict:
    """Trains `cfg` at d_model = width for its steps; `measure` at `snapshots` steps
    (evenly spaced, the first at initialisation, the last after the final step)."""
    from mecefo_jax.run import run as train_run
    from mecefo_jax.training.run_setup import build_run
    cfg = width_config(cfg, width)
    steps = cfg.train.steps
    marks = sorted({round(steps * i / max(snapshots - 1, 1)) for i in range(max(snapshots, 1))})
    run = build_run(cfg, workdir)
    snaps = ParamSnapshots(s for s in marks if s < steps)
    log(f'[rank_fidelity] training d_model={width}, ffn_hidden={cfg.model.ffn_hidden}, '
        f'{cfg.model.num_layers} layers, {steps} steps in {workdir}')
    start = time.perf_counter()
    outcome = train_run(cfg, workdir, run=run, observers=[snaps])
    train_sec = time.perf_counter() - start
    log(f"[rank_fidelity] d_model={width}: trained in {train_sec:.0f} s, val ppl "
        f"{outcome['final_val_ppl']:.2f}; measuring steps {marks}")
    params = {**snaps.params, steps: jax.device_get(outcome['state'].params)}
    tokens = held_out(run, shards)
    grad_fn = grad_error.token_grad_fn(run.model)
    by_step = []
    for step in sorted(params):
        row = measure(params[step], tokens, grad_fn, rank=cfg.mecefo.rank, paper_n_in=paper_n_in,
                      paper_rank=paper_rank, curve=step == steps)
        by_step.append({'step': step, **row})
        log(f"[rank_fidelity] d_model={width} step {step}: projection FFN error at r="
            f"{int(cfg.mecefo.rank)} {row['projection_ffn_error']:.3f}, neighbour FFN error "
            f"{row['neighbour_error']['ffn']:.3f}")
    return {'d_model': width, 'ffn_hidden': cfg.model.ffn_hidden,
            'num_layers': cfg.model.num_layers, 'rank': int(cfg.mecefo.rank), 'steps_trained': steps,
            'learning_rate': cfg.train.learning_rate, 'held_out_tokens': int(tokens.size - len(tokens)),
            'train_sec': train_sec, 'final_val_ppl': outcome['final_val_ppl'], 'steps': by_step}
