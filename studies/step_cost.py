"""Step-cost benchmark: what one device pays for a full train step in each role (`scripts/bench_step.py`).

The per-device cost of MeCeFO (Hu et al., NeurIPS 2025, arXiv 2510.16415)
against exact and plain baselines. Per mode of `step_modes.MODES`: `flops`,
XLA's cost analysis of the step compiled with `unroll_loops=True` (XLA counts
a while body once whatever its trip count; `flops_xla_raw` is the scanned
program's count; a program with no loop is counted as it is), `temp_bytes`
and `peak_bytes` (arguments + outputs + temporaries - aliased, the state
donated) of the real step, and `step_ms`, the median of calls interleaved
with the other modes. Beside them: `ratios` (mode / normal), the gradient
error of mecefo against ndb_naive on the same two shards, and the
fault-free step against plain_dp on the config's full mesh (`overhead`).
XLA:CPU computes bfloat16 dots in float32, so CPU bytes and times of a bf16
model overstate a GPU's. Writes `bench_step.json`.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

import jax
import numpy as np

from studies.fidelity import grad_rel_error, grad_rel_error_by_param
from studies.report import fmt, markdown_table
from studies.step_modes import (
    MECEFO_MODES,
    MODES,
    Bench,
    StepRunner,
    make_plain_dp_step,
    mode_layout,
    random_tokens,
    time_interleaved,
)
from studies.xla_costs import count_while_loops, flops_of, memory_of

METRICS = ('flops', 'temp_bytes', 'peak_bytes', 'step_ms')
OUTPUT_FILE = 'bench_step.json'
OVERHEAD_TARGET = 1.03  # fault-free step time / plain_dp step time


def config_summary(cfg, batch: int) -> dict[str, Any]:
    m = cfg.model
    return {'vocab_size': m.vocab_size, 'd_model': m.d_model, 'num_layers': m.num_layers,
            'num_heads': m.num_heads, 'num_kv_heads': m.num_kv_heads, 'ffn_hidden': m.ffn_hidden,
            'dtype': m.dtype, 'seq_len': cfg.data.seq_len, 'per_device_batch': int(batch),
            'rank': cfg.mecefo.rank, 'remat_ffn': cfg.mecefo.remat_ffn, 'remat_policy': m.remat_policy,
            'scan_layers': m.scan_layers, 'attention': m.attention, 'loss_chunk_tokens': m.loss_chunk_tokens}


def compile_mode(bench: Bench, mode: str, log):
    """(real program, figures, details) of one mode; a real program with no while loop (one
    layer, one loss chunk) is straight-line code, its own complete FLOP count."""
    make, args, info = bench.program(mode)
    t0 = time.perf_counter()
    real = make(bench.model).lower(*args).compile()
    times = {'compile_s': time.perf_counter() - t0, 'flops_source': 'step (no loops)'}
    counting = real
    if count_while_loops(real):
        t1 = time.perf_counter()
        counting = make(bench.model.variant(unroll_loops=True)).lower(*args).compile()
        times.update(compile_unrolled_s=time.perf_counter() - t1, flops_source='unrolled step')
    memory = memory_of(real)
    figures = {'flops': flops_of(counting), 'flops_xla_raw': flops_of(real),
               'temp_bytes': memory['temp_size_in_bytes'], 'peak_bytes': memory['peak_bytes'], 'step_ms': None}
    details = {**info, **times, **memory, 'while_loops_in_flops_program': count_while_loops(counting),
               'while_loops_in_step': count_while_loops(real),
               'conditionals_in_step': (real.as_text() or '').count(' conditional(')}
    log(f"bench[{mode}]: compiled in {times['compile_s']:.1f} s, flops={figures['flops']:.4g} "
        f"(raw {figures['flops_xla_raw']:.4g}) peak={memory['peak_bytes'] / 2**20:.1f} MiB")
    return real, figures, details


def optimizer_update_cost(bench: Bench) -> dict:
    """The batch-independent part of every step: AdamW (+ clipping) alone."""
    def update(grads, opt_state, params):
        import optax
        updates, opt_state = bench.optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state
    params = bench.state_abs.params
    upd = jax.jit(update).lower(params, bench.state_abs.opt_state, params).compile()
    return {'flops': flops_of(upd), 'temp_bytes': memory_of(upd)['temp_size_in_bytes']}


def two_shard_gradients(model, mesh, state, tokens_nbt) -> dict[str, Any]:
    """Host gradients of the ndb_naive and mecefo programs on the same two shards
    (`step.make_grad_fn`: gradient sums over the token count, as the train step)."""
    from mecefo_jax.neighbour.layout import assemble
    from mecefo_jax.parallel import sharding
    from mecefo_jax.parallel import step as step_lib
    grads = {}
    for mode in ('ndb_naive', 'mecefo'):
        layout = mode_layout(mode, tokens_nbt.shape[1])
        batch = jax.device_put(dict(assemble(layout, tokens_nbt), step=np.int32(0)),
                               sharding.batch_shardings(mesh))
        grad_fn = jax.jit(step_lib.make_grad_fn(model, mesh, layout.programs, ordered_reduction=False))
        grads[mode] = jax.device_get(grad_fn(state.params, state.projections, batch)[0])
    return grads


def _time_modes(bench: Bench, result: dict, compiled: dict, *, warmup: int, iters: int, seed: int, log) -> None:
    """Gradient error of mecefo vs ndb_naive, then every mode timed interleaved."""
    from mecefo_jax.neighbour.layout import assemble
    from mecefo_jax.parallel import sharding
    from mecefo_jax.parallel.state import create_train_state
    log('bench: initialising parameters and SVD projections...')
    state, _ = create_train_state(bench.model, bench.optimizer, bench.mesh, seed=seed, rank=bench.cfg.mecefo.rank)
    tokens_nbt = random_tokens(bench.cfg, bench.batch, seed)
    grads = two_shard_gradients(bench.model, bench.mesh, state, tokens_nbt)
    result['grad_rel_error'] = grad_rel_error(grads['mecefo'], grads['ndb_naive'])
    result['grad_rel_error_by_param'] = grad_rel_error_by_param(grads['mecefo'], grads['ndb_naive'])
    del grads
    runner = StepRunner(state)
    calls = {mode: runner.mecefo(compiled[mode], jax.device_put(
        dict(assemble(mode_layout(mode, bench.batch), tokens_nbt), step=np.int32(0)),
        sharding.batch_shardings(bench.mesh))) for mode in MECEFO_MODES}
    calls['plain_dp'] = runner.plain(compiled['plain_dp'],
                                     jax.device_put(tokens_nbt[0], sharding.data_sharded(bench.mesh)))
    log(f'bench: timing, modes interleaved ({warmup} warm-up + {iters} timed rounds)...')
    times = time_interleaved(calls, warmup=warmup, iters=iters)
    for mode in MODES:
        result['modes'][mode]['step_ms'] = float(statistics.median(times[mode]))
        result['details'][mode]['times_ms'] = times[mode]


def fault_free_overhead(cfg, model, optimizer, *, batch: int, warmup: int, iters: int, seed: int = 0,
                        log=print) -> dict[str, Any]:
    """Fault-free train step vs plain_dp on the config's full mesh, same state and global batch,
    timed interleaved: the ratio of medians, and the median and quartiles of per-round ratios."""
    from mecefo_jax.neighbour.layout import assemble, full_layout
    from mecefo_jax.parallel import sharding
    from mecefo_jax.parallel import step as step_lib
    from mecefo_jax.parallel.state import create_train_state
    mesh = sharding.make_mesh(cfg.mesh, allow_subset=True)  # e.g. the tests' 1x1 mesh
    data, model_width = mesh.shape[sharding.DATA_AXIS], mesh.shape[sharding.MODEL_AXIS]
    layout, seq = full_layout(data, batch), cfg.data.seq_len + 1
    log(f'bench[overhead]: fault-free step vs plain_dp on a {data}x{model_width} mesh...')
    state, shardings = create_train_state(model, optimizer, mesh, seed=seed, rank=cfg.mecefo.rank)
    tokens_nbt = np.random.default_rng(seed + 1).integers(0, cfg.model.vocab_size, (data, batch, seq),
                                                          dtype=np.int32)
    step_batch = jax.device_put(dict(assemble(layout, tokens_nbt), step=np.int32(0)),
                                sharding.batch_shardings(mesh))
    tokens = jax.device_put(tokens_nbt.reshape(data * batch, seq), sharding.data_sharded(mesh))
    fault_free = step_lib.make_train_step(model, optimizer, mesh, shardings,
                                          layout.programs, ordered_reduction=False).lower(state, step_batch).compile()
    plain = make_plain_dp_step(model, optimizer, mesh, shardings.params, shardings.opt_state).lower(
        state.params, state.opt_state, tokens).compile()
    runner = StepRunner(state)
    times = time_interleaved({'fault_free': runner.mecefo(fault_free, step_batch),
                              'plain_dp': runner.plain(plain, tokens)}, warmup=max(warmup, 2), iters=iters)
    ff, pd = (float(statistics.median(times[k])) for k in ('fault_free', 'plain_dp'))
    # Each round ran both steps back to back: the per-round ratio cancels load changes
    # slower than a round; its quartiles show the noise.
    paired = sorted(a / b for a, b in zip(times['fault_free'], times['plain_dp']))
    quartiles = statistics.quantiles(paired, n=4) if len(paired) > 1 else [paired[0]] * 3
    log(f'bench[overhead]: fault-free {ff:.2f} ms, plain_dp {pd:.2f} ms, ratio {ff / pd:.3f}')
    return {'mesh': {'data': int(data), 'model': int(model_width)}, 'global_batch': int(data * batch),
            'iters': iters, 'fault_free_ms': ff, 'plain_dp_ms': pd, 'ratio': ff / pd,
            'paired_ratio_median': float(statistics.median(paired)),
            'paired_ratio_quartiles': [float(quartiles[0]), float(quartiles[2])],
            'target': OVERHEAD_TARGET, 'met': ff / pd <= OVERHEAD_TARGET,
            'flops_xla_raw': {'fault_free': flops_of(fault_free), 'plain_dp': flops_of(plain)},
            'peak_bytes': {'fault_free': memory_of(fault_free)['peak_bytes'],
                           'plain_dp': memory_of(plain)['peak_bytes']},
            'times_ms': times}


def _overhead(bench: Bench, *, warmup: int, iters: int, seed: int, log) -> dict:
    """The fault-free overhead check on the config's mesh, if it fits this host."""
    from mecefo_jax.parallel import sharding
    try:  # e.g. a 4-way 'model' mesh on a one-GPU host
        sharding.mesh_shape(bench.cfg.mesh, len(jax.devices()), allow_subset=True)
    except ValueError as error:
        log(f'bench[overhead]: skipped: {error}')
        return {'skipped': f"the config's mesh does not fit this host: {error}"}
    return fault_free_overhead(bench.cfg, bench.model, bench.optimizer, batch=bench.batch, warmup=warmup,
                               iters=iters, seed=seed, log=log)


