"""One device's train step as the GPU sections build, compile, run, time and count it:
`Setup` compiles a mode from the abstract state, `Stepper` is the one way the report times
a step, `compile_all` compiles several at once (XLA compiles off the GIL), `mfu` is the formula.
"""
import concurrent.futures
import math
import time

import jax
import numpy as np

from studies import step_modes, xla_costs
from studies.step_modes import model_flops_per_token

PEAK_FLOPS = 989e12  # H100 / H200 SXM, dense bf16
FIT_FRACTION = 0.9  # a plan fits when its peak is under this share of the device's limit
MIXED_MODES = {'mecefo_mixed': 2, 'mecefo_mixed_eighth': 8}  # adopted rows: ceil(batch / n)


def mfu(cfg, params_abs, tokens: int, step_sec: float, peak_flops: float = PEAK_FLOPS) -> float:
    """(6 N + attention FLOPs) x tokens / step time / peak (`model_flops_per_token`)."""
    return model_flops_per_token(cfg, params_abs) * tokens / step_sec / peak_flops


def mode_layout(mode: str, batch: int):
    """step_modes' one-replica layouts, plus the planned-style neighbour (1.5 shards)
    and the mixed helpers (own shard exact, part of an adopted one approximate)."""
    from mecefo_jax.neighbour.layout import ROLE_MIXED, ROLE_NEIGHBOUR, Layout, Piece
    if mode == 'mecefo_planned':
        role, adopted = ROLE_NEIGHBOUR, math.ceil(batch / 2)
    elif mode in MIXED_MODES:
        role, adopted = ROLE_MIXED, math.ceil(batch / MIXED_MODES[mode])
    else:
        return step_modes.mode_layout(mode, batch)
    pieces = (Piece(0, 0, batch), Piece(1, 0, adopted))
    return Layout(replicas=(0,), roles=(role,), pieces=(pieces,))


class Stepper:
    """Threads ONE donated train state through compiled steps (one copy of a large
    model's state for every mode) and times them the one way the report does."""

    def __init__(self, state):
        self.state = state

    def call(self, program, args, mode: str = 'normal'):
        """A function running one step of `program` on `args`, not waited for."""
        def step():
            if mode == 'plain_dp':
                params, opt_state, loss = program(self.state.params, self.state.opt_state, args)
                self.state = self.state.replace(params=params, opt_state=opt_state)
                return loss
            self.state, metrics = program(self.state, args)
            return metrics
        return step

    def seconds(self, step, steps: int, after=None) -> float:
        """Seconds per step of `steps` calls of `step` dispatched back to back and blocked
        once at the end, the training loop's own pattern; `after(state, out)` follows each."""
        start = time.perf_counter()
        for _ in range(steps):
            out = step()
            if after is not None:
                after(self.state, out)
        jax.block_until_ready((self.state, out))
        return (time.perf_counter() - start) / steps


class Setup:
    """Everything a compile needs for one model shape on one device: `Setup.build(cfg)`."""

    @classmethod
    def build(cls, cfg, device=None):
        from mecefo_jax.model.llama import build_model
        from mecefo_jax.model.optim import make_optimizer
        from mecefo_jax.parallel import sharding
        from mecefo_jax.parallel.sharding import abstract
        from mecefo_jax.parallel.state import trace_layout
        self, rank = cls(), cfg.mecefo.rank
        self.cfg, self.device, self.model = cfg, device or jax.devices()[0], build_model(cfg)
        self.optimizer, self.mesh = make_optimizer(cfg.train), sharding.mesh_from_rows([[self.device]])
        state_layout = trace_layout(self.model, self.optimizer, rank)
        self.shardings = state_layout.shardings(self.mesh)
        self.state_abs = abstract(state_layout.abstract, self.shardings)
        return self

    @property
    def seq(self) -> int:
        return self.cfg.data.seq_len + 1

    def compile(self, mode: str, batch: int):
        from mecefo_jax.parallel import sharding
        from mecefo_jax.parallel import step as step_lib
        from mecefo_jax.parallel.sharding import abstract_batch
        if mode == 'plain_dp':
            tokens = jax.ShapeDtypeStruct((batch, self.seq), np.int32, sharding=sharding.data_sharded(self.mesh))
            fn = step_modes.make_plain_dp_step(self.model, self.optimizer, self.mesh, self.shardings.params,
                                               self.shardings.opt_state)
            return fn.lower(self.state_abs.params, self.state_abs.opt_state, tokens).compile()
        programs = mode_layout(mode, batch).programs
        fn = step_lib.make_train_step(self.model, self.optimizer, self.mesh, self.shardings,
                                       programs, ordered_reduction=False)
        return fn.lower(self.state_abs, abstract_batch(self.mesh, programs[0].rows, self.seq)).compile()

    @property
    def limit(self) -> int | None:
        """The bytes the device's allocator may use (None: no limit on this backend)."""
        return (self.device.memory_stats() or {}).get('bytes_limit')

    def fits(self, compiled) -> tuple[bool, int]:
        """(XLA's planned peak is under FIT_FRACTION of the device's limit, that peak)."""
        peak = xla_costs.memory_of(compiled)['peak_bytes']
        return self.limit is None or peak <= FIT_FRACTION * self.limit, peak

    def timing_state(self, seed: int = 0):
        """A train state with random parameters and projections: timing needs their shapes,
        not an SVD (at 1B that alone takes about 30 s)."""
        from flax import linen

        from mecefo_jax.model.llama import init_params
        from mecefo_jax.parallel.state import TrainState

        def init():
            key, v_key = jax.random.split(jax.random.key(seed))
            params = linen.unbox(init_params(self.model, key))
            projections = jax.tree.map(lambda a: jax.random.normal(v_key, a.shape, a.dtype) / math.sqrt(
                a.shape[-2]), self.state_abs.projections)
            return TrainState(step=jax.numpy.zeros((), jax.numpy.int32), params=params,
                              opt_state=self.optimizer.init(params), projections=projections)
        return jax.jit(init, out_shardings=self.shardings)()

    def batch(self, mode: str, batch: int, tokens_nbt=None):
        """The device batch of `mode` from the two shards `tokens_nbt` (random by default), step 0."""
        from mecefo_jax.neighbour.layout import assemble
        from mecefo_jax.parallel import sharding
        tokens_nbt = step_modes.random_tokens(self.cfg, batch, seed=0) if tokens_nbt is None else tokens_nbt
        if mode == 'plain_dp':
            return jax.device_put(tokens_nbt[0], sharding.data_sharded(self.mesh))
        host = dict(assemble(mode_layout(mode, batch), tokens_nbt), step=np.int32(0))
        return jax.device_put(host, sharding.batch_shardings(self.mesh))


def compile_all(jobs: dict, *, threads: int, start_by: float, log) -> tuple[dict, dict]:
    """({key: compiled}, {key: seconds}) of `jobs` {key: () -> compiled}, `threads` at a time,
    in the jobs' order; a job not started by the monotonic time `start_by` is left out."""
    def run(key):
        t0 = time.perf_counter()
        return (key, None, 0.0) if time.monotonic() > start_by else (key, jobs[key](), time.perf_counter() - t0)

    compiled, seconds = {}, {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for key, program, sec in pool.map(run, list(jobs)):
            if program is not None:
                compiled[key], seconds[key] = program, sec
                log(f'{key}: compiled in {sec:.1f} s')
    return compiled, seconds
