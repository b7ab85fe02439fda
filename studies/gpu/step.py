"""One device's train step timed: in every role (the `step` sections) and in a sweep cell.

Sections `step` (350M) and `step_1b` run at the paper's 16 x 256 tokens a
device, `step_best` at the sweep's fastest cell, so the verdict can price
each point at the batch it models (docs/gpu.md); each writes the
`bench_step*.json` that `scripts/simulate_cluster.py --cost bench` reads.
A sweep cell (`Cells`) is the normal step at one batch and set of knobs.
"""
import json
import os
import statistics
import time

import jax
import numpy as np

from studies import step_cost
from studies.gpu import configs, programs, runner
from studies.gpu.configs import KNOB_FIELDS, KNOBS
from studies.gpu.programs import PEAK_FLOPS, Setup, Stepper, mfu
from studies.xla_costs import matmul_flops, memory_of

MODES = ('normal', 'mecefo', 'ndb_naive', 'mecefo_planned', 'plain_dp', 'mecefo_per_batch')
# 350M's priority order: the mixed helpers before the baselines' plain DP and per-batch neighbour.
MODES_350M = MODES[:4] + tuple(programs.MIXED_MODES) + MODES[4:]
LARGEST = 'ndb_naive'  # two shards, exact backward: the largest memory plan
COMPILE_SHARE = 0.5  # no new compile past this fraction of the section's time
STATED_BEST = {'tokens_per_device': 16384, 'seq_len': 256}  # step_best when no sweep ran
SWEEP_FILE = 'mfu_sweep.json'
_FULL = {'config': 'llama_350m:gpu', 'overrides': {}, 'batch': 16, 'warmup': 2, 'iters': 10,
         'modes': MODES_350M, 'threads': 4}
_SMOKE = {'config': 'tiny', 'overrides': {'model.num_layers': 2, 'model.attention': 'xla'},
          'batch': 2, 'warmup': 1, 'iters': 3, 'modes': MODES_350M, 'threads': 2}
SHAPES = {'step': {'full': _FULL, 'smoke': _SMOKE},
          'step_best': {'full': dict(_FULL, batch=None, iters=8, model='llama_350m'),
                        # The modes the simulator needs, at the smoke sweep's best batch.
                        'smoke': dict(_SMOKE, batch=None, modes=MODES[:3], model='llama_350m')},
          'step_1b': {'full': dict(_FULL, config='llama_1b:gpu', iters=6, modes=MODES),
                      # `step`'s shape: its programs come from the compilation cache.
                      'smoke': dict(_SMOKE, iters=2, modes=MODES[:3])}}
BENCH_FILES = {'step': step_cost.OUTPUT_FILE, 'step_best': 'bench_step_best.json',
               'step_1b': 'bench_step_1b.json'}
CELL_WARMUP, CELL_SEC, CELL_ITERS = 2, 1.5, (2, 20)  # a cell: warm-up, then ~CELL_SEC s of 2 to 20 steps


def best_shape(shape: dict, out_dir: str) -> tuple[dict, str]:
    """`shape` at the sweep's fastest 350M cell (its batch, sequence and settings), or at
    `STATED_BEST` when no sweep result is there; and where the batch came from."""
    path = os.path.join(out_dir, SWEEP_FILE)
    best = ((runner.load(path) or {}).get('best') or {}).get(shape['model'])
    cell, source = (best, f"the sweep's fastest cell ({path})") if best else (
        STATED_BEST, 'stated (no sweep result): ' + json.dumps(STATED_BEST))
    overrides = shape['overrides'] | {'data.seq_len': cell['seq_len']} | (cell.get('overrides') or {})
    return dict(shape, overrides=overrides, batch=_batch(cell)), source


def fit_batch(setup: Setup, batch: int, log) -> tuple[int, dict, tuple]:
    """The largest batch <= `batch` (halving) whose largest plan fits the device."""
    tried = []
    while True:
        start = time.perf_counter()
        compiled = setup.compile(LARGEST, batch)
        fits, peak = setup.fits(compiled)
        tried.append({'batch': batch, 'planned_peak_bytes': peak, 'compile_sec': time.perf_counter() - start})
        if fits or batch == 1:
            break
        log(f'{LARGEST} at batch {batch} plans {peak / 2**30:.1f} GiB, over the device: halving it')
        batch //= 2
    return batch, {'device_limit_bytes': setup.limit, 'tried': tried,
                   'reduced': len(tried) > 1}, (compiled, tried[-1]['compile_sec'])