def run_benchmark(cfg, out_dir: str | None = None, *, batch: int = 4, warmup: int = 2, iters: int = 5,
                  seed: int = 0, device=None, overhead: bool = True, overhead_iters: int = 30,
                  log=None) -> dict[str, Any]:
    """Cost (and with `iters > 0` time) every mode of `cfg`'s model; write `out_dir/bench_step.json`."""
    log = log or (lambda msg: print(msg, flush=True))
    if batch < 1 or iters < 0 or warmup < 0 or overhead_iters < 1:
        raise ValueError(f'need --batch >= 1, --iters >= 0, --warmup >= 0 and --overhead_iters >= 1; got '
                         f'batch={batch}, iters={iters}, warmup={warmup}, overhead_iters={overhead_iters}')
    bench = Bench.build(cfg, batch, device)
    device, summary = bench.device, config_summary(cfg, batch)
    log(f'bench: {summary} on {device.platform}:{device.device_kind}')
    compiled, modes, details = {}, {}, {}
    for mode in MODES:
        compiled[mode], modes[mode], details[mode] = compile_mode(bench, mode, log)
    result: dict[str, Any] = {
        'modes': modes, 'ratios': {}, 'grad_rel_error': None, 'grad_rel_error_by_param': None,
        'optimizer_update': optimizer_update_cost(bench), 'overhead': None, 'config': summary,
        'device': f'{device.platform}:{device.device_kind}', 'jax_version': jax.__version__,
        'warmup': warmup, 'iters': iters, 'seed': seed, 'details': details}
    if iters > 0:
        _time_modes(bench, result, compiled, warmup=warmup, iters=iters, seed=seed, log=log)
    base = modes['normal']
    result['ratios'] = {mode: {k: (v[k] / base[k] if v[k] is not None and base[k] else None) for k in METRICS}
                        for mode, v in modes.items()}
    if overhead and iters > 0:
        result['overhead'] = _overhead(bench, warmup=warmup, iters=overhead_iters, seed=seed, log=log)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, OUTPUT_FILE), 'w') as f:
            json.dump(result, f, indent=2)
    return result


