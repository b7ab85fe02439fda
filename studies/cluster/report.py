"""The cluster projection's outputs: JSON, markdown tables and the size plot.

`write` adds to `sim.monte_carlo`'s result the figures behind the ordering
against the paper (`explain`) and writes simulate_cluster.json, .md (tables
only, by `studies.report.markdown_table`) and .png. What the figures mean,
and what they say about the paper's ordering, is in docs/cluster.md.
`PAPER` holds the paper's Table 2: the only figures here not computed from
the run. Pure numpy + matplotlib.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any

from mecefo_jax.faults import costs as costs_lib
from studies.cluster import recovery as recovery_lib
from studies.cluster import traces as traces_lib
from studies.report import fmt, markdown_table, pyplot

OUTPUT_JSON, OUTPUT_MD, OUTPUT_PNG = ('simulate_cluster.json', 'simulate_cluster.md',
                                      'simulate_cluster.png')
# The paper's Table 2 (MeCeFO, NeurIPS 2025; 32 A100s = 4 nodes x 8): MeCeFO
# throughput in k tokens/s, failure-free and under `high`, and the drops of
# its baselines under `high`. Our sources give no low / mid throughputs.
PAPER = {
    '350M': {'none': 1199.0, 'high': 1186.0, 'high_drop_pct': 1.07,
             'bamboo_high_drop_pct': 7.04, 'oobleck_high_drop_pct': 10.14},
    '1B': {'none': 471.0, 'high': 457.0, 'high_drop_pct': 2.98,
           'bamboo_high_drop_pct': 8.21, 'oobleck_high_drop_pct': 13.87},
    '7B': {'none': 111.1, 'high': 106.5, 'high_drop_pct': 4.18,
           'bamboo_high_drop_pct': 20.84, 'oobleck_high_drop_pct': 28.09},
}


def index_rows(rows):
    return {(r['assumption'], r['model'], r['regime'], r['strategy'], r['num_replicas']): r
            for r in rows}


def needed_mttr_hours(p: float, *, mtbf_hours: float, num_replicas: int,
                      rate_scaling: str) -> float:
    """The MTTR at which >= 1 replica is down a fraction `p` of the time.

    Stationary, ignoring the cap: the failed replicas are an M/M/inf queue,
    P(none down) = exp(-MTTR/MTBF) with the cluster MTBF actually used.
    """
    if not 0 <= p < 1:
        return math.inf
    mtbf = mtbf_hours * (traces_lib.CALIBRATION_REPLICAS / num_replicas
                         if rate_scaling == 'per_replica' else 1.0)
    return -mtbf * math.log(1 - p)


def explain(result: dict[str, Any]) -> dict[str, Any]:
    """Per (assumption, model) under `high`: what MeCeFO's drop is made of.

    With p the time fraction with >= 1 replica down and r the MeCeFO step
    over the fault-free one while down, the drop is about p (1 - 1/r) plus
    recovery time. Matching the paper's drop D needs r* = 1 / (1 - D/p) at
    our p, or p* = D / (1 - 1/r) at our r, i.e. the MTTR of
    `needed_mttr_hours(p*)` at the paper's MTBF.
    """
    cfg = result['config']
    idx = index_rows(result['rows'])
    n, out = cfg['replicas'], {}
    if 'high' not in cfg['regimes']:
        return out
    mtbf, mttr = traces_lib.REGIMES['high']
    for assumption in cfg['assumptions']:
        for model in cfg['models']:
            rows = {s: idx.get((assumption, model, 'high', s, n))
                    for s in cfg['strategies'] if s != 'fault_free'}
            mecefo = rows.get('mecefo')
            if mecefo is None or model not in PAPER:
                continue
            p, r = mecefo['time_frac_any_down'], mecefo['step_ratio_when_down']
            paper_d = PAPER[model]['high_drop_pct'] / 100
            need_p = min(1.0, paper_d / (1 - 1 / r)) if r > 1 else math.inf
            drops = {s: row['drop_pct'] for s, row in rows.items() if row is not None}
            out[f'{assumption}/{model}'] = {
                'assumption': assumption, 'model': model, 'mtbf_hours': mtbf, 'mttr_hours': mttr,
                'time_frac_any_down': p, 'mecefo_step_ratio_when_down': r,
                'mecefo_drop_pct': mecefo['drop_pct'],
                'first_order_drop_pct': 100 * p * (1 - 1 / r),
                'paper_drop_pct': 100 * paper_d,
                'needed_step_ratio_for_paper_drop': 1 / (1 - paper_d / p) if p > paper_d
                else math.inf,
                'needed_time_frac_down_for_paper_drop': need_p,
                'needed_mttr_hours_at_paper_mtbf': needed_mttr_hours(
                    need_p, mtbf_hours=mtbf, num_replicas=n, rate_scaling=cfg['rate_scaling']),
                'ordering': sorted(drops, key=drops.get), 'drops_pct': drops,
            }
    return out


def paper_implied_mfu(shape: costs_lib.ModelShape, tokens_per_sec: float, gpus: int, *,
                      seq_len: int, peak_flops: float = costs_lib.PEAK_FLOPS_A100_BF16,
                      **flop_kw) -> float:
    """The MFU at which the paper's fault-free throughput would run these FLOPs."""
    flops = costs_lib.flops_per_token(shape, mode='normal', seq_len=seq_len, **flop_kw)
    return tokens_per_sec * flops / (gpus * peak_flops) if math.isfinite(flops) else math.nan


