"""What every experiment report shares: number formatting, seeds, tables, atomic JSON, plots.

The experiments write JSON (what the run measured) and markdown tables made
by `markdown_table` alone; what the figures mean is written once, by hand, in
docs/. A missing figure reads 'n/a' everywhere (intervals over seeds:
`studies/intervals.py`).
"""
import math
from collections.abc import Sequence


def fmt(value, spec: str = '.2f', missing: str = 'n/a') -> str:
    """`value` formatted with `spec`, or `missing` for None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, spec)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    """A markdown table: one header row, then a row per entry of `rows` (cells as str)."""
    lines = ['| ' + ' | '.join(headers) + ' |', '|' + '---|' * len(headers)]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f'markdown_table: a row of {len(row)} cells under {len(headers)} '
                             f'headers ({list(headers)}): {list(row)}')
        lines.append('| ' + ' | '.join(str(cell) for cell in row) + ' |')
    return '\n'.join(lines)


def script_command() -> str:
    """The running script's command line, named from the repository's root (as results cite
    it, and as tests/scripts_test.py checks that it still exists)."""
    import os
    import shlex
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return shlex.join(['python', os.path.relpath(os.path.abspath(sys.argv[0]), root), *sys.argv[1:]])


def distinct_seeds(seeds) -> list[int]:
    """`seeds` as ints, at least one and none repeated (a repeat would double-count it)."""
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f'--seeds must give at least one distinct seed, got {seeds}.')
    return seeds


def write_json(path: str, value) -> None:
    """`value` as JSON at `path`, atomically: a temporary file, then a rename, so an
    interrupted write never leaves a partial file that a resumed run would trust."""
    import json
    import os
    tmp = f'{path}.{os.getpid()}.tmp'
    with open(tmp, 'w') as f:
        json.dump(value, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (imported only to draw)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt
