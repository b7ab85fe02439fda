"""The gradient-fidelity runs behind scripts/fidelity.py: train, measure, write JSON and tables.

Every mode trains the config fault-free (`run.run`), keeps its parameters at
evenly spaced steps, and measures (`studies/fidelity.py`) on a neighbour's
rows: the first validation batch's first shards. `rank`: per FFN kernel kind
and width, the projection's curves at the config's rank and at each paper
shape's ratio r / n_in (stand-in (b)), fitted; at the paper's shapes random
initialisation (a) and the fitted laws (c). `projection`: per rank, the
projection alone under every rule, and the neighbour's whole error and step
cost under each implemented rule. `neighbour`: per block, each switch of `VARIANTS`.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any

import jax
import numpy as np

from mecefo_jax.config.resolve import updated
from mecefo_jax.neighbour import projections as proj_lib
from mecefo_jax.training.observers import Observer
from studies import fidelity as fid
from studies.report import markdown_table, write_json

PAPER_RANK = 128  # the LLaMA configs' mecefo.rank; the paper does not state r
# A neighbour's rows at the LLaMA configs' batch (512 sequences of 256 tokens) on 32 replicas: two shards.
PAPER_NEIGHBOUR_TOKENS = 2 * 512 // 32 * 256
# What each switch leaves approximate: attention skip and projection (the paper's rule), the skip
# alone, the projection alone, neither (a check: error 0).
VARIANTS = {'mecefo': {}, 'exact_ffn': {'projection': 'exact'},
            'attention_backward': {'skip_attention': False},
            'exact': {'projection': 'exact', 'skip_attention': False}}


class ParamSnapshots(Observer):
    """Host copies of the parameters entering chosen steps."""

    def __init__(self, steps):
        self.steps, self.params = set(steps), {}

    def on_plan(self, planned) -> None:
        if planned.step in self.steps and planned.step not in self.params:
            self.params[planned.step] = jax.device_get(planned.state.params)


def snapshot_steps(steps: int, snapshots: int) -> list[int]:
    """`snapshots` evenly spaced steps from initialisation to the end; 1: the end only."""
    if snapshots < 1:
        raise ValueError(f'--snapshots={snapshots}: at least 1 (the trained parameters).')
    if snapshots == 1:
        return [steps]
    return sorted({round(steps * i / (snapshots - 1)) for i in range(snapshots)})


@dataclasses.dataclass
class Trained:
    """A fault-free training run's parameters at its snapshots and its held-out rows."""
    cfg: Any
    run: Any  # the `run_setup.Run` it trained (its model, its shard size)
    params: dict  # {step: host params}
    tokens: np.ndarray  # [rows, seq + 1]
    final_val_ppl: float
    train_sec: float


def train(cfg, workdir: str, *, snapshots: int, shards: int, log=print) -> Trained:
    """`cfg` trained fault-free in `workdir`, its parameters kept at `snapshot_steps`."""
    from mecefo_jax.run import run as train_run
    from mecefo_jax.training.run_setup import build_run
    cfg = updated(cfg, {'train.checkpoint_every': 0, 'fault.regime': '', 'fault.events': ''})
    steps = cfg.train.steps
    marks = snapshot_steps(steps, snapshots)
    run = build_run(cfg, workdir)
    snaps = ParamSnapshots(s for s in marks if s < steps)
    start = time.perf_counter()
    outcome = train_run(cfg, workdir, run=run, observers=[snaps])
    train_sec = time.perf_counter() - start
    log(f"[fidelity] trained d_model={cfg.model.d_model} for {steps} steps in {train_sec:.0f} s, val ppl "
        f"{outcome['final_val_ppl']:.2f}; measuring steps {marks}")
    params = {**snaps.params, steps: jax.device_get(outcome['state'].params)}
    if run.val_start is not None:
        run.val_data.set_state(run.val_start)
    batch = np.asarray(next(run.val_data))
    return Trained(cfg, run, params, batch[:shards].reshape(-1, batch.shape[-1]), outcome['final_val_ppl'],
                   train_sec)


def width_config(cfg, width: int):
    """`cfg` at d_model = width with ffn_hidden and mecefo.rank scaled alike (same h / d and r / d)."""
    d, h = cfg.model.d_model, cfg.model.ffn_hidden
    rank = proj_lib.resolve_rank(cfg.mecefo.rank, d, h)
    return updated(cfg, {'model.d_model': width, 'model.ffn_hidden': round(h * width / d),
                         'mecefo.rank': float(max(1, round(rank * width / d)))})


