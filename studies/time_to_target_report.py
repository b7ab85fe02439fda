"""The time-to-target report: figures over seeds, paired gaps, markdown and the plot.

From the stored (seed, run) records of `scripts/time_to_target.py`: per run goodput (fault-free time to target over
the run's, per seed; 0 where the target was not reached) and the perplexity increase at equal steps, with 95%
Student-t intervals (`intervals.py`), the default run's paired goodput gap to every other run, and the validation
set's noise against those gaps (meaning: docs/time_to_target.md). Time is re-modelled from the records
(`goodput.TimeModel`): other costs need no retraining.
"""
import dataclasses
import functools
import math
import os
import statistics

from mecefo_jax.config.resolve import updated
from studies import intervals
from studies.goodput import HOUR, TimeModel, time_to_target
from studies.intervals import cell, side, t_interval
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
    curve, target = record['val_curve'], free['target']
    ttt, val = time_to_target(curve, times, target), dict(curve)
    rows, free_rows = record['row_losses'], free['row_losses']
    paired = _sem(a - b for a, b in zip(rows, free_rows)) if rows and free_rows and record['run'] != 'fault_free' \
        else None
    return {
        'seed': record['seed'], 'how': record['how'], 'schedule': record['schedule'], 'reached': ttt is not None,
        'time_to_target_h': None if ttt is None else ttt / HOUR,
        # The same crossing in steps: what the approximation costs in progress, apart from a step's time.
        'steps_to_target': time_to_target(curve, {s: float(s) for s in val}, target),
        'goodput': 0.0 if ttt is None else free['ttt'] / ttt,
        'val_loss_at_steps': val[steps], 'loss_gap_at_steps': val[steps] - target,
        'ppl_increase_pct': 100.0 * math.expm1(val[steps] - target),
        'hours_at_steps': times[steps] / HOUR, 'stopped_at': max(val),
        'changes': len(record['events']), 'refreshes': len(record['refresh_steps']),
        'saves': len(record['saves']), **parts,
        'level_sem': _sem(rows) if rows else None, 'paired_sem': paired,
        'val_curve_h': [[times[s] / HOUR, v] for s, v in curve],
    }


def time_models(cfg, replicas: int, costs, bench: dict | None = None, model_cls=TimeModel,
                exposed: float | None = None):
    """record -> a `model_cls` of the record's own RECORD_FIELDS (one per key; a record older than a field has its
    first value). With `bench` every step costs the bench's measured ratios, else the FLOP model's; each diluted by
    `exposed` (None: the record's own phi, the one its clock ran at)."""
    @functools.cache
    def model(key: tuple) -> TimeModel:
        run_cfg = updated(cfg, dict(zip(['mecefo.rank', *RECORD_FIELDS], key)))
        return model_cls(run_cfg, replicas, costs, bench, exposed)
    return lambda record: model((float(record.get('rank', cfg.mecefo.rank)),
                                 *(record.get(k, d) for k, d in RECORD_FIELDS.values())))


# {config field: (its record field, the value of a record older than it)} a record's own `TimeModel` is built with,
# beside its rank (`mecefo.rank`, the config's where it has none).
RECORD_FIELDS = {'mecefo.projection': ('projection', 'weights'), 'mecefo.skip_attention': ('skip_attention', True),
                 'mecefo.attention_top_blocks': ('attention_top_blocks', 0),
                 'fault.time_model': ('time_model', 'steps'), 'fault.allreduce_exposed': ('allreduce_exposed', 0.0)}


def figures_per_seed(records: dict, model_for, steps: int) -> dict[str, list[dict]]:
    """{run: [its figures per seed, in seed order]}, each timed by `model_for(record)`."""
    out: dict[str, list[dict]] = {}
    for seed_records in records.values():
        free_record = seed_records['fault_free']
        last, target = free_record['val_curve'][-1]
        if last != steps:
            raise ValueError(f"seed {free_record['seed']}: the fault-free run's last evaluation is not after "
                             f'train.steps={steps}; its stored record is from another config: use another --out.')
        times, _ = model_for(free_record).timeline(free_record)
        free = {'target': target, 'row_losses': free_record['row_losses'],
                'ttt': time_to_target(free_record['val_curve'], times, target)}
        for name, record in seed_records.items():
            out.setdefault(name, []).append(_seed_figures(record, model_for(record), steps, free))
    return out


