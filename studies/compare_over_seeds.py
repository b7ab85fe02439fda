"""The strategy comparison over several failure seeds: mean, spread and a ranking.

`compare_seeds` repeats the comparison (`compare.compare`) over several
failure traces (`fault.seed`), re-timing the programs for each, and reports
mean, std, min and max of every figure, and for each adjacent pair in the
drop-% ranking whether the gap exceeds the spread.
"""
import os
import time

from mecefo_jax.config_resolve import updated
from studies.compare import RUNS, baseline_wins, compare, program_counts, wins_table, write_report
from studies.report import (
    distinct_seeds,
    fmt,
    format_spread,
    markdown_table,
    significance,
    stats,
)

# Figures shown in the seed tables (all scalar figures are aggregated in the JSON).
SEED_MAIN = (('throughput_drop_pct', 'drop %', '.2f'),
             ('modeled_tokens_per_sec', 'modelled tok/s', '.2f'),
             ('final_val_loss', 'final val loss', '.4f'),
             ('val_loss_vs_fault_free_pct', 'val loss vs fault-free %', '+.2f'),
             ('lost_steps', 'lost steps', '.1f'),
             ('events', 'events', '.1f'),
             ('mean_step_ratio', 'mean step x normal', '.3f'))
SEED_MORE = (('worst_step_ratio', 'worst step x normal', '.3f'),
             ('degraded_steps', 'steps degraded', '.1f'),
             ('neighbour_steps', 'steps with a neighbour', '.1f'),
             ('measured_overhead_sec', 'overhead s (measured)', '.2f'),
             ('relaunch_sec_modelled', 'relaunch s (modelled)', '.0f'),
             ('unscaled_tokens_per_sec', 'unscaled tok/s', '.0f'),
             ('wall_tokens_per_sec', 'wall tok/s', '.0f'))


def compare_seeds(cfg, regime: str, out_dir: str, *, seeds, runs=RUNS, log=print) -> dict:
    """`compare` once per failure seed (into out_dir/seed<S>), then mean and spread.

    Each seed sets `fault.seed` (a new failure trace; data order and
    initialisation stay fixed) and re-times the device programs, interleaved,
    in its own `compare` call. Writes compare_faults.{json,md} in out_dir.
    """
    seeds = distinct_seeds(seeds)
    os.makedirs(out_dir, exist_ok=True)
    reports = []
    for seed in seeds:
        seed_cfg = updated(cfg, {'fault.seed': seed})
        log(f'[compare] fault.seed={seed}')
        start = time.perf_counter()
        report = compare(seed_cfg, regime, os.path.join(out_dir, f'seed{seed}'), runs=runs,
                         log=log)
        report['wall_sec'] = time.perf_counter() - start
        reports.append(report)
    report = aggregate(reports)
    write_report(report, out_dir, seeds_markdown)
    return report


def _scalar_figures(entry: dict) -> dict:
    figures = {k: v for k, v in entry.items()
               if (isinstance(v, (int, float)) and not isinstance(v, bool)) or v is None}
    figures['events'] = len(entry['events'])
    return figures


def aggregate(reports: list[dict]) -> dict:
    """Mean and spread over per-seed `compare` reports (same runs in each)."""
    names = list(reports[0]['strategies'])
    strategies = {}
    for name in names:
        per_seed = [_scalar_figures(r['strategies'][name]) for r in reports]
        figures = {k: stats(p.get(k) for p in per_seed) for k in per_seed[0]}
        for key in ('program_steps', 'slowest_program_steps'):
            programs = sorted({p for r in reports for p in r['strategies'][name][key]})
            figures[key] = {p: stats(r['strategies'][name][key].get(p, 0) for r in reports)
                            for p in programs}
        strategies[name] = figures
    programs = {}
    for program in sorted({p for r in reports for p in r['programs']}):
        timed = [r['programs'][program] for r in reports if program in r['programs']]
        programs[program] = {'seeds_timed': len(timed),
                             'seconds': stats(t['seconds'] for t in timed),
                             'ratio_to_normal': stats(t['ratio_to_normal'] for t in timed)}
    report = {'regime': reports[0]['regime'], 'steps': reports[0]['steps'],
              'step_time_sec': reports[0]['step_time_sec'],
              'normal_program': reports[0]['normal_program'],
              'seeds': [{'fault_seed': r['fault_seed'], 'schedule': r['schedule'],
                         'wall_sec': r.get('wall_sec')} for r in reports],
              'programs': programs, 'strategies': strategies}
    report['ranking'] = ranking(strategies)
    means = {n: {k: (v or {}).get('mean') for k, v in s.items()
                 if k not in ('program_steps', 'slowest_program_steps')}
             for n, s in strategies.items()}
    report['baseline_wins'] = baseline_wins(means, spreads=strategies)
    return report


