"""What MeCeFO's machinery costs when nothing fails, and how much of the device a step uses.

`fault_free_overhead`: the fault-free step against `plain_dp` on the
config's full mesh, same state and global batch, timed interleaved (the
ratio of medians, and the median and quartiles of the per-round ratios).
`normal_step_mfu` (GPU): the normal step's model FLOPs per second over the
device's peak, the FLOPs counted by formula (6 x matmul parameters x tokens
+ 12 x layers x d_model x seq_len x tokens, PaLM, causal mask not halved)
and by XLA's unrolled count.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from studies.fidelity import path_names
from studies.step_measure import StepRunner, time_interleaved
from studies.step_modes import make_plain_dp_step
from studies.xla_costs import flops_of, memory_of

OVERHEAD_TARGET = 1.03  # fault-free step time / plain_dp step time
# Dense bf16 peak TFLOP/s by device-kind substring, most specific first.
PEAK_TFLOPS = (('H100 PCIe', 756.0), ('H100', 989.0), ('H200', 989.0), ('A100', 312.0))


def fault_free_overhead(cfg, model, optimizer, *, batch: int, warmup: int, iters: int,
                        seed: int = 0, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Fault-free train step vs plain_dp on the config's full mesh, timed interleaved."""
    from mecefo_jax.neighbour.layout import assemble, full_layout
    from mecefo_jax.parallel import sharding
    from mecefo_jax.parallel import step as step_lib
    from mecefo_jax.parallel.state import create_train_state

    mesh = sharding.make_mesh(cfg.mesh, allow_subset=True)  # e.g. the tests' 1x1 mesh
    data, model_width = mesh.shape[sharding.DATA_AXIS], mesh.shape[sharding.MODEL_AXIS]
    layout = full_layout(data, batch)
    rank = cfg.mecefo.rank
    seq = cfg.data.seq_len + 1
    log(f'bench[overhead]: fault-free step vs plain_dp on a {data}x{model_width} mesh, '
        f'{batch} sequences per replica...')
    state, shardings = create_train_state(model, optimizer, mesh, seed=seed, rank=rank)
    rng = np.random.default_rng(seed + 1)
    tokens_nbt = rng.integers(0, cfg.model.vocab_size, (data, batch, seq), dtype=np.int32)
    host = dict(assemble(layout, tokens_nbt), step=np.int32(0))
    step_batch = jax.device_put(host, sharding.batch_shardings(mesh))
    tokens = jax.device_put(tokens_nbt.reshape(data * batch, seq), sharding.data_sharded(mesh))

    fault_free = step_lib.make_train_step(model, optimizer, mesh, shardings,
                                          layout.programs).lower(state, step_batch).compile()
    plain = make_plain_dp_step(model, optimizer, mesh, shardings.params,
                               shardings.opt_state).lower(
        state.params, state.opt_state, tokens).compile()
    runner = StepRunner(state)
    times = time_interleaved({'fault_free': runner.mecefo(fault_free, step_batch),
                              'plain_dp': runner.plain(plain, tokens)},
                             warmup=max(warmup, 2), iters=iters)
    ff, pd = (float(statistics.median(times[k])) for k in ('fault_free', 'plain_dp'))
    # Each round ran both steps back to back: the per-round ratio cancels
    # load changes slower than a round; its quartiles show the noise.
    paired = sorted(a / b for a, b in zip(times['fault_free'], times['plain_dp']))
    quartiles = (statistics.quantiles(paired, n=4) if len(paired) > 1
                 else [paired[0]] * 3)
    out = {'mesh': {'data': int(data), 'model': int(model_width)},
           'global_batch': int(data * batch), 'iters': iters,
           'fault_free_ms': ff, 'plain_dp_ms': pd, 'ratio': ff / pd,
           'paired_ratio_median': float(statistics.median(paired)),
           'paired_ratio_quartiles': [float(quartiles[0]), float(quartiles[2])],
           'target': OVERHEAD_TARGET, 'met': ff / pd <= OVERHEAD_TARGET,
           'flops_xla_raw': {'fault_free': flops_of(fault_free), 'plain_dp': flops_of(plain)},
           'peak_bytes': {'fault_free': memory_of(fault_free)['peak_bytes'],
                          'plain_dp': memory_of(plain)['peak_bytes']},
           'times_ms': times}
    log(f'bench[overhead]: fault-free {ff:.2f} ms, plain_dp {pd:.2f} ms, '
        f'ratio {ff / pd:.3f} (target <= {OVERHEAD_TARGET})')
    return out


def normal_step_mfu(cfg, params_abs, normal, batch, device, peak_override):
    """Model-FLOPs utilisation of the normal step (GPU), counted two ways (module docstring)."""
    peak, source = peak_tflops_for(device, peak_override)
    tokens = batch * cfg.data.seq_len
    formula = model_flops_per_token(cfg, params_abs) * tokens
    seconds = normal['step_ms'] / 1e3
    out = {'applicable': peak is not None, 'peak_tflops': peak, 'peak_source': source,
           'tokens_per_step': tokens, 'formula_flops': formula, 'xla_flops': normal['flops'],
           'dtype': cfg.model.dtype}
    if peak is not None:
        out['formula'] = formula / seconds / (peak * 1e12)
        out['xla'] = normal['flops'] / seconds / (peak * 1e12)
    return out


def model_flops_per_token(cfg, params_abstract) -> float:
    """6 x matmul params + 12 x layers x d_model x seq_len (PaLM), per trained token.

    Matmul params: every parameter but the embedding table (a gather) and the
    norm scales (elementwise; [layers, d] when scanned, so not told by rank).
    """
    def is_matmul(path) -> bool:
        names = path_names(path)
        return 'embedding' not in names and names[-1] != 'scale'
    matmul_params = sum(int(np.prod(x.shape)) for path, x in
                        jax.tree_util.tree_leaves_with_path(params_abstract) if is_matmul(path))
    m = cfg.model
    return 6.0 * matmul_params + 12.0 * m.num_layers * m.d_model * cfg.data.seq_len


def peak_tflops_for(device, override: float | None) -> tuple[float | None, str]:
    if override:
        return float(override), 'flag --peak_tflops'
    for key, tflops in PEAK_TFLOPS:
        if key in device.device_kind:
            return tflops, f'table entry {key!r} (dense bf16)'
    return None, f'unknown device kind {device.device_kind!r}: pass --peak_tflops'
