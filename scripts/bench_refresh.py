"""Full SVD against the cheap subspace refresh of V: see studies/refresh_bench.py.

python scripts/bench_refresh.py --config configs/llama_7b.py --out DIR
"""
import os
import sys

# This checkout's package, whatever else is installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a configs/*.py file.')
_OUT = flags.DEFINE_string('out', None, 'Output directory for bench_refresh.{json,md}.')
_FULL_REPEATS = flags.DEFINE_integer('full_repeats', 3, 'Timed full SVDs per shape, median '
                                     'reported (at 7B each takes many minutes: use 1).',
                                     lower_bound=1)
_CHEAP_REPEATS = flags.DEFINE_integer('cheap_repeats', 5, 'Timed subspace refreshes per shape.',
                                      lower_bound=1)
flags.mark_flags_as_required(['config', 'out'])


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    from studies import refresh_bench
    result = refresh_bench.run(_CONFIG.value, _OUT.value, full_repeats=_FULL_REPEATS.value,
                               cheap_repeats=_CHEAP_REPEATS.value)
    print(refresh_bench.markdown(result))


if __name__ == '__main__':
    app.run(main)
