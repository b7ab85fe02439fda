"""Side-by-side comparison of fault-tolerance strategies under one schedule.

Runs `fault_free` and every strategy on the same data and the same seeded
failure schedule, then reports modelled throughput, wall-clock throughput
(labelled as such: fake CPU devices share the host's cores), final
validation loss and lost steps.

Modelled time (experiments/observers.py): each step lasts `fault.step_time_sec`
times the measured ratio of its slowest live device's program to a normal
device's (each role's program timed alone on one device), plus the measured
rebuild, compile, restore and blocking-checkpoint seconds and the modelled
relaunch delay of checkpoint/restart. `unscaled_tokens_per_sec` is the same
sum with the raw per-device times instead (dominated by compile time on CPU).

The report also carries the cost table behind that model: every device
program's measured seconds and its ratio to the normal program, and, per
strategy, on how many steps each program ran and was the slowest one, so
what each baseline pays per step is visible. Any figure on which a baseline
beats MeCeFO is stated in the markdown with both values.

`compare_seeds` repeats the comparison over several failure traces
(`fault.seed`), re-timing the programs for each, and reports mean, std, min
and max of every figure, and for each adjacent pair in the drop-% ranking
whether the gap exceeds the spread.
"""
import json
import os
import time

from mecefo_jax.config_resolve import updated
from mecefo_jax.experiments.report import distinct_seeds, fmt, format_spread, pyplot, significance, stats
from mecefo_jax.faults.strategies import STRATEGIES

RUNS = ('fault_free',) + STRATEGIES


