"""The time-to-target report: figures over seeds, paired gaps, markdown and the plot.

Owns what `scripts/time_to_target.py` writes from the stored (seed, run)
records: per run, goodput (the fault-free run's time to target over the
run's, per seed: 1.0 is fault-free; 0 for a seed that did not reach the
target within the limit, so the mean over seeds stays a lower bound that
counts every seed) and the perplexity increase at equal steps, each as the
mean over seeds with a 95% Student-t interval (`intervals.py`); the paired
difference in goodput between the default run and every other run; and the
noise of the validation set against the gaps it measures. Modelled time is
recomputed here from the records (`goodput.TimeModel`), so the report can be
rebuilt with other cost constants without training again.
"""
import dataclasses
import math
import os
import statistics

from mecefo_jax.config_resolve import updated
from studies.goodput import HOUR, TimeModel, time_to_target
from studies.intervals import seeds_to_separate, side, t_interval
from studies.report import fmt, markdown_table, pyplot, write_json

OUTPUT = 'time_to_target'  # time_to_target.{json,md,png}
INTERVAL_NOTE = ('95% two-sided Student-t over seeds (df = seeds - 1), paired per seed for '
                 'differences (studies/intervals.py)')


def _sem(values) -> float | None:
    values = list(values)
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None


def _seed_figures(record: dict, model: TimeModel, steps: int, free: dict) -> dict:
    """One run of one seed against the fault-free run of the seed (`free`: its figures)."""
    times, parts = model.timeline(record)
    target = free['target']
    ttt = time_to_target(record['val_curve'], times, target)
    val = dict(record['val_curve'])
    # The same crossing counted in steps: what the approximation costs in progress,
    # apart from what a step costs in time.
    steps_to_target = time_to_target(record['val_curve'], {s: float(s) for s in val}, target)
    rows, free_rows = record['row_losses'], free['row_losses']
    paired = (_sem(a - b for a, b in zip(rows, free_rows))
              if rows and free_rows and record['run'] != 'fault_free' else None)
    return {
        'seed': record['seed'], 'how': record['how'], 'schedule': record['schedule'],
        'reached': ttt is not None,
        'time_to_target_h': None if ttt is None else ttt / HOUR,
        'steps_to_target': steps_to_target,
        'goodput': 0.0 if ttt is None else free['ttt'] / ttt,
        'val_loss_at_steps': val[steps],
        'loss_gap_at_steps': val[steps] - target,
        'ppl_increase_pct': 100.0 * math.expm1(val[steps] - target),
        'hours_at_steps': times[steps] / HOUR, 'stopped_at': max(val),
        'changes': len(record['events']), 'refreshes': len(record['refresh_steps']),
        'saves': len(record['saves']), **parts,
        'level_sem': _sem(rows) if rows else None, 'paired_sem': paired,
        'val_curve_h': [[times[s] / HOUR, v] for s, v in record['val_curve']],
    }


def time_models(cfg, replicas: int, costs, bench: dict | None = None, model_cls=TimeModel,
                exposed: float | None = None):
    """record -> the `TimeModel` of the record's own rank, projection rule, attention
    backward and clock (a run of its own weighs its neighbour's step by its own FLOPs and
    met its failures on its own clock: `fault.time_model`, `fault.allreduce_exposed`); one
    per key. Records written before a field existed are of its first value ('weights',
    'steps', no all-reduce). With `bench` every record's steps cost the bench's measured
    ratios (the bench's own rule), diluted by `exposed` (None: the record's own phi).
    `model_cls` builds each model (a `TimeModel` that prices steps otherwise)."""
    models = {}

    def model_for(record: dict) -> TimeModel:
        key = (float(record.get('rank', cfg.mecefo.rank)), record.get('projection', 'weights'),
               record.get('skip_attention', True), record.get('attention_top_blocks', 0),
               record.get('time_model', 'steps'), record.get('allreduce_exposed', 0.0))
        if key not in models:
            run_cfg = updated(cfg, dict(zip(RECORD_FIELDS, key)))
            models[key] = model_cls(run_cfg, replicas, costs, bench,
                                    exposed if bench is not None else None)
        return models[key]
    return model_for


