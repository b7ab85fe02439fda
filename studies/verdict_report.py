"""The verdict study's report: every point's time-to-target figures side by side.

Reads what `scripts/verdict.py` has stored under its work directory (one
`time_to_target` experiment per point, `<point>/seed<s>/<run>.json`), and for
each point summarises the seeds whose fault-free run is done and the runs
every such seed has (`time_to_target_report.summarise`: goodput, steps to
target and perplexity increase, each a mean over seeds with a 95% percentile
bootstrap interval), twice: step costs from the analytic FLOP model, and from
the measured GPU step ratios of `BENCH` (`--cost bench`; not for the runs
whose neighbour program the bench did not time, `UNMEASURED`). Beside `drop`'s
paired differences it gives each MeCeFO run's paired difference against the
`drop_adopters` control (the value of an approximated row over a dropped
one), and whether the fault-free validation loss still fell at its last
evaluation (a target in over-fitting would mean nothing). Writes
verdict.{json,md,png}.
"""
from __future__ import annotations

import glob
import json
import math
import os

from studies import time_to_target_report as ttt_report
from studies import verdict_breakeven, verdict_model
from studies import verdict_points as vp
from studies.report import bootstrap_mean, pyplot, write_json
from studies.runs import run_name

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, 'docs', 'results', 'gpu', 'bench_step.json')  # the H200's, 350M
CONTROL = vp.CONTROL_RUN
FIGURES = ('goodput', 'steps_to_target', 'ppl_increase_pct')
# Runs whose neighbour runs another program than the one the bench timed (its FFN gradient
# rule or its attention backward): the bench's ratios do not price them.
UNMEASURED = ('_proj', '_attn')


def load_records(point_dir: str, order=(), require=()) -> dict:
    """{seed: {run: record}}: seeds with a fault-free record and one of every run in
    `require` (a seed still training has only some), runs that every such seed has, in
    the order of the names in `order`, then the others sorted."""
    seeds = {}
    for seed_dir in sorted(glob.glob(os.path.join(point_dir, 'seed*')),
                           key=lambda d: int(os.path.basename(d)[4:])):
        runs = {}
        for path in sorted(glob.glob(os.path.join(seed_dir, '*.json'))):
            with open(path) as f:
                runs[os.path.basename(path)[:-5]] = json.load(f)
        if all(name in runs for name in ('fault_free', *require)):
            seeds[int(os.path.basename(seed_dir)[4:])] = runs
    if not seeds:
        return {}
    common = set.intersection(*(set(r) for r in seeds.values()))
    order = [n for n in order if n in common] + sorted(common - set(order))
    return {s: {name: runs[name] for name in order} for s, runs in seeds.items()}


def _interval(values) -> dict | None:
    """{mean, lo, hi, per_seed} over the seeds with a value (None: not reached)."""
    kept = [v for v in values if v is not None]
    boot = bootstrap_mean(kept, **ttt_report.BOOTSTRAP) if kept else None
    return None if boot is None else dict(boot, per_seed=list(values), seeds_with_value=len(kept))


def _paired(runs: dict, base: str, sign: int = 1, figure: str = 'goodput') -> dict:
    """{run: sign * (base's figure - run's), paired per seed, with its interval}; a seed
    where either has no value (a target not reached) is left out of that pair."""
    if base not in runs or not runs[base][figure]:
        return {}
    ours = runs[base][figure]['per_seed']
    out = {}
    for name, r in runs.items():
        if name in (base, 'fault_free') or not r[figure]:
            continue
        diffs = [sign * (a - b) for a, b in zip(ours, r[figure]['per_seed'])
                 if a is not None and b is not None]
        boot = bootstrap_mean(diffs, **ttt_report.BOOTSTRAP)  # None where no seed pairs
        if boot is None:
            continue
        out[name] = {k: boot[k] for k in ('mean', 'lo', 'hi')}
        out[name]['seeds_needed'] = ttt_report.seeds_to_separate(diffs)
    return out


def _fault_free_falls(records: dict) -> list[bool]:
    """Per seed: the fault-free run's last evaluation is below the one before it."""
    falls = []
    for runs in records.values():
        curve = runs['fault_free']['val_curve']
        falls.append(len(curve) > 1 and curve[-1][1] < curve[-2][1])
    return falls


def _sign(diff: dict | None) -> str:
    """Which side a paired difference's interval is on: '+' above 0, '-' below, '=' across."""
    if diff is None:
        return 'n/a'
    if diff['lo'] == diff['hi']:
        return 'one seed'  # no interval yet
    return '+' if diff['lo'] > 0 else '-' if diff['hi'] < 0 else '='


