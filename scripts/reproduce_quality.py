"""Validation perplexity under failures (the paper's Table 3 at our scale).

python scripts/reproduce_quality.py --config configs/small.py --seeds 2 --out DIR

Trains fault_free, mecefo under low / mid / high, mecefo_planned, drop and
ndb_naive under high
(--runs to choose; mecefo_planned:high:cap=8 adds a planned run whose helpers
hold at most 8 rows in neighbour mode), once per seed (seed s sets train.seed and fault.seed; seeds
start at --config.fault.seed), and writes DIR/quality.{json,md,png} plus each
run's metrics under DIR/seed<s>/<run>/. Failures are drawn with
--config.fault.step_time_sec seconds per step (default 60).
"""
import os
import sys

# This checkout's package, whatever else is installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a configs/*.py file.',
                                          lock_config=True)
_OUT = flags.DEFINE_string('out', None, 'Output directory.')
_SEEDS = flags.DEFINE_integer('seeds', 2, 'Seeds (initialisation + failure trace) per run.',
                              lower_bound=1)
_RUNS = flags.DEFINE_string(
    'runs', 'fault_free,mecefo:low,mecefo:mid,mecefo:high,mecefo_planned:high,drop:high,'
    'ndb_naive:high',
    'Comma-separated strategy:regime runs (fault_free has no regime); '
    'mecefo_planned:REGIME:cap=N caps its rows in neighbour mode per helper '
    '(fault.max_neighbour_rows=N), e.g. mecefo_planned:high:cap=8.')
_GRAD_EVERY = flags.DEFINE_integer(
    'grad_error_every', 10, "Measure the neighbour's gradient error on every k-th "
    'neighbour-mode step (0 disables).', lower_bound=0)
_EVALS = flags.DEFINE_integer('evals', 10, 'Validation evals per run (the curves).',
                              lower_bound=1)
flags.mark_flags_as_required(['config', 'out'])


def main(argv):
    del argv
    from mecefo_jax.command_line import start
    cfg = start(_CONFIG.value)
    from studies import quality
    base = cfg.fault.seed
    quality.reproduce_quality(cfg, _OUT.value, seeds=range(base, base + _SEEDS.value),
                              runs=quality.parse_runs(_RUNS.value),
                              grad_error_every=_GRAD_EVERY.value, evals=_EVALS.value,
                              config_name=config_flags.get_config_filename(flags.FLAGS['config']))
    print(open(f'{_OUT.value}/{quality.OUTPUT}.md').read())


if __name__ == '__main__':
    app.run(main)
