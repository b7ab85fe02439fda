"""Cost tables from measurements: a `bench_step.json` of `scripts/bench_step.py`.

The planner at run time prices layouts with `faults/costs.analytic_table`; the
strategy comparison (`studies/fault_plan.py`) and the studies read measured ratios
through `bench_table` instead.
"""
from __future__ import annotations

import json

from mecefo_jax.faults import costs


def _matches(config: dict, shape: costs.ModelShape) -> bool:
    return all(config.get(k) == getattr(shape, k)
               for k in ('d_model', 'num_layers', 'ffn_hidden', 'vocab_size'))


def bench_table(bench: dict, shape: costs.ModelShape, *, metric: str, seq_len: int,
                replica_seqs: int, mfu: float, path: str = 'bench_step.json',
                **analytic_kw) -> costs.CostTable:
    """The table of a `bench_step.json` dict, applied to `shape`.

    The step time is the bench's normal `step_ms` (scaled to `replica_seqs * seq_len`
    tokens) only when it ran this very shape on a GPU; otherwise analytic, at `mfu`.
    """
    try:
        ratios = bench['ratios']
        get = lambda mode: float(ratios[mode][metric])  # noqa: E731
        ndb, two = get('ndb_naive'), get('mecefo')
    except (KeyError, TypeError) as err:
        raise ValueError(f"--bench_json={path}: needs ratios[mode][{metric!r}] for modes "
                         f"'ndb_naive' and 'mecefo' (missing {err}); write it with "
                         f"scripts/bench_step.py.") from None
    neighbour = [(2.0, two)]
    if 'mecefo_per_batch' in ratios:
        neighbour.insert(0, (1.0, get('mecefo_per_batch')))
    plain = get('plain_dp') if 'plain_dp' in ratios else 1.0
    config = bench.get('config', {})
    device = str(bench.get('device', ''))
    same_shape = _matches(config, shape)
    on_gpu = device.split(':')[0] in ('gpu', 'cuda', 'rocm')
    if same_shape and on_gpu and 'normal' in bench.get('modes', {}):
        bench_tokens = int(config['per_device_batch']) * int(config['seq_len'])
        step_ms = float(bench['modes'].get('plain_dp', bench['modes']['normal'])['step_ms'])
        step = step_ms / 1e3 * replica_seqs * seq_len / bench_tokens
        step_src = f'GPU bench step_ms ({device}), scaled linearly to {replica_seqs} seqs'
    else:
        step = costs.mfu_step_sec(shape, seq_len=seq_len, replica_seqs=replica_seqs, mfu=mfu,
                                  **analytic_kw)
        peak = analytic_kw.get('peak_flops', costs.PEAK_FLOPS_A100_BF16) / 1e12
        step_src = (f'analytic FLOPs at MFU {mfu:g} of {peak:g} TFLOP/s (bench is '
                    f'{device or "unknown device"}, shape '
                    f'{"matches" if same_shape else "differs"})')
    shape_txt = ', '.join(f'{k}={config.get(k)}' for k in
                          ('d_model', 'num_layers', 'ffn_hidden', 'seq_len', 'per_device_batch'))
    return costs.CostTable(source='bench', exact=((1.0, 1.0), (2.0, ndb)),
                           neighbour=tuple(neighbour), plain=plain, step_sec=step,
                           step_sec_source=step_src,
                           note=f'{path}: ratios[*][{metric}] of {shape_txt} on {device}'
                                + ('' if same_shape else ' (another shape: ratios applied as they are)'))


def load_json(path: str, flag: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise ValueError(f'{flag}={path}: no such file.') from None
    except json.JSONDecodeError as err:
        raise ValueError(f'{flag}={path}: not valid JSON ({err}).') from None
