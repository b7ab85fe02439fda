"""Report sections `step`, `step_best` and `step_1b`: one device's train step in every role.

Built from the step-cost benchmark's pieces (`studies/step_modes.py`'s
mode layouts and plain DP step, `step_measure.py`'s interleaved timer),
with what a GPU run adds and what the report's budget allows:

  * `step` (350M) and `step_1b` at the paper's 16 x 256 tokens a device;
    `step_best` (350M) at the batch and settings the sweep found fastest
    (`mfu_sweep.json` beside it), or at `STATED_BEST` when no sweep ran, so
    the verdict can price each point at the batch it models;
  * `mecefo_planned`: a planned-style neighbour (its own shard and half an
    adopted one), beside `normal`, `mecefo` (two shards joined),
    `mecefo_per_batch`, `ndb_naive` and `plain_dp`; and (350M) the capped
    plan's mixed helpers, `mecefo_mixed` (own shard exact, half an adopted
    one in neighbour mode) and `mecefo_mixed_eighth` (an eighth of one);
  * the batch is halved until XLA's memory plan of the largest program
    (`ndb_naive`, two shards exact) fits the device, and the result says so;
  * the other modes compile together (programs.compile_all) and none starts
    past `COMPILE_SHARE` of the section's time (those are listed as skipped);
  * FLOPs: the compiled program's matmuls, scanned layers counted by their
    trip count (`studies/xla_costs.matmul_flops`), not XLA's cost analysis,
    which counts a loop body once;
  * peak memory from the device's allocator (`memory_stats()`) beside XLA's
    plan: the first calls run in ascending order of planned peak, so the
    allocator's running peak after each is that mode's peak.

It writes `bench_step.json` (350M, 16 x 256), `bench_step_best.json` and
`bench_step_1b.json`, which `scripts/simulate_cluster.py --cost bench` reads.
"""
from __future__ import annotations

import json
import os
import statistics
import time

import jax

from studies import step_cost, step_measure, step_modes
from studies.gpu import configs
from studies.gpu.child import write_json
from studies.gpu.programs import (
    FIT_FRACTION,
    MIXED_MODES,
    PEAK_FLOPS,
    Setup,
    compile_all,
    device_limit,
    mfu,
    rows_of,
)
from studies.xla_costs import matmul_flops, memory_of

MODES = ('normal', 'mecefo', 'ndb_naive', 'mecefo_planned', 'plain_dp', 'mecefo_per_batch')
# 350M's priority order: the mixed helpers before the baselines' plain DP and per-batch neighbour.
MODES_350M = MODES[:4] + tuple(MIXED_MODES) + MODES[4:]
LARGEST = 'ndb_naive'  # two shards, exact backward: the largest memory plan
COMPILE_SHARE = 0.5  # no new compile past this fraction of the section's time
COMPILE_THREADS = 4
STATED_BEST = {'tokens_per_device': 16384, 'seq_len': 256}  # step_best when no sweep ran
SWEEP_FILE = 'mfu_sweep.json'
_SMOKE = {'config': 'tiny', 'overrides': {'model.num_layers': 2, 'model.attention': 'xla'},
          'batch': 2, 'warmup': 1, 'iters': 3}
SHAPES = {
    'step': {'full': {'config': 'llama_350m:gpu', 'overrides': {}, 'batch': 16, 'warmup': 2,
                      'iters': 10, 'modes': MODES_350M},
             'smoke': dict(_SMOKE, modes=MODES_350M)},
    'step_best': {'full': {'config': 'llama_350m:gpu', 'overrides': {}, 'batch': None,
                           'warmup': 2, 'iters': 8, 'modes': MODES_350M, 'model': 'llama_350m'},
                  # The modes the simulator needs, at the smoke sweep's best batch.
                  'smoke': dict(_SMOKE, batch=None, modes=('normal', 'mecefo', 'ndb_naive'),
                                model='llama_350m')},
    'step_1b': {'full': {'config': 'llama_1b:gpu', 'overrides': {}, 'batch': 16, 'warmup': 2,
                         'iters': 6, 'modes': MODES},
                # The same code as `step`: at `step`'s shape its programs come from the
                # compilation cache; only the modes the simulator needs.
                'smoke': dict(_SMOKE, iters=2, modes=('normal', 'mecefo', 'ndb_naive'))},
}
BENCH_FILES = {'step': step_cost.OUTPUT_FILE, 'step_best': 'bench_step_best.json',
               'step_1b': 'bench_step_1b.json'}


