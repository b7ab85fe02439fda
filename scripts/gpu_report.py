"""Every GPU figure in one command: see studies/gpu/ and docs/gpu.md.

  python scripts/gpu_report.py --out /tmp/gpu_report [--budget_sec 450] [--sections mfu]
  python scripts/gpu_report.py --out /tmp/gpu_smoke --smoke   # tiny shapes, any CPU

Sections (each in its own process, with its own time limit): environment,
sweep (takes what the others leave of the budget), step (350M), step_best,
step_1b, profile, attention, snapshot; `--sections mfu` runs the first six
(scripts/gpu_mfu.sh). Writes gpu_report.json, gpu_report.md,
mfu_sweep.{json,md}, bench_step.json, bench_step_best.json and
bench_step_1b.json (for scripts/simulate_cluster.py --cost bench) and
profile_trace/ under --out.
"""
import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_OUT = flags.DEFINE_string('out', None, 'Directory for gpu_report.json, gpu_report.md, '
                                        'mfu_sweep.* and bench_step*.json.', required=True)
_BUDGET = flags.DEFINE_float('budget_sec', 450.0, 'Wall-clock budget shared by the sections.')
_SECTIONS = flags.DEFINE_string('sections', 'all', "'all', 'mfu' (environment, sweep, step, "
                                'step_best, step_1b, profile) or a comma-separated list.')
_SMOKE = flags.DEFINE_bool('smoke', False, 'Tiny shapes, the sections in this process: check '
                           'the whole report on a CPU.')


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'unexpected arguments: {argv[1:]}')
    from studies.gpu import report
    try:
        sections = report.select(_SECTIONS.value)
    except ValueError as error:
        raise app.UsageError(str(error)) from None
    result = report.run(_OUT.value, budget_sec=_BUDGET.value, smoke=_SMOKE.value,
                        sections=sections)
    bad = [name for name, r in result['sections'].items() if r['status'] in ('failed', 'timeout')]
    if bad:
        print(f'sections not ok: {", ".join(bad)}', flush=True)


if __name__ == '__main__':
    app.run(main)