# The config fields a record's own `TimeModel` is built with, in `model_for`'s key order.
RECORD_FIELDS = ('mecefo.rank', 'mecefo.projection', 'mecefo.skip_attention',
                 'mecefo.attention_top_blocks', 'fault.time_model', 'fault.allreduce_exposed')


def figures_per_seed(records: dict, model_for, steps: int) -> dict[str, list[dict]]:
    """{run: [its figures per seed, in seed order]}, each timed by `model_for(record)`."""
    out: dict[str, list[dict]] = {}
    for seed_records in records.values():
        free_record = seed_records['fault_free']
        if free_record['val_curve'][-1][0] != steps:
            raise ValueError(f"seed {free_record['seed']}: the fault-free run's last evaluation "
                             f'is not after train.steps={steps}; its stored record is from '
                             'another config: use another --out.')
        target = free_record['val_curve'][-1][1]
        times, _ = model_for(free_record).timeline(free_record)
        free = {'target': target, 'row_losses': free_record['row_losses'],
                'ttt': time_to_target(free_record['val_curve'], times, target)}
        for name, record in seed_records.items():
            out.setdefault(name, []).append(_seed_figures(record, model_for(record), steps, free))
    return out


def _run_summary(rows: list[dict], record: dict) -> dict:
    def mean(key, among=rows):
        values = [r[key] for r in among if r[key] is not None]
        return statistics.fmean(values) if values else None
    # The noise of a gap matters where there is one: the seeds this run was trained in
    # (elsewhere it is the fault-free model, or has its gradients).
    trained = [r for r in rows if r['how'].startswith('trained')]
    return {
        'strategy': record['strategy'], 'regime': record['regime'], 'cap': record['cap'],
        'goodput': t_interval([r['goodput'] for r in rows]),
        'ppl_increase_pct': t_interval([r['ppl_increase_pct'] for r in rows]),
        'reached': [r['seed'] for r in rows if r['reached']],
        'time_to_target_h': [r['time_to_target_h'] for r in rows],
        'mean_time_to_target_h': mean('time_to_target_h'),
        'steps_to_target': [r['steps_to_target'] for r in rows],
        'mean_steps_to_target': mean('steps_to_target'),
        'hours_at_steps': [r['hours_at_steps'] for r in rows],
        'trained_seeds': [r['seed'] for r in trained],
        'mean_paired_sem': mean('paired_sem', trained),
        'mean_abs_gap_at_steps': (statistics.fmean(abs(r['loss_gap_at_steps']) for r in trained)
                                  if trained else None),
        'seeds': rows,
    }


def paired(runs: dict, default: str) -> dict:
    """{run: the default's goodput minus the run's, per seed, with its interval}."""
    ours = runs[default]['goodput']['per_seed']
    out = {}
    for name, r in runs.items():
        if name in (default, 'fault_free'):
            continue
        diffs = [a - b for a, b in zip(ours, r['goodput']['per_seed'])]
        interval = t_interval(diffs)
        # One seed has no spread: its interval is a point and says nothing.
        significant = (interval['lo'] > 0 or interval['hi'] < 0) if len(diffs) > 1 else None
        out[name] = {'vs_default': {k: interval[k] for k in ('mean', 'lo', 'hi')}, 'per_seed': diffs,
                     'significant': significant, 'seeds_needed': seeds_to_separate(diffs)}
    return out