def compile_modes(setup: Setup, batch: int, shape: dict, largest: tuple, ctx, start: float):
    """{mode: compiled} in priority order while time allows (modes of one layout compiled
    once: the mixed helpers at a small batch), each mode's details, the modes skipped."""
    modes, layouts = shape['modes'], {m: m if m == 'plain_dp' else programs.mode_layout(m, batch)
                                      for m in shape['modes']}
    first = {m: next(n for n in modes if layouts[n] == layouts[m]) for m in modes}
    jobs = {m: (lambda m=m: setup.compile(m, batch)) for m in modes if first[m] == m != LARGEST}
    budget = ctx.left() + (time.monotonic() - start)
    compiled, seconds = programs.compile_all(jobs, threads=shape['threads'], log=ctx.log,
                                             start_by=start + COMPILE_SHARE * budget)
    compiled[LARGEST], seconds[LARGEST] = largest
    compiled = {m: compiled[first[m]] for m in modes if first[m] in compiled}
    details = {m: {'compile_sec': seconds[first[m]], 'rows': batch if m == 'plain_dp' else
                   layouts[m].programs[0].rows} for m in compiled}
    return compiled, details, [m for m in modes if m not in compiled]


def time_modes(setup: Setup, compiled: dict, batch: int, shape: dict, ctx):
    """Step ms per mode and round (one step each, rounds interleaved in a fresh order, so a
    change in the machine's load hits every mode alike); the allocator's peak per mode."""
    stepper = Stepper(setup.timing_state())
    calls = {m: stepper.call(p, setup.batch(m, batch), m) for m, p in compiled.items()}
    start, peaks = time.perf_counter(), {}
    for mode in sorted(calls, key=lambda m: memory_of(compiled[m])['peak_bytes']):
        stepper.seconds(calls[mode], 1)  # first call, smallest plan first: a running peak
        peaks[mode] = (setup.device.memory_stats() or {}).get('peak_bytes_in_use')
    per_round = time.perf_counter() - start
    rounds = int(max(2, min(shape['iters'], 0.5 * ctx.left() / max(per_round, 1e-3))))
    ctx.log(f'timing {len(calls)} modes interleaved: {shape["warmup"]} warm-up + {rounds} rounds')
    times, rng, warm = {m: [] for m in calls}, np.random.default_rng(0), max(0, shape['warmup'] - 1)
    for r in range(warm + rounds):  # the first calls were one warm-up round
        for mode in rng.permutation(list(calls)):
            ms = stepper.seconds(calls[mode], 1) * 1e3
            times[mode] += [ms] if r >= warm else []
    return times, peaks


def run(ctx) -> dict:
    """The section named `step`, `step_best` or `step_1b` (`SHAPES`)."""
    key = ctx.params['name']
    shape, source = SHAPES[key]['smoke' if ctx.smoke else 'full'], 'stated'
    if shape['batch'] is None:
        shape, source = best_shape(shape, ctx.out)
    cfg = configs.load(shape['config'], shape['overrides'])
    setup, start = Setup.build(cfg), time.monotonic()
    batch, fit, largest = fit_batch(setup, shape['batch'], ctx.log)
    out = {'config_name': shape['config'], 'config': step_cost.config_summary(cfg, batch),
           'device': f'{setup.device.platform}:{setup.device.device_kind}',
           'batch_source': source, 'batch_requested': shape['batch'], 'batch': batch, 'fit': fit}
    ctx.partial(out)
    compiled, details, skipped = compile_modes(setup, batch, shape, largest, ctx, start)
    out.update(details=details, skipped_modes=skipped)
    ctx.partial(out)
    times, peaks = time_modes(setup, compiled, batch, shape, ctx)
    modes = {}
    for mode, program in compiled.items():
        memory = memory_of(program)
        modes[mode] = {'step_ms': float(statistics.median(times[mode])),
                       'flops': matmul_flops(program.as_text())['flops'],
                       'temp_bytes': memory['temp_size_in_bytes'],
                       'peak_bytes': memory['peak_bytes'], 'device_peak_bytes': peaks[mode]}
        details[mode]['times_ms'] = times[mode]
        ctx.log(f'{mode}: {modes[mode]["step_ms"]:.2f} ms, {modes[mode]["flops"] / 1e9:.4g} GFLOP')
    base, seconds = modes['normal'], modes['normal']['step_ms'] / 1e3
    ratios = {m: {k: v[k] / base[k] if v.get(k) is not None and base.get(k) else None
                  for k in step_cost.METRICS} for m, v in modes.items()}
    out.update(modes=modes, ratios=ratios, mfu={
        'formula': mfu(cfg, setup.state_abs.params, batch * cfg.data.seq_len, seconds),
        'matmuls': base['flops'] / seconds / PEAK_FLOPS, 'peak_flops': PEAK_FLOPS,
        'tokens_per_step': batch * cfg.data.seq_len})
    if ctx.out:
        out['bench_json'] = os.path.join(ctx.out, BENCH_FILES[key])  # what --cost bench reads
        runner.save(out['bench_json'], {k: out[k] for k in ('modes', 'ratios', 'config', 'device', 'mfu',
                                                            'batch_source')} | {'jax_version': jax.__version__})
    return out