def _drop(row, digits=2) -> str:
    return 'n/a' if row is None else f"{row['drop_pct']:.{digits}f} ± {row['drop_pct_std']:.{digits}f}"


def _table2(result) -> str:
    cfg, idx, n = result['config'], index_rows(result['rows']), result['config']['replicas']
    others = [s for s in cfg['strategies'] if s != 'fault_free']
    rows = []
    for assumption in cfg['assumptions']:
        for model in cfg['models']:
            for regime in cfg['regimes']:
                get = lambda s: idx.get((assumption, model, regime, s, n))  # noqa: E731
                if get('mecefo') is None:
                    continue
                paper = PAPER.get(model, {})
                paper_drop = 0.0 if regime == 'none' else paper.get(f'{regime}_drop_pct')
                rows.append([assumption, model, regime, fmt(paper.get(regime), '.1f'),
                             fmt(paper_drop, '.2f'),
                             f"{get('mecefo')['fault_free_tokens_per_sec'] / 1e3:.1f}",
                             f"{get('mecefo')['tokens_per_sec'] / 1e3:.1f}"]
                            + [_drop(get(s)) for s in others])
    return markdown_table(['assumption', 'model', 'regime', 'paper k tok/s',
                           'paper drop %', 'fault-free k tok/s', 'mecefo k tok/s']
                          + [f'{s} drop %' for s in others], rows)


def _explanation(expl) -> str:
    keys = ('time_frac_any_down', 'mecefo_step_ratio_when_down', 'first_order_drop_pct',
            'mecefo_drop_pct', 'paper_drop_pct', 'needed_step_ratio_for_paper_drop',
            'needed_time_frac_down_for_paper_drop', 'needed_mttr_hours_at_paper_mtbf',
            'mttr_hours')
    return markdown_table(('assumption', 'model') + keys + ('ordering',),
                          [[e['assumption'], e['model']]
                           + [fmt(e[k], '.4g') for k in keys] + [' < '.join(e['ordering'])]
                           for e in expl.values()])


def _sweep(result) -> str:
    cfg, rows = result['config'], result['sweep_rows']
    idx, strategies = index_rows(rows), [s for s in cfg['strategies'] if s != 'fault_free']
    cells = []
    for regime in cfg['sweep_regimes']:
        for assumption in cfg['assumptions']:
            for n in sorted({r['num_replicas'] for r in rows}):
                get = lambda s: idx.get((assumption, cfg['sweep_model'], regime, s, n))  # noqa: E731
                first = get(strategies[0])
                if first is not None:
                    cells.append([regime, assumption, n, first['seeds'],
                                  f"{100 * first['time_frac_any_down']:.1f}",
                                  f"{first['mean_replicas_down']:.2f}"]
                                 + [_drop(get(s), 1) for s in strategies])
    return markdown_table(['regime', 'assumption', 'n', 'seeds', '>=1 down %',
                           'mean down'] + [f'{s} drop %' for s in strategies], cells)


