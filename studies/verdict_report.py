"""The verdict study's report: every point's time-to-target figures side by side.

Reads `<point>/seed<s>/<run>.json` under `scripts/verdict.py`'s work directory and, per point, re-times every run's
goodput (`time_to_target_report.figures_per_seed`) under the three step costs of `COSTS`; steps to target and the
perplexity increase cost nothing to re-time. Intervals are 95% Student-t over the seeds, paired per seed for a
difference (`intervals.py`); v's is Fieller's. Writes verdict.{json,md,png}: JSON and tables, whose meaning
docs/verdict.md ("How the report reads") gives.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import pathlib
import statistics

from mecefo_jax.config.resolve import updated
from studies import allreduce, verdict_breakeven, verdict_clock, verdict_model
from studies import time_to_target_report as ttt_report
from studies import verdict_points as vp
from studies.intervals import LEVEL, cell, paired, side, t_interval
from studies.replay import DERIVED
from studies.report import fmt, markdown_table, pyplot, write_json
from studies.runs import Run, run_name
from studies.time_to_target_settings import Settings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, 'docs', 'results', 'gpu', 'bench_step.json')  # the H200's, 350M
# paper_like's step-clock records (one data order, failures counted in steps) that its wall-clock records replaced:
# the same files as at 20c850c, kept to say what moved its figures (`attribution`).
STEP_CLOCK = os.path.join(REPO, 'docs', 'results', 'verdict_step_clock')
COMMAND = 'python scripts/verdict.py --work docs/results/verdict_runs --report_only'
CONTROL = vp.CONTROL_RUN
# Each step cost: its name, whether it prices steps by BENCH's measured ratios, and the all-reduce share phi that
# dilutes each step: 'clock' the one the records' clock ran at (the point's 1M step, `verdict_clock.clock_phi`),
# 'bench' the one of BENCH's 350M step at the point's replicas (`verdict_clock.bench_config`).
COSTS = {'flops_allreduce': ('FLOPs + all-reduce (φ {phi:.3f})', False, 'clock'),
         'h200': ('H200 350M', True, None),
         'h200_allreduce': ('H200 350M + all-reduce (φ {phi:.3f})', True, 'bench')}
GPU = 'h200'  # the cost the map leads with and the default follows
# Runs whose neighbour runs another program than the one the bench timed (its FFN gradient rule or its attention
# backward): the bench's ratios do not price them.
UNMEASURED = ('_proj', '_attn')
MIN_DEFAULT_SEEDS = 4  # the fewest seeds a point needs to set the default fault.strategy


def load_records(point_dir: str, order=(), require=()) -> dict:
    """{seed: {run: record}}: seeds with a fault-free record and one of every run in `require` (a seed still training
    has only some), runs that every such seed has, in the order of the names in `order`, then the others sorted."""
    seeds = {}
    for seed_dir in glob.glob(os.path.join(point_dir, 'seed*')):
        runs = {os.path.basename(path)[:-5]: json.loads(pathlib.Path(path).read_text())
                for path in sorted(glob.glob(os.path.join(seed_dir, '*.json')))}
        if all(name in runs for name in ('fault_free', *require)):
            seeds[int(os.path.basename(seed_dir)[4:])] = runs
    common = set.intersection(*(set(r) for r in seeds.values())) if seeds else set()
    order = [n for n in order if n in common] + sorted(common - set(order))
    return {s: {name: runs[name] for name in order} for s, runs in sorted(seeds.items())}


def point_map(goodput: dict, drop_minus: dict, control: dict | None, contenders: dict) -> dict:
    """The point's row of the map under one cost: its best run by mean goodput, drop's paired difference against each
    of `contenders` ({label: run}), mecefo's against the control."""
    runs = {n: g for n, g in goodput.items() if n != 'fault_free' and g}
    best = max(runs, key=lambda n: runs[n]['mean']) if runs else None
    return {'best': best, 'mecefo_minus_control': control,
            'drop_minus': {label: dict(drop_minus[n], run=n) for label, n in contenders.items() if n in drop_minus}}