def format_table(result: dict[str, Any]) -> str:
    """The modes' figures and ratios, then the run's other figures, as markdown tables."""
    rows = []
    for mode, v in result['modes'].items():
        r = result['ratios'][mode]
        rows.append([mode, f"{v['flops'] / 1e9:.2f}", fmt(r['flops'], '.3f'), f"{v['flops_xla_raw'] / 1e9:.2f}",
                     f"{v['temp_bytes'] / 2**20:.1f}", fmt(r['temp_bytes'], '.3f'),
                     f"{v['peak_bytes'] / 2**20:.1f}", fmt(r['peak_bytes'], '.3f'),
                     fmt(v['step_ms'], '.2f'), fmt(r['step_ms'], '.3f')])
    modes = markdown_table(('mode', 'GFLOPs (unrolled)', 'x', 'GFLOPs (scanned)', 'temp MiB', 'x',
                            'peak MiB', 'x', 'step ms', 'x'), rows)
    other = [('AdamW update GFLOPs', f"{result['optimizer_update']['flops'] / 1e9:.3f}")]
    other += [(f'grad rel error, {group} (mecefo vs exact)', f'{value:.4g}')
              for group, value in (result['grad_rel_error'] or {}).items()]
    overhead = result.get('overhead') or {}
    other += [(f'fault-free overhead: {key}', fmt(overhead[key], '.4g') if isinstance(overhead[key], float)
               else overhead[key])
              for key in ('skipped', 'fault_free_ms', 'plain_dp_ms', 'ratio', 'paired_ratio_median', 'met')
              if key in overhead]
    return modes + '\n\n' + markdown_table(('figure', 'value'), other)


def main(cfg, out_dir: str, **kwargs) -> dict[str, Any]:
    """Entry point for scripts/bench_step.py: run, print the tables, write JSON."""
    result = run_benchmark(cfg, out_dir, **kwargs)
    print(format_table(result), flush=True)
    return result
