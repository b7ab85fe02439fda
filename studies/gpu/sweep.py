"""Report section `sweep`: the fastest normal train step a device runs, found greedily in a budget.

From a baseline cell (the config's GPU variant) it changes one knob at a
time, stage by stage (docs/gpu.md lists them), and keeps a change only where
the step is faster per token by `MIN_GAIN` and fits the device's memory.
XLA flags act only where set before jax starts: stages 1-6 run in one child
process and each flag cell in its own; this section's own process never
imports jax. It writes `mfu_sweep.json` and `mfu_sweep.md` beside the report.
"""
import os
import time

from studies.gpu import report, runner
from studies.gpu.configs import KNOBS

MIN_GAIN = 0.01  # a change is kept when it is at least 1 % faster per token
FULL = {'models': {'llama_350m': ('llama_350m:gpu', {}), 'llama_1b': ('llama_1b:gpu', {})},
        'baseline': {'tokens_per_device': 4096, 'seq_len': 256},
        'tokens': (16384, 32768, 65536), 'seqs': (1024,), 'remats': ('none', 'save_dots', 'full'),
        'flags': (('--xla_gpu_enable_triton_gemm', 'false'),
                  ('--xla_gpu_enable_command_buffer', ''),
                  ('--xla_gpu_enable_while_loop_double_buffering', 'true')),
        'stages': ('batch', 'sequence', 'attention', 'remat', 'scan', 'optimizer'),
        'threads': 4}
# CPU smoke: one tiny model (standing for 350M, which step_best reads), two batches, three
# stages (the others differ in what they propose only: tests/gpu_sweep_test.py), one flag.
SMOKE = dict(FULL, models={'llama_350m': ('tiny', {'model.num_layers': 2, 'model.attention': 'xla'})},
             baseline={'tokens_per_device': 64, 'seq_len': 32}, tokens=(128,), seqs=(64,),
             remats=('none', 'full'), flags=FULL['flags'][:1], threads=2,
             stages=('batch', 'attention', 'remat'))
SETTINGS_SHARE = 0.75  # of the sweep's time: stages 1-6; the flag cells after
FIRST_MODEL_SHARE = 0.55  # of the settings' time: 350M, then 1B with the rest
JSON_FILE, MD_FILE = 'mfu_sweep.json', 'mfu_sweep.md'


def better(cell: dict, best: dict | None) -> bool:
    """Faster per token by MIN_GAIN, and it ran (so it fit)."""
    return bool(cell.get('tokens_per_sec') and cell.get('fits')) and (
        best is None or cell['tokens_per_sec'] > best['tokens_per_sec'] * (1 + MIN_GAIN))


def stages(plan: dict):
    """(name, propose(best settings, what the batch climb stopped at) -> candidates, climb)."""
    def remats(b, blocked):
        others = [r for r in plan['remats'] if r != b['remat_policy']]
        unlock = [dict(b, tokens_per_device=blocked, remat_policy=r) for r in others] if blocked else []
        return [dict(b, remat_policy=r) for r in others] + unlock
    return tuple(stage for stage in (
        ('batch', lambda b, _: [dict(b, tokens_per_device=t) for t in plan['tokens']
                                if t > b['tokens_per_device']], True),
        ('sequence', lambda b, _: [dict(b, seq_len=s) for s in plan['seqs']
                                   if s != b['seq_len'] and s <= b['tokens_per_device']], False),
        ('attention', lambda b, _: [dict(b, attention=a) for a in ('cudnn', 'xla')
                                    if a != b['attention']], False),
        ('remat', remats, False),
        ('scan', lambda b, _: [dict(b, scan_layers=not b['scan_layers'])], False),
        ('optimizer', lambda b, _: [dict(b, flat_optimizer=not b['flat_optimizer'])], False),
    ) if stage[0] in plan['stages'])


def greedy(cells, baseline: dict, plan: dict, deadline: float, log, saved=lambda _: None) -> list:
    """Every measured cell of one model, stages in order, until `deadline` (monotonic);
    `saved(cells so far)` after each."""
    best = cells.measure(baseline, 'baseline')
    measured, blocked = [dict(best, accepted=better(best, None))], None
    saved(measured)
    if not measured[0]['accepted']:
        return measured
    last_stage_sec = 0.0
    for name, propose, climb in stages(plan):
        candidates = propose(_settings(best), blocked)
        if not candidates:
            continue
        if time.monotonic() + last_stage_sec > deadline:
            log(f'{cells.model}: stopped before stage {name}, out of time')
            break
        started = time.monotonic()
        cells.prepare(candidates, start_by=deadline)
        for settings in candidates:
            if time.monotonic() > deadline:
                break
            cell = cells.measure(settings, name)
            accepted = better(cell, best)
            measured.append(dict(cell, accepted=accepted))
            saved(measured)
            if accepted:
                best = cell
            elif climb:
                blocked = None if cell.get('fits') else settings['tokens_per_device']
                break
        last_stage_sec = time.monotonic() - started
    return measured


