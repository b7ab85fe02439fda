"""A real crash on one GPU: the worker SIGKILLed at random steps, back from the keeper's memory,
then from disk with the keeper gone too, every recovery's seconds taken apart.

See tests/drills/gpu_crash.py (the jobs and the report) and docs/crash_drill.md. On a GPU
machine, `bash scripts/gpu_crash.sh OUT [ASSETS]` runs it; `--smoke` runs the same on the
CPU with few steps (the suite does, with configs/tiny.py):

  python scripts/gpu_crash.py --config configs/llama_350m.py:gpu --out runs/crash
  python scripts/gpu_crash.py --smoke --config configs/tiny.py --out runs/crash_smoke
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
_OUT = flags.DEFINE_string('out', None, 'Output directory (crash.json / crash.md and the jobs).')
_STEPS = flags.DEFINE_integer('steps', 40, 'Training steps of each job.', lower_bound=8)
_KILLS = flags.DEFINE_integer('kills', 3, 'Kills from memory, and as many from disk.', lower_bound=1)
_CKPT = flags.DEFINE_integer('checkpoint_every', 10, 'Orbax period (steps): what a disk kill '
                             'goes back to.', lower_bound=1)
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the kill steps.')
_ADDRESS = flags.DEFINE_string('address', None, 'A Ray cluster to run on (default: RAY_ADDRESS, '
                               'else a local one started under --out and stopped at the end).')
_SMOKE = flags.DEFINE_bool('smoke', False, 'Few steps, one kill per tier, on the CPU: the path '
                           'checked before a GPU lease (overrides --steps, --kills, '
                           '--checkpoint_every).')
flags.mark_flags_as_required(['config', 'out'])



def main(argv):
    del argv
    from mecefo_jax.config.resolve import resolve_or_exit
    from mecefo_jax.launch import cluster
    from tests.drills.gpu_crash import run_study
    steps, kills, every = (14, 1, 3) if _SMOKE.value else (_STEPS.value, _KILLS.value, _CKPT.value)
    cfg = _CONFIG.value
    cfg.train.steps, cfg.train.checkpoint_every = steps, every
    cfg = resolve_or_exit(cfg)
    out = os.path.abspath(_OUT.value)
    joined = cluster.join(_ADDRESS.value, os.path.join(out, 'ray'),
                          object_store_mb=cfg.launch.object_store_mb)
    try:
        path = config_flags.get_config_filename(flags.FLAGS['config'])
        run_study(cfg, os.path.join(out, 'jobs'), kills=kills, seed=_SEED.value,
                  command=script_command(), config_path=path)
    finally:
        import ray
        ray.shutdown()
        if joined.started:
            cluster.stop_local(os.path.join(out, 'ray'))
    for name in ('crash.json', 'crash.md'):
        os.replace(os.path.join(out, 'jobs', name), os.path.join(out, name))
    print(open(os.path.join(out, 'crash.md')).read())


if __name__ == '__main__':
    app.run(main)
