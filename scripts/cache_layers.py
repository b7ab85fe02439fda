"""What each relaunch cache saves a recovery: the crash drill's memory job per cache layer.

See tests/drills/cache_layers.py (the variants) and docs/launch.md ("Caches").

  python scripts/cache_layers.py --config configs/tiny.py --out runs/cache_layers --repeats 3
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from studies.report import script_command  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A configs/*.py file.', lock_config=True)
_OUT = flags.DEFINE_string('out', None, 'Output directory (cache_layers.json).')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Runs of each variant, interleaved.', lower_bound=1)
_WORKERS = flags.DEFINE_integer('workers', 4, 'Worker processes of each job.')
_NODES = flags.DEFINE_integer('nodes', 4, 'Simulated Ray nodes on this machine.', lower_bound=1)
_STEPS = flags.DEFINE_integer('steps', 40, 'Training steps of each job.')
_KILL = flags.DEFINE_integer('kill_step', 15, 'Worker 1 is SIGKILLed right after its first '
                             'snapshot at or after this step, once every keeper holds it.')
_VARIANTS = flags.DEFINE_list('variants', None, "Only these variants, 'all' among them (default: every one).")
_RETURN = flags.DEFINE_integer('return_after', 10, 'Steps until the killed worker rejoins.')
flags.mark_flags_as_required(['config', 'out'])


def main(argv):
    del argv
    from mecefo_jax.config.resolve import start
    cfg = _CONFIG.value
    cfg.train.steps = _STEPS.value
    cfg.train.eval_every = 0
    cfg = start(cfg, cpu_devices=lambda c: _WORKERS.value * c.launch.local_devices)
    from tests.drills.cache_layers import run
    if os.path.isdir(_OUT.value) and os.listdir(_OUT.value):
        sys.exit(f'--out {_OUT.value} is not empty: its jobs would resume from what is there.')
    report = run(cfg, os.path.abspath(_OUT.value), repeats=_REPEATS.value, workers=_WORKERS.value,
                 nodes=_NODES.value, kill_step=_KILL.value, return_after=_RETURN.value,
                 **({'variants': tuple(_VARIANTS.value)} if _VARIANTS.value else {}))
    report['command'] = script_command()
    with open(os.path.join(_OUT.value, 'cache_layers.json'), 'w') as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report['table'], indent=2))


if __name__ == '__main__':
    app.run(main)
