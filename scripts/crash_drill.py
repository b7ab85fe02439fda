"""Real crashes on one machine, recovered from memory, from disk and simulated.

See tests/drills/crash_drill.py (the jobs) and docs/crash_drill.md (what the figures mean).

  python scripts/crash_drill.py --config configs/small.py --out runs/drill
  python scripts/crash_drill.py --config configs/tiny.py --nodes 4 --out runs/drill_nodes
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from studies.report import script_command  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A configs/*.py file.',
                                          lock_config=True)
_OUT = flags.DEFINE_string('out', None, 'Output directory (crash_drill.json / .md).')
_WORKERS = flags.DEFINE_integer('workers', 4, 'Worker processes of the memory and disk jobs.')
_NODES = flags.DEFINE_integer('nodes', 1, 'Simulated Ray nodes on this machine the jobs run on; '
                              'with 2 or more, a node-loss job runs too.', lower_bound=1)
_STEPS = flags.DEFINE_integer('steps', 40, 'Training steps of each job.')
_KILL = flags.DEFINE_integer(
    'kill_step', 15, 'Worker 1 is SIGKILLed at this step (disk), or right after its first '
    'snapshot at or after it once every keeper holds that snapshot (memory): a measured '
    'way back, with the expected loss of a random kill reported beside it (interval / 2).')
_RETURN = flags.DEFINE_integer('return_after', 10, 'Steps until the killed worker rejoins.')
_CKPT = flags.DEFINE_integer('checkpoint_every', 10, 'Orbax period of the disk job and of the '
                             'random-kill jobs (steps).')
_RANDOM = flags.DEFINE_integer('random_kills', 3, 'Jobs whose worker 1 is SIGKILLed at a '
                               'uniformly random step under the default snapshot cadence '
                               '(0: none).', lower_bound=0)
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the random kill steps.')
flags.mark_flags_as_required(['config', 'out'])



def main(argv):
    del argv
    from mecefo_jax.config.resolve import start
    cfg = _CONFIG.value
    cfg.train.steps = _STEPS.value  # the drill's own flags set these two fields
    cfg.train.eval_every = 0
    # Overrides included: the launcher hands them to every worker. The
    # simulated run runs here, on the devices all the workers together have.
    cfg = start(cfg, cpu_devices=lambda c: _WORKERS.value * c.launch.local_devices)
    from tests.drills.crash_drill import run_drill
    path = config_flags.get_config_filename(flags.FLAGS['config'])  # recorded in the report
    run_drill(cfg, os.path.abspath(path), os.path.abspath(_OUT.value), workers=_WORKERS.value,
              nodes=_NODES.value, kill_step=_KILL.value, return_after=_RETURN.value,
              checkpoint_every=_CKPT.value, random_kills=_RANDOM.value, seed=_SEED.value,
              command=script_command())
    print(open(os.path.join(_OUT.value, 'crash_drill.md')).read())


if __name__ == '__main__':
    app.run(main)
