"""Per-device step cost of normal / naive NDB / MeCeFO: see mecefo_jax/bench.py.

  python scripts/bench_step.py --config configs/llama_350m.py \
      --config.model.num_layers=4 --config.data.seq_len=256 \
      --config.mecefo.rank=128 --out /tmp/bench
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a configs/*.py file.')
_OUT = flags.DEFINE_string('out', None, 'Directory for bench_step.json.', required=True)
_BATCH = flags.DEFINE_integer('batch', 4, 'Sequences per slot (the per-device batch).')
_WARMUP = flags.DEFINE_integer('warmup', 2, 'Untimed calls per mode before timing.')
_ITERS = flags.DEFINE_integer('iters', 5, 'Timed calls per mode (the median is reported).')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the parameters and random tokens.')


def main(argv):
    del argv
    from mecefo_jax import bench
    bench.main(_CONFIG.value, _OUT.value, batch=_BATCH.value, warmup=_WARMUP.value,
               iters=_ITERS.value, seed=_SEED.value)


if __name__ == '__main__':
    flags.mark_flags_as_required(['config'])
    app.run(main)
