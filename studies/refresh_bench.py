"""Exact SVD against the cheap subspace-iteration refresh of V, at a config's FFN shapes.

    python scripts/bench_refresh.py --config configs/llama_7b.py --out DIR

`bench_shape` is the one measurement of the refresh (the GPU report's
`refresh` section calls it too): for one FFN kernel shape on one device,
seconds (jit, AOT-compiled, median of repeats) and FLOPs of the full SVD
(`top_singular_vectors`) and of the subspace refresh warm-started from the
held V, and the energy ||kernel^T V||_F^2 that V captures relative to the
exact top-r subspace's: cold (random start, random weights), warm (after a
modelled drift of `tau` AdamW steps) and stale (no refresh). `run` does every
FFN shape of a config and writes bench_refresh.json and .md. What the figures mean, the FLOP counts and
the drift model: docs/algorithm.md, "Cheap projection refresh".
"""
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from mecefo_jax.faults.refresh_costs import subspace_flops
from mecefo_jax.neighbour import projections as proj_lib
from studies import xla_costs as aot
from studies.report import fmt, markdown_table

ITERATION_SWEEP = (1, 2, 3, 4)  # energy ratios also reported for these iteration counts


def ffn_shapes(cfg) -> dict[str, tuple[int, int]]:
    """Distinct FFN kernel shapes of one layer: [d, h] (w_gate, as w_up) and [h, d]."""
    d, h = cfg.model.d_model, cfg.model.ffn_hidden
    return {'w_gate': (d, h), 'w_down': (h, d)}


def svd_flops(n: int, m: int) -> float:
    """R-SVD count for Sigma, thin U and V of an [n, m] matrix (GVL 5.4.5)."""
    big, small = max(n, m), min(n, m)
    return 6.0 * big * small ** 2 + 20.0 * small ** 3


def energy(kernel_nm, v_nr) -> float:
    """||kernel^T V||_F^2: the squared singular mass V captures (in float64 on the host)."""
    k = np.asarray(kernel_nm, np.float64)
    v = np.asarray(v_nr, np.float64)
    return float(np.sum((k.T @ v) ** 2))


def top_energy(kernel_nm, r: int) -> float:
    """Sum of the top-r squared singular values, from the eigenvalues of the smaller Gram
    matrix in float64: the exact reference for a drifted kernel without another SVD."""
    k = np.asarray(kernel_nm, np.float64)
    gram = k @ k.T if k.shape[0] <= k.shape[1] else k.T @ k
    return float(np.sum(np.linalg.eigvalsh(gram)[-r:]))


def _timed(fn, args, repeats: int):
    """(last output, wall seconds per run, process CPU seconds per run).

    CPU seconds are reported beside wall seconds because on a shared machine
    the wall clock mostly measures the other processes.
    """
    times, cpu = [], []
    out = None
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        out = jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return out, times, cpu


def _compile(fn, *args):
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - start


def bench_shape(name, n, m, r, *, iterations, drift_std, seed, full_repeats, cheap_repeats,
                log=print) -> dict:
    """Timings, FLOPs and energy ratios for one [n, m] kernel shape."""
    keys = jax.random.split(jax.random.key(seed), 3)
    k0 = jax.random.normal(keys[0], (n, m), jnp.float32) * n ** -0.5  # the model's init
    k1 = k0 + drift_std * jax.random.normal(keys[1], (n, m), jnp.float32)
    full, full_compile = _compile(lambda k: proj_lib.top_singular_vectors(k, r), k0)
    cheap, cheap_compile = _compile(
        lambda k, v: proj_lib.subspace_iteration(k, r, v, iterations=iterations),
        k0, jnp.zeros((n, r), jnp.float32))
    log(f'  {name} [{n}, {m}] r={r}: compiled (svd {full_compile:.1f} s, '
        f'subspace {cheap_compile:.1f} s); {full_repeats} full SVD(s)...')
    v0, full_times, full_cpu = _timed(full, (k0,), full_repeats)  # v0: the pre-drift reference V
    log(f'  {name}: full SVD {statistics.median(full_times):.3f} s; subspace iteration...')
    jax.block_until_ready(cheap(k1, v0))  # warm-up
    _, cheap_times, cheap_cpu = _timed(cheap, (k1, v0), cheap_repeats)
    log(f'  {name}: subspace {statistics.median(cheap_times):.4f} s; energies...')
    h0, h1 = np.asarray(k0, np.float64), np.asarray(k1, np.float64)  # copied to the host once
    exact0, exact1 = energy(h0, v0), top_energy(h1, r)
    sweep = {}
    for its in sorted(set(ITERATION_SWEEP) | {iterations}):
        cold0 = proj_lib.subspace_iteration(k0, r, None, iterations=its, key=keys[2])
        warm1 = proj_lib.subspace_iteration(k1, r, v0, iterations=its)
        sweep[its] = {'cold_random': energy(h0, cold0) / exact0,
                      'warm_drifted': energy(h1, warm1) / exact1}
    return {
        'name': name, 'shape': [n, m], 'rank': r, 'iterations': iterations,
        'full_sec': statistics.median(full_times), 'full_sec_runs': full_times,
        'full_sec_min': min(full_times), 'full_cpu_sec': statistics.median(full_cpu),
        'cheap_cpu_sec': statistics.median(cheap_cpu),
        'cheap_sec_min': min(cheap_times),
        'cheap_sec': statistics.median(cheap_times), 'cheap_sec_runs': cheap_times,
        'full_compile_sec': full_compile, 'cheap_compile_sec': cheap_compile,
        'full_flops': svd_flops(n, m), 'cheap_flops': subspace_flops(n, m, r, iterations),
        'full_flops_xla': aot.flops_of(full), 'cheap_flops_xla': aot.flops_of(cheap),
        'energy_ratio_cold': sweep[iterations]['cold_random'],
        # The SVD's top-r energy against the Gram eigenvalues': 1 up to rounding.
        'exact_energy_check': exact0 / top_energy(h0, r),
        'energy_ratio_warm': sweep[iterations]['warm_drifted'],
        'energy_ratio_stale': energy(h1, v0) / exact1,  # no refresh at all
        'energy_ratio_by_iterations': {str(k): v for k, v in sweep.items()},
    }


