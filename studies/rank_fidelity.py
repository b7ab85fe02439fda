"""How much of an FFN weight gradient MeCeFO's rank-r projection keeps, at the paper's shapes.

A MeCeFO neighbour (Hu et al., NeurIPS 2025, arXiv 2510.16415) replaces each
FFN weight gradient G_W = G_y x^T by G_y (x^T V) V^T, V the top-r right
singular vectors of W (`lowrank.lowrank_dense`; in the code the left ones of
the Flax kernel K = W^T, [n_in, m_out], whose exact gradient over a batch is
G = x^T G_y). The low-rank gradient is V V^T G, so for a kernel and a batch

* captured energy  E(r) = ||W V_r||_F^2 / ||W||_F^2: how steep W's spectrum is;
* gradient error   e(r) = ||(I - V_r V_r^T) G||_F / ||G||_F = sqrt(1 - sum_{i<=r} p_i),
  p_i = ||v_i^T G||^2 / ||G||^2 the share of the batch's input energy, weighted
  by G_y, along W's i-th singular direction. Input directions outside W's
  row space (w_down's, where n_in = h exceeds its rank d) are kept at no
  rank: an error floor.

One SVD gives both at every rank (`rank_fidelity_curves`). This module owns
the stand-ins at the paper's shapes (`PAPER_MODELS`, r = 128, the LLaMA
configs' rank: the paper states none): (a) random initialisation with
inputs independent of W, and (c) the spectrum and gradient profile fitted to
trained weights (stand-in (b), `rank_fidelity_trained`), generated at the
paper's shapes; and `run`, the command behind scripts/rank_fidelity.py,
whose markdown `rank_fidelity_report` writes.
"""
from __future__ import annotations

import json
import os
import tempfile
import time

import jax
import numpy as np

from mecefo_jax.faults.costs import PAPER_MODELS
from mecefo_jax.faults.refresh_costs import ffn_kernels
from studies import rank_fidelity_report, rank_fidelity_trained
from studies.rank_fidelity_curves import (
    FFN_KINDS,
    TARGET_ERROR,
    Curves,
    fitted_curves,
    kernel_curves,
    square_sum,
    summary,
)

PAPER_RANK = 128  # the LLaMA configs' mecefo.rank; the paper does not state r
# The rows a neighbour computes at the LLaMA configs' batch (512 sequences of 256
# tokens) on the paper's 32 replicas: its own shard and the adopted one.
PAPER_NEIGHBOUR_TOKENS = 2 * 512 // 32 * 256
OUTPUT = 'rank_fidelity'  # rank_fidelity.{json,md}


def kernel_shapes(shape) -> dict[str, tuple[int, int]]:
    """{kind: [n_in, m_out]} of a `ModelShape`'s FFN kernels (w_gate, w_up: [d, h]; w_down: [h, d])."""
    return dict(zip(FFN_KINDS, ffn_kernels(shape)))


def random_init_standin(n: int, m: int, *, tokens: int, seed: int) -> Curves:
    """Stand-in (a): the model's initialisation N(0, 1/n_in) at [n, m], measured.

    Its spectrum is Marchenko-Pastur, nearly flat. Inputs and output
    gradients are independent standard Gaussians: at initialisation nothing
    aligns x or G_y with W's top directions (w_down's input is computed from
    the other two kernels, not from it).
    """
    rng = np.random.default_rng(seed)
    kernel = rng.standard_normal((n, m), dtype=np.float32) * np.float32(n ** -0.5)
    x = rng.standard_normal((tokens, n), dtype=np.float32)
    g = rng.standard_normal((tokens, m), dtype=np.float32)
    return kernel_curves(kernel, x.T @ g)


def fitted_standin(n: int, m: int, fit: dict, *, tokens: int, seed: int) -> Curves:
    """Stand-in (c): a kernel and a batch generated at [n, m] with the fitted laws, measured.

    W is written in its own singular basis, diag(sigma) with sigma_i^2 ~ i^-a:
    both figures are invariant under orthogonal changes of W's input and
    output bases, so that basis loses no generality and V is the first r
    coordinates (no SVD). Inputs x = z * s, z standard Gaussian, with s_i^2
    the fitted profile along W's i-th direction and the fitted share outside
    W's row space spread over the n - k directions there; G_y standard
    Gaussian, independent of x, so the batch gradient x^T G_y carries the
    profile in expectation (the fitted profile is already G_y-weighted).
    """
    expected = fitted_curves(n, m, fit)
    k = expected.k
    share = np.diff(expected.grad, prepend=0.0)
    scale = np.sqrt(np.concatenate([share, np.full(n - k, (1.0 - expected.grad[-1])
                                                   / max(n - k, 1))])).astype(np.float32)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, n), dtype=np.float32) * scale
    grad = x.T @ rng.standard_normal((tokens, m), dtype=np.float32)
    return Curves(n, expected.energy, 1.0, np.cumsum(square_sum(grad[:k], 1)),
                  float(square_sum(grad)))


