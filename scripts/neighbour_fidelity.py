"""The neighbour's gradient against the exact one, per block, under each ablation switch.

  python scripts/neighbour_fidelity.py --config configs/small.py --out DIR

See studies/neighbour_fidelity.py. Writes DIR/neighbour_fidelity.{json,md}.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a configs/*.py file.',
                                          lock_config=True)
_OUT = flags.DEFINE_string('out', None, 'Output directory.')
_SNAPSHOTS = flags.DEFINE_integer('snapshots', 4, 'Steps measured, evenly spaced.', lower_bound=1)
flags.mark_flags_as_required(['config', 'out'])


def main(argv):
    del argv
    from mecefo_jax.command_line import start
    cfg = start(_CONFIG.value)
    from studies import neighbour_fidelity as fidelity
    from studies.report import write_json
    os.makedirs(_OUT.value, exist_ok=True)
    result = fidelity.run(cfg, os.path.join(_OUT.value, 'work'), snapshots=_SNAPSHOTS.value)
    result['config'] = config_flags.get_config_filename(flags.FLAGS['config'])
    write_json(os.path.join(_OUT.value, 'neighbour_fidelity.json'), result)
    text = fidelity.markdown(result, result['config'])
    with open(os.path.join(_OUT.value, 'neighbour_fidelity.md'), 'w') as f:
        f.write(text)
    print(text)


if __name__ == '__main__':
    app.run(main)