def _per_seed(rows: dict, figure: str, measured_only: bool = False) -> dict:
    """{run: its `figure` per seed}; None for a run the bench did not time, if `measured_only`."""
    return {name: None if measured_only and any(tag in name for tag in UNMEASURED)
            else [r[figure] for r in seeds] for name, seeds in rows.items()}


def _with_bound(diffs: dict, bounds: dict, base: str) -> dict:
    """Paired differences against `base`, each with how far the records' clock could move it (the two runs'
    `verdict_clock.clock_bound`s added) and its side of 0 once its interval is widened by that much."""
    out = {}
    for name, d in diffs.items():
        bound = bounds[base] + bounds[name]
        out[name] = dict(d, clock_bound=bound, side_with_bound=side(dict(d, lo=d['lo'] - bound, hi=d['hi'] + bound)))
    return out


def _costs(point: vp.Point, records: dict, cfg, replicas: int, bench: dict, phis: dict) -> dict:
    """{cost: (its figures per run and seed, its entry)}: goodput per run, paired against drop and the control, the
    map's row, the progress-rate model at the column's own diluted step, and how far the records' clock could move
    each run (`verdict_clock`), under each of COSTS; `phis` {'clock': phi, 'bench': phi}."""
    from studies.time_to_target import experiment_config
    settings = Settings(**point.settings)
    clock_for = ttt_report.time_models(cfg, replicas, None)

    def run_cfg_for(seed: int, record: dict):
        run = Run(record['strategy'], record['regime'], record['cap'])
        return updated(experiment_config(cfg, run, seed, settings),
                       {k: record.get(field, d) for k, (field, d) in ttt_report.RECORD_FIELDS.items()})
    out = {}
    for label, (name, measured, dilution) in COSTS.items():
        phi = phis[dilution] if dilution else 0.0
        model_for = ttt_report.time_models(cfg, replicas, None, bench if measured else None, exposed=phi)
        timed = verdict_clock.replayed(records, model_for, run_cfg_for, cfg.train.steps, replicas)
        rows = ttt_report.figures_per_seed(timed, model_for, cfg.train.steps)
        stored = ttt_report.figures_per_seed(records, model_for, cfg.train.steps)
        goodput = _per_seed(rows, 'goodput', measured)
        bounds = verdict_clock.mean_bounds(timed, rows, model_for, clock_for, replicas)
        drop_minus = _with_bound(paired(goodput, vp.DEFAULT), bounds, vp.DEFAULT)
        vs_control = _with_bound(paired(goodput, CONTROL, sign=-1), bounds, CONTROL)
        intervals = {n: None if v is None else t_interval(v) for n, v in goodput.items()}
        spec = f'bench:{BENCH}' if measured else 'analytic'
        out[label] = rows, {
            'name': name.format(phi=phi), 'phi': phi, 'clock_phi': phis['clock'],
            'goodput': intervals, 'paired': drop_minus, 'vs_control': vs_control,
            'clock_bound': {n: None if goodput[n] is None else b for n, b in bounds.items()},
            # What replaying a derived run at this column's ratios, its pauses on the clock, moved its mean goodput
            # from its stored record's (replayed on the controller's clock), priced alike.
            'replay_moves': {n: statistics.fmean(r['goodput'] for r in rows[n])
                             - statistics.fmean(r['goodput'] for r in stored[n])
                             for n, record in records[next(iter(records))].items() if record['strategy'] in DERIVED},
            'map': point_map(intervals, drop_minus, vs_control.get(vp.MECEFO_RUN), vp.contenders(point)),
            'model': verdict_model.model_row(cfg, replicas, spec, phi)}
    return out