def best_shape(shape: dict, out_dir: str) -> tuple[dict, str]:
    """`shape` at the sweep's fastest 350M cell (its batch, sequence and settings), or at
    `STATED_BEST` when no sweep result is there; and where the batch came from."""
    path = os.path.join(out_dir, SWEEP_FILE)
    best = None
    if os.path.exists(path):
        with open(path) as f:
            best = (json.load(f).get('best') or {}).get(shape['model'])
    cell, source = (best, f"the sweep's fastest cell ({path})") if best else (
        STATED_BEST, 'stated (no sweep result): ' + json.dumps(STATED_BEST))
    seq = cell['seq_len']
    overrides = shape['overrides'] | {'data.seq_len': seq} | (cell.get('overrides') or {})
    return dict(shape, overrides=overrides, batch=max(1, cell['tokens_per_device'] // seq)), source


def fit_batch(setup: Setup, batch: int, log) -> tuple[int, dict, object]:
    """The largest batch <= `batch` (halving) whose largest plan fits the device."""
    tried = []
    while True:
        start = time.perf_counter()
        compiled = setup.compile(LARGEST, batch)
        fits, peak = setup.fits(compiled)
        tried.append({'batch': batch, 'planned_peak_bytes': peak,
                      'compile_sec': time.perf_counter() - start})
        if fits or batch == 1:
            break
        log(f'{LARGEST} at batch {batch} plans {peak / 2**30:.1f} GiB, over {FIT_FRACTION:.0%} '
            f'of the device: halving the batch')
        batch //= 2
    limit = device_limit(setup.device)
    note = ('no device memory limit on this backend: batch kept' if limit is None else
            f'largest program ({LARGEST}) planned within {FIT_FRACTION:.0%} of the device '
            f'limit at batch {batch}' + (' (reduced)' if len(tried) > 1 else ''))
    return batch, {'device_limit_bytes': limit, 'tried': tried, 'note': note}, compiled


def compile_modes(setup: Setup, batch: int, modes, largest, ctx, start: float):
    """{mode: compiled} in priority order while time allows; details and skipped modes."""
    jobs = {m: (lambda m=m: setup.compile(m, batch)) for m in modes if m != LARGEST}
    budget = ctx.left() + (time.monotonic() - start)
    compiled, seconds = compile_all(jobs, threads=COMPILE_THREADS, log=ctx.log,
                                    start_by=start + COMPILE_SHARE * budget)
    compiled[LARGEST], seconds[LARGEST] = largest
    details = {}
    for mode in [m for m in modes if m in compiled]:
        memory = memory_of(compiled[mode])
        details[mode] = {'compile_sec': seconds[mode], 'rows': rows_of(mode, batch),
                         'planned_peak_bytes': memory['peak_bytes'],
                         'planned_temp_bytes': memory['temp_size_in_bytes']}
    return ({m: compiled[m] for m in modes if m in compiled}, details,
            [m for m in modes if m not in compiled])


def time_modes(setup: Setup, compiled: dict, batch: int, warmup: int, iters: int, ctx):
    """Median step ms per mode (interleaved) and the allocator's running peak per mode."""
    tokens_nbt = step_modes.random_tokens(setup.cfg, batch, seed=0)
    runner = step_measure.StepRunner(setup.timing_state())
    calls = {}
    for mode, program in compiled.items():
        args = setup.batch(mode, batch, tokens_nbt)
        calls[mode] = (runner.plain if mode == 'plain_dp' else runner.mecefo)(program, args)
    start = time.perf_counter()
    running_peak = first_calls_by_plan(calls, compiled, setup.device)
    per_round = time.perf_counter() - start
    rounds = int(max(2, min(iters, 0.5 * ctx.left() / max(per_round, 1e-3) - warmup)))
    ctx.log(f'timing {len(calls)} modes interleaved: {warmup} warm-up + {rounds} rounds')
    times = step_measure.time_interleaved(calls, warmup=max(0, warmup - 1), iters=rounds)
    return {m: float(statistics.median(t)) for m, t in times.items()}, times, running_peak


def first_calls_by_plan(calls: dict, compiled: dict, device) -> dict:
    """Call each mode once, smallest plan first; the allocator's peak after each."""
    order = sorted(calls, key=lambda m: memory_of(compiled[m])['peak_bytes'])
    peaks = {}
    for mode in order:
        calls[mode]()
        peaks[mode] = (device.memory_stats() or {}).get('peak_bytes_in_use')
    return peaks


def ratios_to_normal(modes: dict) -> dict:
    base = modes['normal']
    return {mode: {k: (v[k] / base[k] if v.get(k) is not None and base.get(k) else None)
                   for k in step_cost.METRICS} for mode, v in modes.items()}


def bench_json(out: dict) -> dict:
    """The `bench_step.json` the cluster simulator reads (faults/costs.py)."""
    return {'modes': out['modes'], 'ratios': out['ratios'], 'config': out['config'],
            'device': out['device'], 'jax_version': jax.__version__, 'mfu': out.get('mfu'),
            'batch_source': out['batch_source'],
            'measured': 'scripts/gpu_report.py: ' + out['measured'],
            'flops_note': out['flops_note']}


def run_step(ctx, key: str) -> dict:
    shape = SHAPES[key]['smoke' if ctx.smoke else 'full']
    source = f'stated: {shape["batch"]} sequences a device'
    if shape['batch'] is None:
        shape, source = best_shape(shape, ctx.out)
    cfg = configs.load(shape['config'], shape['overrides'])
    setup = Setup.build(cfg)
    device, start = setup.device, time.monotonic()
    batch, fit, largest = fit_batch(setup, shape['batch'], ctx.log)
    out = {'config_name': shape['config'], 'config': step_cost.config_summary(cfg, batch),
           'device': f'{device.platform}:{device.device_kind}', 'batch_source': source,
           'batch_requested': shape['batch'], 'batch': batch, 'fit': fit,
           'measured': ('the full train step (forward, backward, AdamW update, state checks; '
                        'state donated) on one device, modes timed interleaved'),
           'flops_note': ("flops: the compiled step's matmul FLOPs, while bodies times their "
                          'trip count (studies/xla_costs.matmul_flops)')}
    ctx.partial(out)
    compiled, details, skipped = compile_modes(
        setup, batch, shape['modes'], (largest, fit['tried'][-1]['compile_sec']), ctx, start)
    out.update(details=details, skipped_modes=skipped)
    ctx.partial(out)
    medians, times, peaks = time_modes(setup, compiled, batch, shape['warmup'], shape['iters'],
                                       ctx)
    modes = {}
    for mode, program in compiled.items():
        memory = memory_of(program)
        modes[mode] = {'step_ms': medians[mode], 'flops': matmul_flops(program.as_text())['flops'],
                       'temp_bytes': memory['temp_size_in_bytes'],
                       'peak_bytes': memory['peak_bytes'], 'device_peak_bytes': peaks[mode]}
        details[mode]['times_ms'] = times[mode]
        ctx.log(f'{mode}: {medians[mode]:.2f} ms, {modes[mode]["flops"] / 1e9:.4g} GFLOP')
    tokens, seconds = batch * cfg.data.seq_len, modes['normal']['step_ms'] / 1e3
    out.update(modes=modes, ratios=ratios_to_normal(modes), mfu={
        'formula': mfu(cfg, setup.state_abs.params, tokens, seconds),
        'matmuls': modes['normal']['flops'] / seconds / PEAK_FLOPS,
        'peak_flops': PEAK_FLOPS, 'tokens_per_step': tokens})
    out['device_memory_note'] = (
        'device_peak_bytes: memory_stats()["peak_bytes_in_use"] after each mode\'s first call, '
        'modes called in ascending order of planned peak (a running maximum, state included); '
        "peak_bytes: XLA's plan, arguments + outputs + temporaries - aliased")
    if ctx.out:
        path = os.path.join(ctx.out, BENCH_FILES[key])
        write_json(path, bench_json(out))
        out['bench_json'] = path
    return out


def run_350m(ctx) -> dict:
    return run_step(ctx, 'step')


def run_best(ctx) -> dict:
    return run_step(ctx, 'step_best')


def run_1b(ctx) -> dict:
    return run_step(ctx, 'step_1b')
