"""Report section `profile`: where one train step's time goes, from a `jax.profiler` trace.

The 350M normal step at 16 x 256 tokens (the GPU variant's settings) runs a
few warm-up steps, then `STEPS` steps under `jax.profiler.trace`, written to
`profile_trace/` under the report's directory (TensorBoard or Perfetto open
it). Each op event of the step's module (`args.hlo_op`; the device's events
where the trace has a device, else the host threads' that ran the ops, as on
a CPU) is put in one place by its instruction in the compiled HLO:

  * `attention`: cuDNN's fused attention, or XLA's attention einsums;
  * `matmuls`: dots and GEMM custom calls, and fusions that hold one;
  * `optimizer`: ops under the 'optimizer' name scope (make_optimizer's),
    fusions holding one included (XLA fuses Adam's update into the params');
  * `copies`: copies, transposes, slices and in-place slice updates, and
    fusions of nothing else (data movement);
  * `elementwise`: every other op (fused elementwise work, reductions);
  * `other`: events of the module that name no instruction of it;
  * `idle`: the time between the first and the last op with no op running.

Loops and calls are containers (their bodies' ops are events of their own)
and are not counted. A trace whose device events name no HLO op has its
kernels placed by their names (`KERNEL_WORDS`; `source` says so).
"""
from __future__ import annotations

import glob
import gzip
import json
import os

from studies.gpu import configs
from studies.xla_costs import callees, instructions

SHAPES = {'full': {'config': 'llama_350m:gpu', 'overrides': {}, 'batch': 16},
          'smoke': {'config': 'tiny', 'overrides': {'model.num_layers': 2,
                                                    'model.attention': 'xla'}, 'batch': 2}}
WARMUP, STEPS = 3, 3
CATEGORIES = ('matmuls', 'attention', 'optimizer', 'elementwise', 'copies', 'other')
CONTAINERS = ('while', 'conditional', 'call', 'async-start', 'async-done')
COPIES = ('copy', 'copy-start', 'copy-done', 'transpose', 'dynamic-update-slice', 'bitcast')
# A fusion named only by these (and COPIES) moves data and computes nothing.
MOVES = ('dynamic-slice', 'slice', 'concatenate', 'reshape', 'broadcast', 'pad', 'wrapped')
ATTENTION_MARKS = ('fmha', 'BNTS', 'BTNH', 'dot_product_attention')
TOP_OPS = 12
# Kernel names by place, for a trace whose device events name no HLO op (first match wins).
KERNEL_WORDS = (('attention', ('fmha', 'flash', 'attention')),
                ('matmuls', ('gemm', 'xmma', 'cutlass', 'matmul', 'gemv')),
                ('copies', ('memcpy', 'memset', 'copy', 'transpose')))


def classify(hlo_text: str) -> dict:
    """{instruction name: category (None for containers)} of a compiled module's text."""
    rows = list(instructions(hlo_text))
    matmuls, scopes = {}, {}  # per computation: its dots' and GEMMs' names; every op name
    for computation, _, opcode, _, call, _ in rows:
        scopes.setdefault(computation, []).append(_op_name(call))
        if _is_matmul(opcode, call):
            matmuls.setdefault(computation, []).append(_op_name(call) + _target(call))
    out = {}
    for _, name, opcode, _, call, _ in rows:
        called = [c for _, c in callees(call)]
        held = [n for c in called for n in matmuls.get(c, [])]
        held += [_op_name(call) + _target(call)] if _is_matmul(opcode, call) else []
        names = [_op_name(call)] + [n for c in called for n in scopes.get(c, [])]
        out[name] = _category(name, opcode, names, held)
    return out


def _category(name: str, opcode: str, op_names: list, matmuls: list) -> str | None:
    if opcode in CONTAINERS:
        return None
    if matmuls:
        return 'attention' if any(m in n for n in matmuls for m in ATTENTION_MARKS) else 'matmuls'
    if any('/optimizer/' in n for n in op_names):
        return 'optimizer'
    parts = name.split('.')[0].removesuffix('_fusion').split('_')
    if opcode in COPIES or all(p in COPIES + MOVES for p in parts):
        return 'copies'
    return 'elementwise'


def _is_matmul(opcode: str, call: str) -> bool:
    target = _target(call).lower()
    return opcode == 'dot' or (opcode == 'custom-call'
                               and any(w in target for w in ('gemm', 'matmul', 'fmha')))


def _op_name(call: str) -> str:
    start = call.find('op_name="')
    return call[start + 9:call.find('"', start + 9)] if start >= 0 else ''


