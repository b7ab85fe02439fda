"""Exact SVD against the cheap subspace-iteration refresh of V, at a config's FFN shapes.

    python scripts/bench_refresh.py --config configs/llama_7b.py --out DIR

`bench_shape` measures one FFN kernel shape on one device: seconds (wall and
process CPU: on a shared machine the wall clock mostly measures the other
processes; jit, AOT-compiled, median of repeats) and operation counts of the
full SVD (`top_singular_vectors`) and of the subspace refresh warm-started
from the held V, and the energy ||kernel^T V||_F^2 that V captures relative
to the exact top-r subspace's: cold (random start, random weights), warm
(after a modelled drift of `tau` AdamW steps) and stale (no refresh). `run`
does every FFN shape of a config and writes bench_refresh.json and .md. What
the figures mean and the drift model: docs/algorithm.md, "Cheap projection refresh".
"""
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from mecefo_jax.neighbour import projections as proj_lib
from studies.refresh_costs import subspace_flops
from studies.report import fmt, markdown_table

ITERATION_SWEEP = (1, 2, 3, 4)  # energy ratios also reported for these iteration counts


def svd_flops(n: int, m: int) -> float:
    """R-SVD count for Sigma, thin U and V of an [n, m] matrix (Golub & Van Loan 5.4.5)."""
    big, small = max(n, m), min(n, m)
    return 6.0 * big * small ** 2 + 20.0 * small ** 3


def energy(kernel_nm, v_nr) -> float:
    """||kernel^T V||_F^2: the squared singular mass V captures (in float64 on the host)."""
    return float(np.sum((np.asarray(kernel_nm, np.float64).T @ np.asarray(v_nr, np.float64)) ** 2))


def top_energy(kernel_nm, r: int) -> float:
    """Sum of the top-r squared singular values, from the eigenvalues of the smaller Gram
    matrix in float64: the exact reference for a drifted kernel without another SVD."""
    k = np.asarray(kernel_nm, np.float64)
    return float(np.sum(np.linalg.eigvalsh(k @ k.T if k.shape[0] <= k.shape[1] else k.T @ k)[-r:]))


def _timed(compiled, args, repeats: int):
    """(last output, median wall seconds, median process CPU seconds) of `repeats` runs."""
    wall, cpu, out = [], [], None
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        out = jax.block_until_ready(compiled(*args))
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return out, statistics.median(wall), statistics.median(cpu)


def bench_shape(name, n, m, r, *, iterations, drift_std, seed, full_repeats, cheap_repeats, log=print) -> dict:
    """Timings, operation counts and energy ratios for one [n, m] kernel shape."""
    keys = jax.random.split(jax.random.key(seed), 3)
    k0 = jax.random.normal(keys[0], (n, m), jnp.float32) * n ** -0.5  # the model's init
    k1 = k0 + drift_std * jax.random.normal(keys[1], (n, m), jnp.float32)
    full = jax.jit(lambda k: proj_lib.top_singular_vectors(k, r)).lower(k0).compile()
    cheap = jax.jit(lambda k, v: proj_lib.subspace_iteration(k, r, v, iterations=iterations)).lower(
        k0, jnp.zeros((n, r), jnp.float32)).compile()
    log(f'  {name} [{n}, {m}] r={r}: {full_repeats} full SVD(s)...')
    v0, full_sec, full_cpu = _timed(full, (k0,), full_repeats)  # v0: the pre-drift reference V
    jax.block_until_ready(cheap(k1, v0))  # warm-up
    _, cheap_sec, cheap_cpu = _timed(cheap, (k1, v0), cheap_repeats)
    log(f'  {name}: full SVD {full_sec:.3f} s, subspace {cheap_sec:.4f} s; energies...')
    h0, h1 = np.asarray(k0, np.float64), np.asarray(k1, np.float64)  # copied to the host once
    exact0, exact1 = energy(h0, v0), top_energy(h1, r)
    sweep = {}
    for its in sorted(set(ITERATION_SWEEP) | {iterations}):
        cold0 = proj_lib.subspace_iteration(k0, r, None, iterations=its, key=keys[2])
        warm1 = proj_lib.subspace_iteration(k1, r, v0, iterations=its)
        sweep[str(its)] = {'cold_random': energy(h0, cold0) / exact0, 'warm_drifted': energy(h1, warm1) / exact1}
    return {'name': name, 'shape': [n, m], 'rank': r, 'iterations': iterations,
            'full_sec': full_sec, 'cheap_sec': cheap_sec, 'full_cpu_sec': full_cpu, 'cheap_cpu_sec': cheap_cpu,
            'full_flops': svd_flops(n, m), 'cheap_flops': subspace_flops(n, m, r, iterations),
            'energy_ratio_cold': sweep[str(iterations)]['cold_random'],
            'energy_ratio_warm': sweep[str(iterations)]['warm_drifted'],
            'energy_ratio_stale': energy(h1, v0) / exact1,  # no refresh at all
            'energy_ratio_by_iterations': sweep}


