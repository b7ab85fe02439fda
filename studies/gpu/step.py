"""Report sections `step` (350M) and `step_1b`: one device's train step in every role.

Built from the step-cost benchmark's pieces (`studies/step_modes.py`'s
mode layouts and plain DP step, `step_measure.py`'s interleaved timer,
`step_efficiency.py`'s MFU), with what a GPU run adds and what a
10-minute budget allows:

  * `mecefo_planned`: a planned-style neighbour, `Program(ROLE_NEIGHBOUR,
    rows=1.5 B)` (its own shard and half an adopted one), beside `normal`,
    `mecefo` (two shards joined), `mecefo_per_batch`, `ndb_naive` and
    `plain_dp`;
  * the capped plan's mixed helpers (350M only): `mecefo_mixed`, its own
    shard exact and half an adopted one in neighbour mode (the rows of
    `mecefo_planned`), and `mecefo_mixed_eighth`, its own shard and an
    eighth of one (2 rows at the paper's 16 per shard: 16 orphaned rows
    spread over 8 helpers of a 32-replica cluster);
  * the batch is halved until XLA's memory plan of the largest program
    (`ndb_naive`, two shards exact) fits the device, and the result says so;
  * modes are compiled in priority order and no new one is started past
    `COMPILE_SHARE` of the section's time, so a slow compiler still leaves
    time to run what did compile (the others are listed as skipped);
  * XLA's FLOP count comes from straight-line (unrolled) programs of 1 and 2
    layers, extrapolated linearly in depth (blocks are identical): an
    unrolled 24-layer compile would cost minutes;
  * peak memory from the device's allocator (`memory_stats()`) beside XLA's
    plan: the first calls run in ascending order of planned peak, so the
    allocator's running peak after each is that mode's peak (the state
    included) as long as the plan orders the modes as the device does.

It writes the `bench_step.json` that `scripts/simulate_cluster.py --cost
bench` reads (`bench_step_1b.json` for 1B).
"""
from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time

import jax
import numpy as np

from studies import step_cost, step_efficiency, step_measure, step_modes
from studies.gpu import configs
from studies.gpu.child import write_json

MODES = ('normal', 'mecefo', 'ndb_naive', 'mecefo_planned', 'plain_dp', 'mecefo_per_batch')
MIXED_MODES = {'mecefo_mixed': 2, 'mecefo_mixed_eighth': 8}  # adopted rows: ceil(batch / n)
# 350M's priority order: the mixed helpers before the baselines' plain DP and per-batch neighbour.
MODES_350M = MODES[:4] + tuple(MIXED_MODES) + MODES[4:]
LARGEST = 'ndb_naive'  # two shards, exact backward: the largest memory plan
COMPILE_SHARE = 0.55  # no new compile past this fraction of the section's time
FIT_FRACTION = 0.9  # a plan fits when its peak is under this share of the device's limit
SHAPES = {
    'step': {
        'full': {'config': 'llama_350m', 'overrides': {}, 'batch': 16, 'warmup': 2, 'iters': 10,
                 'modes': MODES_350M, 'flops_modes': MODES + tuple(MIXED_MODES)},
        'smoke': {'config': 'tiny', 'overrides': {'model.num_layers': 3, 'model.attention': 'xla'},
                  'batch': 2, 'warmup': 1, 'iters': 3, 'modes': MODES_350M,
                  'flops_modes': ('normal',)}},
    'step_1b': {
        'full': {'config': 'llama_1b', 'overrides': {}, 'batch': 16, 'warmup': 2, 'iters': 6,
                 'modes': MODES, 'flops_modes': MODES},
        # The same code as `step`: the smoke runs it at `step`'s shape, so its
        # programs come from the compilation cache, and only the modes the
        # simulator needs, to keep the smoke's CPU time down.
        'smoke': {'config': 'tiny', 'overrides': {'model.num_layers': 3, 'model.attention': 'xla'},
                  'batch': 2, 'warmup': 1, 'iters': 2, 'modes': ('normal', 'mecefo', 'ndb_naive'),
                  'flops_modes': ()}},
}
BENCH_FILES = {'step': step_cost.OUTPUT_FILE, 'step_1b': 'bench_step_1b.json'}


