"""Entry point: `python -m mecefo_jax.main --config configs/tiny.py --workdir DIR`.

Parses flags, resolves the config once (`mecefo_jax.settings`) and calls
`train.train`; all logic lives in importable modules.
Multi-host: pass --coordinator, --num_processes and --process_id (or set them
through the cluster's environment) to start `jax.distributed` first.
"""
import json

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a configs/*.py file.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where metrics, checkpoints and config go.')
_COORDINATOR = flags.DEFINE_string('coordinator', None,
                                   'host:port of process 0 for multi-host jax.distributed.')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Processes in a multi-host run.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'This process index in a multi-host run.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
    del argv
    from mecefo_jax.settings import resolve_or_exit
    cfg = resolve_or_exit(_CONFIG.value)  # every field checked before anything starts
    # Orbax logs every save step at INFO; keep the console to progress and results.
    logging.set_verbosity(logging.WARNING)
    # Backends start lazily, so the fake-device count still applies here. It
    # only affects the CPU platform; GPUs are used as they are.
    from mecefo_jax.sharding import simulate_cpu_devices
    simulate_cpu_devices(cfg.mesh.num_cpu_devices)
    import jax
    if _COORDINATOR.value or _NUM_PROCESSES.value:
        jax.distributed.initialize(coordinator_address=_COORDINATOR.value,
                                   num_processes=_NUM_PROCESSES.value,
                                   process_id=_PROCESS_ID.value)
    logging.info('devices: %s', jax.devices())
    summary = run(cfg, _WORKDIR.value)
    summary.pop('state', None)
    if jax.process_index() == 0:
        print(json.dumps(summary, indent=2, default=str))


def run(cfg, workdir: str) -> dict:
    """Train under the configured failures, or fault-free when none are."""
    from mecefo_jax.faults.schedule import failures_requested
    if failures_requested(cfg.fault):
        from mecefo_jax.faults.controller import FaultController
        return FaultController.train(cfg, workdir)
    from mecefo_jax.train import train
    return train(cfg, workdir)


if __name__ == '__main__':
    app.run(main)
