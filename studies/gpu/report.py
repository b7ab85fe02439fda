"""The GPU report: every section in order, then gpu_report.json and gpu_report.md.

`scripts/gpu_report.py` is its command line. Each section runs in its own
process with its own time limit (runner.py): `SECONDS` at the full budget,
fitted to an H100's timings, the sweep taking what is left, so the report
fits one 8-minute call; a larger budget (a slow machine) stretches them
alike. `smoke`: tiny shapes, in this process (a CPU check of the pipeline).
`tables` is the one markdown writer of the report and of the sweep.
"""
import dataclasses
import datetime
import os
import time

from studies.gpu import runner
from studies.report import fmt, markdown_table

FULL_BUDGET_SEC = 450.0
SECONDS = {'environment': 15, 'sweep': None, 'step': 55, 'step_best': 60, 'step_1b': 60,
           'profile': 30, 'attention': 20, 'snapshot': 90}
# Section NAME runs studies/gpu/NAME.py's `run`; step_best and step_1b are step.py's too.
SECTIONS = tuple(runner.Section(name, f"studies.gpu.{name.split('_')[0]}:run", seconds)
                 for name, seconds in SECONDS.items())
# What a lease runs first (scripts/gpu_mfu.sh): the step's speed, and the neighbour's cost.
MFU_SECTIONS = ('environment', 'sweep', 'step', 'step_best', 'step_1b', 'profile')
JSON_FILE, MD_FILE = 'gpu_report.json', 'gpu_report.md'


def select(names: str) -> tuple:
    """The sections named in a comma-separated list ('' or 'all': every one), in report order."""
    if names in ('', 'all'):
        return SECTIONS
    wanted = [n.strip() for n in (','.join(MFU_SECTIONS) if names == 'mfu' else names).split(',')]
    if unknown := [n for n in wanted if n and n not in SECONDS]:
        raise ValueError(f'--sections: no section {", ".join(unknown)}; use "all", "mfu" or '
                         f'names from {", ".join(SECONDS)}.')
    return tuple(s for s in SECTIONS if s.name in wanted)


def _text(value) -> str:
    return fmt(value, '.4g') if isinstance(value, float) else str(value).replace('\n', ' ').replace('|', '/')[:120]


def _records(value) -> list:
    """[(name, record)] where `value` is a list or dict of records holding some scalar, else []."""
    items = list(enumerate(value)) if isinstance(value, list) else list(value.items())
    return items if items and all(isinstance(r, dict) for _, r in items) and any(
        not isinstance(v, (dict, list)) for _, r in items for v in r.values()) else []


def tables(figures: dict) -> list[str]:
    """Figures as markdown: their scalars (nested names dotted) in one table, then a table
    per list or dict of records (one row a record, its scalars as columns)."""
    scalars, lines = [], []

    def walk(name, value):
        if isinstance(value, (dict, list)) and (items := _records(value)):
            columns = list(dict.fromkeys(k for _, r in items for k, v in r.items()
                                         if not isinstance(v, (dict, list))))
            lines.extend(['', markdown_table((name, *columns), [
                (key, *(_text(r.get(c, '')) for c in columns)) for key, r in items])])
        elif isinstance(value, dict):
            for key, v in value.items():
                walk(f'{name}.{key}' if name else key, v)
        elif not isinstance(value, list) or len(value) <= 8:
            scalars.append((name, _text(value)))
    walk('', figures)
    return ([markdown_table(('figure', 'value'), scalars)] if scalars else []) + lines


def markdown(report: dict) -> str:
    meta = report['meta']
    lines = [f"# GPU report: {meta['started_utc']}, {'smoke' if meta['smoke'] else 'full'}, "
             f"{meta['wall_sec']:.0f} s of {meta['budget_sec']:.0f} s", '']
    for name, r in report['sections'].items():
        figures = r.get('partial', r) if r['status'] in ('failed', 'timeout') else r
        lines += [f"## {name}: {r['status']} ({fmt(r.get('wall_sec'), '.1f')} s of "
                  f"{fmt(r.get('limit_sec'), '.0f')} s, {fmt(r.get('cpu_sec'), '.1f')} CPU s)",
                  '', *tables({k: v for k, v in figures.items() if k != 'traceback'}), '']
    return '\n'.join(lines)


def run(out: str, *, budget_sec: float = FULL_BUDGET_SEC, smoke: bool = False,
        sections=SECTIONS, echo=print) -> dict:
    """Run `sections`, write out/gpu_report.{json,md}; returns the report dict."""
    if budget_sec <= 0:
        raise ValueError(f'--budget_sec={budget_sec}: give a positive number of seconds.')
    out, start = os.path.abspath(out), time.monotonic()
    os.makedirs(out, exist_ok=True)
    started = datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')
    stretch = max(1.0, budget_sec / FULL_BUDGET_SEC)
    sections = [dataclasses.replace(s, seconds=s.seconds and s.seconds * stretch) for s in sections]
    params = {'smoke': smoke, 'in_process': smoke, 'out': out,
              'xla_cache_dir': os.path.join(out, 'xla_cache')}
    results = runner.run_sections(sections, params, os.path.join(out, 'sections'),
                                  budget_sec=budget_sec, echo=echo)
    report = {'meta': {'started_utc': started, 'smoke': smoke, 'budget_sec': budget_sec,
                       'wall_sec': time.monotonic() - start, 'order': [s.name for s in sections]},
              'sections': results}
    runner.save(os.path.join(out, JSON_FILE), report)
    with open(os.path.join(out, MD_FILE), 'w') as f:
        f.write(markdown(report))
    echo(f'wrote {os.path.join(out, JSON_FILE)} and {MD_FILE} in {report["meta"]["wall_sec"]:.0f} s')
    return report
