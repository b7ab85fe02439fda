"""The neighbour's FFN gradient under both `mecefo.projection` rules, on trained weights.

MeCeFO's neighbour (Hu et al., NeurIPS 2025, arXiv 2510.16415) projects each
FFN kernel gradient G = x^T G_y on V, the kernel's top-r singular directions
('weights', `lowrank.lowrank_dense`); this project's 'gradient' rule
projects it on Q = orth(G Omega), a range finder on the batch's own gradient
(`lowrank.sketched_dense`). Behind `scripts/compare_projection.py`: train the
config fault-free (`run.run`), take a neighbour's rows (the first validation
batch's first two shards) and, at each rank, measure

* the projection alone, per kernel kind pooled over layers: ||G - P G|| / ||G||
  on the exact kernel gradients, for V V^T, Q Q^T (Omega the rule's own),
  Q Q^T after one power iteration (Q = orth(G G^T G Omega), not
  implemented: what it would buy) and the best rank-r approximation (SVD
  truncation: no rank-r rule does better);
* the neighbour's whole FFN and non-attention error (`grad_error.grad_rel_error`:
  the projection plus the attention cotangent a neighbour drops), as the
  quality runs' `GradientError` reports it;
* the step cost of a neighbour computing two shards, in normal steps, from
  the planner's own FLOP model (`config_planner`).

Writes projection_rules.{json,md}.
"""
from __future__ import annotations

import os
import time

import jax
import numpy as np

from mecefo_jax.config_resolve import updated
from mecefo_jax.neighbour import projections as proj_lib
from studies import grad_error
from studies.rank_fidelity_curves import FFN_KINDS
from studies.rank_fidelity_trained import ffn_kernel_stacks, held_out
from studies.report import write_json

OUTPUT = 'projection_rules'
RULES = ('weights', 'gradient', 'gradient_power1', 'best')


def _orth(y):
    return np.linalg.qr(y)[0]


def projected(rule: str, kernel_nm, g_nm, r: int):
    """P G for one kernel and its exact gradient under `rule` (float64)."""
    from mecefo_jax.neighbour.lowrank import sketch_matrix
    n, m = g_nm.shape
    if rule == 'weights':
        v = np.linalg.svd(kernel_nm, full_matrices=False)[0][:, :r]
        return v @ (v.T @ g_nm)
    if rule == 'best':
        u, s, vt = np.linalg.svd(g_nm, full_matrices=False)
        return (u[:, :r] * s[:r]) @ vt[:r]
    q = _orth(g_nm @ np.asarray(sketch_matrix(n, m, r), np.float64))
    if rule == 'gradient_power1':
        q = _orth(g_nm @ (g_nm.T @ q))
    return q @ (q.T @ g_nm)


def projection_errors(params, exact, r: int) -> dict:
    """{kind: {rule: pooled relative error}} of the projection alone at rank r."""
    kernels, grads = ffn_kernel_stacks(params), ffn_kernel_stacks(exact)
    out = {}
    for kind in FFN_KINDS:
        pairs = [(np.asarray(k, np.float64), np.asarray(g, np.float64))
                 for k, g in zip(kernels[kind], grads[kind])]
        total = sum(np.sum(g * g) for _, g in pairs)
        out[kind] = {rule: float(np.sqrt(sum(np.sum((g - projected(rule, k, g, r)) ** 2)
                                             for k, g in pairs) / total)) for rule in RULES}
    return out


def neighbour_cost(cfg, shard: int) -> float:
    """A neighbour's step over two shards, in normal steps (the planner's FLOP model)."""
    from mecefo_jax.faults.planner import config_planner
    from mecefo_jax.neighbour.layout import ROLE_NEIGHBOUR, ROLE_NORMAL
    cost = config_planner(cfg, shard).cost
    return float(cost(ROLE_NEIGHBOUR, 2 * shard) / cost(ROLE_NORMAL, shard))