def run(cfg, out_dir: str, *, full_repeats: int = 2, cheap_repeats: int = 5,
        seed: int = 0, log=print) -> dict:
    """Benchmarks every FFN shape of `cfg`; writes bench_refresh.{json,md} into out_dir."""
    method, iterations, tau = cfg.mecefo.refresh, cfg.mecefo.refresh_iters, cfg.mecefo.tau
    drift_std = cfg.train.learning_rate * tau ** 0.5
    log(f'refresh bench on {jax.default_backend()} ({jax.devices()[0].device_kind}): '
        f'iterations={iterations}, drift std {drift_std:.3g} (lr {cfg.train.learning_rate} '
        f'x sqrt(tau={tau}))')
    rows = []
    os.makedirs(out_dir, exist_ok=True)
    for name, (n, m) in ffn_shapes(cfg).items():
        r = proj_lib.resolve_rank(cfg.mecefo.rank, n, m)
        rows.append(bench_shape(name, n, m, r, iterations=iterations, drift_std=drift_std,
                                seed=seed, full_repeats=full_repeats,
                                cheap_repeats=cheap_repeats, log=log))
        with open(os.path.join(out_dir, 'bench_refresh.partial.json'), 'w') as f:
            json.dump(rows, f, indent=2)  # a long run's finished shapes survive a kill
    full_sec = sum(row['full_sec'] for row in rows)
    full_cpu, cheap_cpu = (sum(row[k] for row in rows) for k in ('full_cpu_sec', 'cheap_cpu_sec'))
    cheap_sec = sum(row['cheap_sec'] for row in rows)
    result = {
        'backend': jax.default_backend(), 'device_kind': jax.devices()[0].device_kind,
        'refresh': method, 'refresh_iters': iterations, 'tau': tau,
        'drift_std': drift_std,  # of W + N(0, (lr sqrt(tau))^2) per entry
        'full_sec': full_sec, 'cheap_sec': cheap_sec, 'speedup': full_sec / cheap_sec,
        'full_cpu_sec': full_cpu, 'cheap_cpu_sec': cheap_cpu, 'cpu_speedup': full_cpu / cheap_cpu,
        'load_average': os.getloadavg()[0],
        'full_flops': sum(row['full_flops'] for row in rows),
        'cheap_flops': sum(row['cheap_flops'] for row in rows),
        'full_flops_xla': sum(row['full_flops_xla'] for row in rows),
        'cheap_flops_xla': sum(row['cheap_flops_xla'] for row in rows),
        'energy_ratio_warm': min(row['energy_ratio_warm'] for row in rows),
        'energy_ratio_cold': min(row['energy_ratio_cold'] for row in rows),
        'shapes': rows,
    }
    result['flops_ratio'] = result['full_flops'] / result['cheap_flops']
    with open(os.path.join(out_dir, 'bench_refresh.json'), 'w') as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(out_dir, 'bench_refresh.md'), 'w') as f:
        f.write(markdown(result))
    return result


def markdown(result: dict) -> str:
    """One row per kernel shape, then the one-layer totals (w_gate counted once), as tables."""
    shapes = markdown_table(
        ('kernel', 'shape', 'r', 'SVD s', 'subspace s', 'SVD GFLOP', 'subspace GFLOP',
         'energy cold', 'energy warm', 'energy stale'),
        [[row['name'], 'x'.join(map(str, row['shape'])), row['rank'], f"{row['full_sec']:.3f}",
          f"{row['cheap_sec']:.4f}", f"{row['full_flops'] / 1e9:.2f}",
          f"{row['cheap_flops'] / 1e9:.3f}", f"{row['energy_ratio_cold']:.4f}",
          f"{row['energy_ratio_warm']:.5f}", f"{row['energy_ratio_stale']:.5f}"]
         for row in result['shapes']])
    keys = ('backend', 'device_kind', 'refresh_iters', 'drift_std', 'full_sec', 'cheap_sec',
            'speedup', 'full_cpu_sec', 'cheap_cpu_sec', 'cpu_speedup', 'load_average',
            'flops_ratio', 'full_flops_xla', 'cheap_flops_xla', 'energy_ratio_warm')
    totals = markdown_table(('figure', 'value'), [
        (k, fmt(result[k], '.5g') if isinstance(result[k], float) else result[k])
        for k in keys])
    return f'{shapes}\n\n{totals}\n'