def _target(call: str) -> str:
    start = call.find('custom_call_target="')
    return call[start + 20:call.find('"', start + 20)] if start >= 0 else ''


def load_events(trace_dir: str) -> list:
    """The newest trace's complete events ('X'), each with its process's name."""
    paths = sorted(glob.glob(os.path.join(trace_dir, 'plugins', 'profile', '*', '*.trace.json.gz')))
    if not paths:
        raise FileNotFoundError(f'no *.trace.json.gz under {trace_dir}/plugins/profile')
    with gzip.open(paths[-1]) as f:
        events = json.load(f).get('traceEvents', [])
    processes = {e['pid']: e['args'].get('name', '') for e in events
                 if e.get('ph') == 'M' and e.get('name') == 'process_name'}
    return [dict(e, process=processes.get(e.get('pid'), '')) for e in events if e.get('ph') == 'X']


def _kernel_category(name: str) -> str:
    """A device kernel's place by its name alone (a trace whose kernels name no HLO op)."""
    name = name.lower()
    for category, words in KERNEL_WORDS:
        if any(w in name for w in words):
            return category
    return 'elementwise'


def _timed_ops(events: list, categories: dict, module: str) -> tuple[list, str]:
    """[(op, category, start us, duration us)] of the step's ops, and where they came from."""
    def hlo_op(e):
        args = e.get('args') or {}
        return args.get('hlo_op') if str(args.get('hlo_module', '')).startswith(module) else None
    device = [e for e in events if e['process'].startswith('/device:')]
    chosen = [e for e in device if hlo_op(e)] or [e for e in events if hlo_op(e)]
    if chosen:
        source = 'device' if chosen[0]['process'].startswith('/device:') else 'host'
        return [(hlo_op(e), categories.get(hlo_op(e), 'other'), e['ts'], e.get('dur', 0.0))
                for e in chosen], source
    return [(e['name'], _kernel_category(e['name']), e['ts'], e.get('dur', 0.0))
            for e in device], 'device kernels, by name'


def time_by_category(events: list, categories: dict, module: str, steps: int) -> dict:
    """Milliseconds a step per category, idle time and the largest ops (module docstring)."""
    ops, source = _timed_ops(events, categories, module)
    per_category, per_op, spans = dict.fromkeys(CATEGORIES, 0.0), {}, []
    for op, category, start, duration in ops:
        if category is None:
            continue
        ms = float(duration) / 1e3
        per_category[category] += ms / steps
        per_op[op] = (category, per_op.get(op, (category, 0.0))[1] + ms / steps)
        spans.append((float(start), float(start) + float(duration)))
    window = (max(e for _, e in spans) - min(s for s, _ in spans)) / 1e3 if spans else 0.0
    top = sorted(per_op.items(), key=lambda kv: -kv[1][1])[:TOP_OPS]
    return {'source': source, 'events': len(spans), 'categories': per_category,
            'window_ms_per_step': window / steps,
            'idle_ms_per_step': (window - _union_ms(spans)) / steps,
            'top_ops': [{'op': op, 'category': c, 'ms_per_step': ms} for op, (c, ms) in top]}


def _union_ms(spans: list) -> float:
    """Total length (ms) of the union of [start, end) microsecond spans."""
    total, reach = 0.0, float('-inf')
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total / 1e3


def run(ctx) -> dict:
    import jax

    from studies import step_modes
    from studies.gpu.programs import Setup
    shape = SHAPES['smoke' if ctx.smoke else 'full']
    cfg = configs.load(shape['config'], shape['overrides'])
    setup, batch = Setup.build(cfg), shape['batch']
    program = setup.compile('normal', batch)
    state = setup.timing_state()
    args = setup.batch('normal', batch, step_modes.random_tokens(cfg, batch, seed=0))
    for _ in range(WARMUP):
        state, _ = program(state, args)
    jax.block_until_ready(state)
    trace_dir = os.path.join(ctx.out or '/tmp', 'profile_trace')
    with jax.profiler.trace(trace_dir):
        for _ in range(STEPS):
            state, metrics = program(state, args)
        jax.block_until_ready((state, metrics))
    out = {'config_name': shape['config'], 'batch': batch, 'seq_len': cfg.data.seq_len,
           'steps': STEPS, 'trace_dir': trace_dir,
           **time_by_category(load_events(trace_dir), classify(program.as_text()),
                              'jit_train_step', STEPS)}
    ctx.log(f"{out['window_ms_per_step']:.2f} ms a step, idle {out['idle_ms_per_step']:.2f}: "
            + ', '.join(f'{k} {v:.2f}' for k, v in out['categories'].items()))
    return out
