"""`python -m mecefo_jax.launch --nprocs N --config CFG --workdir DIR [--config.x=y ...]`.

Starts N training workers (one `jax.distributed` process each) and one
snapshot keeper per worker, and carries the job through worker failures:
see `mecefo_jax/launch/supervisor.py`. Config overrides must use the
`--config.section.field=value` form; they reach every worker unchanged.
"""
import json
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A configs/*.py file.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'The job directory (metrics, launch/ reports).')
_NPROCS = flags.DEFINE_integer('nprocs', None, 'Worker processes (one per host).')
flags.mark_flags_as_required(['config', 'workdir', 'nprocs'])


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    from mecefo_jax.launch.supervisor import Launcher
    config_args = [f'--config={config_flags.get_config_filename(flags.FLAGS["config"])}'] + [
        a for a in sys.argv[1:] if a.startswith('--config.')]
    summary = Launcher(_CONFIG.value, config_args, _WORKDIR.value, _NPROCS.value).run()
    print(json.dumps(summary, indent=2, default=str))


if __name__ == '__main__':
    app.run(main)
