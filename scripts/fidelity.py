"""How faithful the neighbour's approximate gradient is: see studies/fidelity_runs.py.

OPENBLAS_NUM_THREADS=1 python scripts/fidelity.py --mode rank --config configs/small.py --out DIR
OPENBLAS_NUM_THREADS=1 python scripts/fidelity.py --mode projection --config configs/small.py --out DIR
python scripts/fidelity.py --mode neighbour --config configs/small.py --out DIR

Each mode trains the config fault-free and writes DIR/<name>.{json,md}
(rank_fidelity, projection_rules, neighbour_fidelity): the rank-r
projection's error at the paper's shapes, the two projection rules side by
side, and the neighbour's gradient per block under each ablation switch.
One thread for numpy's BLAS: a threaded OpenBLAS on a shared machine spins
against the other processes and the SVDs run many times slower.
"""
import os
import shlex
import sys
import tempfile

# This checkout's package, whatever else is installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

NAMES = {'rank': 'rank_fidelity', 'projection': 'projection_rules', 'neighbour': 'neighbour_fidelity'}
_MODE = flags.DEFINE_enum('mode', None, list(NAMES), 'Which measurement to run.')
_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a configs/*.py file.', lock_config=True)
_OUT = flags.DEFINE_string('out', None, "Output directory for the mode's <name>.{json,md}.")
_WORKDIR = flags.DEFINE_string('workdir', '', 'Where the training runs go (default: a fresh temporary directory).')
_SNAPSHOTS = flags.DEFINE_integer('snapshots', 4, 'rank, neighbour: steps measured, evenly spaced from '
                                  'initialisation to the end (1: the end only).', lower_bound=1)
_SHARDS = flags.DEFINE_integer('shards', 2, "Validation shards in the held-out rows (a neighbour's own and "
                               'adopted one: 2).', lower_bound=1)
_WIDTHS = flags.DEFINE_list('widths', ['128', '256'], 'rank: d_model values to train the config at '
                            '(ffn_hidden and mecefo.rank scaled alike).')
_MODELS = flags.DEFINE_list('models', ['350M', '1B', '7B'], 'rank: paper shapes (faults.costs.PAPER_MODELS).')
_PAPER_RANK = flags.DEFINE_integer('paper_rank', 128, "rank: r at the paper shapes (the LLaMA configs' "
                                   'mecefo.rank).', lower_bound=1)
_TOKENS = flags.DEFINE_integer('tokens', None, 'rank: rows of each generated batch at the paper shapes '
                               "(default: a neighbour's two shards at the LLaMA configs' batch, 8192).", lower_bound=1)
_SEED = flags.DEFINE_integer('seed', 0, 'rank: seed of the generated stand-ins.')
_RANKS = flags.DEFINE_list('ranks', ['32', '64'], 'projection: ranks r to measure.')
flags.mark_flags_as_required(['mode', 'config', 'out'])


def _ints(flag, values) -> list[int]:
    try:
        return [int(v) for v in values]
    except ValueError:
        raise app.UsageError(f'--{flag.name}={",".join(values)}: give whole numbers, e.g. 32,64.') from None


def _measure(cfg, workdir: str) -> tuple[dict, list[str]]:
    """The mode's result (without command and config) and its tables."""
    from studies import fidelity_runs as runs
    mode = _MODE.value
    if mode == 'rank':
        from mecefo_jax.faults.costs import PAPER_MODELS
        unknown = sorted(set(_MODELS.value) - set(PAPER_MODELS))
        if unknown:
            raise app.UsageError(f'--models: {unknown} not in {sorted(PAPER_MODELS)}.')
        result = runs.run_rank(
            cfg, workdir=workdir, widths=_ints(_WIDTHS, _WIDTHS.value),
            models={name: PAPER_MODELS[name] for name in _MODELS.value}, paper_rank=_PAPER_RANK.value,
            tokens=_TOKENS.value or runs.PAPER_NEIGHBOUR_TOKENS, snapshots=_SNAPSHOTS.value,
            shards=_SHARDS.value, seed=_SEED.value)
        return result, runs.rank_tables(result)
    if mode == 'projection':
        result = runs.run_projection(cfg, workdir=workdir, ranks=_ints(_RANKS, _RANKS.value), shards=_SHARDS.value)
        return result, runs.projection_tables(result)
    result = runs.run_neighbour(cfg, workdir=workdir, snapshots=_SNAPSHOTS.value, shards=_SHARDS.value)
    return result, runs.neighbour_tables(result)


def main(argv):
    del argv
    from mecefo_jax.config.resolve import start
    cfg = start(_CONFIG.value)
    from studies.fidelity_runs import write
    thread_env = ''.join(f'{k}={os.environ[k]} ' for k in ('OPENBLAS_NUM_THREADS',) if k in os.environ)
    header = {'command': thread_env + shlex.join(['python', *sys.argv]),
              'config': config_flags.get_config_filename(flags.FLAGS['config'])}
    result, tables = _measure(cfg, _WORKDIR.value or tempfile.mkdtemp(prefix=f'{NAMES[_MODE.value]}_'))
    print(write(_OUT.value, NAMES[_MODE.value], {**header, **result}, tables))


if __name__ == '__main__':
    app.run(main)