def point_map(p: dict, contenders: dict) -> dict:
    """The point's row of the map: its best run by mean goodput, drop's paired difference
    against each of `contenders` ({label: run}), and mecefo's against the control, each
    with its side of 0."""
    runs = {n: r for n, r in p['runs'].items() if n != 'fault_free' and r['goodput']}
    best = max(runs, key=lambda n: runs[n]['goodput']['mean']) if runs else None
    drop_minus = {label: dict(p['paired'][n], run=n, side=_sign(p['paired'][n]))
                  for label, n in contenders.items() if n in p['paired']}
    control = p['vs_control'].get(vp.MECEFO_RUN)
    return {'best': best, 'drop_minus': drop_minus,
            'mecefo_minus_control': dict(control, side=_sign(control)) if control else None}


def _hours(records: dict) -> dict:
    """Wall and CPU hours the point's stored records took to train (replays take none)."""
    runs = [r for seed in records.values() for r in seed.values()]
    return {k: sum(r.get(f'{k}_sec', 0.0) for r in runs) / 3600 for k in ('wall', 'cpu')}


def summarise_point(point: vp.Point, records: dict, bench: dict | None,
                    bench_path: str = BENCH) -> dict:
    """One point's figures (module docstring), under analytic and bench step costs."""
    from configs.small import get_config
    from mecefo_jax.config_resolve import resolve
    from studies.time_to_target_settings import Settings
    cfg = resolve(vp.point_config(get_config(), point))
    out = {'moves': point.moves, 'overrides': point.overrides, 'seeds': list(records),
           'fault_free_falls_at_last_eval': _fault_free_falls(records), 'hours': _hours(records)}
    for label, costs in (('analytic', None), ('bench', bench)):
        if label == 'bench' and bench is None:
            continue
        settings = Settings(**point.settings, bench=costs)
        summary = ttt_report.summarise(records, cfg=cfg, settings=settings, default=vp.DEFAULT,
                                       val_split_batches=math.nan, config_name=point.name)
        runs = {name: {'goodput': r['goodput'],
                       'steps_to_target': _interval(r['steps_to_target']),
                       'ppl_increase_pct': r['ppl_increase_pct']}
                for name, r in summary['runs'].items()
                if label == 'analytic' or not any(tag in name for tag in UNMEASURED)}
        # Steps and perplexity the run's minus drop's: above 0, drop is ahead, as for goodput.
        entry = {'runs': runs, 'paired': _paired(runs, vp.DEFAULT),
                 'paired_steps': _paired(runs, vp.DEFAULT, -1, 'steps_to_target'),
                 'paired_ppl': _paired(runs, vp.DEFAULT, -1, 'ppl_increase_pct'),
                 'vs_control': _paired(runs, CONTROL, sign=-1), 'step_costs': summary['step_costs']}
        entry['map'] = point_map(entry, vp.contenders(point))
        per_seed = {n: r['steps_to_target']['per_seed'] for n, r in runs.items()
                    if r['steps_to_target']}
        entry['model'] = verdict_model.model_row(
            cfg, summary['replicas'], per_seed,
            'analytic' if label == 'analytic' else f'bench:{bench_path}', ttt_report.BOOTSTRAP)
        if label == 'analytic':
            out.update(entry, steps=summary['steps'], replicas=summary['replicas'])
            out['break_even_helper_step'] = {
                run: verdict_breakeven.break_even_helper_step(
                    records, run, vp.DEFAULT, cfg, summary['replicas'], summary['steps'])
                for run in (vp.MECEFO_RUN, run_name(*vp.capped_plan(point))) if run in runs}
        else:
            out['bench'] = entry
    return out


def build(work: str, bench_path: str = BENCH) -> dict:
    bench = None
    if bench_path and os.path.exists(bench_path):
        with open(bench_path) as f:
            bench = json.load(f)
    points = {}
    for name, point in vp.POINTS.items():
        names = [run_name(*r) for r in vp.runs_of(point)]
        # A point is reported once some seed has its fault-free run and drop's beside it.
        records = load_records(os.path.join(work, name), order=names, require=(vp.DEFAULT,))
        if records:
            points[name] = summarise_point(point, records, bench, bench_path)
    return {'default': vp.DEFAULT, 'control': CONTROL, 'bench': os.path.relpath(bench_path, REPO)
            if bench else None, 'bootstrap': ttt_report.BOOTSTRAP, 'points': points}


def _cell(s: dict | None, spec: str = '.3f') -> str:
    if s is None:
        return 'n/a'
    return f"{format(s['mean'], spec)} [{format(s['lo'], spec)}, {format(s['hi'], spec)}]"


