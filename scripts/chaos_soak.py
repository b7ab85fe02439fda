"""A chaos soak: one launcher job, many random deaths of every kind, nothing lost or leaked.

  python scripts/chaos_soak.py --config configs/tiny.py --kills 100 --seed 0 --out DIR

See tests/drills/chaos_soak.py (the kills), chaos_verify.py (the checks) and
chaos_report.py (DIR/chaos_soak.{json,md}: the tables, and what this run found).
Exits 1 where the job lost a step, trained another model than the simulation
of its failures, or left something behind.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from studies.report import script_command  # noqa: E402
from tests.drills.chaos_soak import GAP_STEPS, SPARE_STEPS, WORKERS  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A configs/*.py file.',
                                          lock_config=True)
_OUT = flags.DEFINE_string('out', None, 'Output directory (the job, logs, chaos_soak.*).')
_KILLS = flags.DEFINE_integer('kills', 100, 'Random deaths to inflict.', lower_bound=1)
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the kinds, targets and moments.')
_NODES = flags.DEFINE_integer('nodes', 3, 'Simulated Ray nodes (the head and the rest).',
                              lower_bound=2)
_SPARE = flags.DEFINE_integer('spare_steps', SPARE_STEPS, 'Steps the job runs beyond the most its kills '
                              'can take (fewer: a shorter job, the same kills).', lower_bound=1)
_MAX_GAP = flags.DEFINE_integer('max_gap', GAP_STEPS[1], 'The most steps a kill lands into a running '
                                'generation (fewer: a shorter job, the same kinds in the same order).',
                                lower_bound=GAP_STEPS[0], upper_bound=GAP_STEPS[1])
_WORKERS = flags.DEFINE_integer('workers', WORKERS, 'Worker processes of the job (fewer: less to start at '
                                'each relaunch; 2 still gives every kind a target).', lower_bound=2)
flags.mark_flags_as_required(['config', 'out'])



def main(argv):
    del argv
    from mecefo_jax.config.resolve import start, updated
    from tests.drills import chaos_soak
    values = chaos_soak.job_values(_KILLS.value, os.path.join(_OUT.value, 'cache'),
                                   os.path.join(_OUT.value, 'xla_cache'), spare_steps=_SPARE.value,
                                   max_gap=_MAX_GAP.value, workers=_WORKERS.value)
    cfg = start(_CONFIG.value)  # fake CPU devices here: the in-process simulation needs them
    cfg = updated(cfg, values)
    from tests.drills import chaos_report
    path = config_flags.get_config_filename(flags.FLAGS['config'])
    report = chaos_report.run(path, cfg, os.path.abspath(_OUT.value), kills=_KILLS.value,
                              seed=_SEED.value, nodes=_NODES.value, values=values, max_gap=_MAX_GAP.value,
                              command=script_command(), workers=_WORKERS.value)
    print(chaos_report.markdown(report))
    sys.exit(1 if chaos_report.broken(report) else 0)


if __name__ == '__main__':
    app.run(main)
