"""The low-rank FFN gradient at the paper's shapes: see studies/rank_fidelity.py.

OPENBLAS_NUM_THREADS=1 python scripts/rank_fidelity.py --config configs/small.py --out DIR

Trains the config at each of --widths (stand-in (b)), fits its curves, and
measures the captured energy and the low-rank gradient's error at the
paper's 350M / 1B / 7B FFN shapes under random initialisation (a) and the
fitted laws (c); writes DIR/rank_fidelity.{json,md}. One thread for numpy's
BLAS: on a shared machine a threaded OpenBLAS spins against the other
processes and its SVDs run many times slower.
"""
import os
import shlex
import sys

# This checkout's package, whatever else is installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a configs/*.py file.',
                                          lock_config=True)
_OUT = flags.DEFINE_string('out', None, 'Output directory for rank_fidelity.{json,md}.')
_WIDTHS = flags.DEFINE_list('widths', ['128', '256'], 'd_model values to train the config at '
                            '(ffn_hidden and mecefo.rank scaled alike).')
_MODELS = flags.DEFINE_list('models', ['350M', '1B', '7B'], 'Paper shapes (PAPER_MODELS).')
_RANK = flags.DEFINE_integer('rank', 128, "r at the paper shapes (the LLaMA configs' "
                             'mecefo.rank).', lower_bound=1)
_TOKENS = flags.DEFINE_integer('tokens', None, 'Rows of each generated batch at the paper '
                               "shapes (default: a neighbour's two shards, 8192).", lower_bound=1)
_SNAPSHOTS = flags.DEFINE_integer('snapshots', 4, 'Training steps measured, evenly spaced from '
                                  'initialisation to the end.', lower_bound=1)
_SHARDS = flags.DEFINE_integer('shards', 2, 'Validation shards in the held-out batch (a '
                               "neighbour's own and adopted one: 2).", lower_bound=1)
_WORKDIR = flags.DEFINE_string('workdir', '', 'Where the training runs go (default: a fresh '
                               'temporary directory).')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the generated stand-ins.')
flags.mark_flags_as_required(['config', 'out'])


def main(argv):
    del argv
    from mecefo_jax.command_line import start
    cfg = start(_CONFIG.value)
    from mecefo_jax.faults.costs import PAPER_MODELS
    from studies import rank_fidelity
    unknown = sorted(set(_MODELS.value) - set(PAPER_MODELS))
    if unknown:
        raise app.UsageError(f'--models: {unknown} not in {sorted(PAPER_MODELS)}.')
    thread_env = ''.join(f'{k}={os.environ[k]} ' for k in ('OPENBLAS_NUM_THREADS',)
                         if k in os.environ)
    rank_fidelity.run(
        cfg, _OUT.value, widths=[int(w) for w in _WIDTHS.value],
        models={name: PAPER_MODELS[name] for name in _MODELS.value}, rank=_RANK.value,
        tokens=_TOKENS.value or rank_fidelity.PAPER_NEIGHBOUR_TOKENS,
        snapshots=_SNAPSHOTS.value, shards=_SHARDS.value, workdir=_WORKDIR.value,
        seed=_SEED.value, command=thread_env + shlex.join(['python', *sys.argv]),
        config_name=config_flags.get_config_filename(flags.FLAGS['config']))
    print(open(os.path.join(_OUT.value, f'{rank_fidelity.OUTPUT}.md')).read())


if __name__ == '__main__':
    app.run(main)
