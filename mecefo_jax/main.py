"""Entry point: `python -m mecefo_jax.main --config configs/tiny.py --workdir DIR`.

Parses flags, resolves the config once (`mecefo_jax.config_resolve`: every field
typed and checked before anything starts) and calls `run`, the one way to
train: it picks the controller (fault-free, the fault controller, or
checkpoint/restart) from the config and hands the loop the caller's observers. Its flags are defined only when this
module runs as a program, so experiments and the launcher's workers (which
define their own `--config`) can import `run`.
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
    from mecefo_jax.command_line import start
    FLAGS = flags.FLAGS
    cfg = start(FLAGS.config)  # every field checked before anything starts
    import jax
    if FLAGS.coordinator or FLAGS.num_processes:
        jax.distributed.initialize(coordinator_address=FLAGS.coordinator,
                                   num_processes=FLAGS.num_processes,
                                   process_id=FLAGS.process_id)
    logging.info('devices: %s', jax.devices())
    from mecefo_jax.observers import TokenCount
    from mecefo_jax.preemption import EXIT_PREEMPTED, Preempted, PreemptionGuard
    from mecefo_jax.workdir_lock import WorkdirError, WorkdirLock
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


def run(cfg, workdir: str, *, run=None, observers=(), stop_at=None, restore=None,
        elastic: bool = False, preemption=None) -> dict:
    """Train under the configured failures, or fault-free when none are.

    The controller follows from the config: fault-free data parallelism when
    no failure is configured and every replica is present; otherwise the
    fault controller for `fault.strategy` (checkpoint/restart has its own).
    `elastic` (a launcher's worker, whose job loses and regains workers)
    always takes the fault controller: its processes then agree on the live
    mask before every step, which also starts their collectives together.
    `run` is a prebuilt `train.Run` (default: built from `cfg`);
    `observers`, `stop_at`, `restore` and `preemption` go to `train.train`.
    """
    from mecefo_jax import train as train_lib
    from mecefo_jax.faults.schedule import failures_requested
    from mecefo_jax.faults.strategies import strategy_spec
    failures = failures_requested(cfg.fault)
    built = run or train_lib.build_run(cfg, workdir)
    if not failures and not elastic and all(built.present):
        controller = train_lib.StaticController(built)
    elif strategy_spec(cfg.fault.strategy).restores_at_failure:
        from mecefo_jax.faults.restart import RestartController
        controller = RestartController.from_config(cfg, built)
    else:
        from mecefo_jax.faults.controller import FaultController
        controller = FaultController.from_config(cfg, built)
    return train_lib.train(cfg, workdir, controller=controller, run=built, observers=observers,
                           stop_at=stop_at, restore=restore, preemption=preemption)


if __name__ == '__main__':
    _define_flags()
    app.run(main)