def run(cfg, out_dir: str, *, full_repeats: int = 2, cheap_repeats: int = 5, seed: int = 0, log=print) -> dict:
    """Benchmarks one layer's FFN shapes of `cfg` ([d, h] as w_gate and w_up, [h, d] as w_down);
    writes bench_refresh.{json,md} into out_dir."""
    iterations, tau = cfg.mecefo.refresh_iters, cfg.mecefo.tau
    drift_std = cfg.train.learning_rate * tau ** 0.5  # of W + N(0, (lr sqrt(tau))^2) per entry
    log(f'refresh bench on {jax.default_backend()}: iterations={iterations}, drift std {drift_std:.3g}')
    d, h = cfg.model.d_model, cfg.model.ffn_hidden
    rows = [bench_shape(name, n, m, proj_lib.resolve_rank(cfg.mecefo.rank, n, m), iterations=iterations,
                        drift_std=drift_std, seed=seed, full_repeats=full_repeats, cheap_repeats=cheap_repeats,
                        log=log)
            for name, (n, m) in {'w_gate': (d, h), 'w_down': (h, d)}.items()]
    total = {key: sum(row[key] for row in rows)
             for key in ('full_sec', 'cheap_sec', 'full_cpu_sec', 'cheap_cpu_sec', 'full_flops', 'cheap_flops')}
    result = {'backend': jax.default_backend(), 'device_kind': jax.devices()[0].device_kind,
              'refresh': cfg.mecefo.refresh, 'refresh_iters': iterations, 'tau': tau, 'drift_std': drift_std,
              **total, 'speedup': total['full_sec'] / total['cheap_sec'],
              'cpu_speedup': total['full_cpu_sec'] / total['cheap_cpu_sec'],
              'flops_ratio': total['full_flops'] / total['cheap_flops'], 'load_average': os.getloadavg()[0],
              'energy_ratio_warm': min(row['energy_ratio_warm'] for row in rows),
              'energy_ratio_cold': min(row['energy_ratio_cold'] for row in rows), 'shapes': rows}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, 'bench_refresh.json'), 'w') as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(out_dir, 'bench_refresh.md'), 'w') as f:
        f.write(markdown(result))
    return result


def markdown(result: dict) -> str:
    """One row per kernel shape, then the one-layer totals (w_gate counted once), as tables."""
    shapes = markdown_table(
        ('kernel', 'shape', 'r', 'SVD s', 'subspace s', 'SVD GFLOP', 'subspace GFLOP', 'energy cold',
         'energy warm', 'energy stale'),
        [[row['name'], 'x'.join(map(str, row['shape'])), row['rank'], f"{row['full_sec']:.3f}",
          f"{row['cheap_sec']:.4f}", f"{row['full_flops'] / 1e9:.2f}", f"{row['cheap_flops'] / 1e9:.3f}",
          f"{row['energy_ratio_cold']:.4f}", f"{row['energy_ratio_warm']:.5f}", f"{row['energy_ratio_stale']:.5f}"]
         for row in result['shapes']])
    keys = ('backend', 'device_kind', 'refresh_iters', 'drift_std', 'full_sec', 'cheap_sec', 'speedup',
            'full_cpu_sec', 'cheap_cpu_sec', 'cpu_speedup', 'load_average', 'flops_ratio', 'energy_ratio_warm')
    totals = markdown_table(('figure', 'value'), [
        (k, fmt(result[k], '.5g') if isinstance(result[k], float) else result[k]) for k in keys])
    return f'{shapes}\n\n{totals}\n'
