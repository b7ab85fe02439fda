"""Side-by-side comparison of fault-tolerance strategies under one schedule.

Runs `fault_free` and every strategy on the same data and the same seeded
failure schedule, and reports per strategy: modelled throughput (each step
lasts `fault.step_time_sec` times its slowest live device's program over a
normal device's, each program timed alone on one device, plus the measured
overheads: studies/probes.py), wall-clock throughput, final validation loss,
lost steps, the per-program cost table and which programs each strategy ran,
and every figure on which a baseline beats MeCeFO (`baseline_wins`). How to
read it: docs/failures.md. Over several failure seeds: `compare_over_seeds`.
"""
import json
import os
import time

from mecefo_jax.config_resolve import updated
from mecefo_jax.faults.strategies import STRATEGIES
from studies.report import fmt, markdown_table, significance

RUNS = ('fault_free',) + STRATEGIES
# What a run's summary (run.run with the probes) gives each strategy's entry as it is.
SUMMARY_FIGURES = ('modeled_tokens_per_sec', 'final_val_loss', 'lost_steps', 'executed_steps',
                   'useful_tokens', 'modelled_sec', 'modelled_compute_sec',
                   'unscaled_tokens_per_sec', 'measured_overhead_sec', 'checkpoint_block_sec',
                   'relaunch_sec_modelled', 'compiles', 'degraded_steps', 'neighbour_steps',
                   'program_steps', 'slowest_program_steps')


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
    from mecefo_jax.faults import schedule as schedule_lib
    from mecefo_jax.faults.planner import config_planner
    from mecefo_jax.faults.strategies import layout_for
    from studies.role_timer import layout_keys
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
    from mecefo_jax.training.metrics import read_metrics
    return [(r['step'], r['val_loss']) for r in read_metrics(workdir) if 'val_loss' in r]


def _event_timings(events: list[dict]) -> list[dict]:
    keys = ('kind', 'step', 'replicas', 'live', 'detect_sec', 'rebuild_sec', 'compile_sec',
            'restore_sec', 'refresh_sec', 'first_step_sec', 'lost_steps',
            'relaunch_sec_modelled')
    return [{k: e[k] for k in keys} for e in events]


def _train_observed(cfg, workdir: str, timer) -> dict:
    """One run through `run.run`, with modelled time, tokens and program usage observed."""
    from mecefo_jax.neighbour.layout import full_layout
    from mecefo_jax.run import run as train_run
    from mecefo_jax.training.observers import TokenCount
    from mecefo_jax.training.run_setup import build_run
    from studies.probes import ModelledTime, ProgramUsage
    run = build_run(cfg, workdir)
    normal = full_layout(run.num_shards, run.shard_batch)
    observers = [TokenCount(cfg.data.seq_len), ProgramUsage(timer),
                 ModelledTime(timer, cfg.fault.step_time_sec, normal)]
    return train_run(cfg, workdir, run=run, observers=observers)


def compare(cfg, regime: str, out_dir: str, *, runs=RUNS, log=print) -> dict:
    """Run every strategy, write compare_faults.{json,md}, return the JSON dict."""
    from mecefo_jax.faults import schedule as schedule_lib
    from mecefo_jax.model import optim
    from mecefo_jax.model.llama import build_model
    from mecefo_jax.neighbour.layout import ROLE_NORMAL, Program
    from studies.role_timer import RoleTimer

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
        results[name] = {key: summary[key] for key in SUMMARY_FIGURES}
        results[name].update(
            wall_tokens_per_sec=summary['useful_tokens'] / wall,
            # Modelled compute per executed step, in normal-step units.
            mean_step_ratio=summary['modelled_compute_sec'] / (
                max(summary['executed_steps'], 1) * step_time),
            events=_event_timings(summary['events']), val_curve=_val_curve(workdir))
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
    write_report(report, out_dir, markdown)
    return report


def write_report(report: dict, out_dir: str, markdown) -> None:
    """compare_faults.json, and compare_faults.md by `markdown(report)`."""
    with open(os.path.join(out_dir, 'compare_faults.json'), 'w') as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(out_dir, 'compare_faults.md'), 'w') as f:
        f.write(markdown(report))


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


