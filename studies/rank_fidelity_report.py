"""The rank-fidelity report's markdown: every figure read from `rank_fidelity.run`'s JSON.

Owns the tables (error and captured energy per stand-in, paper shape and
kernel kind; the trained models' curves and their trend over training; the
fits behind stand-in (c)), the gap between the small model at its own rank
and each paper shape at r = 128, the rank each needs for the paper's 0.6,
and the verdict on whether the small model misleads and which way. Nothing
here is a hard-coded figure: every sentence with a number is built from the
JSON, so a rerun rewrites it.
"""
from __future__ import annotations

import math

from studies.rank_fidelity_curves import FFN_KINDS
from studies.report import fmt


def _rank_text(rank, floor: float) -> str:
    return f'never (floor {floor:.2f})' if rank is None else f'r={rank}'


def _rows(result: dict) -> list[tuple[str, str, dict]]:
    """(model, stand-in label, {kind: (error, energy, rank text)}) for every paper shape."""
    rank, rows = result['rank'], []
    for model, kinds in result['paper'].items():
        cells = {kind: (row['random_init']['error']['paper'], row['random_init']['energy']['paper'],
                        _rank_text(row['random_init']['rank_for_target'],
                                   row['random_init']['error_floor']))
                 for kind, row in kinds.items()}
        rows.append((model, f'(a) random init, r={rank}', cells))
        for width, trained in result['trained'].items():
            final = trained['steps'][-1]['kinds']
            cells = {}
            for kind, row in final.items():
                pooled, paper_n = row['pooled'], kinds[kind]['shape'][0]
                need = pooled['rank_for_target']
                scaled = None if need is None else math.ceil(need * paper_n / pooled['n_in'])
                cells[kind] = (pooled['error'][model], pooled['energy'][model],
                               _rank_text(scaled, pooled['error_floor']))
            ranks = '/'.join(str(final[k]['pooled']['ranks'][model]) for k in FFN_KINDS)
            rows.append((model, f'(b) trained d={width} at r/n_in (r={ranks})', cells))
        for width in result['trained']:
            cells = {}
            for kind, row in kinds.items():
                measured = row['fitted'][width]['measured']
                cells[kind] = (measured['error']['paper'], measured['energy']['paper'],
                               _rank_text(measured['rank_for_target'], measured['error_floor']))
            rows.append((model, f'(c) fitted to d={width}, r={rank} (extrapolation)', cells))
    return rows


def _small(result: dict) -> tuple[str, dict]:
    """The narrowest trained model at its own rank: the figure the main issue quotes."""
    width, trained = next(iter(result['trained'].items()))
    final = trained['steps'][-1]['kinds']
    return width, {kind: (row['pooled']['error']['own'], row['pooled']['energy']['own'],
                          row['pooled']['ranks']['own']) for kind, row in final.items()}


def _tables(result: dict) -> list[str]:
    width, small = _small(result)
    head = '| shape | stand-in | ' + ' | '.join(f'`{k}`' for k in FFN_KINDS) + ' |'
    rule = '|---|---|' + '---|' * len(FFN_KINDS)
    prefix = f'| small d={width} (trained) | own r=' + '/'.join(str(small[k][2]) for k in FFN_KINDS)
    error = [head, rule, prefix + ' | ' + ' | '.join(f'{small[k][0]:.3f}' for k in FFN_KINDS) + ' |']
    energy = [head, rule, prefix + ' | ' + ' | '.join(f'{small[k][1]:.3f}' for k in FFN_KINDS) + ' |']
    for model, label, cells in _rows(result):
        error.append(f'| {model} | {label} | ' + ' | '.join(
            f'{cells[k][0]:.3f} (0.6: {cells[k][2]})' for k in FFN_KINDS) + ' |')
        energy.append(f'| {model} | {label} | ' + ' | '.join(
            f'{cells[k][1]:.3f}' for k in FFN_KINDS) + ' |')
    return (['### Relative error of the low-rank FFN weight gradient (rank that reaches '
             f"{result['target_error']})", ''] + error
            + ['', '### Captured energy ||W V_r||^2 / ||W||^2 at the same ranks', ''] + energy)


