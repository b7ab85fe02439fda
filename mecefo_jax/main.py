"""Entry point: `python -m mecefo_jax.main --config configs/tiny.py --workdir DIR`.

Parses flags, resolves the config once (`mecefo_jax.config.resolve`: every field
typed and checked before anything starts) and calls `mecefo_jax.run.run`, the
one way to train. Its flags are defined only when this module runs as a
program.
Multi-host: pass --coordinator, --num_processes and --process_id (or set them
through the cluster's environment) to start `jax.distributed` first.
"""
import json
import sys

from absl import app, flags, logging
from ml_collections import config_flags


def _define_flags():
    config_flags.DEFINE_config_file('config', None, 'Path to a configs/*.py file.',
                                    lock_config=True)
    flags.DEFINE_string('workdir', None, 'Where metrics, checkpoints and config go.')
    flags.DEFINE_string('coordinator', None,
                        'host:port of process 0 for multi-host jax.distributed.')
    flags.DEFINE_integer('num_processes', None, 'Processes in a multi-host run.')
    flags.DEFINE_integer('process_id', None, 'This process index in a multi-host run.')
    flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
    del argv
    from mecefo_jax.config.resolve import start
    FLAGS = flags.FLAGS
    cfg = start(FLAGS.config)  # every field checked before anything starts
    import jax
    if FLAGS.coordinator or FLAGS.num_processes:
        jax.distributed.initialize(coordinator_address=FLAGS.coordinator,
                                   num_processes=FLAGS.num_processes,
                                   process_id=FLAGS.process_id)
    logging.info('devices: %s', jax.devices())
    from mecefo_jax.host.workdir_lock import WorkdirError, WorkdirLock
    from mecefo_jax.run import run
    from mecefo_jax.training.observers import TokenCount
    from mecefo_jax.training.preemption import EXIT_PREEMPTED, Preempted, PreemptionGuard
    lock = WorkdirLock(FLAGS.workdir, active=jax.process_index() == 0)
    try:
        lock.acquire()  # one run per workdir
    except WorkdirError as error:
        sys.exit(f'main: {error}')
    # SIGTERM or a first Ctrl-C saves the step and stops.
    with lock, PreemptionGuard() as preemption:
        try:
            summary = run(cfg, FLAGS.workdir, observers=[TokenCount(cfg.data.seq_len)],
                          preemption=preemption)
        except Preempted as stopped:
            print(stopped, flush=True)
            sys.exit(EXIT_PREEMPTED)
    summary.pop('state', None)
    if jax.process_index() == 0:
        print(json.dumps(summary, indent=2, default=str))


if __name__ == '__main__':
    _define_flags()
    app.run(main)