def _costs(result) -> str:
    cfg, rows = result['config'], []
    for name, t in result['cost_tables'].items():
        mfu = (paper_implied_mfu(costs_lib.PAPER_MODELS[name], PAPER[name]['none'] * 1e3,
                                 traces_lib.CALIBRATION_REPLICAS, seq_len=cfg['seq_len'],
                                 rank=cfg['rank'], recompute_ffn=cfg['recompute_ffn'],
                                 causal_scores=cfg['causal_scores'],
                                 peak_flops=cfg['peak_tflops'] * 1e12)
               if name in PAPER else None)
        r = t['ratios']
        rows.append([name, t['source'], *(f'{r[k]:.3f}' for k in
                                          ('ndb_naive', 'mecefo', 'mecefo_per_batch', 'plain_dp')),
                     f"{t['step_sec']:.4f}", t['step_sec_source'],
                     f"{cfg['global_batch'] * cfg['seq_len'] / t['step_sec'] / 1e3:.1f}",
                     fmt(mfu, '.2f'), f"{t['refresh_sec']:.3f}", f"{t['refresh_split_sec']:.3f}"])
    return markdown_table(('model', 'source', 'ndb_naive', 'mecefo', 'mecefo_per_batch',
                           'plain_dp', 'fault-free step s', 'step source', 'fault-free k tok/s',
                           'paper-implied MFU', 'refresh s', 'refresh s split over live'), rows)


def _recovery(result) -> str:
    rec = result['recovery']
    return markdown_table(('entry', 'recovery s', 'restore s', 'lost steps', 'source'),
                          [[name, f"{rec[name]['recovery_sec']:g}", f"{rec[name]['restore_sec']:g}",
                            fmt(rec[name]['lost_steps'], 'g', missing='since last checkpoint'),
                            rec[name]['source']] for name in recovery_lib.ENTRIES])


def markdown(result: dict[str, Any]) -> str:
    """The run's tables, one section each (what they mean: docs/cluster.md)."""
    expl = result.get('explanation') or explain(result)
    sections = [(f"Drop % at {result['config']['replicas']} replicas (mean ± std over seeds)",
                 _table2(result))]
    if expl:
        sections.append(("MeCeFO under `high` against the paper's drop", _explanation(expl)))
    if result['sweep_rows']:
        sections.append((f"Drop % against cluster size ({result['config']['sweep_model']})",
                         _sweep(result)))
    sections += [('Cost tables (per device; ratios over one normal shard)', _costs(result)),
                 ('Recovery table (per live-set change)', _recovery(result))]
    return '\n\n'.join(['# Cluster projection'] + [f'## {title}\n\n{table}'
                                                  for title, table in sections]) + '\n'


def plot(result: dict[str, Any], path: str) -> bool:
    """Drop % against cluster size, one panel per (regime, assumption)."""
    rows = result['sweep_rows']
    if not rows:
        return False
    plt = pyplot()
    cfg = result['config']
    panels = [(g, a) for g in cfg['sweep_regimes'] for a in cfg['assumptions']]
    cols, lines = len(cfg['assumptions']), len(panels) // len(cfg['assumptions'])
    fig, axes = plt.subplots(lines, cols, figsize=(6.5 * cols, 4.2 * lines), squeeze=False)
    for ax, (regime, assumption) in zip(axes.ravel(), panels):
        for s in cfg['strategies']:
            pts = sorted((r['num_replicas'], r['drop_pct'], r['drop_pct_std']) for r in rows
                         if r['assumption'] == assumption and r['strategy'] == s
                         and r['regime'] == regime)
            if pts and s != 'fault_free':
                x, y, e = zip(*pts)
                ax.errorbar(x, y, yerr=e, marker='o', ms=3, capsize=2, label=s)
        ax.set_xscale('log', base=2)
        ax.set_xlabel('replicas (GPUs)')
        ax.set_ylabel('throughput drop %')
        ax.set_title(f"{assumption} ({cfg['sweep_model']}, {regime})", fontsize=10)
        ax.grid(alpha=0.3)
    axes.ravel()[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _finite(x):
    """JSON has no infinity: unbounded 'needed' figures become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def write(result: dict[str, Any], out_dir: str) -> dict[str, str]:
    """Writes simulate_cluster.{json,md,png} under `out_dir`; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    result = dict(result, explanation=explain(result), paper=PAPER)
    paths = {k: os.path.join(out_dir, name) for k, name in
             (('json', OUTPUT_JSON), ('md', OUTPUT_MD), ('png', OUTPUT_PNG))}
    with open(paths['json'], 'w') as f:
        json.dump(_finite(result), f, indent=1, allow_nan=False)
    with open(paths['md'], 'w') as f:
        f.write(markdown(result))
    if not plot(result, paths['png']):
        del paths['png']
    return paths