def _gap(result: dict) -> list[str]:
    """Paper shape at r = 128 minus small at its own rank, per stand-in; and the verdict."""
    width, small = _small(result)
    lines, signs = ['## The gap against the small model', ''], {}
    for model, label, cells in _rows(result):
        gaps = {k: cells[k][0] - small[k][0] for k in FFN_KINDS}
        signs.setdefault(label[:3], []).extend(gaps.values())
        lines.append(f'- {model}, {label}: ' + ', '.join(
            f'`{k}` {cells[k][0]:.3f} ({gaps[k]:+.3f})' for k in FFN_KINDS))
    lines += ['', f'(in brackets: minus small d={width} at its own rank, ' + ', '.join(
        f'`{k}` {small[k][0]:.3f}' for k in FFN_KINDS) + ').', '']
    for tag, name in (('(a)', 'random initialisation'), ('(b)', 'trained weights at the ratio'),
                      ('(c)', 'the fitted extrapolation')):
        values = signs.get(tag, [])
        if not values:
            continue
        if all(v > 0 for v in values):
            verdict = ('higher at every paper shape and kernel: the small model at its own rank '
                       '**understates** the error (it misleads optimistically)')
        elif all(v < 0 for v in values):
            verdict = ('lower at every paper shape and kernel: the small model at its own rank '
                       '**overstates** the error (it misleads pessimistically)')
        else:
            verdict = 'higher for some shapes and kernels and lower for others'
        lines.append(f'- Under {name} {tag}, the error at r={result["rank"]} is {verdict} '
                     f'(gaps {min(values):+.3f} to {max(values):+.3f}).')
    return lines + ['']


def _trained(result: dict) -> list[str]:
    """Each trained width's pooled curves at its final step, and the neighbour's whole error."""
    models = list(result['paper'])
    lines = ['## Stand-in (b): trained weights, real activations, held-out batch', '',
             '| d | kernel | n_in | own r: energy / error | ' + ' | '.join(
                 f'{m} ratio: r, energy / error' for m in models)
             + f" | r for {result['target_error']} (r/n_in) | error at r = k |",
             '|---|---|---|---|' + '---|' * len(models) + '---|---|']
    for width, trained in result['trained'].items():
        for kind, row in trained['steps'][-1]['kinds'].items():
            p = row['pooled']
            need = p['rank_for_target']
            lines.append(
                f"| {width} | `{kind}` | {p['n_in']} | r={p['ranks']['own']}: "
                f"{p['energy']['own']:.3f} / {p['error']['own']:.3f} | " + ' | '.join(
                    f"{p['ranks'][m]}: {p['energy'][m]:.3f} / {p['error'][m]:.3f}" for m in models)
                + f" | {_rank_text(need, p['error_floor'])}"
                + ('' if need is None else f' ({need / p["n_in"]:.3f})')
                + f" | {p['error_floor']:.3f} |")
    lines += ['', "Whole FFN group at the config's own rank: the projection alone against the "
              "neighbour's whole gradient error (projection plus the attention cotangent it drops; "
              'what the quality runs report):', '']
    for width, trained in result['trained'].items():
        final = trained['steps'][-1]
        lines.append(
            f"- d={width} (h={trained['ffn_hidden']}, {trained['num_layers']} layers, "
            f"r={trained['rank']}, {trained['steps_trained']} steps, lr "
            f"{trained['learning_rate']:g}, val ppl {trained['final_val_ppl']:.2f}, trained in "
            f"{trained['train_sec']:.0f} s; {trained['held_out_tokens']} held-out tokens): "
            f"projection {final['projection_ffn_error']:.3f}, neighbour FFN "
            f"{final['neighbour_error']['ffn']:.3f}, neighbour non-attention "
            f"{final['neighbour_error']['total_non_attention']:.3f}.")
    return lines + ['']


def _trend(result: dict) -> list[str]:
    """How the fitted exponents and the errors move with training steps."""
    lines = ['## Over training: fitted exponents and errors', '',
             'Spectrum exponent a (sigma_i^2 ~ i^-a), gradient-profile exponent g (p_i ~ i^-g '
             "inside W's row space) and share q outside it, per kind; error at the own rank.", '',
             '| d | step | ' + ' | '.join(f'`{k}` a / g / q / error' for k in FFN_KINDS)
             + ' | neighbour FFN error |', '|---|---|' + '---|' * (len(FFN_KINDS) + 1)]
    for width, trained in result['trained'].items():
        for row in trained['steps']:
            cells = []
            for kind in FFN_KINDS:
                fit, pooled = row['kinds'][kind]['fit'], row['kinds'][kind]['pooled']
                cells.append(f"{fit['spectrum']['exponent']:.3f} / {fit['profile']['exponent']:.3f}"
                             f" / {fit['outside']:.3f} / {pooled['error']['own']:.3f}")
            lines.append(f"| {width} | {row['step']} | " + ' | '.join(cells)
                         + f" | {row['neighbour_error']['ffn']:.3f} |")
    return lines + ['']


