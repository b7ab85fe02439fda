"""One sweep cell: a model's normal train step at one batch and one set of settings, timed.

A cell's settings are the knobs the sweep turns: tokens a device, tokens a
sequence, `model.attention`, `model.remat_policy`, `model.scan_layers`,
`train.flat_optimizer` and the XLA flags its process started with. `Cells`
compiles the cells of a sweep stage together (programs.compile_all), then
runs each alone: XLA's memory plan first (a cell over the device's memory is
recorded as not fitting, not run), then a few warm-up steps and a timed run
of steps dispatched back to back, blocked once at the end (the loop's own
pattern: the host never waits for a step it has just dispatched).
"""
from __future__ import annotations

import time

import jax

from studies import step_modes
from studies.gpu import configs
from studies.gpu.configs import KNOB_FIELDS as _FIELDS
from studies.gpu.configs import KNOBS
from studies.gpu.programs import PEAK_FLOPS, Setup, compile_all, mfu
from studies.xla_costs import matmul_flops

WARMUP = 2
TIMED_SEC = 1.5  # steps timed per cell: about this long, between MIN_ITERS and MAX_ITERS
MIN_ITERS, MAX_ITERS = 2, 20


def overrides(settings: dict) -> dict:
    """The config fields a cell's settings set."""
    return {'data.seq_len': settings['seq_len'],
            **{_FIELDS[k]: settings[k] for k in KNOBS}}


def key(settings: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in settings.items()))


def is_out_of_memory(error: Exception) -> bool:
    text = str(error)
    return 'RESOURCE_EXHAUSTED' in text or 'Out of memory' in text or 'out of memory' in text


class Cells:
    """Compiles and times the cells of one model (`config`: a configs.load name, with
    `base` overrides: the smoke's tiny shapes)."""

    def __init__(self, model: str, config: str, base: dict, log, threads: int = 4):
        self.model, self.config, self.base, self.log, self.threads = model, config, base, log, threads
        self._setups, self._compiled = {}, {}

    def defaults(self) -> dict:
        """The config's own settings for every knob (its GPU variant in a full run)."""
        cfg = configs.load(self.config, self.base)
        return {'attention': cfg.model.attention, 'remat_policy': cfg.model.remat_policy,
                'scan_layers': cfg.model.scan_layers,
                'flat_optimizer': cfg.train.flat_optimizer}

    def setup(self, settings: dict) -> Setup:
        k = key({n: v for n, v in settings.items() if n != 'tokens_per_device'})
        if k not in self._setups:
            self._setups[k] = Setup.build(configs.load(self.config,
                                                       dict(self.base, **overrides(settings))))
        return self._setups[k]

    def _compile(self, settings: dict):
        """(compiled or the exception it raised, compile seconds)."""
        start = time.perf_counter()
        try:
            program = self.setup(settings).compile('normal', batch_of(settings))
        except Exception as error:  # noqa: BLE001  (a cell that cannot compile is a result)
            program = error
        return program, time.perf_counter() - start

    def prepare(self, cells: list, start_by: float) -> None:
        """Compile `cells` together (none started past `start_by`); `measure` takes them."""
        jobs = {key(s): (lambda s=s: self._compile(s)) for s in cells
                if key(s) not in self._compiled}
        done, _ = compile_all(jobs, threads=self.threads, start_by=start_by, log=lambda _: None)
        self._compiled.update(done)

    def measure(self, settings: dict, stage: str) -> dict:
        """The cell's figures; `fits` False (and no time) where the plan or the run
        exceeds the device's memory; `error` where it failed otherwise."""
        cell = {'model': self.model, 'stage': stage, **settings, 'batch': batch_of(settings),
                'xla_flags': settings.get('xla_flags', ''), 'overrides': overrides(settings)}
        program, compile_sec = self._compiled.pop(key(settings), None) or self._compile(settings)
        cell['compile_sec'] = round(compile_sec, 2)
        if isinstance(program, Exception):
            return dict(cell, fits=not is_out_of_memory(program), error=_short(program))
        setup = self.setup(settings)
        fits, peak = setup.fits(program)
        cell.update(fits=fits, peak_mib=round(peak / 2**20, 1))
        if not fits:
            return cell
        try:
            step_sec = time_steps(setup, program, cell['batch'])
        except Exception as error:  # noqa: BLE001  (out of memory at run time is a result)
            return dict(cell, fits=not is_out_of_memory(error), error=_short(error))
        tokens = settings['tokens_per_device']
        params = setup.state_abs.params
        cell.update(step_ms=step_sec * 1e3, tokens_per_sec=tokens / step_sec,
                    mfu=mfu(setup.cfg, params, tokens, step_sec),
                    mfu_matmuls=matmul_flops(program.as_text())['flops'] / step_sec / PEAK_FLOPS)
        self.log(f'{self.model} {describe(cell)}: {cell["step_ms"]:.2f} ms, '
                 f'{cell["tokens_per_sec"]:.0f} tokens/s, MFU {cell["mfu"]:.1%}')
        return cell


def batch_of(settings: dict) -> int:
    return max(1, settings['tokens_per_device'] // settings['seq_len'])


def time_steps(setup: Setup, program, batch: int) -> float:
    """Seconds per step of `program` run back to back after warm-up (state donated)."""
    state = setup.timing_state()
    args = setup.batch('normal', batch, step_modes.random_tokens(setup.cfg, batch, seed=0))
    for _ in range(WARMUP):
        start = time.perf_counter()
        state, _ = program(state, args)
        jax.block_until_ready(state)
    iters = int(min(MAX_ITERS, max(MIN_ITERS, TIMED_SEC / max(time.perf_counter() - start, 1e-6))))
    start = time.perf_counter()
    for _ in range(iters):
        state, metrics = program(state, args)
    jax.block_until_ready((state, metrics))
    return (time.perf_counter() - start) / iters


def describe(cell: dict) -> str:
    flags = f", {cell['xla_flags']}" if cell.get('xla_flags') else ''
    return (f"{cell['tokens_per_device']} tokens ({cell['batch']} x {cell['seq_len']}), "
            f"{cell['attention']}, remat {cell['remat_policy']}, "
            f"{'scanned' if cell['scan_layers'] else 'unrolled'}, "
            f"{'flat' if cell['flat_optimizer'] else 'per-leaf'} AdamW{flags}")


def _short(error: Exception) -> str:
    return f'{type(error).__name__}: {str(error)[:300]}'