def _run_summary(rows: list[dict], record: dict) -> dict:
    # The noise of a gap matters where there is one: the seeds this run was trained in (elsewhere it is the fault-free
    # model, or has its gradients).
    trained = [r for r in rows if r['how'].startswith('trained')]

    def of(key, among=rows):
        return [r[key] for r in among]

    def mean(key, among=rows):
        values = [v for v in of(key, among) if v is not None]
        return statistics.fmean(values) if values else None
    return {
        'strategy': record['strategy'], 'regime': record['regime'], 'cap': record['cap'],
        'goodput': t_interval(of('goodput')), 'ppl_increase_pct': t_interval(of('ppl_increase_pct')),
        'reached': [r['seed'] for r in rows if r['reached']],
        'time_to_target_h': of('time_to_target_h'), 'mean_time_to_target_h': mean('time_to_target_h'),
        'steps_to_target': of('steps_to_target'), 'mean_steps_to_target': mean('steps_to_target'),
        'hours_at_steps': of('hours_at_steps'), 'trained_seeds': of('seed', trained),
        'mean_paired_sem': mean('paired_sem', trained),
        'mean_abs_gap_at_steps': statistics.fmean(map(abs, of('loss_gap_at_steps', trained))) if trained else None,
        'seeds': rows,
    }


def paired(runs: dict, default: str) -> dict:
    """{run: the default's goodput minus the run's, per seed, with its interval}."""
    gaps = intervals.paired({name: r['goodput']['per_seed'] for name, r in runs.items()}, default)
    # One seed has no spread: its interval is a point and says nothing.
    return {name: {'vs_default': {k: d[k] for k in ('mean', 'lo', 'hi')}, 'per_seed': d['per_seed'],
                   'significant': d['side'] in '+−' if d['n'] > 1 else None, 'seeds_needed': d['seeds_needed']}
            for name, d in gaps.items()}


