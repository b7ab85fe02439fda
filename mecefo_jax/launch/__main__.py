"""`python -m mecefo_jax.launch --nprocs N --config CFG --workdir DIR [--address ADDR] [--config.x=y ...]`.

Runs N training workers and a keeper per worker on Ray, through worker and node failures
(`launcher`), joining the cluster at `--address` (or `RAY_ADDRESS`) or starting a local
one that outlives it (`cluster`). The config is resolved here, once. Rerunning the same
command after the launcher died resumes from its keepers; `--cleanup` instead removes what
a job that will not be rerun left: its keepers, their shared memory, its local cluster.
"""
import json
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A configs/*.py file.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'The job directory (metrics, launch/ reports).')
_NPROCS = flags.DEFINE_integer('nprocs', None, 'Worker processes (one per host).', lower_bound=1)
_ADDRESS = flags.DEFINE_string(
    'address', None, "An existing Ray cluster to run on (host:port of its head, or 'auto'); "
    'default: RAY_ADDRESS, else a local cluster started for this workdir.')
_CLEANUP = flags.DEFINE_bool('cleanup', False, "Remove this workdir's keepers and local Ray "
                             'cluster left by a launcher that was killed, instead of running.')
flags.mark_flags_as_required(['workdir'])


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    if _CLEANUP.value:
        _cleanup()
        return
    if _CONFIG.value is None or _NPROCS.value is None:
        sys.exit('launch: --config and --nprocs are required (or --cleanup).')
    from mecefo_jax.config.resolve import resolve_or_exit
    cfg = resolve_or_exit(_CONFIG.value)
    from mecefo_jax.host.workdir_lock import WorkdirError, WorkdirLock
    from mecefo_jax.launch import cluster
    from mecefo_jax.launch.generation import WorkerProgramError
    from mecefo_jax.launch.launcher import Launcher
    from mecefo_jax.training.preemption import EXIT_PREEMPTED
    try:
        lock = WorkdirLock(_WORKDIR.value).acquire()  # one job per workdir
    except WorkdirError as error:
        sys.exit(f'launch: {error}')
    with lock:
        try:  # the workers and their batch split are checked before any cluster is touched
            launcher = Launcher(cfg, _WORKDIR.value, _NPROCS.value)
        except ValueError as error:
            sys.exit(f'launch: {error}')
        joined = launcher.joined = cluster.join(_ADDRESS.value, _WORKDIR.value,
                                                object_store_mb=cfg.launch.object_store_mb)
        try:
            summary = launcher.run()
        except WorkerProgramError:  # the launcher has shown the worker's traceback
            sys.exit(1)
        except ValueError as error:  # refused before it started: nothing was touched
            sys.exit(f'launch: {error}')
        finally:
            import ray
            ray.shutdown()
            # A cluster this command started holds nothing worth keeping once the job's
            # keepers are gone; one it found (with a killed launcher's keepers) is left as
            # found unless the job ran and ended them. A killed launcher leaves both.
            if joined.local_pid is not None and (joined.started or launcher.stopped_keepers):
                cluster.stop_local(_WORKDIR.value)
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


def _cleanup() -> None:
    """--cleanup: what a killed launcher left, never a running job's (its lock is live)."""
    import os

    from mecefo_jax.host.workdir_lock import WorkdirError, WorkdirLock, WorkdirLockedError
    from mecefo_jax.launch.cluster import cleanup
    if not os.path.isdir(_WORKDIR.value):  # no lock to hold, and nothing to make
        print(json.dumps(cleanup(_WORKDIR.value, _ADDRESS.value), indent=2))
        return
    try:
        with WorkdirLock(_WORKDIR.value):
            removed = cleanup(_WORKDIR.value, _ADDRESS.value)
    except WorkdirLockedError as error:
        sys.exit(f'launch: --cleanup refused: the job is running, and its keepers hold its only '
                 f'fast copy. Stop it first (Ctrl-C or SIGTERM saves a step; rerunning the same '
                 f'command resumes it), then --cleanup if it will not be rerun.\n{error}')
    except WorkdirError as error:
        sys.exit(f'launch: {error}')
    print(json.dumps(removed, indent=2))


if __name__ == '__main__':
    app.run(main)
