"""The GPU report: every section in order, then gpu_report.json and gpu_report.md.

`scripts/gpu_report.py` is its command line. Each section runs in its own
process with its own time limit (runner.py): the seconds below at the full
budget, fitted to an H100's timings; the sweep takes what is left, so the
whole report fits one 8-minute call. With `smoke`, every section runs at
tiny shapes (a CPU check of the whole pipeline); a budget over the full one
(a slow machine) stretches every section's seconds alike.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import time

from studies.gpu import runner, tables
from studies.gpu.child import write_json

_PKG = 'studies.gpu'
FULL_BUDGET_SEC = 450.0
SECTIONS = (
    runner.Section('environment', f'{_PKG}.environment:run', seconds=15),
    runner.Section('sweep', f'{_PKG}.sweep:run', seconds=None),
    runner.Section('step', f'{_PKG}.step:run_350m', seconds=55),
    runner.Section('step_best', f'{_PKG}.step:run_best', seconds=60),
    runner.Section('step_1b', f'{_PKG}.step:run_1b', seconds=60),
    runner.Section('profile', f'{_PKG}.profile:run', seconds=30),
    runner.Section('attention', f'{_PKG}.attention:run', seconds=20),
    runner.Section('refresh', f'{_PKG}.refresh:run', seconds=20),
    runner.Section('snapshot', f'{_PKG}.snapshot:run', seconds=90),
    runner.Section('compile', f'{_PKG}.compile:run', seconds=25),
)
# What a lease runs first (scripts/gpu_mfu.sh): the step's speed, and the neighbour's cost.
MFU_SECTIONS = ('environment', 'sweep', 'step', 'step_best', 'step_1b', 'profile')
JSON_FILE = 'gpu_report.json'
MD_FILE = 'gpu_report.md'


def select(names: str) -> tuple:
    """The sections named in a comma-separated list ('' or 'all': every one), in report order."""
    if names in ('', 'all'):
        return SECTIONS
    if names == 'mfu':
        names = ','.join(MFU_SECTIONS)
    wanted = [n.strip() for n in names.split(',') if n.strip()]
    known = [s.name for s in SECTIONS]
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(f'--sections: no section {", ".join(unknown)}; use "all", "mfu" or '
                         f'names from {", ".join(known)}.')
    return tuple(s for s in SECTIONS if s.name in wanted)


def run(out: str, *, budget_sec: float = FULL_BUDGET_SEC, smoke: bool = False,
        sections=SECTIONS, echo=print) -> dict:
    """Run `sections`, write out/gpu_report.{json,md}; returns the report dict."""
    if budget_sec <= 0:
        raise ValueError(f'--budget_sec={budget_sec}: give a positive number of seconds.')
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    started = datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')
    start = time.monotonic()
    stretch = max(1.0, budget_sec / FULL_BUDGET_SEC)
    sections = [dataclasses.replace(s, seconds=None if s.seconds is None else s.seconds * stretch)
                for s in sections]
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
