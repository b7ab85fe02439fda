"""Report section `sweep`: the fastest normal train step a device runs, found greedily in a budget.

Best-known trainers reach 35 to 60 % MFU on an H100 where this project's
step, at 16 x 256 tokens a device, reaches about 21 to 25 %. The sweep looks
for where the rest goes, at 350M and 1B: from a baseline cell (4k tokens a
device at 256 a sequence, the config's GPU variant) it changes one knob at
a time, in this order, and keeps a change only where the step is faster per
token (by `MIN_GAIN`) and fits the device's memory:

  1. batch: 16k, 32k, 64k tokens a device, climbing while each is faster;
  2. sequence: 1,024 tokens (the same tokens a device);
  3. attention: cuDNN's fused kernel or XLA's (`model.attention`);
  4. remat: none, save_dots, full (`model.remat_policy`), and, where the
     batch climb stopped at memory, the next batch with each policy;
  5. layers scanned or unrolled (`model.scan_layers`);
  6. Adam's moments flat or per leaf (`train.flat_optimizer`);
  7. XLA flags from MaxText's GPU recipe, each against XLA's default:
     Triton GEMM off, command buffers off, while-loop double buffering on.

Flags must be set before jax starts, so stages 1-6 run in one child process
and each flag cell in its own (`runner.run_section`); this section's own
process never imports jax. At the end the baseline cells run again in a
fresh process: their ratio to the first run is the drift of the machine
over the sweep. It writes `mfu_sweep.json` (every cell, the best per model,
the best per model and batch, the drift and the settings that would become
the configs' GPU variant) and `mfu_sweep.md` beside the report.
"""
from __future__ import annotations

import os
import time

from studies.gpu import runner, tables
from studies.gpu.child import write_json
from studies.gpu.configs import KNOBS

MIN_GAIN = 0.01  # a change is kept when it is at least 1 % faster per token
FULL = {'models': {'llama_350m': ('llama_350m:gpu', {}), 'llama_1b': ('llama_1b:gpu', {})},
        'baseline': {'tokens_per_device': 4096, 'seq_len': 256},
        'tokens': (16384, 32768, 65536), 'seqs': (1024,), 'remats': ('none', 'save_dots', 'full'),
        'flags': (('--xla_gpu_enable_triton_gemm', 'false'),
                  ('--xla_gpu_enable_command_buffer', ''),
                  ('--xla_gpu_enable_while_loop_double_buffering', 'true')),
        'stages': ('batch', 'sequence', 'attention', 'remat', 'scan', 'optimizer'),
        'threads': 4, 'drift_sec': 30.0}
# CPU smoke: one tiny model (standing for 350M, which step_best reads), two batches, four
# stages (the others differ in what they propose only: tests/gpu_sweep_test.py), one flag.
SMOKE = dict(FULL, models={'llama_350m': ('tiny', {'model.num_layers': 2, 'model.attention': 'xla'})},
             baseline={'tokens_per_device': 64, 'seq_len': 32}, tokens=(128,), seqs=(64,),
             remats=('none', 'full'), flags=FULL['flags'][:1], threads=2, drift_sec=20.0,
             stages=('batch', 'attention', 'remat', 'optimizer'))
SETTINGS_SHARE = 0.7  # of the sweep's time: stages 1-6; the flags and the drift check after
FIRST_MODEL_SHARE = 0.55  # of the settings' time: 350M, then 1B with the rest
JSON_FILE, MD_FILE = 'mfu_sweep.json', 'mfu_sweep.md'


def better(cell: dict, best: dict | None) -> bool:
    """Faster per token by MIN_GAIN, and it ran (so it fit)."""
    if not cell.get('tokens_per_sec') or not cell.get('fits'):
        return False
    return best is None or cell['tokens_per_sec'] > best['tokens_per_sec'] * (1 + MIN_GAIN)


def stages(plan: dict):
    """(name, propose(best settings, what the batch climb stopped at) -> candidates, climb)."""
    def toggle(knob):
        return lambda b, _: [dict(b, **{knob: not b[knob]})]

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
        ('scan', toggle('scan_layers'), False),
        ('optimizer', toggle('flat_optimizer'), False),
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


def settings_child(ctx) -> dict:
    """Stages 1-6 for every model, in this process (a child of the sweep)."""
    from studies.gpu.cells import Cells
    plan = SMOKE if ctx.smoke else FULL
    measured, models = [], list(plan['models'])
    for i, model in enumerate(models):
        config, base = plan['models'][model]
        cells = Cells(model, config, base, ctx.log, threads=plan['threads'])
        share = FIRST_MODEL_SHARE if i == 0 and len(models) > 1 else 1.0
        deadline = time.monotonic() + ctx.left() * share - 5
        baseline = dict(plan['baseline'], **cells.defaults(), xla_flags='')
        done = list(measured)
        measured = done + greedy(cells, baseline, plan, deadline, ctx.log,
                                 lambda cells_so_far: ctx.partial({'cells': done + cells_so_far}))
    return {'cells': measured}


def cells_child(ctx) -> dict:
    """The cells `ctx.params['cells']` (settings and model), in this process as started."""
    from studies.gpu.cells import Cells
    plan = SMOKE if ctx.smoke else FULL
    measured = []
    for item in ctx.params['cells']:
        config, base = plan['models'][item['model']]
        cells = Cells(item['model'], config, base, ctx.log, threads=1)
        measured.append(cells.measure(item['settings'], ctx.params['stage']))
        ctx.partial({'cells': measured})
    return {'cells': measured}