def mode_layout(mode: str, batch: int):
    """step_modes' one-replica layouts, plus the planned-style neighbour (1.5 shards)
    and the mixed helpers (own shard exact, part of an adopted one approximate)."""
    from mecefo_jax.neighbour.layout import ROLE_MIXED, ROLE_NEIGHBOUR, Layout, Piece
    if mode == 'mecefo_planned':
        role, adopted = ROLE_NEIGHBOUR, math.ceil(batch / 2)
    elif mode in MIXED_MODES:
        role, adopted = ROLE_MIXED, math.ceil(batch / MIXED_MODES[mode])
    else:
        return step_modes.mode_layout(mode, batch)
    pieces = (Piece(0, 0, batch), Piece(1, 0, adopted))
    return Layout(replicas=(0,), roles=(role,), pieces=(pieces,))


@dataclasses.dataclass
class Setup:
    """Everything a compile needs for one model shape on one device."""
    cfg: object
    model: object
    optimizer: object
    mesh: object
    shardings: object
    state_abs: object
    device: object

    @classmethod
    def build(cls, cfg, model, device):
        from mecefo_jax.model.optim import make_optimizer
        from mecefo_jax.parallel import sharding
        from mecefo_jax.parallel.aot import abstract
        from mecefo_jax.parallel.state import abstract_train_state, state_shardings
        mesh = sharding.mesh_from_rows([[device]])
        optimizer = make_optimizer(cfg.train)
        rank = cfg.mecefo.rank
        shardings = state_shardings(model, optimizer, mesh, rank)
        state_abs = abstract(abstract_train_state(model, optimizer, rank=rank), shardings)
        return cls(cfg, model, optimizer, mesh, shardings, state_abs, device)

    def with_layers(self, layers: int, unroll: bool):
        model = self.model.variant(num_layers=layers, unroll_loops=unroll)
        return Setup.build(self.cfg, model, self.device)

    def compile(self, mode: str, batch: int):
        from mecefo_jax.parallel import sharding
        from mecefo_jax.parallel import step as step_lib
        from mecefo_jax.parallel.aot import abstract_batch
        seq = self.cfg.data.seq_len + 1
        if mode == 'plain_dp':
            tokens = jax.ShapeDtypeStruct((batch, seq), np.int32,
                                          sharding=sharding.data_sharded(self.mesh))
            fn = step_modes.make_plain_dp_step(self.model, self.optimizer, self.mesh,
                                              self.shardings.params, self.shardings.opt_state)
            return fn.lower(self.state_abs.params, self.state_abs.opt_state, tokens).compile()
        programs = mode_layout(mode, batch).programs
        fn = step_lib.make_train_step(self.model, self.optimizer, self.mesh, self.shardings,
                                      programs)
        return fn.lower(self.state_abs, abstract_batch(self.mesh, programs[0].rows, seq)).compile()


def device_limit(device) -> int | None:
    return (device.memory_stats() or {}).get('bytes_limit')


def fit_batch(setup: Setup, batch: int, log) -> tuple[int, dict, object]:
    """The largest batch <= `batch` (halving) whose largest plan fits the device."""
    from mecefo_jax.parallel.aot import memory_of
    limit = device_limit(setup.device)
    tried = []
    while True:
        start = time.perf_counter()
        compiled = setup.compile(LARGEST, batch)
        peak = memory_of(compiled)['peak_bytes']
        tried.append({'batch': batch, 'planned_peak_bytes': peak,
                      'compile_sec': time.perf_counter() - start})
        if limit is None or peak <= FIT_FRACTION * limit or batch == 1:
            break
        log(f'{LARGEST} at batch {batch} plans {peak / 2**30:.1f} GiB > {FIT_FRACTION:.0%} of '
            f'{limit / 2**30:.1f} GiB: halving the batch')
        batch //= 2
    note = ('no device memory limit on this backend: batch kept' if limit is None else
            f'largest program ({LARGEST}) planned within {FIT_FRACTION:.0%} of the device '
            f'limit at batch {batch}' + (' (reduced)' if len(tried) > 1 else ''))
    return batch, {'device_limit_bytes': limit, 'tried': tried, 'note': note}, compiled


