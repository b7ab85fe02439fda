"""What if these replicas fail? Every strategy's layout and modelled step: see studies/fault_plan.py.

  python scripts/plan_faults.py --config configs/llama_350m.py --replicas 32 --down 3,4,17
  python scripts/plan_faults.py --config configs/llama_350m.py --down 3 --cost bench:bench_step.json --json

Nothing is compiled or run. Override any config field with --config.SECTION.FIELD=VALUE.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A configs/*.py file.')
_DOWN = flags.DEFINE_string('down', '', 'Failed replicas, comma-separated (e.g. 3,4,17).')
_REPLICAS = flags.DEFINE_integer('replicas', 0, 'Data-parallel replicas; 0: mesh.data, or '
                                 'mesh.num_cpu_devices / mesh.model when mesh.data is -1.')
_COST = flags.DEFINE_string('cost', 'analytic', 'analytic | bench:PATH | roles:PATH')
_JSON = flags.DEFINE_bool('json', False, 'Print one JSON object keyed by strategy.')
_CAP = flags.DEFINE_integer('max_neighbour_rows', -1, 'mecefo_planned row cap; -1: the '
                            "config's fault.max_neighbour_rows, 0: none.")
flags.mark_flags_as_required(['config'])


def main(argv):
    del argv
    from mecefo_jax.config.resolve import resolve_or_exit
    from studies import fault_plan as plan
    cfg = resolve_or_exit(_CONFIG.value)
    replicas = _REPLICAS.value or (cfg.mesh.data if cfg.mesh.data > 0
                                   else cfg.mesh.num_cpu_devices // cfg.mesh.model)
    try:
        down = tuple(int(x) for x in _DOWN.value.split(',') if x.strip())
    except ValueError:
        sys.exit(f'plan_faults: --down={_DOWN.value}: use comma-separated replica numbers, '
                 'e.g. --down=3,4,17.')
    try:
        report = plan.plan_all(cfg, replicas=replicas, down=down, cost_spec=_COST.value,
                               max_neighbour_rows=None if _CAP.value < 0 else _CAP.value)
    except ValueError as err:
        sys.exit(f'plan_faults: {err}')
    print(json.dumps(report, indent=1) if _JSON.value else plan.format_text(report))


if __name__ == '__main__':
    app.run(main)
