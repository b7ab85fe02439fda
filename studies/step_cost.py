"""Step-cost benchmark: what one device pays for a full train step in each role.

The per-device cost of MeCeFO (Hu et al., NeurIPS 2025, arXiv 2510.16415)
against exact and plain baselines, and the fault-free overhead check;
`scripts/bench_step.py` is its command line. It writes `bench_step.json`:
`modes[mode]` holds each mode's figures (`step_measure`: every mode compiled
on one device and timed interleaved; the modes are `step_modes`'), `ratios[mode]`
= mode / normal, beside the gradient error of mecefo against ndb_naive
(`fidelity`) and the fault-free overhead and MFU (`step_efficiency`).
"""
from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from studies.fidelity import grad_rel_error, grad_rel_error_by_param, two_shard_gradients
from studies.report import fmt, markdown_table
from studies.step_efficiency import fault_free_overhead, normal_step_mfu
from studies.step_measure import (
    Bench,
    StepRunner,
    compile_modes,
    new_bench,
    optimizer_update_cost,
    time_interleaved,
)
from studies.step_modes import MECEFO_MODES, MODES, mode_layout, random_tokens

METRICS = ('flops', 'temp_bytes', 'peak_bytes', 'step_ms')
OUTPUT_FILE = 'bench_step.json'


def config_summary(cfg, batch: int) -> dict[str, Any]:
    m = cfg.model
    return {'vocab_size': m.vocab_size, 'd_model': m.d_model, 'num_layers': m.num_layers,
            'num_heads': m.num_heads, 'num_kv_heads': m.num_kv_heads,
            'ffn_hidden': m.ffn_hidden, 'dtype': m.dtype, 'seq_len': cfg.data.seq_len,
            'per_device_batch': int(batch), 'rank': cfg.mecefo.rank,
            'remat_ffn': cfg.mecefo.remat_ffn, 'remat_policy': m.remat_policy,
            'scan_layers': m.scan_layers, 'attention': m.attention,
            'loss_chunk_tokens': m.loss_chunk_tokens}


def _time_modes(bench: Bench, result: dict, compiled: dict, *, warmup: int, iters: int,
                seed: int, peak_tflops: float | None) -> None:
    """Gradient error of mecefo vs ndb_naive, then every mode timed interleaved (and MFU)."""
    from mecefo_jax.neighbour.layout import assemble
    from mecefo_jax.parallel import sharding
    from mecefo_jax.parallel.state import create_train_state
    log, mesh, modes = bench.log, bench.mesh, result['modes']
    log('bench: initialising parameters and SVD projections...')
    state, _ = create_train_state(bench.model, bench.optimizer, mesh, seed=seed,
                                  rank=bench.cfg.mecefo.rank)
    tokens_nbt = random_tokens(bench.cfg, bench.batch, seed)
    batches = {}
    for mode in MECEFO_MODES:
        host = dict(assemble(mode_layout(mode, bench.batch), tokens_nbt), step=np.int32(0))
        batches[mode] = jax.device_put(host, sharding.batch_shardings(mesh))
    log('bench: gradient error of mecefo vs ndb_naive on the same two shards...')
    grads = two_shard_gradients(bench.model, mesh, state, tokens_nbt)
    result['grad_rel_error'] = grad_rel_error(grads['mecefo'], grads['ndb_naive'])
    result['grad_rel_error_by_param'] = grad_rel_error_by_param(grads['mecefo'],
                                                                grads['ndb_naive'])
    del grads
    runner = StepRunner(state)
    calls = {mode: runner.mecefo(compiled[mode], batches[mode]) for mode in MECEFO_MODES}
    calls['plain_dp'] = runner.plain(
        compiled['plain_dp'], jax.device_put(tokens_nbt[0], sharding.data_sharded(mesh)))
    log(f'bench: timing, modes interleaved ({warmup} warm-up + {iters} timed rounds)...')
    times = time_interleaved(calls, warmup=warmup, iters=iters)
    for mode in MODES:
        modes[mode]['step_ms'] = float(statistics.median(times[mode]))
        result['details'][mode]['times_ms'] = times[mode]
        log(f'bench[{mode}]: step={modes[mode]["step_ms"]:.2f} ms')
    if bench.device.platform == 'gpu':
        result['mfu'] = normal_step_mfu(bench.cfg, bench.state_abs.params, modes['normal'], bench.batch,
                             bench.device, peak_tflops)
    else:
        result['mfu'] = {'applicable': False,
                         'reason': f'model-FLOPs utilisation is reported on GPU only '
                                   f'(this is {bench.device.platform})'}


def _overhead(bench: Bench, *, warmup: int, iters: int, seed: int) -> dict:
    """The fault-free overhead check on the config's mesh, if it fits this host."""
    from mecefo_jax.parallel import sharding
    try:  # e.g. a 4-way 'model' mesh on a one-GPU host
        sharding.mesh_shape(bench.cfg.mesh, len(jax.devices()), allow_subset=True)
    except ValueError as error:
        bench.log(f'bench[overhead]: skipped: {error}')
        return {'skipped': f"the config's mesh does not fit this host: {error}"}
    return fault_free_overhead(bench.cfg, bench.model, bench.optimizer, batch=bench.batch,
                               warmup=warmup, iters=iters, seed=seed, log=bench.log)