def _sided(diff: dict | None) -> str:
    """A paired difference with its interval and its side of 0 (`_sign`), or n/a."""
    return f"{_cell(diff, '+.3f')} ({diff['side']})" if diff else 'n/a'


SEEDS_NOTE = ('Seeds to separate: the seeds a paired difference against drop needs for a '
              'two-sided 5% test at 80% power at the measured variance, ((z_0.975 + z_0.8) σ / '
              'δ)², δ and σ the mean and sample std of the per-seed differences (a normal '
              'approximation; at least 2, the fewest an interval needs; ∞: the mean difference is 0).')


def _seeds_to_separate(diff: dict | None) -> str:
    """A paired difference's `seeds_needed`, rounded up; n/a without one."""
    need = (diff or {}).get('seeds_needed')
    if need is None:
        return 'n/a'
    return '∞' if math.isinf(need) else str(max(2, math.ceil(need)))


def map_lines(report: dict) -> list[str]:
    """The map: per point (analytic step costs; GPU ones where measured), the best run and
    drop's paired difference against each contender, its side of 0 in brackets (+: drop
    sooner, -: the contender sooner, =: the interval holds 0)."""
    labels = list(vp.contenders(vp.POINTS['small']))
    lines = ['## The map', '',
             '| point | seeds | best by goodput | ' + ' | '.join(f'drop − {x}' for x in labels)
             + ' | `mecefo_high` − control | v measured | break-even v | neighbour step '
             '| break-even step | break-even v, split | train hours (wall) |',
             '|---|---|---|' + '---|' * len(labels) + '---|---|---|---|---|---|---|']
    for name, p in report['points'].items():
        for label, entry in (('', p), (', GPU costs', p.get('bench'))):
            if not entry:
                continue
            m = entry['map']
            cells = [_sided(m['drop_minus'].get(x)) for x in labels]
            control = _sided(m['mecefo_minus_control'])
            hours = f"{p['hours']['wall']:.2f}" if not label else ''
            model, split = entry['model'], entry['model']['best_split']
            v = _cell(model['measured_v_interval'], '.2f')
            c_star = 'n/a' if model['break_even_step'] is None else f"{model['break_even_step']:.3f}"
            lines.append(f"| {name}{label} | {len(p['seeds'])} | `{m['best']}` | "
                         + ' | '.join(cells) + f" | {control} | {v} | "
                         f"{model['break_even_v']:.2f} | {model['one_failure_steps']['mecefo']:.3f} "
                         f"| {c_star} | {split['break_even_v']:.2f} ({split['helpers']} at "
                         f"{split['neighbour_step']:.2f}) | {hours} |")
    caps = ', '.join(f'{n}: `{vp.contenders(pt)["capped plan"]}`' for n, pt in vp.POINTS.items())
    return lines + ['', f'The capped plan of each point: {caps}. v: the progress of a row '
                    "mecefo approximates relative to an exact one, measured as 1 - (mecefo's "
                    "steps lost) / (the control's), from mean steps to target [95% bootstrap "
                    "interval, the seeds resampled]; break-even v: "
                    "where mecefo's progress rate would equal drop's with one replica down "
                    "(`verdict_model.py`: 1/2 + (c - 1)(n - 1)/2, c the neighbour's step); "
                    "break-even step: the neighbour step under which mecefo would keep up with "
                    "drop at the measured v (1 + (2v - 1)/(n - 1); below 1: not even a free "
                    "neighbour would); break-even v, split: the same with the failed shard "
                    "split over the k neighbours that need the least v (k/(k + 1) once their "
                    "step is under a normal one), k and their step in brackets: a model of "
                    "the paper's batch, since a one-row shard does not split."]


def readme_map(report: dict) -> list[str]:
    """The README's map, a row per point: the best run and drop's paired difference
    against mecefo under both step costs, against the capped plan, mecefo against the
    control, v with its interval and the v it needs (one neighbour; the shard split).
    `tests/verdict_test.py` holds the README to these lines."""
    lines = ['| point | moves | seeds | best: analytic / H200 costs | `drop` − `mecefo`: '
             'analytic / H200 costs | `drop` − capped plan | `mecefo` − `drop_adopters` | '
             'v [95%] | v needed (H200): one neighbour / split |',
             '|---|---|---|---|---|---|---|---|---|']
    for name, p in report['points'].items():
        gpu = p.get('bench') or p
        m, mg = p['map'], gpu['map']
        mecefo = ' / '.join(_sided(x['drop_minus'].get('mecefo')) for x in (m, mg))
        split = gpu['model']['best_split']
        lines.append(
            f"| {name} | {p['moves'].split(' (')[0]} | {len(p['seeds'])} | `{m['best']}` / "
            f"`{mg['best']}` | {mecefo} | {_sided(m['drop_minus'].get('capped plan'))} | "
            f"{_sided(m['mecefo_minus_control'])} | "
            f"{_cell(p['model']['measured_v_interval'], '.2f')} | "
            f"{gpu['model']['break_even_v']:.2f} / {split['break_even_v']:.2f} |")
    hours = {name: p['hours']['wall'] for name, p in report['points'].items()}
    per_point = ', '.join(f'{name} {h:.2f}' for name, h in hours.items())
    return lines + ['', f'The records above took {sum(hours.values()):.2f} hours of training '
                    f"on this project's 2-core machine ({per_point})."]


