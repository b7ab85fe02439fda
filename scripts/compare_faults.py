"""Compare fault-tolerance strategies under seeded failure schedules.

python scripts/compare_faults.py --config configs/tiny.py --regime high --seeds 3 --out DIR

With --seeds S the comparison runs S times, with fault.seed = base, base+1, ...
(base: --config.fault.seed), each seed into DIR/seed<k>/, and DIR/compare_faults.{json,md}
report mean, std, min and max of every figure and which drop-% rankings are significant.
"""
import json
import os
import sys

# This checkout's package, whatever else is installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a configs/*.py file.',
                                          lock_config=True)
_REGIME = flags.DEFINE_enum('regime', 'high', ['low', 'mid', 'high', ''],
                            "Paper failure regime ('' uses --config.fault.events).")
_SEEDS = flags.DEFINE_integer('seeds', 1, 'Failure traces (fault.seed values) to average over.',
                              lower_bound=1)
_OUT = flags.DEFINE_string('out', None, 'Output directory.')
flags.mark_flags_as_required(['config', 'out'])


def main(argv):
    del argv
    from mecefo_jax.command_line import start
    cfg = start(_CONFIG.value)
    from studies.compare_over_seeds import compare_seeds
    base = cfg.fault.seed
    report = compare_seeds(cfg, _REGIME.value, _OUT.value,
                           seeds=range(base, base + _SEEDS.value))
    print(open(f'{_OUT.value}/compare_faults.md').read())
    print(json.dumps({k: v['throughput_drop_pct'] and v['throughput_drop_pct']['mean']
                      for k, v in report['strategies'].items()}))


if __name__ == '__main__':
    app.run(main)