def _point_facts(point: vp.Point, records: dict, cfg, replicas: int) -> dict:
    """What the point is and how its records ran, before any figure."""
    runs = [r for seed in records.values() for r in seed.values()]
    clocks = sorted({r.get('time_model', 'steps') for r in runs if r['strategy'] != 'fault_free'})
    curves = [seed['fault_free']['val_curve'] for seed in records.values()]
    return {'moves': point.moves, 'overrides': point.overrides, 'seeds': list(records),
            'model_params': allreduce.param_count(cfg.model),
            'tokens_per_step': cfg.data.global_batch_size * cfg.data.seq_len, 'replicas': replicas,
            'steps': cfg.train.steps, 'time_model': clocks[0] if len(clocks) == 1 else 'mixed: ' + ', '.join(clocks),
            'data_seeds': [seed['fault_free'].get('data_seed', 0) for seed in records.values()], 'interval': 't',
            'fault_free_falls_at_last_eval': [len(c) > 1 and c[-1][1] < c[-2][1] for c in curves],
            'hours': {k: sum(r.get(f'{k}_sec', 0.0) for r in runs) / 3600 for k in ('wall', 'cpu')}}


def _point_cfg(point: vp.Point):
    from configs.small import get_config
    from mecefo_jax.config.resolve import resolve
    return resolve(vp.point_config(get_config(), point))


def summarise_point(point: vp.Point, records: dict, bench: dict) -> dict:
    """One point's figures (module docstring)."""
    cfg = _point_cfg(point)
    replicas = len(next(iter(records.values()))['fault_free']['layouts'][0]['live'])
    out = _point_facts(point, records, cfg, replicas)
    shape = verdict_clock.bench_config(bench, replicas)
    out['allreduce'] = {'clock': dict(allreduce.step_allreduce(cfg, replicas), ran_at=verdict_clock.clock_phi(records),
                                      sensitivity=verdict_clock.phi_sensitivity(cfg, replicas)),
                        'bench': dict(allreduce.step_allreduce(shape, replicas),
                                      sensitivity=verdict_clock.phi_sensitivity(shape, replicas, bench))}
    phis = {'clock': out['allreduce']['clock']['ran_at'], 'bench': out['allreduce']['bench']['phi']}
    costs = _costs(point, records, cfg, replicas, bench, phis)
    out['costs'] = {label: entry for label, (_, entry) in costs.items()}
    analytic = costs['flops_allreduce'][0]
    steps, ppl = _per_seed(analytic, 'steps_to_target'), _per_seed(analytic, 'ppl_increase_pct')
    out['runs'] = {name: {'goodput': {label: c['goodput'][name] for label, c in out['costs'].items()},
                          'steps_to_target': t_interval(steps[name]), 'ppl_increase_pct': t_interval(ppl[name])}
                   for name in analytic}
    # Steps and perplexity the run's minus drop's: above 0, drop is ahead, as for goodput.
    out['paired_steps'], out['paired_ppl'] = paired(steps, vp.DEFAULT, -1), paired(ppl, vp.DEFAULT, -1)
    v = out['v'] = verdict_model.measured_v_interval(steps)
    out['break_even_step'] = None if v is None else verdict_model.break_even_step(replicas, v['mean'])
    out['break_even_helper_step'] = {
        run: verdict_breakeven.break_even_helper_step(records, run, vp.DEFAULT, cfg, replicas)
        for run in (vp.MECEFO_RUN, run_name(*vp.capped_plan(point))) if run in analytic}
    return out