def _fits(result: dict) -> list[str]:
    """Stand-in (c): the fits, and measured against expected at each paper shape."""
    rank = result['rank']
    lines = ['## Stand-in (c): the fitted laws at the paper shapes (an extrapolation)', '',
             '| shape | kernel | fitted to d | a (rms) | g (rms) | q | error at r='
             f'{rank}: measured / expected [range over layers] | energy: measured [range] |',
             '|---|---|---|---|---|---|---|---|']
    for model, kinds in result['paper'].items():
        for kind, row in kinds.items():
            for width, fitted in row['fitted'].items():
                fit, err, energy = fitted['fit'], fitted['layer_range']['error'], \
                    fitted['layer_range']['energy']
                lines.append(
                    f"| {model} {row['shape'][0]}x{row['shape'][1]} | `{kind}` | {width} | "
                    f"{fit['spectrum']['exponent']:.3f} ({fit['spectrum']['rms']:.3f}) | "
                    f"{fit['profile']['exponent']:.3f} ({fit['profile']['rms']:.3f}) | "
                    f"{fit['outside']:.3f} | {fitted['measured']['error']['paper']:.3f} / "
                    f"{fitted['expected']['error']['paper']:.3f} [{err[0]:.3f}, {err[1]:.3f}] | "
                    f"{fitted['measured']['energy']['paper']:.3f} "
                    f"[{energy[0]:.3f}, {energy[1]:.3f}] |")
    return lines + ['']


def _width_trend(result: dict, model: str) -> list[str]:
    """How the error at `model`'s ratio moves from the narrowest to the widest trained model."""
    widths = list(result['trained'])
    if len(widths) < 2:
        return []
    first, last = (result['trained'][w]['steps'][-1]['kinds'] for w in (widths[0], widths[-1]))
    changes = [last[k]['pooled']['error'][model] - first[k]['pooled']['error'][model]
               for k in FFN_KINDS]
    profile = ', '.join(f"{first[k]['fit']['profile']['exponent']:.2f} -> "
                        f"{last[k]['fit']['profile']['exponent']:.2f}" for k in FFN_KINDS)
    if all(c < 0 for c in changes):
        reading = (f"so reading the paper's ratio off d={widths[0]} alone overstates the error "
                   "at the paper's widths, by an amount not measured here")
    elif all(c > 0 for c in changes):
        reading = f"so reading the paper's ratio off d={widths[0]} alone understates the error"
    else:
        reading = 'with no common direction'
    return [f'- **Width.** From d={widths[0]} to d={widths[-1]} the error at the {model} ratio '
            f'changes by {min(changes):+.3f} to {max(changes):+.3f} (per kernel kind) and the '
            f'gradient-profile exponent g moves {profile} (gate, up, down), {reading}.']


def _agreement(result: dict) -> float:
    """The largest |(c) - (b)| error at r = 128 over shapes, kinds and trained widths."""
    return max(abs(row['fitted'][w]['measured']['error']['paper']
                   - result['trained'][w]['steps'][-1]['kinds'][kind]['pooled']['error'][model])
               for model, kinds in result['paper'].items() for kind, row in kinds.items()
               for w in result['trained'])