def measure_rank(params, tokens, grad_fn, *, rank, paper_n_in: dict, paper_rank: int, curve: bool) -> dict:
    """Every FFN kernel's curves on one batch, pooled per kind and fitted, at the config's rank
    ('own') and each paper model's ratio; and the neighbour's whole gradient error."""
    projections = proj_lib.compute_projections(params, rank)
    weights = np.ones(len(tokens), np.float32)
    exact, approx = (jax.device_get(grad_fn(params, projections, tokens, weights, neighbour=mode))
                     for mode in (False, True))
    kernels, grads = fid.ffn_kernel_stacks(params), fid.ffn_kernel_stacks(exact)
    kinds, residual, total = {}, 0.0, 0.0
    for kind in fid.FFN_KINDS:
        layers = [fid.kernel_curves(k, g) for k, g in zip(kernels[kind], grads[kind])]
        pooled = fid.Curves.pooled(layers)
        n, m = kernels[kind].shape[-2:]
        ranks = {'own': proj_lib.resolve_rank(rank, n, m),
                 **{name: max(1, round(paper_rank * n / n_in[kind])) for name, n_in in paper_n_in.items()}}
        kinds[kind] = {'pooled': fid.summary(pooled, ranks, curve=curve), 'fit': fid.fit_curves(pooled),
                       'layer_fits': [fid.fit_curves(c) for c in layers],
                       'layers': [fid.summary(c, ranks) for c in layers]}
        residual += pooled.grad_total - pooled.grad[min(ranks['own'], pooled.k) - 1]
        total += pooled.grad_total
    errors = fid.grad_rel_error(approx, exact)
    return {'kinds': kinds, 'projection_ffn_error': float(np.sqrt(max(residual, 0.0) / total)),
            'neighbour_error': {g: errors[g] for g in ('ffn', 'total_non_attention')}}


def _trained_width(cfg, width: int, *, workdir: str, paper_n_in: dict, paper_rank: int, snapshots: int,
                   shards: int, log) -> dict:
    """Stand-in (b): `cfg` trained at d_model = width, measured at each snapshot."""
    trained = train(width_config(cfg, width), workdir, snapshots=snapshots, shards=shards, log=log)
    cfg, tokens = trained.cfg, trained.tokens
    grad_fn = fid.token_grad_fn(trained.run.model)
    steps = [{'step': step, **measure_rank(params, tokens, grad_fn, rank=cfg.mecefo.rank, paper_n_in=paper_n_in,
                                           paper_rank=paper_rank, curve=step == cfg.train.steps)}
             for step, params in sorted(trained.params.items())]
    return {'d_model': width, 'ffn_hidden': cfg.model.ffn_hidden, 'num_layers': cfg.model.num_layers,
            'rank': int(cfg.mecefo.rank), 'steps_trained': cfg.train.steps,
            'learning_rate': cfg.train.learning_rate, 'held_out_tokens': int(tokens.size - len(tokens)),
            'train_sec': trained.train_sec, 'final_val_ppl': trained.final_val_ppl, 'steps': steps}


def _paper_kind(n: int, m: int, kind: str, *, rank: int, trained: dict, tokens: int, seed: int) -> dict:
    """Stand-ins (a) and (c) (from each trained width: measured, expected, and the expected
    figures' range over the per-layer fits) for one paper kernel."""
    def at_rank(curves):
        return fid.summary(curves, {'paper': rank})
    fitted = {}
    for width, result in trained.items():
        final = result['steps'][-1]['kinds'][kind]
        per_layer = [at_rank(fid.fitted_curves(n, m, f)) for f in final['layer_fits']]
        fitted[width] = {'fit': final['fit'],
                         'measured': at_rank(fid.fitted_standin(n, m, final['fit'], tokens=tokens, seed=seed)),
                         'expected': at_rank(fid.fitted_curves(n, m, final['fit'])),
                         'layer_range': {key: [min(s[key]['paper'] for s in per_layer),
                                               max(s[key]['paper'] for s in per_layer)]
                                         for key in ('energy', 'error')}}
    return {'shape': [n, m], 'random_init': at_rank(fid.random_init_standin(n, m, tokens=tokens, seed=seed)),
            'fitted': fitted}