def markdown(report: dict) -> str:
    lines = ['# The verdict: drop against MeCeFO, point by point', '',
             "Goodput: the fault-free run's modelled time to its final validation loss over "
             "each run's (1.0 is fault-free), mean over seeds [95% bootstrap interval]; paired: "
             f"`{report['default']}`'s goodput minus the run's, per seed (above 0: drop is "
             "sooner), and the run's steps to target and perplexity increase at equal steps "
             "minus drop's (above 0: drop is ahead; a seed where either did not reach the "
             "target is left out of the steps' pair); vs control: the run's goodput minus "
             f"`{report['control']}`'s (above 0: an "
             'approximated row is worth more than a dropped one). GPU step costs: the '
             f"measured wall-time ratios of `{report['bench']}` (`--cost bench`), n/a for a run "
             'whose neighbour runs a program the bench did not time (another FFN gradient '
             'rule, or an attention backward).', '', *map_lines(report), '']
    for name, p in report['points'].items():
        seeds = ', '.join(map(str, p['seeds']))
        lines += [f"## {name}: {p['moves']}", '',
                  f"{p['replicas']} replicas, {p['steps']} steps, seeds {seeds}; fault-free "
                  'validation loss fell at its last evaluation in '
                  f"{sum(p['fault_free_falls_at_last_eval'])} of {len(p['seeds'])} seeds.", '',
                  '| run | goodput | paired (drop − run) | vs control | steps to target | '
                  'paired (run − drop) | ppl increase % | paired (run − drop) | '
                  'goodput, GPU step costs | seeds to separate from drop: goodput / steps |',
                  '|---|---|---|---|---|---|---|---|---|---|']
        bench = p.get('bench', {}).get('runs', {})
        for run, r in p['runs'].items():
            paired, control = p['paired'].get(run), p['vs_control'].get(run)
            lines.append(f"| `{run}` | {_cell(r['goodput'])} | {_cell(paired, '+.3f')} | "
                         f"{_cell(control, '+.3f')} | {_cell(r['steps_to_target'], '.1f')} | "
                         f"{_cell(p['paired_steps'].get(run), '+.1f')} | "
                         f"{_cell(r['ppl_increase_pct'], '+.2f')} | "
                         f"{_cell(p['paired_ppl'].get(run), '+.2f')} | "
                         f"{_cell((bench.get(run) or {}).get('goodput'))} | "
                         f"{_seeds_to_separate(paired)} / "
                         f"{_seeds_to_separate(p['paired_steps'].get(run))} |")
        helper = ', '.join(f'`{run}` ' + ('n/a' if c is None else f'{c:.3f}')
                           for run, c in p.get('break_even_helper_step', {}).items())
        lines += ['', f'Break-even helper step (records re-timed, `verdict_breakeven.py`): '
                  f'{helper}; a run keeps up with drop where its slower layouts cost under '
                  'that many normal steps.', '']
    return '\n'.join(lines + [SEEDS_NOTE, ''])


def plot(report: dict, path: str) -> None:
    plt = pyplot()
    points = list(report['points'])
    if not points:
        return
    fig, axes = plt.subplots(1, len(points), figsize=(4 * len(points), 4.5), squeeze=False,
                             sharey=True)
    for ax, name in zip(axes[0], points):
        runs = [(r, v['goodput']) for r, v in report['points'][name]['runs'].items()
                if r != 'fault_free' and v['goodput']]
        ys = range(len(runs))
        means = [g['mean'] for _, g in runs]
        errs = [[g['mean'] - g['lo'] for _, g in runs], [g['hi'] - g['mean'] for _, g in runs]]
        ax.errorbar(means, list(ys), xerr=errs, fmt='o', capsize=3)
        ax.set_yticks(list(ys), [r for r, _ in runs], fontsize=7)
        ax.set_title(name)
        ax.set_xlabel('goodput')
        ax.axvline(1.0, color='grey', lw=0.5)
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
    print('The README map (README.md, Results):', *readme_map(report), sep='\n')
    return report
