"""The cluster projection's outputs: simulate_cluster.json, .md (tables only) and .png;
`PAPER` is the only figures not computed by the run. What they mean: docs/cluster.md."""
from __future__ import annotations

import itertools
import json
import math
import os
from typing import Any

from studies.cluster import traces as traces_lib
from studies.report import fmt, markdown_table, pyplot

# MeCeFO (NeurIPS 2025) Table 2, 32 A100s: MeCeFO k tokens/s fault-free and under
# `high`, and the drops of it and its baselines under `high` (no low / mid figures).
PAPER = {
    '350M': {'none': 1199.0, 'high': 1186.0, 'high_drop_pct': 1.07, 'bamboo_high_drop_pct': 7.04,
             'oobleck_high_drop_pct': 10.14},
    '1B': {'none': 471.0, 'high': 457.0, 'high_drop_pct': 2.98, 'bamboo_high_drop_pct': 8.21,
           'oobleck_high_drop_pct': 13.87},
    '7B': {'none': 111.1, 'high': 106.5, 'high_drop_pct': 4.18, 'bamboo_high_drop_pct': 20.84,
           'oobleck_high_drop_pct': 28.09},
}


def _index(rows):
    return {(r['assumption'], r['model'], r['regime'], r['strategy'], r['num_replicas']): r for r in rows}


def needed_mttr_hours(p: float, *, mtbf_hours: float, num_replicas: int, rate_scaling: str) -> float:
    """The MTTR at which >= 1 replica is down a fraction `p` of the time: the failed
    replicas are an M/M/inf queue, P(none down) = exp(-MTTR/MTBF) at the cluster MTBF used."""
    if not 0 <= p < 1:
        return math.inf
    mtbf = mtbf_hours * (traces_lib.CALIBRATION_REPLICAS / num_replicas
                         if rate_scaling == 'per_replica' else 1.0)
    return -mtbf * math.log(1 - p)


def explain(result: dict[str, Any]) -> dict[str, Any]:
    """Per (assumption, model) under `high`, what MeCeFO's drop is made of (docs/cluster.md)."""
    cfg, idx, out = result['config'], _index(result['rows']), {}
    mtbf, mttr = traces_lib.REGIMES['high']
    for assumption, model in itertools.product(cfg['assumptions'], cfg['models']):
        rows = {s: idx.get((assumption, model, 'high', s, cfg['replicas']))
                for s in cfg['strategies'] if s != 'fault_free'}
        if (mecefo := rows.get('mecefo')) is not None and model in PAPER:
            p, r = mecefo['time_frac_any_down'], mecefo['step_ratio_when_down']
            paper_d = PAPER[model]['high_drop_pct'] / 100
            need_p = min(1.0, paper_d / (1 - 1 / r)) if r > 1 else math.inf
            drops = {s: row['drop_pct'] for s, row in rows.items() if row is not None}
            out[f'{assumption}/{model}'] = {
                'assumption': assumption, 'model': model, 'mtbf_hours': mtbf, 'mttr_hours': mttr,
                'time_frac_any_down': p, 'mecefo_step_ratio_when_down': r,
                'mecefo_drop_pct': mecefo['drop_pct'], 'first_order_drop_pct': 100 * p * (1 - 1 / r),
                'paper_drop_pct': 100 * paper_d,
                'needed_step_ratio_for_paper_drop': 1 / (1 - paper_d / p) if p > paper_d else math.inf,
                'needed_time_frac_down_for_paper_drop': need_p,
                'needed_mttr_hours_at_paper_mtbf': needed_mttr_hours(
                    need_p, mtbf_hours=mtbf, num_replicas=cfg['replicas'],
                    rate_scaling=cfg['rate_scaling']),
                'ordering': sorted(drops, key=drops.get), 'drops_pct': drops,
            }
    return out


def _drop(row, digits=2) -> str:
    return 'n/a' if row is None else f"{row['drop_pct']:.{digits}f} ± {row['drop_pct_std']:.{digits}f}"