def attribution(records: dict, step_clock: dict, cfg, replicas: int, phi: float) -> dict | None:
    """What moved the FLOP-model goodput of each run a point's step-clock records (STEP_CLOCK) share with its
    wall-clock ones, over the seeds both have: {run: mean goodput of} 'step_clock', those records priced as they were
    reported (the FLOP model, undiluted); 'step_clock_diluted', the same records at the wall-clock records' phi (on
    the step clock an outage lasts its steps at any step price: no clock to replay); 'wall_clock', the wall-clock
    records on their own clock (the report's FLOPs + all-reduce column); and 'seed0', the last two at seed 0 alone,
    whose two records share the data order (data.seed 0), the initialisation and the trace. None where they share
    no seed 0 or no run."""
    seeds = [s for s in step_clock if s in records]
    names = [n for n in next(iter(step_clock.values())) if n != 'fault_free' and n in records[next(iter(records))]]
    if 0 not in seeds or not names:
        return None

    def goodput(recs: dict, exposed: float) -> dict:
        recs = {s: {n: recs[s][n] for n in ('fault_free', *names)} for s in seeds}
        rows = ttt_report.figures_per_seed(recs, ttt_report.time_models(cfg, replicas, None, exposed=exposed),
                                           cfg.train.steps)
        return {n: [r['goodput'] for r in rows[n]] for n in names}
    undiluted, diluted, wall = goodput(step_clock, 0.0), goodput(step_clock, phi), goodput(records, phi)
    first = seeds.index(0)
    return {n: {'step_clock': statistics.fmean(undiluted[n]), 'step_clock_diluted': statistics.fmean(diluted[n]),
                'wall_clock': statistics.fmean(wall[n]), 'seeds': seeds,
                'seed0': {'step_clock_diluted': diluted[n][first], 'wall_clock': wall[n][first]}} for n in names}


def default_point(report: dict) -> str | None:
    """The point the default `fault.strategy` follows: of those with at least MIN_DEFAULT_SEEDS seeds, the one at the
    largest shape (model parameters); among equal shapes, the last in the study's order (verdict_points.POINTS runs
    towards the paper)."""
    eligible = [(p['model_params'], list(vp.POINTS).index(n), n) for n, p in report['points'].items()
                if len(p['seeds']) >= MIN_DEFAULT_SEEDS]
    return max(eligible)[2] if eligible else None


def build(work: str) -> dict:
    with open(BENCH) as f:
        bench = json.load(f)
    points = {}
    for name, point in vp.POINTS.items():
        names = [run_name(*r) for r in vp.runs_of(point)]
        # A point is reported once some seed has its fault-free run and drop's beside it.
        records = load_records(os.path.join(work, name), order=names, require=(vp.DEFAULT,))
        if records:
            points[name] = summarise_point(point, records, bench)
            moved = os.path.isdir(os.path.join(STEP_CLOCK, name)) and attribution(
                records, load_records(os.path.join(STEP_CLOCK, name)), _point_cfg(point), points[name]['replicas'],
                points[name]['costs']['flops_allreduce']['clock_phi'])
            if moved:
                points[name]['attribution'] = moved
    report = {'command': COMMAND, 'default': vp.DEFAULT, 'control': CONTROL, 'bench': os.path.relpath(BENCH, REPO),
              'interval': 't', 'level': LEVEL, 'cluster': dataclasses.asdict(allreduce.Cluster()), 'points': points}
    report['default_point'] = default_point(report)
    return report


def _seeds_needed(diff: dict | None) -> str:
    need = (diff or {}).get('seeds_needed')
    return 'n/a' if need is None else '∞' if math.isinf(need) else str(need)


def _params(n: int) -> str:
    return f'{n / 1e9:.1f}B' if n >= 1e9 else f'{n / 1e6:.0f}M' if n >= 1e6 else f'{n / 1e3:.0f}k'


def _gpu_header(text: str) -> str:
    return f'{text}, {COSTS[GPU][0]}'


# README.md's map: {the map's column: its header there}.
README_COLUMNS = {'point': 'point', 'model': 'model', 'seeds': 'seeds', 'best': _gpu_header('best'),
                  'drop − mecefo': _gpu_header('`drop` − `mecefo`') + ' [95% t]', 'v': 'v [95%]'}
NO_CONTROL = 'control not run'  # v and mecefo − control where the point did not run the control