def run_rank(cfg, *, workdir: str, widths, models: dict, paper_rank: int = PAPER_RANK,
             tokens: int = PAPER_NEIGHBOUR_TOKENS, snapshots: int = 4, shards: int = 2, seed: int = 0,
             log=print) -> dict:
    """Stand-in (b) at every width of `widths`, then (a) and (c) at every shape of `models`."""
    start = time.perf_counter()
    shapes = {name: fid.kernel_shapes(shape) for name, shape in models.items()}
    paper_n_in = {name: {kind: n for kind, (n, _) in kinds.items()} for name, kinds in shapes.items()}
    trained = {str(w): _trained_width(cfg, w, workdir=os.path.join(workdir, f'd{w}'), paper_n_in=paper_n_in,
                                      paper_rank=paper_rank, snapshots=snapshots, shards=shards, log=log)
               for w in widths}
    paper = {name: {kind: _paper_kind(n, m, kind, rank=paper_rank, trained=trained, tokens=tokens, seed=seed + j)
                    for j, (kind, (n, m)) in enumerate(kinds.items())} for name, kinds in shapes.items()}
    return {'backend': jax.default_backend(), 'rank': paper_rank, 'target_error': fid.TARGET_ERROR,
            'tokens': tokens, 'seed': seed,
            'models': {name: {'d_model': s.d_model, 'ffn_hidden': s.ffn_hidden,
                              'kernels': {k: list(v) for k, v in shapes[name].items()}}
                       for name, s in models.items()},
            'trained': trained, 'paper': paper,
            'wall_sec': time.perf_counter() - start, 'load_average': os.getloadavg()[0]}


def neighbour_cost(cfg, shard: int) -> float:
    """A neighbour's step over two shards, in normal steps (the planner's FLOP model)."""
    from mecefo_jax.faults.planner import config_planner
    from mecefo_jax.neighbour.layout import ROLE_NEIGHBOUR, ROLE_NORMAL
    cost = config_planner(cfg, shard).cost
    return float(cost(ROLE_NEIGHBOUR, 2 * shard) / cost(ROLE_NORMAL, shard))


def run_projection(cfg, *, workdir: str, ranks, shards: int = 2, log=print) -> dict:
    """Per rank of `ranks`: the projection's errors per rule, the neighbour's errors and its cost."""
    from mecefo_jax.model.llama import build_model
    start = time.perf_counter()
    trained = train(cfg, workdir, snapshots=1, shards=shards, log=log)
    cfg, tokens, (params,) = trained.cfg, trained.tokens, trained.params.values()
    weights = np.ones(len(tokens), np.float32)
    exact = jax.device_get(fid.token_grad_fn(build_model(cfg))(params, {}, tokens, weights, neighbour=False))
    rows = []
    for r in ranks:
        row = {'rank': r, 'projection': fid.projection_errors(params, exact, r)}
        projections = proj_lib.compute_projections(params, r)
        for rule in ('weights', 'gradient'):
            rule_cfg = updated(cfg, {'mecefo.rank': float(r), 'mecefo.projection': rule})
            grads = fid.token_grad_fn(build_model(rule_cfg))(params, projections, tokens, weights, neighbour=True)
            errors = fid.grad_rel_error(jax.device_get(grads), exact)
            row[rule] = {'ffn': errors['ffn'], 'total_non_attention': errors['total_non_attention'],
                         'neighbour_cost': neighbour_cost(rule_cfg, trained.run.shard_batch)}
        rows.append(row)
    return {'backend': jax.default_backend(), 'steps': cfg.train.steps, 'final_val_ppl': trained.final_val_ppl,
            'd_model': cfg.model.d_model, 'ffn_hidden': cfg.model.ffn_hidden,
            'tokens': int(tokens.size - len(tokens)), 'rows': rows, 'wall_sec': time.perf_counter() - start}


def run_neighbour(cfg, *, workdir: str, snapshots: int = 4, shards: int = 2, log=print) -> dict:
    """Per snapshot: {variant: `fidelity.by_layer`} of the neighbour's gradient against the exact one."""
    start = time.perf_counter()
    trained = train(cfg, workdir, snapshots=snapshots, shards=shards, log=log)
    cfg, model, tokens = trained.cfg, trained.run.model, trained.tokens
    weights = np.ones(len(tokens), np.float32)
    steps = []
    for step, params in sorted(trained.params.items()):
        projections = proj_lib.compute_projections(params, cfg.mecefo.rank)
        exact = jax.device_get(fid.token_grad_fn(model)(params, projections, tokens, weights, neighbour=False))
        steps.append({'step': step, 'variants': {
            name: fid.by_layer(jax.device_get(fid.token_grad_fn(model.variant(**changes))(
                params, projections, tokens, weights, neighbour=True)), exact)
            for name, changes in VARIANTS.items()}})
    return {'backend': jax.default_backend(), 'steps': steps, 'rows': int(len(tokens)), 'rank': cfg.mecefo.rank,
            'num_layers': cfg.model.num_layers, 'final_val_ppl': trained.final_val_ppl, 'variants': VARIANTS,
            'wall_sec': time.perf_counter() - start}


