"""Compile time of a new topology's train step against depth: see studies/compile_time.py.

  python scripts/bench_compile.py --config configs/small.py --depths 2,24 --out /tmp/compile
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a configs/*.py file.',
                                          lock_config=True)
_DEPTHS = flags.DEFINE_list('depths', ['2', '24'], 'Comma-separated layer counts.')
_OUT = flags.DEFINE_string('out', None, 'Directory for bench_compile.json.')
flags.mark_flags_as_required(['config'])


def main(argv):
    del argv
    from mecefo_jax.config.resolve import start
    cfg = start(_CONFIG.value)
    try:
        depths = [int(d) for d in _DEPTHS.value]
    except ValueError:
        sys.exit(f'--depths={",".join(_DEPTHS.value)}: use comma-separated layer counts, '
                 'e.g. --depths=2,24.')
    from studies import compile_time as bench_compile
    result = bench_compile.run(cfg, depths, _OUT.value)
    for row in result['rows']:
        print(f"scan_layers={row['scan_layers']!s:5} layers={row['num_layers']:3d} "
              f"compile {row['compile_sec']:7.2f} s  x{row['ratio_to_shallowest']:.2f}")


if __name__ == '__main__':
    app.run(main)