def summarise(records: dict, *, cfg, settings, default: str, val_split_batches: float,
              config_name: str = '') -> dict:
    """The report's JSON from {seed: {run: record}} (see module docstring)."""
    seeds = list(records)
    first = records[seeds[0]]
    replicas = len(first['fault_free']['layouts'][0]['live'])
    model = TimeModel(cfg, replicas, settings.costs, settings.bench)
    steps = cfg.train.steps
    rows = figures_per_seed(records, time_models(cfg, replicas, settings.costs, settings.bench), steps)
    runs = {name: _run_summary(rows[name], first[name]) for name in first}
    level = [r['level_sem'] for r in rows['fault_free']]
    return {
        'config': config_name, 'seeds': seeds, 'default': default, 'steps': steps,
        'limit_steps': settings.limit(steps), 'replicas': replicas,
        'regime_replicas': settings.regime_replicas,
        'eval': {'eval_every': settings.eval_every, 'dense_eval_every': settings.dense_eval_every,
                 'dense_from_step': round(settings.dense_from * steps),
                 'eval_batches': cfg.train.eval_batches},
        'val_noise': {'eval_batches': cfg.train.eval_batches,
                      'val_split_batches': val_split_batches,
                      'sequences': len(first['fault_free']['row_losses']),
                      'level_sem': statistics.fmean(level) if None not in level else None,
                      'paired_sem': {n: r['mean_paired_sem'] for n, r in runs.items()},
                      'mean_abs_gap': {n: r['mean_abs_gap_at_steps'] for n, r in runs.items()}},
        'step_costs': model.step_cost_source,
        'costs': {**dataclasses.asdict(settings.costs), 'step_time_sec': model.step_time_sec,
                  'relaunch_delay_sec': model.relaunch_sec, 'refresh': model.refresh},
        'interval': 't', 'runs': runs, 'paired': paired(runs, default),
    }


def output_name(settings) -> str:
    """time_to_target, or time_to_target_bench when the steps cost a bench's ratios (the
    analytic report of the same records stays beside it)."""
    return OUTPUT + ('_bench' if settings.bench is not None else '')


def write(report: dict, out_dir: str, name: str = OUTPUT) -> None:
    write_json(os.path.join(out_dir, f'{name}.json'), report)
    with open(os.path.join(out_dir, f'{name}.md'), 'w') as f:
        f.write(markdown(report))
    plot(report, os.path.join(out_dir, f'{name}.png'))


def _interval(s: dict | None, spec: str) -> str:
    if s is None:
        return 'n/a'
    return f"{format(s['mean'], spec)} [{format(s['lo'], spec)}, {format(s['hi'], spec)}]"


def _seeds(values, spec: str) -> str:
    return ' / '.join(fmt(v, spec, '-') for v in values)


def _settings_table(report: dict) -> list[str]:
    """What the run was: seeds, replicas, target, evaluations, step costs (meaning:
    docs/time_to_target.md)."""
    e = report['eval']
    rows = [('seeds (train.seed = fault.seed = data.seed)', ', '.join(map(str, report['seeds']))),
            ('replicas; regimes read per replica of', f"{report['replicas']}; "
             f"{report['regime_replicas']}"),
            ('target: fault-free val loss after (steps); limit', f"{report['steps']}; "
             f"{report['limit_steps']}"),
            ('evaluations: every; dense every, from step; batches',
             f"{e['eval_every']}; {e['dense_eval_every']}, {e['dense_from_step']}; "
             f"{e['eval_batches']}"),
            ('step costs', report['step_costs']), ('intervals', INTERVAL_NOTE)]
    return [f"# Time to target: `{report['config'] or 'config'}`", '',
            markdown_table(('setting', 'value'), rows), '']


def _goodput_table(report: dict) -> list[str]:
    n = len(report['seeds'])
    rows = [(name, _interval(r['goodput'], '.3f'), _seeds(r['goodput']['per_seed'], '.3f'),
             f"{len(r['reached'])}/{n}", _seeds(r['time_to_target_h'], '.2f'),
             f"{statistics.fmean(r['hours_at_steps']):.2f}", fmt(r.get('mean_steps_to_target'), '.1f'))
            for name, r in report['runs'].items()]
    headers = ('run', 'goodput', 'per seed', 'reached', 'time to target h (per seed)',
               f"hours at {report['steps']} steps (mean)", 'steps to target (mean)')
    return ["## Goodput (fault-free time to target / the run's; 0: not reached)", '',
            markdown_table(headers, rows), '']