def _cell(s: dict, label: str, paper_n: int | None = None) -> str:
    """'error / energy (rank reaching the target)' of a `fidelity.summary`; the rank scaled to
    `paper_n` inputs where given (stand-in (b) read at a paper shape's ratio)."""
    need = s['rank_for_target']
    if need is not None and paper_n is not None:
        need = math.ceil(need * paper_n / s['n_in'])
    reach = f"never (floor {s['error_floor']:.2f})" if need is None else f'r={need}'
    return f"{s['error'][label]:.3f} / {s['energy'][label]:.3f} ({reach})"


def _fit_cell(kind: dict) -> str:
    fit = kind['fit']
    return (f"{fit['spectrum']['exponent']:.3f} / {fit['profile']['exponent']:.3f} / {fit['outside']:.3f} / "
            f"{kind['pooled']['error']['own']:.3f}")


def rank_tables(result: dict) -> list[str]:
    """Error / captured energy (rank reaching the target) per shape and stand-in; fits over training."""
    kinds_of = {w: t['steps'][-1]['kinds'] for w, t in result['trained'].items()}
    rows = [[f'd={w}', 'trained, own r', *(_cell(k[kind]['pooled'], 'own') for kind in fid.FFN_KINDS)]
            for w, k in kinds_of.items()]
    for model, paper in result['paper'].items():
        rows.append([model, f"random init, r={result['rank']}",
                     *(_cell(paper[kind]['random_init'], 'paper') for kind in fid.FFN_KINDS)])
        rows += [[model, f'trained d={w} at r/n_in', *(_cell(k[kind]['pooled'], model, paper[kind]['shape'][0])
                                                      for kind in fid.FFN_KINDS)] for w, k in kinds_of.items()]
        rows += [[model, f"fitted to d={w}, r={result['rank']}",
                  *(_cell(paper[kind]['fitted'][w]['measured'], 'paper') for kind in fid.FFN_KINDS)]
                 for w in kinds_of]
    trend = [[w, row['step'], *(_fit_cell(row['kinds'][kind]) for kind in fid.FFN_KINDS),
              f"{row['projection_ffn_error']:.3f}", f"{row['neighbour_error']['ffn']:.3f}"]
             for w, t in result['trained'].items() for row in t['steps']]
    return [markdown_table(['shape', 'stand-in', *fid.FFN_KINDS], rows),
            markdown_table(['d', 'step', *(f'{k} a / g / q / error' for k in fid.FFN_KINDS),
                            'projection FFN error', 'neighbour FFN error'], trend)]


def projection_tables(result: dict) -> list[str]:
    """The neighbour's errors and step cost per rank and rule; the projection alone per kernel."""
    keys = ('ffn', 'total_non_attention', 'neighbour_cost')
    whole = [[row['rank'], rule, *(f'{row[rule][key]:.3f}' for key in keys)]
             for row in result['rows'] for rule in ('weights', 'gradient')]
    alone = [[row['rank'], kind, *(f'{errors[rule]:.3f}' for rule in fid.RULES)]
             for row in result['rows'] for kind, errors in row['projection'].items()]
    return [markdown_table(['r', 'rule', 'neighbour FFN error', 'non-attention error',
                            'neighbour step (2 shards, normal steps)'], whole),
            markdown_table(['r', 'kernel', *fid.RULES], alone)]


def _groups(variant: dict, num_layers: int) -> list[tuple[str, dict]]:
    """[(label, figures)] of one variant's `fidelity.by_layer`, blocks bottom first."""
    return ([(f'block {i} {g}', variant['layers'][i][g])
             for i in range(num_layers) for g in ('ffn', 'ffn_norm', 'attention')]
            + [(g, variant[g]) for g in ('embedding', 'top')])


def neighbour_tables(result: dict) -> list[str]:
    """Per step, block and group: each variant's cosine (relative error)."""
    rows = []
    for entry in result['steps']:
        columns = [_groups(v, result['num_layers']) for v in entry['variants'].values()]
        rows += [[entry['step'], cells[0][0], *(f"{f['cosine']:.3f} ({f['rel_error']:.3f})" for _, f in cells)]
                 for cells in zip(*columns)]
    return [markdown_table(['step', 'group', *result['variants']], rows)]


def write(out_dir: str, name: str, report: dict, tables: list[str]) -> str:
    """out_dir/name.json and out_dir/name.md (the command, then the tables); returns the markdown."""
    os.makedirs(out_dir, exist_ok=True)
    write_json(os.path.join(out_dir, f'{name}.json'), report)
    text = '\n\n'.join([f'# {name}', f"```\n{report['command']}\n```", *tables]) + '\n'
    with open(os.path.join(out_dir, f'{name}.md'), 'w') as f:
        f.write(text)
    return text