def run_benchmark(cfg, out_dir: str | None = None, *, batch: int = 4, warmup: int = 2,
                  iters: int = 5, seed: int = 0, device=None, overhead: bool = True,
                  overhead_iters: int = 30, peak_tflops: float | None = None,
                  log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Cost (and with `iters > 0` time) every mode; write `out_dir/bench_step.json`.

    `cfg` is the full config (model, data.seq_len, mecefo.rank/remat_ffn,
    train for the optimizer, mesh for the overhead check). Returns the dict
    written to the JSON file.
    """
    if log is None:
        def log(msg):
            print(msg, flush=True)
    if batch < 1 or iters < 0 or warmup < 0 or overhead_iters < 1:
        raise ValueError(f'need --batch >= 1, --iters >= 0, --warmup >= 0 and '
                         f'--overhead_iters >= 1; got batch={batch}, iters={iters}, '
                         f'warmup={warmup}, overhead_iters={overhead_iters}')
    device = jax.devices()[0] if device is None else device
    bench = new_bench(cfg, batch, device, log)
    summary = config_summary(cfg, batch)
    log(f'bench: {summary} on {device.platform}:{device.device_kind}')
    modes, details, compiled = compile_modes(bench)
    result: dict[str, Any] = {
        'modes': modes, 'ratios': {}, 'grad_rel_error': None,
        'grad_rel_error_by_param': None, 'optimizer_update': optimizer_update_cost(bench),
        'overhead': None, 'mfu': None,
        'config': summary, 'device': f'{device.platform}:{device.device_kind}',
        'jax_version': jax.__version__, 'warmup': warmup, 'iters': iters, 'seed': seed,
        'details': details,
    }
    if iters > 0:
        _time_modes(bench, result, compiled, warmup=warmup, iters=iters, seed=seed,
                    peak_tflops=peak_tflops)
    else:
        result['mfu'] = {'applicable': False, 'reason': '--iters 0: nothing was timed'}
    base = modes['normal']
    result['ratios'] = {
        mode: {k: (v[k] / base[k] if v[k] is not None and base[k] else None)
               for k in METRICS} for mode, v in modes.items()}
    if overhead and iters > 0:
        result['overhead'] = _overhead(bench, warmup=warmup, iters=overhead_iters, seed=seed)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, OUTPUT_FILE)
        with open(path, 'w') as f:
            json.dump(result, f, indent=2)
        log(f'bench: wrote {path}')
    return result


def format_table(result: dict[str, Any]) -> str:
    """The modes' figures and ratios, then the run's other figures, as markdown tables."""
    rows = []
    for mode, v in result['modes'].items():
        r = result['ratios'][mode]
        rows.append([mode, f"{v['flops'] / 1e9:.2f}", fmt(r['flops'], '.3f'),
                     f"{v['flops_xla_raw'] / 1e9:.2f}", f"{v['temp_bytes'] / 2**20:.1f}",
                     fmt(r['temp_bytes'], '.3f'), f"{v['peak_bytes'] / 2**20:.1f}",
                     fmt(r['peak_bytes'], '.3f'), fmt(v['step_ms'], '.2f'), fmt(r['step_ms'], '.3f')])
    modes = markdown_table(('mode', 'GFLOPs (unrolled)', 'x', 'GFLOPs (scanned)', 'temp MiB', 'x',
                            'peak MiB', 'x', 'step ms', 'x'), rows)
    other = [('AdamW update GFLOPs', f"{result['optimizer_update']['flops'] / 1e9:.3f}")]
    other += [(f'grad rel error, {group} (mecefo vs exact)', f'{value:.4g}')
              for group, value in (result['grad_rel_error'] or {}).items()]
    overhead, mfu = result.get('overhead') or {}, result.get('mfu') or {}
    for key in ('skipped', 'fault_free_ms', 'plain_dp_ms', 'ratio', 'paired_ratio_median', 'met'):
        if key in overhead:
            other.append((f'fault-free overhead: {key}', fmt(overhead[key], '.4g')
                          if isinstance(overhead[key], float) else overhead[key]))
    for key in ('formula', 'xla', 'peak_tflops', 'reason'):
        if key in mfu:
            other.append((f'MFU: {key}', fmt(mfu[key], '.4g') if isinstance(mfu[key], float)
                          else mfu[key]))
    return modes + '\n\n' + markdown_table(('figure', 'value'), other)


def main(cfg, out_dir: str, **kwargs) -> dict[str, Any]:
    """Entry point for scripts/bench_step.py: run, print the table, write JSON."""
    result = run_benchmark(cfg, out_dir, **kwargs)
    print(format_table(result), flush=True)
    return result
