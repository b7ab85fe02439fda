r"""Per-device train-step cost of normal / naive NDB / MeCeFO / plain DP: see studies/step_cost.py.

  python scripts/bench_step.py --config configs/llama_350m.py \
      --config.data.seq_len=256 --config.mecefo.rank=128 --iters 0 --out /tmp/bench
  python scripts/bench_step.py --config configs/small.py --out /tmp/bench_small

Override any config field with --config.SECTION.FIELD=VALUE. Needs jax, flax,
optax, orbax-checkpoint, numpy, absl and ml_collections (no data packages).
On a CPU host the process simulates `mesh.num_cpu_devices` devices (for the
fault-free overhead check on the config's full mesh).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a configs/*.py file.',
                                          lock_config=True)
_OUT = flags.DEFINE_string('out', None, 'Directory for bench_step.json.')
_BATCH = flags.DEFINE_integer('batch', 4, 'Sequences per shard (the per-device batch).',
                              lower_bound=1)
_WARMUP = flags.DEFINE_integer('warmup', 2, 'Untimed rounds before timing.', lower_bound=0)
_ITERS = flags.DEFINE_integer('iters', 5, 'Timed rounds (median reported); 0 = FLOPs and '
                              'memory only.', lower_bound=0)
_OVERHEAD_ITERS = flags.DEFINE_integer('overhead_iters', 30, 'Timed rounds of the fault-free '
                                       'vs plain_dp check.', lower_bound=1)
_NO_OVERHEAD = flags.DEFINE_boolean('no_overhead', False, 'Skip the fault-free vs plain_dp '
                                    'timing on the full mesh.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the parameters and random tokens.')
flags.mark_flags_as_required(['config', 'out'])


def main(argv):
    del argv
    from mecefo_jax.config.resolve import start
    cfg = start(_CONFIG.value)  # and fake CPU devices for the full-mesh overhead check
    from studies import step_cost as bench
    bench.main(cfg, _OUT.value, batch=_BATCH.value, warmup=_WARMUP.value, iters=_ITERS.value,
               overhead=not _NO_OVERHEAD.value, overhead_iters=_OVERHEAD_ITERS.value, seed=_SEED.value)


if __name__ == '__main__':
    app.run(main)