def measure(cfg, params, tokens, ranks, *, shard: int) -> list[dict]:
    """Per rank: the projection's errors, the neighbour's errors and its step cost, per rule."""
    from mecefo_jax.model.llama import build_model
    weights = np.ones(len(tokens), np.float32)
    exact_fn = grad_error.token_grad_fn(build_model(cfg))
    exact = jax.device_get(exact_fn(params, {}, tokens, weights, neighbour=False))
    rows = []
    for r in ranks:
        row = {'rank': r, 'projection': projection_errors(params, exact, r)}
        projections = proj_lib.compute_projections(params, r)
        for rule in ('weights', 'gradient'):
            rule_cfg = updated(cfg, {'mecefo.rank': float(r), 'mecefo.projection': rule})
            grads = grad_error.token_grad_fn(build_model(rule_cfg))(
                params, projections, tokens, weights, neighbour=True)
            errors = grad_error.grad_rel_error(jax.device_get(grads), exact)
            row[rule] = {'ffn': errors['ffn'], 'total_non_attention': errors['total_non_attention'],
                         'neighbour_cost': neighbour_cost(rule_cfg, shard)}
        rows.append(row)
    return rows


def run(cfg, out_dir: str, *, ranks, workdir: str, shards: int = 2, command: str = '',
        config_name: str = '', log=print) -> dict:
    """Train `cfg` fault-free in `workdir`, measure at `ranks`, write the report in out_dir."""
    from mecefo_jax.run import run as train_run
    from mecefo_jax.training.run_setup import build_run
    cfg = updated(cfg, {'train.checkpoint_every': 0})
    start = time.perf_counter()
    training = build_run(cfg, workdir)
    outcome = train_run(cfg, workdir, run=training)
    log(f'[projection_rules] trained {cfg.train.steps} steps in {time.perf_counter() - start:.0f} s, '
        f"val ppl {outcome['final_val_ppl']:.2f}")
    params = jax.device_get(outcome['state'].params)
    tokens = held_out(training, shards)
    rows = measure(cfg, params, tokens, ranks, shard=training.shard_batch)
    report = {'command': command, 'config': config_name, 'backend': jax.default_backend(),
              'steps': cfg.train.steps, 'final_val_ppl': outcome['final_val_ppl'],
              'd_model': cfg.model.d_model, 'ffn_hidden': cfg.model.ffn_hidden,
              'tokens': int(tokens.size - len(tokens)), 'rows': rows,
              'wall_sec': time.perf_counter() - start}
    os.makedirs(out_dir, exist_ok=True)
    write_json(os.path.join(out_dir, f'{OUTPUT}.json'), report)
    with open(os.path.join(out_dir, f'{OUTPUT}.md'), 'w') as f:
        f.write(markdown(report))
    return report


def markdown(report: dict) -> str:
    lines = ["# The neighbour's FFN gradient under both projection rules", '',
             f"`{report['config']}` (d={report['d_model']}, h={report['ffn_hidden']}) trained "
             f"{report['steps']} steps fault-free (val ppl {report['final_val_ppl']:.2f}); a "
             f"neighbour's rows: {report['tokens']} held-out tokens. Measured on "
             f"{report['backend']} in {report['wall_sec'] / 60:.1f} minutes by", '',
             f"```\n{report['command']}\n```", '',
             '| r | rule | neighbour FFN error | non-attention error | neighbour step '
             '(2 shards, normal steps) |', '|---|---|---|---|---|']
    for row in report['rows']:
        for rule in ('weights', 'gradient'):
            x = row[rule]
            lines.append(f"| {row['rank']} | {rule} | {x['ffn']:.3f} | "
                         f"{x['total_non_attention']:.3f} | {x['neighbour_cost']:.3f} |")
    lines += ['', 'The projection alone, ||G - P G|| / ||G|| on the exact kernel gradients '
              '(pooled over layers): P = V V^T (weights), Q Q^T (gradient), Q Q^T after one '
              'power iteration (not implemented), and the best rank-r approximation.', '',
              '| r | kernel | ' + ' | '.join(RULES) + ' |', '|---|---' + '|---' * len(RULES) + '|']
    for row in report['rows']:
        for kind, errors in row['projection'].items():
            lines.append(f"| {row['rank']} | `{kind}` | "
                         + ' | '.join(f'{errors[rule]:.3f}' for rule in RULES) + ' |')
    return '\n'.join(lines) + '\n'