def markdown(result: dict[str, Any]) -> str:
    """Table 2 with the paper's figures beside ours, then the size sweep (the rest: the JSON)."""
    cfg = result['config']
    others = [s for s in cfg['strategies'] if s != 'fault_free']
    idx, sweep_idx = _index(result['rows']), _index(result['sweep_rows'])
    table2, sweep = [], []
    for assumption, model, regime in itertools.product(cfg['assumptions'], cfg['models'], cfg['regimes']):
        get = {s: idx.get((assumption, model, regime, s, cfg['replicas'])) for s in others}
        if get.get('mecefo') is not None:
            paper = PAPER.get(model, {})
            table2.append([assumption, model, regime, fmt(paper.get(regime), '.1f'),
                           fmt(0.0 if regime == 'none' else paper.get(f'{regime}_drop_pct'), '.2f'),
                           f"{get['mecefo']['fault_free_tokens_per_sec'] / 1e3:.1f}",
                           f"{get['mecefo']['tokens_per_sec'] / 1e3:.1f}"] + [_drop(get[s]) for s in others])
    sizes = sorted({r['num_replicas'] for r in result['sweep_rows']})
    for regime, assumption, n in itertools.product(cfg['sweep_regimes'], cfg['assumptions'], sizes):
        get = {s: sweep_idx.get((assumption, cfg['sweep_model'], regime, s, n)) for s in others}
        if (first := get[others[0]]) is not None:
            sweep.append([regime, assumption, n, first['seeds'], f"{100 * first['time_frac_any_down']:.1f}",
                          f"{first['mean_replicas_down']:.2f}"] + [_drop(get[s], 1) for s in others])
    head = ['assumption', 'model', 'regime', 'paper k tok/s', 'paper drop %', 'fault-free k tok/s',
            'mecefo k tok/s']
    md = (f"# Cluster projection\n\n## Drop % at {cfg['replicas']} replicas (mean ± std over seeds)\n\n"
          + markdown_table(head + [f'{s} drop %' for s in others], table2) + '\n')
    if sweep:
        md += (f"\n## Drop % against cluster size ({cfg['sweep_model']})\n\n" + markdown_table(
            ['regime', 'assumption', 'n', 'seeds', '>=1 down %', 'mean down']
            + [f'{s} drop %' for s in others], sweep) + '\n')
    return md


def plot(result: dict[str, Any], path: str) -> None:
    """Drop % against cluster size, one panel per (regime, assumption)."""
    plt, cfg, rows = pyplot(), result['config'], result['sweep_rows']
    cols, lines = len(cfg['assumptions']), len(cfg['sweep_regimes'])
    fig, axes = plt.subplots(lines, cols, figsize=(6.5 * cols, 4.2 * lines), squeeze=False)
    panels = [(g, a) for g in cfg['sweep_regimes'] for a in cfg['assumptions']]
    for ax, (regime, assumption) in zip(axes.ravel(), panels):
        for s in (s for s in cfg['strategies'] if s != 'fault_free'):
            pts = sorted((r['num_replicas'], r['drop_pct'], r['drop_pct_std']) for r in rows
                         if (r['assumption'], r['strategy'], r['regime']) == (assumption, s, regime))
            if pts:
                x, y, e = zip(*pts)
                ax.errorbar(x, y, yerr=e, marker='o', ms=3, capsize=2, label=s)
        ax.set_xscale('log', base=2)
        ax.set(xlabel='replicas (GPUs)', ylabel='throughput drop %')
        ax.set_title(f"{assumption} ({cfg['sweep_model']}, {regime})", fontsize=10)
        ax.grid(alpha=0.3)
    axes.ravel()[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _finite(x):
    """JSON has no infinity: unbounded 'needed' figures become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    return [_finite(v) for v in x] if isinstance(x, (list, tuple)) else x


def write(result: dict[str, Any], out_dir: str) -> list[str]:
    """Writes simulate_cluster.{json,md,png} (no .png without a sweep) under `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    result = dict(result, explanation=explain(result), paper=PAPER)
    path = os.path.join(out_dir, 'simulate_cluster')
    with open(f'{path}.json', 'w') as f:
        json.dump(_finite(result), f, indent=1, allow_nan=False)
    with open(f'{path}.md', 'w') as f:
        f.write(markdown(result))
    if not result['sweep_rows']:
        return [f'{path}.json', f'{path}.md']
    plot(result, f'{path}.png')
    return [f'{path}.json', f'{path}.md', f'{path}.png']