def _fitted_rows(n: int, m: int, rank: int, trained: dict, *, tokens: int, seed: int,
                 kind: str) -> dict:
    """Stand-in (c) from each trained width: measured on a generated batch, expected, and
    the range of the expected figures over the per-layer fits."""
    rows = {}
    for width, result in trained.items():
        final = result['steps'][-1]['kinds'][kind]
        per_layer = [summary(fitted_curves(n, m, f), {'paper': rank}) for f in final['layer_fits']]
        rows[width] = {
            'fit': final['fit'],
            'measured': summary(fitted_standin(n, m, final['fit'], tokens=tokens, seed=seed),
                                {'paper': rank}),
            'expected': summary(fitted_curves(n, m, final['fit']), {'paper': rank}),
            'layer_range': {key: [min(s[key]['paper'] for s in per_layer),
                                  max(s[key]['paper'] for s in per_layer)]
                            for key in ('energy', 'error')}}
    return rows


def paper_standins(models, *, rank: int, trained: dict, tokens: int, seed: int,
                   log=print) -> dict:
    """Stand-ins (a) and (c) at every paper shape and kernel kind: {model: {kind: row}}."""
    out = {}
    for name, shape in models.items():
        out[name] = {}
        for j, (kind, (n, m)) in enumerate(kernel_shapes(shape).items()):
            start = time.perf_counter()
            out[name][kind] = {
                'shape': [n, m],
                'random_init': summary(random_init_standin(n, m, tokens=tokens, seed=seed + j),
                                       {'paper': rank}),
                'fitted': _fitted_rows(n, m, rank, trained, tokens=tokens, seed=seed + j,
                                       kind=kind)}
            log(f'[rank_fidelity] {name} {kind} [{n}, {m}]: random init error at r={rank} '
                f"{out[name][kind]['random_init']['error']['paper']:.3f} "
                f'({time.perf_counter() - start:.0f} s)')
    return out


def run(cfg, out_dir: str, *, widths, models=PAPER_MODELS, rank: int = PAPER_RANK,
        tokens: int = PAPER_NEIGHBOUR_TOKENS, snapshots: int = 4, shards: int = 2,
        workdir: str = '', seed: int = 0, command: str = '', config_name: str = '',
        log=print) -> dict:
    """Every stand-in; writes rank_fidelity.{json,md} into out_dir and returns the JSON.

    `cfg` is trained at each d_model of `widths` (stand-in (b)); `models`
    ({name: ModelShape}) are the shapes of stand-ins (a) and (c) at rank
    `rank`, with `tokens` rows per generated batch.
    """
    start = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    workdir = workdir or tempfile.mkdtemp(prefix='rank_fidelity_')
    paper_n_in = {name: {kind: n for kind, (n, _) in kernel_shapes(shape).items()}
                  for name, shape in models.items()}
    trained = {}
    for width in widths:
        trained[str(width)] = rank_fidelity_trained.train_and_measure(
            cfg, width, workdir=os.path.join(workdir, f'd{width}'), paper_n_in=paper_n_in,
            paper_rank=rank, snapshots=snapshots, shards=shards, log=log)
    paper = paper_standins(models, rank=rank, trained=trained, tokens=tokens, seed=seed, log=log)
    result = {
        'command': command, 'config': config_name, 'backend': jax.default_backend(),
        'rank': rank, 'target_error': TARGET_ERROR, 'tokens': tokens, 'seed': seed,
        'models': {name: {'d_model': s.d_model, 'ffn_hidden': s.ffn_hidden,
                          'kernels': {k: list(v) for k, v in kernel_shapes(s).items()}}
                   for name, s in models.items()},
        'trained': trained, 'paper': paper,
        'wall_sec': time.perf_counter() - start, 'load_average': os.getloadavg()[0]}
    with open(os.path.join(out_dir, f'{OUTPUT}.json'), 'w') as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out_dir, f'{OUTPUT}.md'), 'w') as f:
        f.write(rank_fidelity_report.markdown(result))
    return result
