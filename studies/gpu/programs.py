"""One device's train step as the GPU sections build, compile, run and count it.

`Setup` holds one model shape on one device: its abstract state (compiles
need no arrays), the compiled step of each mode (`step_modes`' one-replica
layouts, the planned-style neighbour and the mixed helpers), and a state to
run them on whose SVD projections are random (timing needs their shapes,
not an SVD: at 1B the SVD alone takes about 30 s). `compile_all` compiles
several programs at once (XLA compiles in C++, off the GIL; a 16-core GPU
machine compiles 4 about as fast as 1). `mfu` is the one MFU formula.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import time

import jax
import numpy as np

from studies import step_modes
from studies.step_efficiency import model_flops_per_token

PEAK_FLOPS = 989e12  # H100 / H200 SXM, dense bf16
FIT_FRACTION = 0.9  # a plan fits when its peak is under this share of the device's limit
MIXED_MODES = {'mecefo_mixed': 2, 'mecefo_mixed_eighth': 8}  # adopted rows: ceil(batch / n)


def mfu(cfg, params_abs, tokens: int, step_sec: float, peak_flops: float = PEAK_FLOPS) -> float:
    """(6 N + attention FLOPs) x tokens / step time / peak, as a fraction.

    N: the parameters that take part in matmuls (the head, not the embedding
    lookup nor the norms), attention 12 x layers x d_model x seq_len per
    token (PaLM; the causal mask not halved): `model_flops_per_token`.
    """
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


def rows_of(mode: str, batch: int) -> int:
    return batch if mode == 'plain_dp' else mode_layout(mode, batch).programs[0].rows


def device_limit(device) -> int | None:
    return (device.memory_stats() or {}).get('bytes_limit')


@dataclasses.dataclass
class Setup:
    """Everything a compile needs for one model shape on one device."""
    cfg: object
    model: object
    optimizer: object
    mesh: object
    shardings: object
    state_abs: object
    device: object

    @classmethod
    def build(cls, cfg, model=None, device=None):
        """`cfg`'s model (or `model`) on `device` (the first device by default)."""
        from mecefo_jax.model.llama import build_model
        from mecefo_jax.model.optim import make_optimizer
        from mecefo_jax.parallel import sharding
        from mecefo_jax.parallel.aot import abstract
        from mecefo_jax.parallel.state import abstract_train_state, state_shardings
        device = device or jax.devices()[0]
        model = model or build_model(cfg)
        mesh = sharding.mesh_from_rows([[device]])
        optimizer = make_optimizer(cfg.train)
        rank = cfg.mecefo.rank
        shardings = state_shardings(model, optimizer, mesh, rank)
        state_abs = abstract(abstract_train_state(model, optimizer, rank=rank), shardings)
        return cls(cfg, model, optimizer, mesh, shardings, state_abs, device)

    @property
    def seq(self) -> int:
        return self.cfg.data.seq_len + 1

    def compile(self, mode: str, batch: int):
        from mecefo_jax.parallel import sharding
        from mecefo_jax.parallel import step as step_lib
        from mecefo_jax.parallel.aot import abstract_batch
        if mode == 'plain_dp':
            tokens = jax.ShapeDtypeStruct((batch, self.seq), np.int32,
                                          sharding=sharding.data_sharded(self.mesh))
            fn = step_modes.make_plain_dp_step(self.model, self.optimizer, self.mesh,
                                               self.shardings.params, self.shardings.opt_state)
            return fn.lower(self.state_abs.params, self.state_abs.opt_state, tokens).compile()
        programs = mode_layout(mode, batch).programs
        fn = step_lib.make_train_step(self.model, self.optimizer, self.mesh, self.shardings,
                                      programs)
        return fn.lower(self.state_abs, abstract_batch(self.mesh, programs[0].rows,
                                                       self.seq)).compile()

    def fits(self, compiled) -> tuple[bool, int]:
        """(XLA's planned peak is under FIT_FRACTION of the device's limit, that peak)."""
        from studies.xla_costs import memory_of
        peak, limit = memory_of(compiled)['peak_bytes'], device_limit(self.device)
        return limit is None or peak <= FIT_FRACTION * limit, peak

    def timing_state(self, seed: int = 0):
        """A train state with random parameters and random (not SVD) projections."""
        from flax import linen

        from mecefo_jax.model.llama import init_params
        from mecefo_jax.parallel.state import TrainState

        def init():
            key, v_key = jax.random.split(jax.random.key(seed))
            params = linen.unbox(init_params(self.model, key))
            projections = jax.tree.map(
                lambda a: jax.random.normal(v_key, a.shape, a.dtype) / math.sqrt(a.shape[-2]),
                self.state_abs.projections)
            return TrainState(step=jax.numpy.zeros((), jax.numpy.int32), params=params,
                              opt_state=self.optimizer.init(params), projections=projections)
        return jax.jit(init, out_shardings=self.shardings)()

    def batch(self, mode: str, batch: int, tokens_nbt):
        """The device batch of `mode` from the two shards `tokens_nbt` (step 0)."""
        from mecefo_jax.neighbour.layout import assemble
        from mecefo_jax.parallel import sharding
        if mode == 'plain_dp':
            return jax.device_put(tokens_nbt[0], sharding.data_sharded(self.mesh))
        host = dict(assemble(mode_layout(mode, batch), tokens_nbt), step=np.int32(0))
        return jax.device_put(host, sharding.batch_shardings(self.mesh))


def compile_all(jobs: dict, *, threads: int, start_by: float, log) -> tuple[dict, dict]:
    """({key: compiled}, {key: seconds}) of `jobs` {key: () -> compiled}, `threads` at a time,
    in the jobs' order; a job not started by the monotonic time `start_by` is left out."""
    def run(key):
        if time.monotonic() > start_by:
            return key, None, 0.0
        t0 = time.perf_counter()
        return key, jobs[key](), time.perf_counter() - t0

    compiled, seconds = {}, {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for key, program, sec in pool.map(run, list(jobs)):
            if program is not None:
                compiled[key], seconds[key] = program, sec
                log(f'{key}: compiled in {sec:.1f} s')
    return compiled, seconds
