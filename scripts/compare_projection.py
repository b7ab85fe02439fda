"""The neighbour's FFN gradient under both projection rules: see
studies/projection_rules.py.

OPENBLAS_NUM_THREADS=1 python scripts/compare_projection.py --config configs/small.py \
    --out docs/results/projection_rules --ranks 32,64

Trains the config fault-free, then measures, at each rank, the neighbour's FFN
gradient error and step cost under mecefo.projection=weights and =gradient;
writes DIR/projection_rules.{json,md}.
"""
import os
import shlex
import sys
import tempfile

# This checkout's package, whatever else is installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a configs/*.py file.',
                                          lock_config=True)
_OUT = flags.DEFINE_string('out', None, 'Output directory for projection_rules.{json,md}.')
_RANKS = flags.DEFINE_list('ranks', ['32', '64'], 'Ranks r to measure.')
_WORKDIR = flags.DEFINE_string('workdir', '', 'Where the training run goes (default: a fresh '
                               'temporary directory).')
flags.mark_flags_as_required(['config', 'out'])


def main(argv):
    del argv
    from mecefo_jax.command_line import start
    cfg = start(_CONFIG.value)
    from studies import projection_rules
    thread_env = ''.join(f'{k}={os.environ[k]} ' for k in ('OPENBLAS_NUM_THREADS',)
                         if k in os.environ)
    report = projection_rules.run(
        cfg, _OUT.value, ranks=[int(r) for r in _RANKS.value],
        workdir=_WORKDIR.value or tempfile.mkdtemp(prefix='projection_rules_'),
        command=thread_env + shlex.join(['python', *sys.argv]),
        config_name=config_flags.get_config_filename(flags.FLAGS['config']))
    print(projection_rules.markdown(report))


if __name__ == '__main__':
    app.run(main)