def _run_config(cfg, name: str, regime: str):
    return updated(cfg, {
        'fault.regime': '' if name == 'fault_free' else regime,
        'fault.events': '' if name == 'fault_free' else cfg.fault.events,
        'fault.strategy': 'mecefo' if name == 'fault_free' else name,
        'train.checkpoint_every': 0,  # only checkpoint_restart pays for checkpoints
        # Eight evals per run draw the validation curves.
        'train.eval_every': max(1, cfg.train.steps // 8)})


def _schedule_programs(cfg, runs) -> set:
    """Every device program any run will use: layouts follow from the live masks."""
    from mecefo_jax.experiments.role_timer import layout_keys
    from mecefo_jax.faults import schedule as schedule_lib
    from mecefo_jax.faults.planner import config_planner
    from mecefo_jax.faults.strategies import layout_for
    replicas = num_replicas(cfg)
    steps = cfg.train.steps
    schedule = schedule_lib.FailureSchedule(
        schedule_lib.events_from_config(cfg.fault, num_replicas=replicas, total_steps=steps),
        replicas)
    masks = {schedule.live_mask(step) for step in range(steps)} | {(True,) * replicas}
    shard_batch = cfg.data.global_batch_size // replicas
    planner = config_planner(cfg, shard_batch)  # the controller's own
    return {key for name in runs for mask in masks if any(mask)
            for key in layout_keys(layout_for('mecefo' if name == 'fault_free' else name,
                                              mask, shard_batch,
                                              planner=planner))}


def _val_curve(workdir: str) -> list[tuple[int, float]]:
    from mecefo_jax.metrics import read_metrics
    return [(r['step'], r['val_loss']) for r in read_metrics(workdir) if 'val_loss' in r]


def _event_timings(events: list[dict]) -> list[dict]:
    keys = ('kind', 'step', 'replicas', 'live', 'detect_sec', 'rebuild_sec', 'compile_sec',
            'restore_sec', 'refresh_sec', 'first_step_sec', 'lost_steps',
            'relaunch_sec_modelled')
    return [{k: e[k] for k in keys} for e in events]


def _train_observed(cfg, workdir: str, timer) -> dict:
    """One run through `main.run`, with modelled time, tokens and program usage observed."""
    from mecefo_jax.experiments.observers import ModelledTime, ProgramUsage
    from mecefo_jax.layout import full_layout
    from mecefo_jax.main import run as train_run
    from mecefo_jax.observers import TokenCount
    from mecefo_jax.train import build_run
    run = build_run(cfg, workdir)
    normal = full_layout(run.num_shards, run.shard_batch)
    observers = [TokenCount(cfg.data.seq_len), ProgramUsage(timer),
                 ModelledTime(timer, cfg.fault.step_time_sec, normal)]
    return train_run(cfg, workdir, run=run, observers=observers)


def compare(cfg, regime: str, out_dir: str, *, runs=RUNS, log=print) -> dict:
    """Run every strategy, write compare_faults.{json,md,png}, return the JSON dict."""
    from mecefo_jax import optim
    from mecefo_jax.experiments.role_timer import RoleTimer
    from mecefo_jax.faults import schedule as schedule_lib
    from mecefo_jax.layout import ROLE_NORMAL, Program
    from mecefo_jax.model import build_model

    os.makedirs(out_dir, exist_ok=True)
    if regime:
        cfg = updated(cfg, {'fault.regime': regime})
    timer = RoleTimer(build_model(cfg), optim.make_optimizer(cfg.train),
                      seq_len=cfg.data.seq_len, vocab_size=cfg.model.vocab_size,
                      rank=cfg.mecefo.rank)
    timer.measure(_schedule_programs(cfg, runs))
    step_time = cfg.fault.step_time_sec
    results = {}
    for name in runs:
        log(f'[compare] {name}: training {cfg.train.steps} steps')
        workdir = os.path.join(out_dir, name)
        start = time.perf_counter()
        summary = _train_observed(_run_config(cfg, name, regime), workdir, timer)
        wall = time.perf_counter() - start
        summary.pop('state')
        results[name] = {
            'modeled_tokens_per_sec': summary['modeled_tokens_per_sec'],
            'wall_tokens_per_sec': summary['useful_tokens'] / wall,
            'final_val_loss': summary['final_val_loss'],
            'lost_steps': summary['lost_steps'],
            'executed_steps': summary['executed_steps'],
            'useful_tokens': summary['useful_tokens'],
            'modelled_sec': summary['modelled_sec'],
            'modelled_compute_sec': summary['modelled_compute_sec'],
            'unscaled_tokens_per_sec': summary['unscaled_tokens_per_sec'],
            'measured_overhead_sec': summary['measured_overhead_sec'],
            'checkpoint_block_sec': summary['checkpoint_block_sec'],
            'relaunch_sec_modelled': summary['relaunch_sec_modelled'],
            'compiles': summary['compiles'],
            # Modelled compute per executed step, in normal-step units.
            'mean_step_ratio': summary['modelled_compute_sec'] / (
                max(summary['executed_steps'], 1) * step_time),
            'degraded_steps': summary['degraded_steps'],
            'neighbour_steps': summary['neighbour_steps'],
            'program_steps': summary['program_steps'],
            'slowest_program_steps': summary['slowest_program_steps'],
            'events': _event_timings(summary['events']),
            'val_curve': _val_curve(workdir),
        }
        log(f"[compare] {name}: modelled {results[name]['modeled_tokens_per_sec']:.0f} tok/s, "
            f"val loss {results[name]['final_val_loss']:.4f}")
    normal = Program(ROLE_NORMAL, cfg.data.global_batch_size // num_replicas(cfg))
    programs = program_table(timer.table(), normal.name)
    for entry in results.values():
        # The worst program the strategy had to wait for, in normal-step units.
        entry['worst_step_ratio'] = max(programs[n]['ratio_to_normal']
                                        for n in entry['slowest_program_steps'])
    add_relative_figures(results)
    schedule = schedule_lib.format_events(schedule_lib.events_from_config(
        cfg.fault, num_replicas=num_replicas(cfg), total_steps=cfg.train.steps))
    report = {'regime': regime, 'fault_seed': cfg.fault.seed, 'schedule': schedule,
              'steps': cfg.train.steps, 'step_time_sec': step_time,
              'normal_program': normal.name, 'programs': programs, 'strategies': results}
    report['baseline_wins'] = baseline_wins(results)
    with open(os.path.join(out_dir, 'compare_faults.json'), 'w') as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(out_dir, 'compare_faults.md'), 'w') as f:
        f.write(markdown_table(report))
    plot(report, os.path.join(out_dir, 'compare_faults.png'))
    return report


def program_table(seconds_by_name: dict, normal_name: str) -> dict:
    """{program: {'seconds', 'ratio_to_normal'}} from a RoleTimer table."""
    if normal_name not in seconds_by_name:
        raise KeyError(f'the normal program {normal_name!r} was not timed; timed: '
                       f'{sorted(seconds_by_name)}. The all-live layout must be measured.')
    normal = seconds_by_name[normal_name]
    return {name: {'seconds': sec, 'ratio_to_normal': sec / normal}
            for name, sec in seconds_by_name.items()}


def add_relative_figures(results: dict) -> None:
    """Throughput drop and validation-loss change vs `fault_free`; None without it."""
    ref = results.get('fault_free')
    for entry in results.values():
        entry['throughput_drop_pct'] = (
            100.0 * (1.0 - entry['modeled_tokens_per_sec'] / ref['modeled_tokens_per_sec'])
            if ref else None)
        entry['val_loss_vs_fault_free_pct'] = (
            100.0 * (entry['final_val_loss'] / ref['final_val_loss'] - 1.0) if ref else None)


# (figure, label, higher is better, format): what "a baseline beats MeCeFO" is judged on.
WIN_FIGURES = (
    ('modeled_tokens_per_sec', 'modelled throughput (tok/s)', True, '.2f'),
    ('final_val_loss', 'final validation loss', False, '.4f'),
    ('mean_step_ratio', 'mean step cost (x normal step)', False, '.3f'),
    ('worst_step_ratio', 'slowest program (x normal step)', False, '.3f'),
    ('measured_overhead_sec', 'measured overhead (s)', False, '.2f'),
)
REFERENCE = 'mecefo'


def baseline_wins(strategies: dict, spreads: dict | None = None) -> list[str]:
    """Sentences for every figure on which a baseline beats `mecefo`, with both values.

    `strategies[name][figure]` is a number (one run) or the mean over seeds;
    with `spreads` ({name: {figure: {'std', 'values'}}}) each sentence also says
    whether the gap exceeds the spread (see `significance`).
    """
    ref = strategies.get(REFERENCE)
    if ref is None:
        return []
    lines = []
    for name, entry in strategies.items():
        if name in (REFERENCE, 'fault_free'):
            continue
        for figure, label, higher, spec in WIN_FIGURES:
            mine, theirs = ref.get(figure), entry.get(figure)
            if mine is None or theirs is None:
                continue
            if (theirs > mine) if higher else (theirs < mine):
                rel = f' ({100.0 * (theirs / mine - 1.0):+.2f}%)' if mine else ''
                line = (f'`{name}` beats `{REFERENCE}` on {label}: '
                        f'{format(theirs, spec)} vs {format(mine, spec)}{rel}')
                if spreads is not None:
                    sig = significance(spreads[REFERENCE][figure], spreads[name][figure])
                    line += f'; {sig["verdict"]}'
                lines.append(line + '.')
    return lines


def num_replicas(cfg) -> int:
    """Data-parallel replicas of the full mesh this config builds."""
    import jax

    from mecefo_jax.sharding import mesh_shape
    return mesh_shape(cfg.mesh, len(jax.devices()))[0]


def _counts(counter: dict) -> str:
    return ', '.join(f'{k} ({v})' for k, v in sorted(counter.items())) or '-'


def markdown_table(report: dict) -> str:
    lines = [f"Regime `{report['regime']}`, schedule `{report['schedule'] or 'none'}`, "
             f"{report['steps']} steps.", '',
             '| strategy | modelled tok/s | drop % | unscaled tok/s | wall tok/s | final val loss '
             '| vs fault-free % | lost steps | events | overhead s (measured) '
             '| relaunch s (modelled) |',
             '|---|---|---|---|---|---|---|---|---|---|---|']
    for name, r in report['strategies'].items():
        lines.append(
            f"| {name} | {r['modeled_tokens_per_sec']:.2f} | {fmt(r['throughput_drop_pct'], '.2f')} | "
            f"{r['unscaled_tokens_per_sec']:.0f} | {r['wall_tokens_per_sec']:.0f} | {r['final_val_loss']:.4f} | "
            f"{fmt(r['val_loss_vs_fault_free_pct'], '+.2f')} | {r['lost_steps']} | {len(r['events'])} | "
            f"{r['measured_overhead_sec']:.2f} | {r['relaunch_sec_modelled']:.0f} |")
    if 'fault_free' not in report['strategies']:
        lines += ['', 'fault_free was not run: drops and loss changes are n/a.']
    if report.get('programs'):
        lines += ['', *program_markdown(report['programs'], report['normal_program']),
                  '', *usage_markdown(report['strategies'])]
    wins = report.get('baseline_wins')
    if wins is not None:
        lines += ['', *wins_markdown(wins)]
    return '\n'.join(lines) + '\n'


def program_markdown(programs: dict, normal_name: str) -> list[str]:
    """The per-device program table: seconds alone on one device, ratio to normal."""
    lines = [f'Device programs, each timed alone on one device (median of interleaved calls); '
             f'ratio to the normal program `{normal_name}`:', '',
             '| program | seconds | x normal |', '|---|---|---|']
    for name, p in programs.items():
        lines.append(f"| {name} | {p['seconds']:.5f} | {p['ratio_to_normal']:.3f} |")
    return lines


def usage_markdown(strategies: dict) -> list[str]:
    """Which programs each strategy's layouts ran, and what its steps cost."""
    lines = ['Programs per strategy (executed steps on which some device ran it; steps on '
             'which it was the slowest, i.e. set the step time):', '',
             '| strategy | programs run (steps) | slowest (steps) | mean step x normal '
             '| worst step x normal | steps degraded | steps with a neighbour |',
             '|---|---|---|---|---|---|---|']
    for name, r in strategies.items():
        lines.append(f"| {name} | {_counts(r['program_steps'])} | "
                     f"{_counts(r['slowest_program_steps'])} | {r['mean_step_ratio']:.3f} | "
                     f"{r['worst_step_ratio']:.3f} | {r['degraded_steps']} | "
                     f"{r['neighbour_steps']} |")
    return lines


def wins_markdown(wins: list[str]) -> list[str]:
    if not wins:
        return [f'No baseline beats `{REFERENCE}` on any of: '
                + ', '.join(label for _, label, _, _ in WIN_FIGURES) + '.']
    return [f'Where a baseline beats `{REFERENCE}`:', ''] + [f'- {w}' for w in wins]


def plot(report: dict, path: str) -> None:
    plt = pyplot()
    names = list(report['strategies'])
    fig, (bars, curves) = plt.subplots(1, 2, figsize=(13, 4.5))
    bars.bar(names, [report['strategies'][n]['modeled_tokens_per_sec'] for n in names])
    bars.set_ylabel('modelled tokens/s')
    bars.set_title(f"Throughput, regime {report['regime'] or 'explicit'}")
    bars.tick_params(axis='x', rotation=30)
    for n in names:
        curve = report['strategies'][n]['val_curve']
        curves.plot([s for s, _ in curve], [v for _, v in curve], marker='o', label=n)
    curves.set_xlabel('step')
    curves.set_ylabel('validation loss')
    curves.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ------------------------------------------------------------ over seeds

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
    with open(os.path.join(out_dir, 'compare_faults.json'), 'w') as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(out_dir, 'compare_faults.md'), 'w') as f:
        f.write(seeds_markdown(report))
    plot_seeds(report, os.path.join(out_dir, 'compare_faults.png'))
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
        lines.append(f'| {name} | {_counts(run)} | {_counts(slow)} |')

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
