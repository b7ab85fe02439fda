"""Report section `profile`: where one train step's time goes, from a `jax.profiler` trace.

The `step` section's normal step runs `STEPS` steps under the profiler after
a warm-up (`profile_trace/` beside the report). Each op event of the step's
module (`args.hlo_op`: the device's events, else the host's, as on a CPU) is
put in one of `CATEGORIES` by its instruction in the compiled HLO; loops and
calls are containers, not counted; `idle` is the time between the first and
the last op with none running. Kernels that name no HLO op go by their names.
"""
import glob
import gzip
import json
import os

from studies.gpu import configs
from studies.xla_costs import callees, instructions

WARMUP, STEPS, TOP_OPS = 3, 3, 12
CATEGORIES = ('matmuls', 'attention', 'optimizer', 'elementwise', 'copies', 'other')
CONTAINERS = ('while', 'conditional', 'call', 'async-start', 'async-done')
COPIES = ('copy', 'copy-start', 'copy-done', 'transpose', 'dynamic-update-slice', 'bitcast')
# A fusion named only by these (and COPIES) moves data and computes nothing.
MOVES = ('dynamic-slice', 'slice', 'concatenate', 'reshape', 'broadcast', 'pad', 'wrapped')
ATTENTION_MARKS = ('fmha', 'BNTS', 'BTNH', 'dot_product_attention')
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
        matmuls.setdefault(computation, []).extend(_matmul(opcode, call))
    out = {}
    for _, name, opcode, _, call, _ in rows:
        called = [c for _, c in callees(call)]
        held = [n for c in called for n in matmuls.get(c, [])] + _matmul(opcode, call)
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


def _matmul(opcode: str, call: str) -> list:
    """[op name and target] of a dot or a GEMM or fused-attention call; [] of any other op."""
    target = _op_name(call, 'custom_call_target')
    if opcode == 'dot' or (opcode == 'custom-call'
                           and any(w in target.lower() for w in ('gemm', 'matmul', 'fmha'))):
        return [_op_name(call) + target]
    return []


def _op_name(call: str, key: str = 'op_name') -> str:
    start = call.find(f'{key}="')
    return call[start + len(key) + 2:call.find('"', start + len(key) + 2)] if start >= 0 else ''


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
    return [(e['name'], next((c for c, words in KERNEL_WORDS if any(w in e['name'].lower() for w in words)),
                             'elementwise'), e['ts'], e.get('dur', 0.0)) for e in device], 'device kernels, by name'


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

    from studies.gpu.programs import Setup, Stepper
    from studies.gpu.step import SHAPES
    shape = SHAPES['step']['smoke' if ctx.smoke else 'full']
    cfg, batch = configs.load(shape['config'], shape['overrides']), shape['batch']
    setup = Setup.build(cfg)
    program, stepper = setup.compile('normal', batch), Stepper(setup.timing_state())
    step = stepper.call(program, setup.batch('normal', batch))
    stepper.seconds(step, WARMUP)
    trace_dir = os.path.join(ctx.out or '/tmp', 'profile_trace')
    with jax.profiler.trace(trace_dir):
        stepper.seconds(step, STEPS)
    out = {'config_name': shape['config'], 'batch': batch, 'seq_len': cfg.data.seq_len,
           'steps': STEPS, 'trace_dir': trace_dir,
           **time_by_category(load_events(trace_dir), classify(program.as_text()),
                              'jit_train_step', STEPS)}
    ctx.log(f"{out['window_ms_per_step']:.2f} ms a step, idle {out['idle_ms_per_step']:.2f}: "
            + ', '.join(f'{k} {v:.2f}' for k, v in out['categories'].items()))
    return out
