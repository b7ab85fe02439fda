"""The step-cost modes compiled on one device, and timed: their FLOPs, memory and wall time.

Per mode: `flops`, XLA's cost analysis of the step compiled with
`ModelConfig.unroll_loops=True` (XLA counts a while body once whatever its
trip count; `flops_xla_raw` is the scanned program's count, and a program
with no loop is counted as it is); `temp_bytes` and `peak_bytes` (arguments
+ outputs + temporaries - aliased, the state donated) of the real step;
`step_ms`, the median of calls interleaved with the other modes in a fresh
random order each round, so that load changes on a shared machine hit every
mode alike. XLA:CPU computes bfloat16 dots in float32, so CPU bytes and
times of a bf16 model overstate a GPU's.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mecefo_jax.parallel.aot import abstract, abstract_batch
from studies.step_modes import MODES, make_plain_dp_step, mode_layout, unrolled
from studies.xla_costs import count_while_loops, flops_of, memory_of


@dataclasses.dataclass
class Bench:
    """What every stage of `run_benchmark` shares: the model, its mesh and abstract state."""
    cfg: Any
    batch: int
    device: Any
    log: Callable[[str], None]
    model: Any
    optimizer: Any
    mesh: Any
    shardings: Any
    state_abs: Any

    @property
    def seq(self) -> int:
        return self.cfg.data.seq_len + 1


def new_bench(cfg, batch: int, device, log, model=None) -> Bench:
    """`model` (default: the model of `cfg`), its optimizer, a one-device mesh on `device`
    and the abstract state."""
    from mecefo_jax.model.llama import build_model
    from mecefo_jax.model.optim import make_optimizer
    from mecefo_jax.parallel import sharding
    from mecefo_jax.parallel.state import abstract_train_state, state_shardings
    model = build_model(cfg) if model is None else model
    mesh = sharding.mesh_from_rows([[device]])
    optimizer = make_optimizer(cfg.train)
    rank = cfg.mecefo.rank
    shardings = state_shardings(model, optimizer, mesh, rank)
    state_abs = abstract(abstract_train_state(model, optimizer, rank=rank), shardings)
    return Bench(cfg, batch, device, log, model, optimizer, mesh, shardings, state_abs)


def _compile_pair(bench: Bench, make, args, mode):
    """(real program, the program whose FLOPs are counted, compile times), from abstract args.

    A real program with no while loop (one layer, one loss chunk) is already
    straight-line code: its count is complete and it is its own counting program.
    """
    t0 = time.perf_counter()
    real = make(bench.model).lower(*args).compile()
    t1 = time.perf_counter()
    if not count_while_loops(real):
        bench.log(f'bench[{mode}]: compiled in {t1 - t0:.1f} s (no loops: counted as is)')
        return real, real, {'compile_s': t1 - t0, 'flops_source': 'step (no loops)'}
    counting = make(unrolled(bench.model)).lower(*args).compile()
    t2 = time.perf_counter()
    bench.log(f'bench[{mode}]: compiled in {t1 - t0:.1f} s (+{t2 - t1:.1f} s unrolled for FLOPs)')
    return real, counting, {'compile_s': t1 - t0, 'compile_unrolled_s': t2 - t1,
                            'flops_source': 'unrolled step'}


def mode_program(bench: Bench, mode: str):
    """(make(model) -> jitted step, its abstract args, what it computes) for one mode."""
    from mecefo_jax.neighbour.layout import ROLE_NEIGHBOUR
    from mecefo_jax.parallel import sharding
    from mecefo_jax.parallel import step as step_lib
    if mode == 'plain_dp':
        tokens_abs = jax.ShapeDtypeStruct((bench.batch, bench.seq), jnp.int32,
                                          sharding=sharding.data_sharded(bench.mesh))
        return (lambda m: make_plain_dp_step(m, bench.optimizer, bench.mesh,
                                             bench.shardings.params, bench.shardings.opt_state),
                (bench.state_abs.params, bench.state_abs.opt_state, tokens_abs),
                {'rows': bench.batch, 'neighbour': False})
    programs = mode_layout(mode, bench.batch).programs
    return (lambda m: step_lib.make_train_step(m, bench.optimizer, bench.mesh,
                                               bench.shardings, programs),
            (bench.state_abs, abstract_batch(bench.mesh, programs[0].rows, bench.seq)),
            {'program': programs[0].name, 'rows': programs[0].rows,
             'neighbour': programs[0].role == ROLE_NEIGHBOUR})


def compile_modes(bench: Bench):
    """Compile every mode: (figures per mode, details per mode, the real programs)."""
    modes, details, compiled = {}, {}, {}
    for mode in MODES:
        make, args, info = mode_program(bench, mode)
        real, counting, times = _compile_pair(bench, make, args, mode)
        memory = memory_of(real)
        compiled[mode] = real
        modes[mode] = {'flops': flops_of(counting), 'flops_xla_raw': flops_of(real),
                       'temp_bytes': memory['temp_size_in_bytes'],
                       'peak_bytes': memory['peak_bytes'], 'step_ms': None}
        details[mode] = {**info, **times, **memory,
                         'while_loops_in_flops_program': count_while_loops(counting),
                         'while_loops_in_step': count_while_loops(real),
                         'conditionals_in_step': (real.as_text() or '').count(' conditional(')}
        bench.log(f'bench[{mode}]: flops={modes[mode]["flops"]:.4g} '
                  f'(raw {modes[mode]["flops_xla_raw"]:.4g}) '
                  f'temp={memory["temp_size_in_bytes"] / 2**20:.1f} MiB '
                  f'peak={memory["peak_bytes"] / 2**20:.1f} MiB')
    return modes, details, compiled


def optimizer_update_cost(bench: Bench) -> dict:
    """The batch-independent part of every step: AdamW (+ clipping) alone."""
    def update(grads, opt_state, params):
        import optax
        updates, opt_state = bench.optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state
    params, opt_state = bench.state_abs.params, bench.state_abs.opt_state
    upd = jax.jit(update).lower(params, opt_state, params).compile()
    return {'flops': flops_of(upd), 'temp_bytes': memory_of(upd)['temp_size_in_bytes']}


def time_interleaved(programs: dict, *, warmup: int, iters: int, seed: int = 0):
    """Per-name wall times (ms) of `iters` rounds calling every program once.

    `programs[name]` is a `call()` that runs one step and blocks until it is
    done. Round-robin, so a change in machine load during the run (shared
    CPUs) hits every program alike instead of whichever ran last; each round
    takes a fresh random order (seeded), so no program always runs next to
    the same one (caches a big program leaves cold, its lingering threads).
    """
    names = list(programs)
    rng = np.random.default_rng(seed)
    for _ in range(warmup):
        for call in programs.values():
            call()
    times = {name: [] for name in programs}
    for _ in range(iters):
        for k in rng.permutation(len(names)):
            name = names[k]
            start = time.perf_counter()
            programs[name]()
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


class StepRunner:
    """Threads ONE donated train state through every compiled step it calls.

    MeCeFO steps get a batch stamped with step 0: the first call applies its
    update and later calls leave the state as it is (same arithmetic, see
    step.py); plain_dp steps update params and optimizer state in place.
    One state for all programs keeps a large model's memory to one copy.
    """

    def __init__(self, state):
        self.state = state

    def mecefo(self, compiled, batch):
        def call():
            self.state, metrics = compiled(self.state, batch)
            jax.block_until_ready((self.state, metrics))
        return call

    def plain(self, compiled, tokens):
        def call():
            params, opt_state, loss = compiled(self.state.params, self.state.opt_state, tokens)
            self.state = self.state.replace(params=params, opt_state=opt_state)
            jax.block_until_ready((self.state, loss))
        return call
