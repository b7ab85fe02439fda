"""What if these replicas fail? Every strategy's layout and modelled step, before a long run.

The library behind `scripts/plan_faults.py`:

  python scripts/plan_faults.py --config configs/llama_350m.py --replicas 32 --down 3,4,17
  python scripts/plan_faults.py --config configs/tiny.py --down 3 --cost roles:compare_faults.json --json

Per live replica: its role (normal, neighbour, or mixed: its own shard exact
and the adopted rows in neighbour mode), its pieces (shard[start:stop]) and
the modelled cost of its device program in normal steps (a device runs its
role's busiest program, padding included), then the step's slowest device
and the rows computed in neighbour mode (`mecefo_planned` under the config's
`fault.max_neighbour_rows`, shown when set, or the `max_neighbour_rows` given).
`--json` prints one object keyed by strategy: {slowest_cost, neighbour_rows,
replicas: [{replica, role, pieces, cost}]}. Costs: `analytic` (the FLOP model of the
config's own shape, `faults/costs.py`), `bench:PATH` (a bench_step.json) or
`roles:PATH` (a compare_faults.json). Nothing is compiled or run.
"""
from __future__ import annotations

import re

import numpy as np

from mecefo_jax.config.defaults import STRATEGIES
from mecefo_jax.faults import costs as costs_lib
from mecefo_jax.faults.planner import Planner, attention_share, program_cost
from mecefo_jax.faults.strategies import layout_for
from mecefo_jax.neighbour.layout import ROLE_NAMES, ROLE_NORMAL, Layout
from studies import bench_costs


def cost_table(cfg, spec: str, shard: int) -> costs_lib.CostTable:
    """The cost table `--cost` names, for shards of `shard` sequences of `cfg`'s model."""
    kind, _, path = spec.partition(':')
    shape = costs_lib.shape_of(cfg.model)
    rank = _rank(cfg)
    common = dict(seq_len=cfg.data.seq_len, replica_seqs=shard, mfu=1.0, rank=rank,
                  recompute_ffn=cfg.mecefo.remat_ffn, projection=cfg.mecefo.projection,
                  attention_backward=attention_share(cfg.mecefo, cfg.model.num_layers))
    if kind == 'analytic' and not path:
        return costs_lib.analytic_table(shape, **common)
    if kind == 'bench' and path:
        return bench_costs.bench_table(bench_costs.load_json(path, '--cost bench:'), shape,
                                       metric='step_ms', path=path, **common)
    if kind == 'roles' and path:
        return roles_table(bench_costs.load_json(path, '--cost roles:'), shape, path=path, **common)
    raise ValueError(f'--cost={spec!r}: use analytic, bench:PATH (bench_step.json) or '
                     f'roles:PATH (compare_faults.json).')


# RoleTimer's program names (layout.Program.name): '<role>x<rows>'. A mixed program
# ('mixedx4+1') is one normal and one neighbour piece, so it adds no point of its own.
_PROGRAM_NAME = re.compile(r'^(normal|neighbour)x(\d+)$')
_ROLES = {'normal': 0, 'neighbour': 1}


def program_seconds(roles: dict) -> dict[str, float]:
    """{program name: seconds} from what the strategy comparison writes.

    `compare_faults.json` has `programs[name]['seconds']`, a number for one
    seed or a {mean, std, min, max} dict over seeds (the mean is used); a
    controller summary has `role_seconds` {name: seconds}; a bare table is
    read as it is.
    """
    table = roles.get('programs', roles.get('role_seconds', roles))
    out = {}
    for name, value in table.items():
        if isinstance(value, dict):
            value = value.get('seconds')
            if isinstance(value, dict):
                value = value.get('mean')
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[str(name)] = float(value)
    return out


def roles_table(roles: dict, shape: costs_lib.ModelShape, *, seq_len: int, replica_seqs: int,
                mfu: float, path: str = 'compare_faults.json', **analytic_kw) -> costs_lib.CostTable:
    """The table of per-program seconds measured by the strategy comparison.

    Keys are program names, e.g. 'normalx2' (2 examples exact) or
    'neighbourx4'. The reference is the fault-free program: the normal one
    with the fewest rows. Ratios only: these are CPU timings of a small
    config, so absolute time is analytic.
    """
    table = program_seconds(roles)
    parsed = []  # (role, examples, seconds)
    for key, sec in table.items():
        m = _PROGRAM_NAME.match(str(key))
        if m:
            parsed.append((_ROLES[m.group(1)], int(m.group(2)), sec))
    normals = [p for p in parsed if p[0] == 0]
    if not normals or not any(p[0] == 1 for p in parsed):
        raise ValueError(f'--roles_json={path}: needs programs (or role_seconds) with a normal '
                         f"program ('normalxB') and a neighbour program ('neighbourx...'); "
                         f'got keys {sorted(table)[:8]}. Run scripts/compare_faults.py.')
    ref_examples, ref_sec = min(normals, key=lambda p: p[1])[1:]

    def points(role):
        by_x: dict[float, list[float]] = {}
        for r, ex, sec in parsed:
            if r == role:
                by_x.setdefault(ex / ref_examples, []).append(sec / ref_sec)
        return tuple((x, float(np.mean(v))) for x, v in sorted(by_x.items()))

    step = costs_lib.mfu_step_sec(shape, seq_len=seq_len, replica_seqs=replica_seqs, mfu=mfu, **analytic_kw)
    peak = analytic_kw.get('peak_flops', costs_lib.PEAK_FLOPS_A100_BF16) / 1e12
    return costs_lib.CostTable(
        source='roles', exact=points(0), neighbour=points(1), step_sec=step,
        step_sec_source=f'analytic FLOPs at MFU {mfu:g} of {peak:g} TFLOP/s (role timings are ratios only)',
        note=f'{path}: per-role seconds measured on this machine, reference {ref_examples} examples')


def _rank(cfg) -> int:
    from mecefo_jax.neighbour.projections import resolve_rank  # imports jax; nothing is compiled
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