def map_table(report: dict, readme: bool = False) -> str:
    """The map under the H200's costs: per point its shape, seeds, the clock its records ran on, the best run, drop
    against each contender and mecefo against the control (95% t, side of 0), the seeds that would separate drop
    from mecefo, and v. `readme`: README.md's six columns (`tests/verdict_test.py` holds README.md and
    docs/verdict.md to these tables)."""
    labels = list(vp.contenders(vp.POINTS['small']))
    headers = ['point', 'model', 'seeds', 'failures met in', 'best', *(f'drop − {x}' for x in labels),
               'seeds to separate drop, mecefo', 'mecefo − control', 'v']
    rows = []
    for name, p in report['points'].items():
        m, ran = p['costs'][GPU]['map'], CONTROL in p['runs']
        rows.append([name, _params(p['model_params']), len(p['seeds']), p['time_model'], f"`{m['best']}`",
                     *(cell(m['drop_minus'].get(x), '+.3f') for x in labels),
                     _seeds_needed(m['drop_minus'].get('mecefo')),
                     cell(m['mecefo_minus_control'], '+.3f') if ran else NO_CONTROL,
                     cell(p['v'], '.2f') if ran else NO_CONTROL])
    if readme:
        keep = [headers.index(h) for h in README_COLUMNS]
        headers, rows = list(README_COLUMNS.values()), [[row[i] for i in keep] for row in rows]
    return markdown_table(headers, rows)


def costs_table(report: dict) -> str:
    """Per point and step cost: mecefo's step under one failure (the c the break-even v takes), the best run,
    drop − mecefo with how far the records' clock could move it beside its interval's half-width, v* of one
    neighbour and of the best split, and what replaying elastic and checkpoint_restart at the cost's ratios, pauses
    on the clock, moved their goodput."""
    rows = []
    for name, p in report['points'].items():
        for c in p['costs'].values():
            diff = c['map']['drop_minus'].get('mecefo')
            rows.append([name, c['name'], f"{c['model']['one_failure_steps']['mecefo']:.3f}", f"`{c['map']['best']}`",
                         cell(diff, '+.3f'), 'n/a' if diff is None else
                         f"±{diff['clock_bound']:.3f} / {diff['hi'] - diff['mean']:.3f} ({diff['side_with_bound']})",
                         f"{c['model']['break_even_v']:.2f} / {c['model']['best_split']['break_even_v']:.2f}",
                         ', '.join(f'{m:+.3f}' for m in c['replay_moves'].values())])
    return markdown_table(['point', 'step cost', "mecefo's step, one failure", 'best', 'drop − mecefo',
                           "the clock's bound on it / half-width (side with it)", 'break-even v: one / split',
                           'replays moved: ' + ', '.join(report['points'][next(iter(report['points']))]['costs'][GPU]
                                                        ['replay_moves'])], rows)


def clock_table(report: dict) -> str:
    """Per point: the clock its records ran on (phi of its 1M step), phi of the 350M step the H200 columns take at
    its replicas, each under the Cluster's stated assumptions and the others (`verdict_clock.phi_sensitivity`); the
    break-even steps and the training hours."""
    rows = []
    for name, p in report['points'].items():
        clock, bench = p['allreduce']['clock'], p['allreduce']['bench']
        helper = ', '.join(f'{fmt(s, ".3f")}' for s in p['break_even_helper_step'].values())
        rows.append([name, p['replicas'], f"{p['time_model']}, φ {clock['ran_at']:.4f}",
                     ' / '.join(f'{x:.3f}' for x in clock['sensitivity'].values()),
                     ' / '.join(f'{x:.3f}' for x in bench['sensitivity'].values()),
                     fmt(p['break_even_step'], '.3f'), helper, f"{p['hours']['wall']:.2f}"])
    first = next(iter(report['points'].values()))['allreduce']
    return markdown_table(['point', 'replicas', 'records met failures on', 'φ of the 1M step: '
                           + ' / '.join(first['clock']['sensitivity']),
                           'φ of the 350M step: ' + ' / '.join(first['bench']['sensitivity']), 'break-even step',
                           'break-even helper step: mecefo, capped', 'train hours'], rows)


