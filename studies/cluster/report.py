"""Reports of the cluster simulator: JSON, markdown and the size plot.

This module writes `sim.monte_carlo`'s result (`write`): the JSON with the
computed explanation (`explanation`) and the paper's figures, the markdown
(`report_markdown`), and the plot of drop % against cluster size (`plot`).
Pure numpy + matplotlib.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any

from studies.cluster.explanation import PAPER, explain
from studies.cluster.report_markdown import markdown
from studies.report import pyplot

OUTPUT_JSON, OUTPUT_MD, OUTPUT_PNG = ('simulate_cluster.json', 'simulate_cluster.md',
                                      'simulate_cluster.png')


def plot(result: dict[str, Any], path: str) -> bool:
    """Drop % against cluster size, one panel per (reading, assumption)."""
    rows = result['sweep_rows']
    if not rows:
        return False
    plt = pyplot()
    cfg = result['config']
    panels = [(g, r, a) for g in cfg['sweep_regimes'] for r in cfg['readings']
              for a in cfg['assumptions']]
    cols, lines = len(cfg['assumptions']), len(panels) // len(cfg['assumptions'])
    fig, axes = plt.subplots(lines, cols, figsize=(6.5 * cols, 4.2 * lines), squeeze=False)
    for ax, (regime, reading, assumption) in zip(axes.ravel(), panels):
        for s in cfg['strategies']:
            if s == 'fault_free':
                continue
            pts = sorted((r['num_replicas'], r['drop_pct'], r['drop_pct_std']) for r in rows
                         if r['reading'] == reading and r['assumption'] == assumption
                         and r['strategy'] == s and r['regime'] == regime)
            if pts:
                x, y, e = zip(*pts)
                ax.errorbar(x, y, yerr=e, marker='o', ms=3, capsize=2, label=s)
        ax.set_xscale('log', base=2)
        ax.set_xlabel('replicas (GPUs)')
        ax.set_ylabel('throughput drop %')
        ax.set_title(f"reading {reading}, {assumption} ({cfg['sweep_model']}, "
                     f"{regime})", fontsize=10)
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