def _settings(cell: dict) -> dict:
    return {k: cell[k] for k in ('tokens_per_device', 'seq_len', *KNOBS, 'xla_flags') if k in cell}


def cells_child(ctx) -> dict:
    """In this process (a child of the sweep): the cells `ctx.params['cells']` (settings and
    model) where given, else stages 1-6 for every model."""
    from studies.gpu.step import Cells
    plan, measured = SMOKE if ctx.smoke else FULL, []
    for item in ctx.params.get('cells', []):
        cells = Cells(item['model'], *plan['models'][item['model']], ctx.log, threads=1)
        measured.append(cells.measure(item['settings'], ctx.params['stage']))
        ctx.partial({'cells': measured})
    for i, model in enumerate([] if 'cells' in ctx.params else plan['models']):
        cells = Cells(model, *plan['models'][model], ctx.log, threads=plan['threads'])
        share = FIRST_MODEL_SHARE if i == 0 and len(plan['models']) > 1 else 1.0
        baseline = dict(plan['baseline'], **cells.defaults(), xla_flags='')
        done = list(measured)
        measured = done + greedy(cells, baseline, plan, time.monotonic() + ctx.left() * share - 5,
                                 ctx.log, lambda so_far: ctx.partial({'cells': done + so_far}))
    return {'cells': measured}


def endpoint(cells: list, model: str) -> dict | None:
    """Where the greedy search of `model` ended: its last kept cell."""
    return next((c for c in reversed(cells) if c['model'] == model and c.get('accepted')), None)


def summary(cells: list, plan: dict) -> dict:
    """Every cell; the best per model (where its search ended) and the fastest per model and
    batch; and what each best would set in the configs' GPU variant."""
    models = [m for m in plan['models'] if any(c['model'] == m for c in cells)]
    best, by_batch = {m: c for m in models if (c := endpoint(cells, m))}, {m: {} for m in models}
    for c in sorted((c for c in cells if c.get('tokens_per_sec') and c.get('fits')),
                    key=lambda c: c['tokens_per_sec']):
        by_batch[c['model']][f"{c['tokens_per_device']}x{c['seq_len']}"] = c  # the fastest last
    defaults = {m: {'config': {k: v for k, v in c['overrides'].items() if k != 'data.seq_len'},
                    'xla_flags': c.get('xla_flags', ''), 'tokens_per_device': c['tokens_per_device'],
                    'seq_len': c['seq_len']} for m, c in best.items()}
    return {'cells': cells, 'best': best, 'best_by_batch': by_batch, 'min_gain': MIN_GAIN,
            'gpu_defaults': defaults}


def _child(ctx, name: str, limit: float, flags: str = '', **params) -> list:
    """The cells a child of the sweep measured (`cells_child`; XLA `flags` set at its start)."""
    base = {k: ctx.params.get(k) for k in ('smoke', 'in_process', 'out', 'xla_cache_dir')}
    env = {'XLA_FLAGS': ' '.join(filter(None, [os.environ.get('XLA_FLAGS', ''), flags]))}
    result = runner.run_section(runner.Section(name, 'studies.gpu.sweep:cells_child'), max(5.0, limit),
                                dict(base, **params), os.path.join(ctx.out or '/tmp', 'sections', 'sweep'),
                                echo=ctx.log, env=env if flags else None)
    if result['status'] != 'ok':
        ctx.log(f'{name}: {result["status"]} ({result.get("error")})')
    return (result if result['status'] == 'ok' else result.get('partial') or {}).get('cells', [])


def run(ctx) -> dict:
    """Stages 1-6 in one child, then each flag toggled on each model's best cell, greedily,
    each in a process of its own; all within the section's time."""
    plan, deadline = SMOKE if ctx.smoke else FULL, time.monotonic() + ctx.left() - 10
    cells = _child(ctx, 'settings', (deadline - time.monotonic()) * SETTINGS_SHARE)
    ctx.partial({'cells': cells})
    for model in plan['models']:
        kept = []
        for flag, value in plan['flags']:
            best, left = endpoint(cells, model), deadline - time.monotonic()
            if best is None or left < 10:
                break
            trial = ' '.join(kept + [f'{flag}={value}'])
            for cell in _child(ctx, f'flags_{model}_{len(cells)}', min(
                    left, 3 * max(5.0, best.get('compile_sec', 5.0)) + 30), flags=trial, stage='flags',
                    cells=[{'model': model, 'settings': dict(_settings(best), xla_flags=trial)}]):
                cells.append(dict(cell, accepted=better(cell, best)))
                kept = trial.split() if cells[-1]['accepted'] else kept
            ctx.partial({'cells': cells})
    out = summary(cells, plan)
    if ctx.out:
        runner.save(os.path.join(ctx.out, JSON_FILE), out)
        with open(os.path.join(ctx.out, MD_FILE), 'w') as f:
            f.write('\n'.join(['# MFU sweep', '', *report.tables(out)]) + '\n')
    return out
