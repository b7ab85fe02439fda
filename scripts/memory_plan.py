"""Per-device train-step memory, normal and neighbour roles: see studies/memory_plan.py.

  python scripts/memory_plan.py --config configs/llama_7b.py --num_devices 32 --out /tmp/plan

Compiles ahead of time on fake CPU devices with no parameters materialised.
One replica's devices (mesh.model of them) would suffice to compile one
device's program; two replicas are compiled (2 x mesh.model fake devices),
which adds the real all-reduce (see studies/memory_plan.py).
Override any config field with --config.SECTION.FIELD=VALUE.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a configs/*.py file.',
                                          lock_config=True)
_NUM_DEVICES = flags.DEFINE_integer(
    'num_devices', 32, 'Devices of the planned cluster (mesh.data=-1 resolves against it); '
    'default 32 = 4 nodes x 8 GPUs, as in the paper.', lower_bound=1)
_LIMIT_GB = flags.DEFINE_float('limit_gb', 70.0, 'Per-device budget the plan checks against '
                               '(GB = 1e9 bytes).')
_FAILURE_STEP = flags.DEFINE_boolean(
    'failure_step', False, 'Also compile the lax.switch step devices run during a failure '
    '(one normal and one neighbour replica).')
_OUT = flags.DEFINE_string('out', None, 'Directory for memory_plan.json.')
flags.mark_flags_as_required(['config'])


def main(argv):
    del argv
    from mecefo_jax.config.resolve import start
    from mecefo_jax.parallel.sharding import mesh_shape
    from studies import memory_plan

    def replicas_compiled(cfg) -> int:  # fake CPU devices for the replicas compiled
        try:
            return memory_plan.REPLICAS * mesh_shape(cfg.mesh, _NUM_DEVICES.value)[1]
        except ValueError as error:
            sys.exit(f'memory_plan: {error}')
    cfg = start(_CONFIG.value, cpu_devices=replicas_compiled)
    memory_plan.main(cfg, _OUT.value, num_devices=_NUM_DEVICES.value, limit_gb=_LIMIT_GB.value,
                     failure_step=_FAILURE_STEP.value)


if __name__ == '__main__':
    app.run(main)
