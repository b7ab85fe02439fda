"""What if these replicas fail? Every strategy's layout and modelled step, before a long run.

  python -m mecefo_jax.faults.plan --config configs/llama_350m.py --replicas 32 --down 3,4,17
  python -m mecefo_jax.faults.plan --config configs/tiny.py --down 3 --cost roles:compare_faults.json --json

Per live replica: its role (normal, neighbour, or mixed: its own shard exact
and the adopted rows in neighbour mode), its pieces (shard[start:stop]) and
the modelled cost of its device program in normal steps (a device runs its
role's busiest program, padding included), then the step's slowest device
and the rows computed in neighbour mode (`mecefo_planned` under the config's
`fault.max_neighbour_rows`, shown when set; `--max_neighbour_rows` overrides it).
`--json` prints one object keyed by strategy: {slowest_cost, neighbour_rows,
replicas: [{replica, role, pieces, cost}]}. Costs: `analytic` (the FLOP model of the
config's own shape, `faults/costs.py`), `bench:PATH` (a bench_step.json) or
`roles:PATH` (a compare_faults.json). Nothing is compiled or run.
"""
from __future__ import annotations

import json

from mecefo_jax.faults import costs as costs_lib
from mecefo_jax.faults.planner import Planner, program_cost
from mecefo_jax.faults.strategies import STRATEGIES, layout_for
from mecefo_jax.layout import ROLE_NAMES, ROLE_NORMAL, Layout


def cost_table(cfg, spec: str, shard: int) -> costs_lib.CostTable:
    """The cost table `--cost` names, for shards of `shard` sequences of `cfg`'s model."""
    kind, _, path = spec.partition(':')
    shape = costs_lib.shape_of(cfg.model)
    rank = _rank(cfg)
    common = dict(seq_len=cfg.data.seq_len, replica_seqs=shard, mfu=1.0, rank=rank,
                  recompute_ffn=cfg.mecefo.remat_ffn)
    if kind == 'analytic' and not path:
        return costs_lib.analytic_table(shape, **common)
    if kind == 'bench' and path:
        return costs_lib.bench_table(costs_lib.load_json(path, '--cost bench:'), shape,
                                     metric='step_ms', path=path, **common)
    if kind == 'roles' and path:
        return costs_lib.roles_table(costs_lib.load_json(path, '--cost roles:'), shape,
                                     path=path, **common)
    raise ValueError(f'--cost={spec!r}: use analytic, bench:PATH (bench_step.json) or '
                     f'roles:PATH (compare_faults.json).')


def _rank(cfg) -> int:
    from mecefo_jax.projections import resolve_rank  # imports jax; nothing is compiled
    return resolve_rank(cfg.mecefo.rank, cfg.model.d_model, cfg.model.ffn_hidden)


def strategy_report(layout: Layout, cost) -> dict:
    """{slowest_cost, neighbour_rows, replicas: [{replica, role, pieces, cost}]};
    costs in normal steps, rows as computed (padding not counted)."""
    program_of = {p.role: p for p in layout.programs}
    replicas = []
    for r, role, pieces in zip(layout.replicas, layout.roles, layout.pieces):
        replicas.append({'replica': r, 'role': ROLE_NAMES[role],
                         'pieces': [f'{p.shard}[{p.start}:{p.stop}]' for p in pieces],
                         'cost': program_cost(cost, program_of[role])})
    return {'slowest_cost': max(x['cost'] for x in replicas),
            'neighbour_rows': layout.neighbour_mode_rows(), 'replicas': replicas}


