"""The GPU report: every section in order, then gpu_report.json and gpu_report.md.

`scripts/gpu_report.py` is its command line. Each section runs in its own
process with a share of the budget (weights below, favouring the step);
see runner.py. With `smoke`, every section runs at tiny shapes (a CPU
check of the whole pipeline).
"""
from __future__ import annotations

import datetime
import os
import time

from studies.gpu import runner, tables
from studies.gpu.child import write_json

_PKG = 'studies.gpu'
SECTIONS = (
    runner.Section('environment', f'{_PKG}.environment:run', weight=0.5),
    runner.Section('step', f'{_PKG}.step:run_350m', weight=3.5),
    runner.Section('step_1b', f'{_PKG}.step:run_1b', weight=2.0),
    runner.Section('attention', f'{_PKG}.attention:run', weight=0.6),
    runner.Section('refresh', f'{_PKG}.refresh:run', weight=1.6),
    runner.Section('snapshot', f'{_PKG}.snapshot:run', weight=1.8),
    runner.Section('compile', f'{_PKG}.compile:run', weight=1.0),
)
JSON_FILE = 'gpu_report.json'
MD_FILE = 'gpu_report.md'


def run(out: str, *, budget_sec: float = 540.0, smoke: bool = False, sections=SECTIONS,
        echo=print) -> dict:
    """Run `sections`, write out/gpu_report.{json,md}; returns the report dict."""
    if budget_sec <= 0:
        raise ValueError(f'--budget_sec={budget_sec}: give a positive number of seconds.')
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    started = datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')
    start = time.monotonic()
    params = {'smoke': smoke, 'out': out, 'xla_cache_dir': os.path.join(out, 'xla_cache')}
    results = runner.run_sections(sections, params, os.path.join(out, 'sections'),
                                  budget_sec=budget_sec, echo=echo)
    report = {'meta': {'started_utc': started, 'smoke': smoke, 'budget_sec': budget_sec,
                       'wall_sec': time.monotonic() - start,
                       'order': [s.name for s in sections]},
              'sections': results}
    write_json(os.path.join(out, JSON_FILE), report)
    with open(os.path.join(out, MD_FILE), 'w') as f:
        f.write(tables.markdown(report))
    echo(f'wrote {os.path.join(out, JSON_FILE)} and {MD_FILE} '
         f'in {report["meta"]["wall_sec"]:.0f} s')
    return report