def _paired_table(report: dict) -> list[str]:
    rows = [(name, _interval(p['vs_default'], '+.3f'), _seeds(p['per_seed'], '+.3f'),
             side(dict(p['vs_default'], n=len(p['per_seed']))),
             fmt(p['seeds_needed'], '.0f'))
            for name, p in report['paired'].items()]
    return [f"## Paired: `{report['default']}` goodput minus each run's", '',
            markdown_table(('run', 'difference', 'per seed', 'side of 0',
                            'seeds to separate (80% power)'), rows), '']


def _ppl_table(report: dict) -> list[str]:
    rows = [(name, _interval(r['ppl_increase_pct'], '+.2f'),
             _seeds(r['ppl_increase_pct']['per_seed'], '+.2f'),
             '; '.join(dict.fromkeys(s['how'] for s in r['seeds'])))
            for name, r in report['runs'].items()]
    return [f"## Validation perplexity at {report['steps']} steps vs fault-free (%)", '',
            markdown_table(('run', 'increase %', 'per seed', 'how it was obtained (per seed)'),
                           rows), '']


def _noise(report: dict) -> list[str]:
    v = report['val_noise']
    rows = [(name, fmt(gap, '.4f', 'none (not trained)'),
             fmt(v['paired_sem'][name], '.4f', 'none (the fault-free gradients)'))
            for name, gap in v['mean_abs_gap'].items() if name != 'fault_free']
    return ["## The validation set's noise against the gaps", '',
            markdown_table(('batches', 'sequences', 'split (batches)', 'level standard error'),
                           [(v['eval_batches'], v['sequences'], f"{v['val_split_batches']:.2f}",
                             fmt(v['level_sem'], '.4f'))]), '',
            markdown_table(('run', 'mean abs gap in val loss', 'paired standard error'), rows), '']


def _costs(report: dict) -> list[str]:
    c = report['costs']
    rows = [(f'`{k}`', f'{c[k]:g}') for k in c if k != 'refresh']
    r = c['refresh']
    rows.append(('projection refresh', f"{r['refresh_sec']:.3g} s + {r['refresh_split_sec']:.3g} s "
                 f"/ live replicas ({r['refresh_source']})"))
    return ['## Cost constants (modelled cluster seconds; stated, not measured)', '',
            markdown_table(('constant', 'value'), rows), '']


def markdown(report: dict) -> str:
    return '\n'.join(_settings_table(report) + _goodput_table(report) + _paired_table(report)
                     + _ppl_table(report) + _noise(report) + _costs(report))


def plot(report: dict, path: str) -> None:
    """Validation loss against modelled hours: median over seeds, min-max band, per run."""
    import numpy as np
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    pairs = plt.get_cmap('tab20').colors  # ten hues, dark then light: one colour per run
    colors = pairs[0::2] + pairs[1::2]
    for k, (name, r) in enumerate(report['runs'].items()):
        color = colors[k % len(colors)]
        curves = [s['val_curve_h'] for s in r['seeds']]
        points = min(len(c) for c in curves)  # evaluations every seed has
        hours = np.median([[h for h, _ in c[:points]] for c in curves], axis=0)
        losses = np.array([[v for _, v in c[:points]] for c in curves])
        for ax in axes:
            ax.plot(hours, np.median(losses, axis=0), color=color, lw=1.2, label=name)
            ax.fill_between(hours, losses.min(axis=0), losses.max(axis=0), color=color,
                            alpha=0.15, lw=0)
    free = report['runs']['fault_free']['seeds']
    targets = [s['val_loss_at_steps'] for s in free]
    end = max(s['hours_at_steps'] for s in free)
    for ax in axes:
        ax.axhline(float(np.median(targets)), color='k', lw=0.6, ls='--')
        ax.set_xlabel('modelled hours')
        ax.set_ylabel('validation loss')
    axes[0].set_title('Validation loss (median over seeds, min-max band)')
    axes[1].set_title('Near the target (dashed: median fault-free target)')
    last = max(h for r in report['runs'].values() for s in r['seeds'] for h, _ in s['val_curve_h'])
    axes[1].set_xlim(0.75 * end, 1.02 * last)
    axes[1].set_ylim(min(targets) - 0.05, max(targets) + 0.15)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
