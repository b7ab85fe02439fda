"""Compare fault-tolerance strategies under one seeded failure schedule.

python scripts/compare_faults.py --config configs/tiny.py --regime high --out DIR
"""
import json

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a configs/*.py file.')
_REGIME = flags.DEFINE_enum('regime', 'high', ['low', 'mid', 'high', ''],
                            "Paper failure regime ('' uses --config.fault.events).")
_OUT = flags.DEFINE_string('out', None, 'Output directory.')
flags.mark_flags_as_required(['config', 'out'])


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    from mecefo_jax.sharding import simulate_cpu_devices
    simulate_cpu_devices(int(_CONFIG.value.mesh.num_cpu_devices))
    from mecefo_jax.compare import compare
    report = compare(_CONFIG.value, _REGIME.value, _OUT.value)
    print(open(f'{_OUT.value}/compare_faults.md').read())
    print(json.dumps({k: v['throughput_drop_pct'] for k, v in report['strategies'].items()}))


if __name__ == '__main__':
    app.run(main)