class Driver:
    """Runs the sweep's children within the section's time and gathers their cells."""

    def __init__(self, ctx, plan: dict):
        self.ctx, self.plan, self.cells = ctx, plan, []
        self.work = os.path.join(ctx.out or '/tmp', 'sections', 'sweep')
        self.deadline = time.monotonic() + ctx.left() - 10  # its children end before it

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def child(self, name: str, target: str, limit: float, flags: str = '', **params) -> list:
        base = {k: self.ctx.params.get(k) for k in ('smoke', 'out', 'xla_cache_dir')}
        env = {'XLA_FLAGS': ' '.join(filter(None, [os.environ.get('XLA_FLAGS', ''), flags]))}
        result = runner.run_section(runner.Section(name, f'studies.gpu.sweep:{target}'),
                                    max(5.0, limit), dict(base, **params), self.work,
                                    echo=self.ctx.log, env=env)
        if result['status'] not in ('ok', 'timeout', 'failed'):
            return []
        figures = result if result['status'] == 'ok' else result.get('partial') or {}
        if result['status'] != 'ok':
            self.ctx.log(f'{name}: {result["status"]} ({result.get("error")})')
        return figures.get('cells', [])

    def flags(self, model: str, reserve: float) -> None:
        """Each flag toggled on the model's best cell, in a process of its own, greedily."""
        kept = []
        for flag, value in self.plan['flags']:
            best = endpoint(self.cells, model)
            if best is None or self.left() < reserve + 10:
                return
            trial = ' '.join(kept + [f'{flag}={value}'])
            settings = dict(_settings(best), xla_flags=trial)
            limit = min(self.left() - reserve, 3 * max(5.0, best.get('compile_sec', 5.0)) + 30)
            for cell in self.child(f'flags_{model}_{len(self.cells)}', 'cells_child', limit,
                                   flags=trial, stage='flags',
                                   cells=[{'model': model, 'settings': settings}]):
                accepted = better(cell, best)
                self.cells.append(dict(cell, accepted=accepted))
                kept = trial.split() if accepted else kept

    def drift(self) -> dict:
        """The baseline cells again, in a fresh process: rerun / first step time."""
        first = {c['model']: c for c in self.cells if c['stage'] == 'baseline' and c.get('step_ms')}
        items = [{'model': m, 'settings': _settings(c)} for m, c in first.items()]
        again = self.child('drift', 'cells_child', self.left(), stage='drift', cells=items)
        return {c['model']: {'first_ms': first[c['model']]['step_ms'], 'rerun_ms': c['step_ms'],
                             'ratio': c['step_ms'] / first[c['model']]['step_ms']}
                for c in again if c.get('step_ms')}


def endpoint(cells: list, model: str) -> dict | None:
    """Where the greedy search of `model` ended: its last kept cell."""
    return next((c for c in reversed(cells) if c['model'] == model and c.get('accepted')), None)


def best_cell(cells: list, model: str, tokens: int | None = None, seq: int | None = None):
    """The fastest cell per token of `model` that ran (at `tokens` x `seq` when given)."""
    ran = [c for c in cells if c['model'] == model and c.get('tokens_per_sec') and c.get('fits')
           and c['stage'] != 'drift' and tokens in (None, c['tokens_per_device'])
           and seq in (None, c['seq_len'])]
    return max(ran, key=lambda c: c['tokens_per_sec'], default=None)


def gpu_defaults(best: dict) -> dict:
    """What the configs' GPU variant would set from the best cell (configs/llama_*.py)."""
    fields = dict(best['overrides'])
    fields.pop('data.seq_len', None)
    return {'config': fields, 'xla_flags': best.get('xla_flags', ''),
            'tokens_per_device': best['tokens_per_device'], 'seq_len': best['seq_len']}


def summary(cells: list, drift: dict, plan: dict) -> dict:
    models = [m for m in plan['models'] if any(c['model'] == m for c in cells)]
    best = {m: endpoint(cells, m) for m in models}
    batches = {m: sorted({(c['tokens_per_device'], c['seq_len']) for c in cells if c['model'] == m})
               for m in models}
    by_batch = {m: {f'{t}x{s}': best_cell(cells, m, t, s) for t, s in batches[m]
                    if best_cell(cells, m, t, s)} for m in models}
    return {'cells': cells, 'best': {m: c for m, c in best.items() if c},
            'best_by_batch': by_batch, 'drift': drift, 'min_gain': MIN_GAIN,
            'gpu_defaults': {m: gpu_defaults(c) for m, c in best.items() if c}}


def run(ctx) -> dict:
    plan = SMOKE if ctx.smoke else FULL
    driver = Driver(ctx, plan)
    reserve = plan['drift_sec']
    settings_sec = (driver.left() - reserve) * SETTINGS_SHARE
    driver.cells += driver.child('settings', 'settings_child', settings_sec)
    ctx.partial({'cells': driver.cells})
    for model in plan['models']:
        driver.flags(model, reserve)
        ctx.partial({'cells': driver.cells})
    out = summary(driver.cells, driver.drift() if driver.left() > 5 else {}, plan)
    if ctx.out:
        write_json(os.path.join(ctx.out, JSON_FILE), out)
        with open(os.path.join(ctx.out, MD_FILE), 'w') as f:
            f.write('\n'.join(['# MFU sweep', ''] + tables.sweep(out)) + '\n')
    return out