def ranking(strategies: dict) -> list[dict]:
    """Strategies by mean drop % (smallest first), each with the significance of
    its gap to the next one; empty when drops are n/a (no fault_free)."""
    ranked = sorted((n for n, s in strategies.items() if s.get('throughput_drop_pct')),
                    key=lambda n: strategies[n]['throughput_drop_pct']['mean'])
    rows = []
    for i, name in enumerate(ranked):
        row = {'rank': i + 1, 'strategy': name,
               'drop_pct': strategies[name]['throughput_drop_pct']}
        if i + 1 < len(ranked):
            row['next'] = ranked[i + 1]
            row.update(significance(strategies[name]['throughput_drop_pct'],
                                    strategies[ranked[i + 1]]['throughput_drop_pct']))
        rows.append(row)
    return rows


def _spread_table(strategies: dict, columns) -> str:
    return markdown_table(['strategy'] + [label for _, label, _ in columns],
                          [[name] + [format_spread(s.get(k), spec) for k, _, spec in columns]
                           for name, s in strategies.items()])


def _yes_no(value) -> str:
    return 'n/a' if value is None else ('yes' if value else 'no')


def seeds_markdown(report: dict) -> str:
    """The seeds' tables: cells are mean ± sample std [min, max] over seeds."""
    strategies = report['strategies']
    tables = [f"# Regime `{report['regime']}`, {report['steps']} steps, "
              f"fault.step_time_sec={report['step_time_sec']:g}, {len(report['seeds'])} seeds",
              markdown_table(('fault.seed', 'schedule (step:replica:duration)', 'wall s'),
                             [[s['fault_seed'], f"`{s['schedule'] or 'none'}`",
                               fmt(s['wall_sec'], '.0f')] for s in report['seeds']]),
              _spread_table(strategies, SEED_MAIN), _spread_table(strategies, SEED_MORE),
              markdown_table(('program', 'seeds timed', 'seconds alone on one device',
                              f"x {report['normal_program']}"),
                             [[name, p['seeds_timed'], format_spread(p['seconds'], '.5f'),
                               format_spread(p['ratio_to_normal'], '.3f')]
                              for name, p in report['programs'].items()]),
              markdown_table(('strategy', 'programs run (mean steps)', 'slowest (mean steps)'),
                             [[name] + [program_counts({p: round(v['mean'], 1)
                                                        for p, v in s[key].items()})
                                        for key in ('program_steps', 'slowest_program_steps')]
                              for name, s in strategies.items()]),
              markdown_table(('rank', 'strategy', 'drop %', 'next', 'gap', 'spread (std sum)',
                              'significant', 'same order in every seed'),
                             [[row['rank'], row['strategy'], format_spread(row['drop_pct'], '.2f'),
                               row.get('next', '-'), fmt(row.get('gap'), '.2f'),
                               fmt(row.get('spread'), '.2f'), _yes_no(row.get('significant')),
                               _yes_no(row.get('same_order_in_every_seed'))]
                              for row in report['ranking']])]
    if report['baseline_wins']:
        tables.append(wins_table(report['baseline_wins']))
    return '\n\n'.join(tables) + '\n'
