"""The strategy comparison over several failure seeds: mean, spread and a ranking.

`compare_seeds` repeats the comparison (`compare.compare`) over several
failure traces (`fault.seed`), re-timing the programs for each, and reports
mean, std, min and max of every figure, and for each adjacent pair in the
drop-% ranking whether the gap exceeds the spread.
"""
import os
import time

from mecefo_jax.config_resolve import updated
from studies.compare import (
    RUNS,
    baseline_wins,
    compare,
    program_counts,
    wins_markdown,
    write_report,
)
from studies.report import distinct_seeds, fmt, format_spread, pyplot, significance, stats

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
    in its own `compare` call. Writes compare_faults.{json,md,png} in out_dir.
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
    write_report(report, out_dir, seeds_markdown, plot_seeds)
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


def _seed_table(strategies: dict, columns) -> list[str]:
    lines = ['| strategy | ' + ' | '.join(label for _, label, _ in columns) + ' |',
             '|---|' + '---|' * len(columns)]
    for name, s in strategies.items():
        lines.append(f'| {name} | ' + ' | '.join(format_spread(s.get(k), spec)
                                                  for k, _, spec in columns) + ' |')
    return lines


def seeds_markdown(report: dict) -> str:
    seeds = report['seeds']
    lines = [f"Regime `{report['regime']}`, {report['steps']} steps, "
             f"fault.step_time_sec={report['step_time_sec']:g}, {len(seeds)} failure seeds. "
             'Cells: mean ± sample std [min, max] over seeds.', '',
             '| fault.seed | schedule (step:replica:duration) | wall s |', '|---|---|---|']
    for s in seeds:
        lines.append(f"| {s['fault_seed']} | `{s['schedule'] or 'none'}` | "
                     f"{fmt(s['wall_sec'], '.0f')} |")
    if len({s['schedule'] for s in seeds}) < len(seeds):
        lines += ['', 'Some seeds share a schedule (explicit `fault.events`?): their spread '
                  'is timing noise only.']
    strategies = report['strategies']
    lines += ['', *_seed_table(strategies, SEED_MAIN), '', *_seed_table(strategies, SEED_MORE)]
    if 'fault_free' not in strategies:
        lines += ['', 'fault_free was not run: drops and loss changes are n/a.']

    lines += ['', f"Device programs, each timed alone on one device, once per seed; ratio to "
              f"the normal program `{report['normal_program']}`:", '',
              '| program | seeds timed | seconds | x normal |', '|---|---|---|---|']
    for name, p in report['programs'].items():
        lines.append(f"| {name} | {p['seeds_timed']} | {format_spread(p['seconds'], '.5f')} | "
                     f"{format_spread(p['ratio_to_normal'], '.3f')} |")
    lines += ['', 'Programs per strategy, mean steps over seeds (on which some device ran it; '
              'on which it was the slowest):', '',
              '| strategy | programs run (mean steps) | slowest (mean steps) |', '|---|---|---|']
    for name, s in strategies.items():
        run = {p: round(v['mean'], 1) for p, v in s['program_steps'].items()}
        slow = {p: round(v['mean'], 1) for p, v in s['slowest_program_steps'].items()}
        lines.append(f'| {name} | {program_counts(run)} | {program_counts(slow)} |')

    lines += ['', 'Drop-% ranking (smallest first). A gap is significant when it exceeds the '
              'sum of the two sample stds; "every seed" says whether the order holds in each '
              'seed (same trace for all strategies within a seed).', '',
              '| rank | strategy | drop % | gap to next | spread (std sum) | significant '
              '| same order in every seed |', '|---|---|---|---|---|---|---|']
    def yes_no(value) -> str:
        return 'n/a' if value is None else ('yes' if value else 'no')

    for row in report['ranking']:
        pair = (['-'] * 4 if 'next' not in row else
                [fmt(row['gap'], '.2f'), fmt(row['spread'], '.2f'),
                 yes_no(row['significant']), yes_no(row['same_order_in_every_seed'])])
        lines.append(f"| {row['rank']} | {row['strategy']} | "
                     f"{format_spread(row['drop_pct'], '.2f')} | "
                     + ' | '.join(pair) + ' |')
    lines += ['', *ranking_sentences(report['ranking'])]
    lines += ['', *wins_markdown(report['baseline_wins'])]
    return '\n'.join(lines) + '\n'


def ranking_sentences(rows: list[dict]) -> list[str]:
    if not rows:
        return ['No drop-% ranking: fault_free was not run.']
    out = []
    for row in rows[:-1]:
        a, b = row['strategy'], row['next']
        if row['significant'] is None:
            out.append(f'- `{a}` < `{b}`: {row["verdict"]}.')
        elif row['significant']:
            out.append(f"- `{a}` ranks above `{b}` significantly: gap {row['gap']:.2f} points "
                       f"> spread {row['spread']:.2f}.")
        else:
            out.append(f"- `{a}` vs `{b}`: the ranking is not significant (gap "
                       f"{row['gap']:.2f} points <= spread {row['spread']:.2f}).")
    return out


def plot_seeds(report: dict, path: str) -> None:
    plt = pyplot()
    names = list(report['strategies'])
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    # Loss as a change vs fault-free when there is one: absolute losses differ by too
    # little to read on bars starting at zero.
    loss = (('val_loss_vs_fault_free_pct', 'final val loss vs fault-free %')
            if 'fault_free' in names else ('final_val_loss', 'final validation loss'))
    for ax, (key, label) in zip(axes, (('throughput_drop_pct', 'modelled throughput drop %'),
                                       loss)):
        shown = [n for n in names if report['strategies'][n].get(key)]
        s = [report['strategies'][n][key] for n in shown]
        ax.bar(shown, [x['mean'] for x in s], yerr=[x['std'] or 0.0 for x in s], capsize=4)
        for i, x in enumerate(s):
            ax.plot([i] * len(x['values']), x['values'], 'k.', ms=4)
        ax.set_ylabel(label)
        ax.tick_params(axis='x', rotation=30)
    axes[0].set_title(f"Regime {report['regime'] or 'explicit'}, {len(report['seeds'])} seeds "
                      '(bar: mean, whisker: std, dots: seeds)')
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