def summarise(records: dict, *, cfg, settings, default: str, val_split_batches: float,
              config_name: str = '') -> dict:
    """The report's JSON from {seed: {run: record}} (see module docstring)."""
    seeds, steps = list(records), cfg.train.steps
    first = records[seeds[0]]
    replicas = len(first['fault_free']['layouts'][0]['live'])
    model = TimeModel(cfg, replicas, settings.costs, settings.bench)
    rows = figures_per_seed(records, time_models(cfg, replicas, settings.costs, settings.bench), steps)
    runs = {name: _run_summary(rows[name], first[name]) for name in first}
    level = [r['level_sem'] for r in rows['fault_free']]
    return {
        'config': config_name, 'seeds': seeds, 'default': default, 'steps': steps,
        'limit_steps': settings.limit(steps), 'replicas': replicas, 'regime_replicas': settings.regime_replicas,
        'eval': {'eval_every': settings.eval_every, 'dense_eval_every': settings.dense_eval_every,
                 'dense_from_step': round(settings.dense_from * steps), 'eval_batches': cfg.train.eval_batches},
        'val_noise': {'eval_batches': cfg.train.eval_batches, 'val_split_batches': val_split_batches,
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
    """time_to_target, or time_to_target_bench where steps cost a bench's ratios (beside the analytic one)."""
    return OUTPUT + ('_bench' if settings.bench is not None else '')


def write(report: dict, out_dir: str, name: str = OUTPUT) -> None:
    write_json(os.path.join(out_dir, f'{name}.json'), report)
    with open(os.path.join(out_dir, f'{name}.md'), 'w') as f:
        f.write(markdown(report))
    plot(report, os.path.join(out_dir, f'{name}.png'))


def _seeds(values, spec: str) -> str:
    return ' / '.join(fmt(v, spec, '-') for v in values)


def _section(title: str | None, headers, rows) -> list[str]:
    """A table and a blank line, under `title` and a blank line where there is one."""
    return ([title, ''] if title else []) + [markdown_table(headers, rows), '']


def _settings_table(report: dict) -> list[str]:
    """What the run was: seeds, replicas, target, evaluations, step costs."""
    e = report['eval']
    rows = [('seeds (train.seed = fault.seed = data.seed)', ', '.join(map(str, report['seeds']))),
            ('replicas; regimes read per replica of', f"{report['replicas']}; {report['regime_replicas']}"),
            ('target: fault-free val loss after (steps); limit', f"{report['steps']}; {report['limit_steps']}"),
            ('evaluations: every; dense every, from step; batches',
             f"{e['eval_every']}; {e['dense_eval_every']}, {e['dense_from_step']}; {e['eval_batches']}"),
            ('step costs', report['step_costs']), ('intervals', INTERVAL_NOTE)]
    return _section(f"# Time to target: `{report['config'] or 'config'}`", ('setting', 'value'), rows)


def _run_tables(report: dict) -> list[str]:
    """Goodput, the default's paired gap to each run, and the perplexity increase."""
    n, runs = len(report['seeds']), report['runs']
    goodput = [(name, cell(r['goodput']), _seeds(r['goodput']['per_seed'], '.3f'),
                f"{len(r['reached'])}/{n}", _seeds(r['time_to_target_h'], '.2f'),
                f"{statistics.fmean(r['hours_at_steps']):.2f}", fmt(r.get('mean_steps_to_target'), '.1f'))
               for name, r in runs.items()]
    paired = [(name, cell(p['vs_default'], '+.3f'), _seeds(p['per_seed'], '+.3f'),
               side(dict(p['vs_default'], n=len(p['per_seed']))), fmt(p['seeds_needed'], '.0f'))
              for name, p in report['paired'].items()]
    ppl = [(name, cell(r['ppl_increase_pct'], '+.2f'), _seeds(r['ppl_increase_pct']['per_seed'], '+.2f'),
            '; '.join(dict.fromkeys(s['how'] for s in r['seeds']))) for name, r in runs.items()]
    return (_section("## Goodput (fault-free time to target / the run's; 0: not reached)",
                     ('run', 'goodput', 'per seed', 'reached', 'time to target h (per seed)',
                      f"hours at {report['steps']} steps (mean)", 'steps to target (mean)'), goodput)
            + _section(f"## Paired: `{report['default']}` goodput minus each run's",
                       ('run', 'difference', 'per seed', 'side of 0', 'seeds to separate (80% power)'), paired)
            + _section(f"## Validation perplexity at {report['steps']} steps vs fault-free (%)",
                       ('run', 'increase %', 'per seed', 'how it was obtained (per seed)'), ppl))


def _noise_and_costs(report: dict) -> list[str]:
    """The validation set's noise against the gaps, and the stated cost constants."""
    v, c = report['val_noise'], report['costs']
    gaps = [(name, fmt(gap, '.4f', 'none (not trained)'),
             fmt(v['paired_sem'][name], '.4f', 'none (the fault-free gradients)'))
            for name, gap in v['mean_abs_gap'].items() if name != 'fault_free']
    r = c['refresh']
    constants = [(f'`{k}`', f'{c[k]:g}') for k in c if k != 'refresh'] + [
        ('projection refresh', f"{r['refresh_sec']:.3g} s + {r['refresh_split_sec']:.3g} s "
         f"/ live replicas ({r['refresh_source']})")]
    return (_section("## The validation set's noise against the gaps",
                     ('batches', 'sequences', 'split (batches)', 'level standard error'),
                     [(v['eval_batches'], v['sequences'], f"{v['val_split_batches']:.2f}",
                       fmt(v['level_sem'], '.4f'))])
            + _section(None, ('run', 'mean abs gap in val loss', 'paired standard error'), gaps)
            + _section('## Cost constants (modelled cluster seconds; stated, not measured)',
                       ('constant', 'value'), constants))


def markdown(report: dict) -> str:
    return '\n'.join(_settings_table(report) + _run_tables(report) + _noise_and_costs(report))


def plot(report: dict, path: str) -> None:
    """Validation loss against modelled hours: median over seeds, min-max band, per run."""
    import numpy as np
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    pairs = plt.get_cmap('tab20').colors  # ten hues, dark then light: one colour per run
    colors = pairs[0::2] + pairs[1::2]
    for k, (name, r) in enumerate(report['runs'].items()):
        curves = [s['val_curve_h'] for s in r['seeds']]
        points = np.array([c[:min(map(len, curves))] for c in curves])  # the evaluations every seed has
        hours, losses = np.median(points[:, :, 0], axis=0), points[:, :, 1]
        for ax in axes:
            ax.plot(hours, np.median(losses, axis=0), color=colors[k % len(colors)], lw=1.2, label=name)
            ax.fill_between(hours, losses.min(axis=0), losses.max(axis=0), color=colors[k % len(colors)],
                            alpha=0.15, lw=0)
    free = report['runs']['fault_free']['seeds']
    targets = [s['val_loss_at_steps'] for s in free]
    for ax, title in zip(axes, ('Validation loss (median over seeds, min-max band)',
                                'Near the target (dashed: median fault-free target)')):
        ax.axhline(float(np.median(targets)), color='k', lw=0.6, ls='--')
        ax.set(xlabel='modelled hours', ylabel='validation loss', title=title)
    last = max(h for r in report['runs'].values() for s in r['seeds'] for h, _ in s['val_curve_h'])
    axes[1].set(xlim=(0.75 * max(s['hours_at_steps'] for s in free), 1.02 * last),
                ylim=(min(targets) - 0.05, max(targets) + 0.15))
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