def compile_modes(setup: Setup, batch: int, modes, first: tuple, ctx, start: float):
    """{mode: compiled} in priority order while time allows; details and skipped modes."""
    from mecefo_jax.parallel.aot import memory_of
    compiled, skipped = {first[0]: first[1]}, []
    details = {first[0]: {'compile_sec': first[2]}}
    budget = ctx.left() + (time.monotonic() - start)
    for mode in modes:
        if mode not in compiled:
            if time.monotonic() - start > COMPILE_SHARE * budget:
                skipped.append(mode)
                continue
            t0 = time.perf_counter()
            compiled[mode] = setup.compile(mode, batch)
            details[mode] = {'compile_sec': time.perf_counter() - t0}
        memory = memory_of(compiled[mode])
        details.setdefault(mode, {}).update(
            rows=batch if mode == 'plain_dp' else mode_layout(mode, batch).programs[0].rows,
            planned_peak_bytes=memory['peak_bytes'],
            planned_temp_bytes=memory['temp_size_in_bytes'])
        ctx.log(f'{mode}: compiled, planned peak {memory["peak_bytes"] / 2**20:.1f} MiB')
    return {m: compiled[m] for m in modes if m in compiled}, details, skipped


def time_modes(setup: Setup, compiled: dict, batch: int, warmup: int, iters: int, ctx):
    """Median step ms per mode (interleaved) and the allocator's running peak per mode."""
    from mecefo_jax.neighbour.layout import assemble
    from mecefo_jax.parallel import sharding
    from mecefo_jax.parallel.state import create_train_state
    state, _ = create_train_state(setup.model, setup.optimizer, setup.mesh, seed=0,
                                  rank=setup.cfg.mecefo.rank)
    tokens_nbt = step_modes.random_tokens(setup.cfg, batch, seed=0)
    runner = step_measure.StepRunner(state)
    del state
    calls = {}
    for mode, program in compiled.items():
        if mode == 'plain_dp':
            tokens = jax.device_put(tokens_nbt[0], sharding.data_sharded(setup.mesh))
            calls[mode] = runner.plain(program, tokens)
        else:
            host = dict(assemble(mode_layout(mode, batch), tokens_nbt), step=np.int32(0))
            calls[mode] = runner.mecefo(program, jax.device_put(
                host, sharding.batch_shardings(setup.mesh)))
    running_peak = first_calls_by_plan(calls, compiled, setup.device)
    ctx.log(f'timing {len(calls)} modes interleaved: {warmup} warm-up + {iters} rounds')
    times = step_measure.time_interleaved(calls, warmup=max(0, warmup - 1), iters=iters)
    return {m: float(statistics.median(t)) for m, t in times.items()}, times, running_peak


def first_calls_by_plan(calls: dict, compiled: dict, device) -> dict:
    """Call each mode once, smallest plan first; the allocator's peak after each."""
    from mecefo_jax.parallel.aot import memory_of
    order = sorted(calls, key=lambda m: memory_of(compiled[m])['peak_bytes'])
    peaks = {}
    for mode in order:
        calls[mode]()
        peaks[mode] = (device.memory_stats() or {}).get('peak_bytes_in_use')
    return peaks


def extrapolated_flops(setup: Setup, mode: str, batch: int) -> float:
    """XLA's count of the unrolled step at 1 and 2 layers, linear in depth."""
    from mecefo_jax.parallel.aot import flops_of
    one, two = (flops_of(setup.with_layers(n, unroll=True).compile(mode, batch)) for n in (1, 2))
    return one + (setup.model.cfg.num_layers - 1) * (two - one)


def count_flops(setup: Setup, modes: dict, which, batch: int, ctx) -> None:
    """Fill `modes[m]['flops']` for `which`, in order, while 3 counts' time is left."""
    last = 0.0
    for mode in [m for m in which if m in modes]:
        if ctx.left() < 3 * last + 5:
            ctx.log(f'FLOP counts stopped before {mode}: {ctx.left():.0f} s left')
            return
        t0 = time.perf_counter()
        modes[mode]['flops'] = extrapolated_flops(setup, mode, batch)
        last = time.perf_counter() - t0
        ctx.log(f'{mode}: {modes[mode]["flops"] / 1e9:.2f} GFLOP per step ({last:.1f} s)')


def ratios_to_normal(modes: dict) -> dict:
    base = modes['normal']
    return {mode: {k: (v[k] / base[k] if v.get(k) is not None and base.get(k) else None)
                   for k in step_cost.METRICS} for mode, v in modes.items()}