def _batch(settings: dict) -> int:
    return max(1, settings['tokens_per_device'] // settings['seq_len'])


def _key(settings: dict, *leave_out: str) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in settings.items() if k not in leave_out))


def _failed(cell: dict, error: Exception) -> dict:
    """A cell that raised: out of memory is a cell that does not fit."""
    oom = any(m in str(error) for m in ('RESOURCE_EXHAUSTED', 'Out of memory', 'out of memory'))
    return dict(cell, fits=not oom, error=f'{type(error).__name__}: {str(error)[:300]}')


class Cells:
    """The normal step of one model (`config`: a configs.load name, with `base` overrides: the
    smoke's tiny shapes) at a sweep cell's settings: compiled a stage at a time, timed alone."""

    def __init__(self, model: str, config: str, base: dict, log, threads: int = 4):
        self.model, self.config, self.base, self.log, self.threads = model, config, base, log, threads
        self._setups, self._compiled = {}, {}

    @staticmethod
    def overrides(settings: dict) -> dict:
        """The config fields a cell's settings set."""
        return {'data.seq_len': settings['seq_len'], **{KNOB_FIELDS[k]: settings[k] for k in KNOBS}}

    def defaults(self) -> dict:
        """The config's own settings for every knob (its GPU variant in a full run)."""
        cfg = configs.load(self.config, self.base)
        return {k: getattr(getattr(cfg, f.split('.')[0]), f.split('.')[1]) for k, f in KNOB_FIELDS.items()}

    def setup(self, settings: dict) -> Setup:
        if (k := _key(settings, 'tokens_per_device')) not in self._setups:
            self._setups[k] = Setup.build(configs.load(self.config, self.base | self.overrides(settings)))
        return self._setups[k]

    def _compile(self, settings: dict):
        """(compiled or the exception it raised, compile seconds)."""
        start = time.perf_counter()
        try:
            program = self.setup(settings).compile('normal', _batch(settings))
        except Exception as error:  # noqa: BLE001  (a cell that cannot compile is a result)
            program = error
        return program, time.perf_counter() - start

    def prepare(self, cells: list, start_by: float) -> None:
        """Compile `cells` together (none started past `start_by`); `measure` takes them."""
        jobs = {_key(s): (lambda s=s: self._compile(s)) for s in cells if _key(s) not in self._compiled}
        self._compiled.update(programs.compile_all(jobs, threads=self.threads, start_by=start_by,
                                                   log=lambda _: None)[0])

    def measure(self, settings: dict, stage: str) -> dict:
        """The cell's figures; `fits` False (and no time) where the plan or the run
        exceeds the device's memory; `error` where it failed otherwise."""
        batch, tokens = _batch(settings), settings['tokens_per_device']
        cell = {'model': self.model, 'stage': stage, **settings, 'batch': batch,
                'xla_flags': settings.get('xla_flags', ''), 'overrides': self.overrides(settings)}
        program, compile_sec = self._compiled.pop(_key(settings), None) or self._compile(settings)
        cell['compile_sec'] = round(compile_sec, 2)
        if isinstance(program, Exception):
            return _failed(cell, program)
        setup = self.setup(settings)
        fits, peak = setup.fits(program)
        cell.update(fits=fits, peak_mib=round(peak / 2**20, 1))
        try:
            if fits:
                stepper = Stepper(setup.timing_state())
                step = stepper.call(program, setup.batch('normal', batch))
                iters = CELL_SEC / max(stepper.seconds(step, CELL_WARMUP), 1e-6)
                sec = stepper.seconds(step, int(min(CELL_ITERS[1], max(CELL_ITERS[0], iters))))
                cell.update(step_ms=sec * 1e3, tokens_per_sec=tokens / sec,
                            mfu=mfu(setup.cfg, setup.state_abs.params, tokens, sec),
                            mfu_matmuls=matmul_flops(program.as_text())['flops'] / sec / PEAK_FLOPS)
                self.log(f'{self.model} {tokens} tokens, {self.overrides(settings)} {cell["xla_flags"]}: '
                         f'{sec * 1e3:.2f} ms, MFU {cell["mfu"]:.1%}')
        except Exception as error:  # noqa: BLE001  (out of memory at run time is a result)
            return _failed(cell, error)
        return cell
