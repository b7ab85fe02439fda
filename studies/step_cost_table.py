"""The step-cost benchmark's result as a plain-text table (what `scripts/bench_step.py` prints)."""
from __future__ import annotations

from typing import Any

from studies.grad_error import GROUPS
from studies.report import fmt


def format_table(result: dict[str, Any]) -> str:
    """A plain-text table of the figures, their ratios and the gradient error."""
    lines = [f"{'mode':<17}{'GFLOPs':>10}{'x':>7}{'raw GF':>9}{'temp MiB':>10}{'x':>7}"
             f"{'peak MiB':>10}{'x':>7}{'step ms':>10}{'x':>7}"]
    for mode, v in result['modes'].items():
        r = result['ratios'][mode]
        lines.append(
            f"{mode:<17}{v['flops'] / 1e9:>10.2f}{r['flops']:>7.3f}"
            f"{v['flops_xla_raw'] / 1e9:>9.2f}"
            f"{v['temp_bytes'] / 2**20:>10.1f}{r['temp_bytes']:>7.3f}"
            f"{v['peak_bytes'] / 2**20:>10.1f}{r['peak_bytes']:>7.3f}"
            + fmt(v['step_ms'], '>10.2f', missing=f'{"-":>10}')
            + fmt(r['step_ms'], '>7.3f', missing=f'{"-":>7}'))
    o = result['optimizer_update']
    lines.append(f"(AdamW update alone: {o['flops'] / 1e9:.3f} GFLOPs; GFLOPs are XLA's count "
                 f"of the unrolled step, raw GF of the scanned one)")
    err = result['grad_rel_error']
    if err is not None:
        lines.append('grad rel error (mecefo vs exact, same 2 shards): ' + ', '.join(
            f'{g}={err[g]:.4g}' for g in GROUPS)
            + '  [attention=1 by construction: the neighbour gives no attention gradient]')
    ov = result.get('overhead')
    if ov and 'skipped' in ov:
        lines.append(f"fault-free overhead: skipped ({ov['skipped']})")
    elif ov:
        lines.append(f"fault-free overhead on a {ov['mesh']['data']}x{ov['mesh']['model']} mesh "
                     f"(global batch {ov['global_batch']}, {ov['iters']} interleaved rounds): "
                     f"fault-free {ov['fault_free_ms']:.2f} ms / plain_dp "
                     f"{ov['plain_dp_ms']:.2f} ms = {ov['ratio']:.3f} "
                     f"(target <= {ov['target']}: {'met' if ov['met'] else 'MISSED'}); "
                     f"per-round ratio median {ov['paired_ratio_median']:.3f}, quartiles "
                     f"{ov['paired_ratio_quartiles'][0]:.3f}-{ov['paired_ratio_quartiles'][1]:.3f}")
    mfu = result.get('mfu') or {}
    if mfu.get('applicable'):
        lines.append(f"MFU of the normal step: {mfu['formula']:.1%} (formula FLOPs), "
                     f"{mfu['xla']:.1%} (XLA count); peak {mfu['peak_tflops']} TFLOP/s "
                     f"from {mfu['peak_source']}")
    elif mfu:
        lines.append(f"MFU: not applicable ({mfu.get('reason', mfu.get('peak_source'))})")
    return '\n'.join(lines)