def mfu(setup: Setup, normal: dict, batch: int) -> dict:
    """step_efficiency's MFU (formula and XLA FLOPs over the device's peak), plus TFLOP/s achieved."""
    if normal.get('flops') is None:
        return {'applicable': False,
                'reason': 'the normal step was not FLOP-counted (not asked, or no time left)'}
    out = step_efficiency.normal_step_mfu(setup.cfg, setup.state_abs.params, normal, batch,
                                          setup.device, None)
    seconds = normal['step_ms'] / 1e3
    out['achieved_tflops_formula'] = out['formula_flops'] / seconds / 1e12
    out['achieved_tflops_xla'] = out['xla_flops'] / seconds / 1e12
    if not out['applicable']:
        out['reason'] = out['peak_source']
    return out


def extrapolation_check(setup: Setup, modes: dict, batch: int) -> dict:
    """Smoke only: the depth extrapolation against the full unrolled count of `normal`."""
    from mecefo_jax.parallel.aot import flops_of
    layers = setup.model.cfg.num_layers
    direct = flops_of(setup.with_layers(layers, unroll=True).compile('normal', batch))
    return {'layers': layers, 'direct': direct, 'extrapolated': modes['normal']['flops'],
            'ratio': modes['normal']['flops'] / direct}


def bench_json(out: dict) -> dict:
    """The `bench_step.json` the cluster simulator reads (faults/costs.py)."""
    return {'modes': out['modes'], 'ratios': out['ratios'], 'config': out['config'],
            'device': out['device'], 'jax_version': jax.__version__, 'mfu': out.get('mfu'),
            'measured': 'scripts/gpu_report.py: ' + out['measured'],
            'flops_note': out['flops_note']}


def run_step(ctx, key: str) -> dict:
    from mecefo_jax.model.llama import build_model
    from mecefo_jax.parallel.aot import flops_of, memory_of
    shape = SHAPES[key]['smoke' if ctx.smoke else 'full']
    cfg = configs.load(shape['config'], shape['overrides'])
    device = jax.devices()[0]
    setup = Setup.build(cfg, build_model(cfg), device)
    start = time.monotonic()
    batch, fit, largest = fit_batch(setup, shape['batch'], ctx.log)
    out = {'config_name': shape['config'], 'config': step_cost.config_summary(cfg, batch),
           'device': f'{device.platform}:{device.device_kind}',
           'batch_requested': shape['batch'], 'batch': batch, 'fit': fit,
           'measured': ('the full train step (forward, backward, AdamW update, state checks; '
                        'state donated) on one device, modes timed interleaved'),
           'flops_note': ('flops: XLA cost analysis of the unrolled step at 1 and 2 layers, '
                          'extrapolated linearly to the depth; flops_xla_raw: the scanned '
                          'program (loop bodies counted once)')}
    ctx.partial(out)
    first = (LARGEST, largest, fit['tried'][-1]['compile_sec'])
    compiled, details, skipped = compile_modes(setup, batch, shape['modes'], first, ctx, start)
    out.update(details=details, skipped_modes=skipped)
    ctx.partial(out)
    medians, times, peaks = time_modes(setup, compiled, batch, shape['warmup'], shape['iters'],
                                       ctx)
    modes = {}
    for mode, program in compiled.items():
        memory = memory_of(program)
        modes[mode] = {'step_ms': medians[mode], 'flops': None,
                       'flops_xla_raw': flops_of(program),
                       'temp_bytes': memory['temp_size_in_bytes'],
                       'peak_bytes': memory['peak_bytes'], 'device_peak_bytes': peaks[mode]}
        details[mode]['times_ms'] = times[mode]
        ctx.log(f'{mode}: {medians[mode]:.2f} ms')
    out.update(modes=modes, ratios=ratios_to_normal(modes))
    ctx.partial(out)
    count_flops(setup, modes, shape['flops_modes'], batch, ctx)
    out.update(ratios=ratios_to_normal(modes), mfu=mfu(setup, modes['normal'], batch))
    if ctx.smoke and modes['normal']['flops'] is not None:
        out['flops_extrapolation_check'] = extrapolation_check(setup, modes, batch)
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


def run_1b(ctx) -> dict:
    return run_step(ctx, 'step_1b')