def attribution_table(p: dict) -> str:
    """What moved each run's FLOP-model goodput from the step-clock records to the wall-clock ones (`attribution`)."""
    rows = [[f'`{run}`', f"{a['step_clock']:.3f}", f"{a['step_clock_diluted']:.3f}", f"{a['wall_clock']:.3f}",
             f"{a['seed0']['step_clock_diluted']:.4f} → {a['seed0']['wall_clock']:.4f}"]
            for run, a in p['attribution'].items()]
    phi = p['costs']['flops_allreduce']['clock_phi']
    return markdown_table(['run', 'step clock, FLOPs (φ 0)', f'step clock, FLOPs + all-reduce (φ {phi:.3f})',
                           f'wall clock, FLOPs + all-reduce (φ {phi:.3f})', 'seed 0: step clock → wall clock, at φ'],
                          rows)


def point_table(p: dict) -> str:
    """Every run of a point: goodput under each cost, drop's paired difference under the H200's costs, steps to
    target and perplexity, each paired against drop."""
    gpu = p['costs'][GPU]['paired']
    rows = [[f'`{run}`', *(cell(r['goodput'].get(label)) for label in COSTS), cell(gpu.get(run), '+.3f'),
             _seeds_needed(gpu.get(run)), cell(r['steps_to_target'], '.1f'), cell(p['paired_steps'].get(run), '+.1f'),
             cell(r['ppl_increase_pct'], '+.2f'), cell(p['paired_ppl'].get(run), '+.2f')]
            for run, r in p['runs'].items()]
    return markdown_table(['run', *(f"goodput, {c['name']}" for c in p['costs'].values()),
                           _gpu_header('drop − run'), 'seeds to separate', 'steps to target', 'run − drop',
                           'ppl increase %', 'run − drop'], rows)


def markdown(report: dict) -> str:
    lines = ['# The verdict: drop against MeCeFO, point by point', '', f'`{COMMAND}`', '', '## The map', '',
             map_table(report), '', '## Under each step cost', '', costs_table(report), '',
             '## The clock and the all-reduce share', '', clock_table(report), '']
    for name, p in report['points'].items():
        lines += [f"## {name}: {p['moves']}", '', point_table(p), '']
        if 'attribution' in p:
            seeds = ', '.join(map(str, next(iter(p['attribution'].values()))['seeds']))
            lines += [f'From its step-clock records to its wall-clock ones (seeds {seeds}):', '',
                      attribution_table(p), '']
    return '\n'.join(lines)


def plot(report: dict, path: str) -> None:
    """Goodput per run and point under each step cost, with its t interval."""
    plt = pyplot()
    points = report['points']
    if not points:
        return
    fig, axes = plt.subplots(1, len(points), figsize=(4.5 * len(points), 4.5), squeeze=False)
    for ax, (name, p) in zip(axes[0], points.items()):
        runs = [r for r in p['runs'] if r != 'fault_free']
        for k, (label, cost) in enumerate(p['costs'].items()):
            cells = [(y + 0.2 * (k - 1), g) for y, r in enumerate(runs)
                     if (g := p['runs'][r]['goodput'].get(label))]
            ax.errorbar([g['mean'] for _, g in cells], [y for y, _ in cells], fmt='o', capsize=2, label=cost['name'],
                        ms=3, xerr=[[g['mean'] - g['lo'] for _, g in cells], [g['hi'] - g['mean'] for _, g in cells]])
        ax.set_yticks(list(range(len(runs))), runs, fontsize=7)
        ax.set(title=name, xlabel='goodput')
        ax.axvline(1.0, color='grey', lw=0.5)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(work: str, out_dir: str) -> dict:
    report = build(work)
    os.makedirs(out_dir, exist_ok=True)
    write_json(os.path.join(out_dir, 'verdict.json'), report)
    with open(os.path.join(out_dir, 'verdict.md'), 'w') as f:
        f.write(markdown(report))
    plot(report, os.path.join(out_dir, 'verdict.png'))
    print(f"verdict: {len(report['points'])} point(s) -> {out_dir}/verdict.{{json,md,png}}")
    print('The README map (README.md, Results):', map_table(report, readme=True), sep='\n')
    return report
