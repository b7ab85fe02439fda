"""Side-by-side comparison of fault-tolerance strategies under one schedule.

Runs `fault_free` and every strategy on the same data and the same seeded
failure schedule, then reports modelled throughput, wall-clock throughput
(labelled as such: fake CPU devices share the host's cores), final
validation loss and lost steps.

Modelled time (faults/controller.py): each step lasts `fault.step_time_sec`
times the measured ratio of its slowest live device's program to a normal
device's (each role's program timed alone on one device), plus the measured
rebuild, compile, restore and blocking-checkpoint seconds and the modelled
relaunch delay of checkpoint/restart. `unscaled_tokens_per_sec` is the same
sum with the raw per-device times instead (dominated by compile time on CPU).
"""
import copy
import json
import os
import time

from mecefo_jax.faults.strategies import STRATEGIES

RUNS = ('fault_free',) + STRATEGIES


def _run_config(cfg, name: str, regime: str):
    run_cfg = copy.deepcopy(cfg)
    run_cfg.fault.regime = '' if name == 'fault_free' else regime
    run_cfg.fault.events = '' if name == 'fault_free' else cfg.fault.events
    run_cfg.fault.strategy = 'mecefo' if name == 'fault_free' else name
    run_cfg.train.checkpoint_every = 0  # only checkpoint_restart pays for checkpoints
    # Eight evals per run draw the validation curves.
    run_cfg.train.eval_every = max(1, int(cfg.train.steps) // 8)
    return run_cfg


def _schedule_programs(cfg, runs) -> set:
    """Every device program any run will use: layouts follow from the live masks."""
    from mecefo_jax.faults import schedule as schedule_lib
    from mecefo_jax.faults.cost_model import layout_keys
    from mecefo_jax.faults.strategies import layout_for
    replicas = num_replicas(cfg)
    steps = int(cfg.train.steps)
    schedule = schedule_lib.FailureSchedule(
        schedule_lib.events_from_config(cfg.fault, num_replicas=replicas, total_steps=steps),
        replicas)
    masks = {schedule.live_mask(step) for step in range(steps)} | {(True,) * replicas}
    shard_batch = int(cfg.data.global_batch_size) // replicas
    return {key for name in runs for mask in masks if any(mask)
            for key in layout_keys(layout_for('mecefo' if name == 'fault_free' else name,
                                              mask, shard_batch,
                                              spread_k=int(cfg.fault.spread_k)))}


def _val_curve(workdir: str) -> list[tuple[int, float]]:
    from mecefo_jax.metrics import read_metrics
    return [(r['step'], r['val_loss']) for r in read_metrics(workdir) if 'val_loss' in r]


def _event_timings(events: list[dict]) -> list[dict]:
    keys = ('kind', 'step', 'replicas', 'live', 'detect_sec', 'rebuild_sec', 'compile_sec',
            'restore_sec', 'refresh_sec', 'first_step_sec', 'lost_steps',
            'relaunch_sec_modelled')
    return [{k: e[k] for k in keys} for e in events]


def compare(cfg, regime: str, out_dir: str, *, runs=RUNS, log=print) -> dict:
    """Run every strategy, write compare_faults.{json,md,png}, return the JSON dict."""
    from mecefo_jax import optim
    from mecefo_jax.faults import schedule as schedule_lib
    from mecefo_jax.faults.controller import FaultController
    from mecefo_jax.faults.cost_model import RoleTimer
    from mecefo_jax.model import Llama, ModelConfig

    os.makedirs(out_dir, exist_ok=True)
    cfg = copy.deepcopy(cfg)
    if regime:
        cfg.fault.regime = regime
    timer = RoleTimer(Llama(ModelConfig.from_config(cfg)), optim.make_optimizer(cfg.train),
                      seq_len=int(cfg.data.seq_len), vocab_size=int(cfg.model.vocab_size),
                      rank=cfg.mecefo.rank)
    timer.measure(_schedule_programs(cfg, runs))
    results = {}
    for name in runs:
        log(f'[compare] {name}: training {cfg.train.steps} steps')
        workdir = os.path.join(out_dir, name)
        start = time.perf_counter()
        summary = FaultController.train(_run_config(cfg, name, regime), workdir, timer=timer)
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
            'events': _event_timings(summary['events']),
            'val_curve': _val_curve(workdir),
        }
        log(f"[compare] {name}: modelled {results[name]['modeled_tokens_per_sec']:.0f} tok/s, "
            f"val loss {results[name]['final_val_loss']:.4f}")
    add_relative_figures(results)
    schedule = schedule_lib.format_events(schedule_lib.events_from_config(
        cfg.fault, num_replicas=num_replicas(cfg), total_steps=int(cfg.train.steps)))
    report = {'regime': regime, 'schedule': schedule, 'steps': int(cfg.train.steps),
              'role_seconds': timer.table(), 'strategies': results}
    with open(os.path.join(out_dir, 'compare_faults.json'), 'w') as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(out_dir, 'compare_faults.md'), 'w') as f:
        f.write(markdown_table(report))
    plot(report, os.path.join(out_dir, 'compare_faults.png'))
    return report


def add_relative_figures(results: dict) -> None:
    """Throughput drop and validation-loss change vs `fault_free`; None without it."""
    ref = results.get('fault_free')
    for entry in results.values():
        entry['throughput_drop_pct'] = (
            100.0 * (1.0 - entry['modeled_tokens_per_sec'] / ref['modeled_tokens_per_sec'])
            if ref else None)
        entry['val_loss_vs_fault_free_pct'] = (
            100.0 * (entry['final_val_loss'] / ref['final_val_loss'] - 1.0) if ref else None)


def _fmt(value, spec: str) -> str:
    return 'n/a' if value is None else format(value, spec)


def num_replicas(cfg) -> int:
    """Data-parallel replicas of the full mesh this config builds."""
    import jax
    from mecefo_jax.sharding import mesh_shape
    return mesh_shape(cfg.mesh, len(jax.devices()))[0]


def markdown_table(report: dict) -> str:
    lines = [f"Regime `{report['regime']}`, schedule `{report['schedule'] or 'none'}`, "
             f"{report['steps']} steps.", '',
             '| strategy | modelled tok/s | drop % | unscaled tok/s | wall tok/s | final val loss '
             '| vs fault-free % | lost steps | events | overhead s (measured) '
             '| relaunch s (modelled) |',
             '|---|---|---|---|---|---|---|---|---|---|---|']
    for name, r in report['strategies'].items():
        lines.append(
            f"| {name} | {r['modeled_tokens_per_sec']:.2f} | {_fmt(r['throughput_drop_pct'], '.2f')} | "
            f"{r['unscaled_tokens_per_sec']:.0f} | {r['wall_tokens_per_sec']:.0f} | {r['final_val_loss']:.4f} | "
            f"{_fmt(r['val_loss_vs_fault_free_pct'], '+.2f')} | {r['lost_steps']} | {len(r['events'])} | "
            f"{r['measured_overhead_sec']:.2f} | {r['relaunch_sec_modelled']:.0f} |")
    if 'fault_free' not in report['strategies']:
        lines += ['', 'fault_free was not run: drops and loss changes are n/a.']
    return '\n'.join(lines) + '\n'


def plot(report: dict, path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
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