def plan_all(cfg, *, replicas: int, down, cost_spec: str = 'analytic',
             strategies=STRATEGIES, max_neighbour_rows: int | None = None) -> dict:
    """Every strategy's report for `down` of `replicas` replicas (see module docstring)."""
    if replicas < 1 or cfg.data.global_batch_size % replicas:
        raise ValueError(f'data.global_batch_size={cfg.data.global_batch_size} must split '
                         f'evenly over --replicas={replicas}.')
    bad = [r for r in down if not 0 <= r < replicas]
    if bad or len(set(down)) >= replicas:
        raise ValueError(f'--down={",".join(map(str, down))}: need distinct replicas in '
                         f'[0, {replicas}) and at least one left live.')
    shard = cfg.data.global_batch_size // replicas
    table = cost_table(cfg, cost_spec, shard)
    raw = costs_lib.role_cost(table, shard)
    cost = lambda role, rows: raw(role, rows) / raw(ROLE_NORMAL, shard)  # noqa: E731
    cap = cfg.fault.max_neighbour_rows if max_neighbour_rows is None else max_neighbour_rows
    planner = Planner(shard, cost, max_neighbour_rows=cap)
    live = tuple(r not in set(down) for r in range(replicas))
    report = {name: strategy_report(layout_for(name, live, shard, planner=planner), cost)
              for name in strategies}
    if cap and 'mecefo_planned' in report:
        report['mecefo_planned']['max_neighbour_rows'] = cap
    return report


def format_text(report: dict) -> str:
    lines = []
    for name, entry in sorted(report.items(), key=lambda kv: kv[1]['slowest_cost']):
        cap = entry.get('max_neighbour_rows')
        lines.append(f'{name}: slowest device {entry["slowest_cost"]:.3f}x a normal step, '
                     f'{entry["neighbour_rows"]} rows in neighbour mode'
                     + (f' (cap {cap})' if cap else ''))
        for x in entry['replicas']:
            if x['role'] != 'normal' or len(x['pieces']) > 1:
                lines.append(f'  replica {x["replica"]:>4} {x["role"]:<9} {x["cost"]:.3f}x  '
                             + ' '.join(x['pieces']))
        rest = sum(1 for x in entry['replicas'] if x['role'] == 'normal' and len(x['pieces']) == 1)
        lines.append(f'  {rest} other replicas: normal, own shard only, 1.000x')
    return '\n'.join(lines)


def main(argv):
    del argv
    from absl import flags

    from mecefo_jax.config_resolve import resolve_or_exit
    cfg = resolve_or_exit(_CONFIG.value)
    replicas = flags.FLAGS.replicas or (cfg.mesh.data if cfg.mesh.data > 0
                                        else cfg.mesh.num_cpu_devices // cfg.mesh.model)
    down = tuple(int(x) for x in flags.FLAGS.down.split(',') if x.strip())
    try:
        cap = flags.FLAGS.max_neighbour_rows
        report = plan_all(cfg, replicas=replicas, down=down, cost_spec=flags.FLAGS.cost,
                          max_neighbour_rows=None if cap < 0 else cap)
    except ValueError as err:
        raise SystemExit(f'plan: {err}') from None
    print(json.dumps(report, indent=1) if flags.FLAGS.json else format_text(report))


def _define_flags():
    from absl import flags
    from ml_collections import config_flags
    config = config_flags.DEFINE_config_file('config', None, 'A configs/*.py file.')
    flags.DEFINE_string('down', '', 'Failed replicas, comma-separated (e.g. 3,4,17).')
    flags.DEFINE_integer('replicas', 0, 'Data-parallel replicas; 0: mesh.data, or '
                         'mesh.num_cpu_devices / mesh.model when mesh.data is -1.')
    flags.DEFINE_string('cost', 'analytic', 'analytic | bench:PATH | roles:PATH')
    flags.DEFINE_bool('json', False, 'Print one JSON object keyed by strategy.')
    flags.DEFINE_integer('max_neighbour_rows', -1, 'mecefo_planned row cap; -1: the '
                         "config's fault.max_neighbour_rows, 0: none.")
    flags.mark_flags_as_required(['config'])
    return config


if __name__ == '__main__':
    from absl import app
    _CONFIG = _define_flags()
    app.run(main)