def _reading(result: dict) -> list[str]:
    """What the figures say, each sentence built from them."""
    width, trained = next(iter(result['trained'].items()))
    first, final = trained['steps'][0], trained['steps'][-1]
    model, target = next(iter(result['paper'])), result['target_error']
    gate, start_gate = final['kinds']['w_gate'], first['kinds']['w_gate']['fit']['spectrum']
    random_energy = result['paper'][model]['w_gate']['random_init']['energy']['paper']
    projection, whole = final['projection_ffn_error'], final['neighbour_error']['ffn']
    outside = {w: t['steps'][-1]['kinds']['w_down']['fit']['outside']
               for w, t in result['trained'].items()}
    floors = ', '.join(f'{math.sqrt(q):.2f} (d={w})' for w, q in outside.items())
    reach = ('no rank reaches' if all(math.sqrt(q) > target for q in outside.values())
             else 'it caps what any rank reaches, at')
    energy_gap = gate['pooled']['energy'][model] - random_energy
    return ['## Reading the figures', '',
            f"- **Where small's error comes from.** At d={width}, r={trained['rank']}, the "
            f'projection alone has a relative error of {projection:.3f} on the FFN gradient '
            f"(pooled over kinds); the neighbour's whole FFN error, which also misses the "
            f'attention cotangent a neighbour drops, is {whole:.3f} ({whole - projection:+.3f}).',
            f"- **`w_down`'s floor.** {outside[width]:.0%} of its gradient (d={width}; "
            f"{first['kinds']['w_down']['fit']['outside']:.0%} at initialisation) lies in input "
            "directions outside W's row space (n_in = h > d, its rank), which no rank keeps: "
            f'an error floor of {floors}; {reach} {target}. The paper shapes have the same h / d.',
            f"- **The spectrum.** Over {trained['steps_trained']} steps `w_gate`'s spectrum "
            f"exponent went {start_gate['exponent']:.3f} -> {gate['fit']['spectrum']['exponent']:.3f}"
            f"; its captured energy at the {model} ratio is {gate['pooled']['energy'][model]:.3f}, "
            f'random initialisation at {model} {random_energy:.3f} ({energy_gap:+.3f}). A power '
            f"law fits these spectra with a residual of {gate['fit']['spectrum']['rms']:.3f} "
            f"(step 0: {start_gate['rms']:.3f}), so (c)'s captured energy is the least reliable "
            "figure here. (c)'s error depends only on the gradient profile, fitted to a residual "
            f"of {gate['fit']['profile']['rms']:.3f}; it is within {_agreement(result):.3f} of (b)'s."
            ] + _width_trend(result, model) + ['']


ASSUMPTIONS = """## What each stand-in assumes

- **(a) random initialisation** at each paper shape: W ~ N(0, 1/n_in) (the
  model's initialiser), inputs x and output gradients G_y independent
  standard Gaussians. Its spectrum is nearly flat and nothing aligns the
  batch with W's top directions, so it bounds the captured energy from below
  and the error from above for weights that have learnt anything.
- **(b) trained weights** of the small model(s), trained here with the
  library's own loop on the embedded corpus, measured on a held-out batch
  with the exact x and G_y of every FFN kernel (through the exact kernel
  gradient x^T G_y), read at the rank whose ratio r / n_in equals each paper
  shape's 128 / n_in. It assumes the curves depend on r / n_in only, and its
  models trained for far fewer steps, on far less data, than the paper's.
- **(c) the fitted laws**: power laws fitted to (b)'s final curves
  (sigma_i^2 ~ i^-a; the gradient profile p_i ~ i^-g inside W's row space;
  the share q outside it, carried over to `w_down`, whose h / d is nearly
  the same at every shape), generated at the paper's shapes with
  independent Gaussian G_y and measured. A power law has no scale of its
  own, so (c) extends (b)'s ratio reading smoothly rather than adding
  information; its uncertainty is at least the spread of the per-layer fits
  (the ranges) and the fit's residual, and nothing here measures how a
  longer training run, or a wider model, would move the exponents beyond
  the trend the table above shows.
"""


def markdown(result: dict) -> str:
    """The whole report."""
    widths = ', '.join(f"d={w} ({t['steps_trained']} steps)" for w, t in result['trained'].items())
    lines = [
        "# Rank fidelity: the low-rank FFN gradient at the paper's shapes", '',
        "MeCeFO's neighbour replaces each FFN weight gradient G_y x^T by G_y (x^T V) V^T, V "
        'the top-r right singular vectors of W (Hu et al., NeurIPS 2025, arXiv 2510.16415). '
        'Per kernel kind: the captured energy ||W V_r||^2 / ||W||^2 and the relative error '
        '||G_y x^T (I - V_r V_r^T)|| / ||G_y x^T|| of the low-rank gradient, at the LLaMA '
        f"configs' r={result['rank']} on the paper's 350M / 1B / 7B FFN shapes, under three "
        f"stand-ins for trained weights (below). The paper reports a relative error below "
        f"{result['target_error']}; it does not state r.", '',
        f"Measured by `studies/rank_fidelity.py` on {result['backend']}, "
        f"{fmt(result['wall_sec'] / 60, '.1f')} minutes (load average "
        f"{fmt(result['load_average'], '.1f')}); trained: {widths} of "
        f"`{result['config'] or 'the config'}`; generated batches of {result['tokens']} tokens "
        "(a neighbour's two shards at the LLaMA configs' batch on 32 replicas), seed "
        f"{result['seed']}:", '', '```', result['command'] or '(called from Python)', '```', '']
    lines += _gap(result) + _reading(result) + _tables(result) + [''] + _trained(result)
    lines += _trend(result)
    lines += _fits(result) + [ASSUMPTIONS]
    return '\n'.join(lines)