# (figure, higher is better): what "a baseline beats MeCeFO" is judged on.
WIN_FIGURES = (('modeled_tokens_per_sec', True), ('final_val_loss', False),
               ('mean_step_ratio', False), ('worst_step_ratio', False),
               ('measured_overhead_sec', False))
REFERENCE = 'mecefo'


def baseline_wins(strategies: dict, spreads: dict | None = None) -> list[dict]:
    """Every figure on which a baseline beats `mecefo`, with both values.

    `strategies[name][figure]` is a number (one run) or the mean over seeds;
    with `spreads` ({name: {figure: {'std', 'values'}}}) each win also says
    whether the gap exceeds the spread (see `significance`).
    """
    ref = strategies.get(REFERENCE)
    wins = []
    for name, entry in strategies.items():
        if ref is None or name in (REFERENCE, 'fault_free'):
            continue
        for figure, higher in WIN_FIGURES:
            mine, theirs = ref.get(figure), entry.get(figure)
            if mine is None or theirs is None or not ((theirs > mine) if higher else (theirs < mine)):
                continue
            win = {'strategy': name, 'figure': figure, 'value': theirs, REFERENCE: mine,
                   'relative_pct': 100.0 * (theirs / mine - 1.0) if mine else None}
            if spreads is not None:
                sig = significance(spreads[REFERENCE][figure], spreads[name][figure])
                win.update(gap=sig['gap'], spread=sig['spread'], significant=sig['significant'])
            wins.append(win)
    return wins


def wins_table(wins: list[dict]) -> str:
    keys = ('strategy', 'figure', 'value', REFERENCE, 'relative_pct', 'gap', 'spread',
            'significant')
    keys = [k for k in keys if any(k in w for w in wins)]
    return markdown_table(keys, [[fmt(w.get(k), '.4g') if isinstance(w.get(k), float)
                                  else fmt(w.get(k), '') for k in keys] for w in wins])


def num_replicas(cfg) -> int:
    """Data-parallel replicas of the full mesh this config builds."""
    import jax

    from mecefo_jax.parallel.sharding import mesh_shape
    return mesh_shape(cfg.mesh, len(jax.devices()))[0]


def program_counts(counter: dict) -> str:
    """A table cell: `program (steps), ...` by program name, or '-' for none."""
    return ', '.join(f'{k} ({v})' for k, v in sorted(counter.items())) or '-'


def markdown(report: dict) -> str:
    """One seed's tables: strategies, device programs, programs per strategy, baseline wins."""
    strategies = markdown_table(
        ('strategy', 'modelled tok/s', 'drop %', 'unscaled tok/s', 'wall tok/s',
         'final val loss', 'vs fault-free %', 'lost steps', 'events', 'overhead s (measured)',
         'relaunch s (modelled)'),
        [[name, f"{r['modeled_tokens_per_sec']:.2f}", fmt(r['throughput_drop_pct'], '.2f'),
          f"{r['unscaled_tokens_per_sec']:.0f}", f"{r['wall_tokens_per_sec']:.0f}",
          f"{r['final_val_loss']:.4f}", fmt(r['val_loss_vs_fault_free_pct'], '+.2f'),
          r['lost_steps'], len(r['events']), f"{r['measured_overhead_sec']:.2f}",
          f"{r['relaunch_sec_modelled']:.0f}"] for name, r in report['strategies'].items()])
    tables = [f"# Regime `{report['regime']}`, schedule `{report['schedule'] or 'none'}`, "
              f"{report['steps']} steps", strategies]
    if report.get('programs'):
        tables.append(markdown_table(
            ('program', 'seconds alone on one device', f"x {report['normal_program']}"),
            [[name, f"{p['seconds']:.5f}", f"{p['ratio_to_normal']:.3f}"]
             for name, p in report['programs'].items()]))
        tables.append(markdown_table(
            ('strategy', 'programs run (steps)', 'slowest (steps)', 'mean step x normal',
             'worst step x normal', 'steps degraded', 'steps with a neighbour'),
            [[name, program_counts(r['program_steps']), program_counts(r['slowest_program_steps']),
              f"{r['mean_step_ratio']:.3f}", f"{r['worst_step_ratio']:.3f}", r['degraded_steps'],
              r['neighbour_steps']] for name, r in report['strategies'].items()]))
    if report.get('baseline_wins'):
        tables.append(wins_table(report['baseline_wins']))
    return '\n\n'.join(tables) + '\n'
