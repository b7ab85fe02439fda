"""`python -m mecefo_jax.launch --nprocs N --config CFG --workdir DIR [--config.x=y ...]`.

Starts N training workers (one `jax.distributed` process each) and one
snapshot keeper per worker, and carries the job through worker failures:
see `mecefo_jax/launch/supervisor.py`. The config and its
`--config.section.field=value` overrides are resolved here, once; every
worker of every generation loads that resolved config (`launch/config.json`).
"""
import json
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A configs/*.py file.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'The job directory (metrics, launch/ reports).')
_NPROCS = flags.DEFINE_integer('nprocs', None, 'Worker processes (one per host).', lower_bound=1)
flags.mark_flags_as_required(['config', 'workdir', 'nprocs'])


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    from mecefo_jax.launch.supervisor import Launcher
    from mecefo_jax.settings import resolve_or_exit
    cfg = resolve_or_exit(_CONFIG.value)
    from mecefo_jax.launch.exits import WorkerProgramError
    from mecefo_jax.preemption import EXIT_PREEMPTED
    from mecefo_jax.workdir_lock import WorkdirLock
    with WorkdirLock(_WORKDIR.value):  # one job per workdir
        try:
            summary = Launcher(cfg, _WORKDIR.value, _NPROCS.value).run()
        except WorkerProgramError:  # the launcher has shown the worker's traceback
            sys.exit(1)
    print(json.dumps(summary, indent=2, default=str))
    if summary['preempted_at'] is not None:
        if summary['unsaved_workers']:
            print(f"preempted: workers {summary['unsaved_workers']} did not save within "
                  'launch.stop_timeout_sec; rerun the same command to resume from the newest '
                  'checkpoint.', flush=True)
        else:
            print(f"preempted: saved step {summary['preempted_at']}; rerun the same command "
                  'to resume there.', flush=True)
        sys.exit(EXIT_PREEMPTED)


if __name__ == '__main__':
    app.run(main)
