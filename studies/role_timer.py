"""Modelled step time: the slowest live device's own program, timed alone.

Fake CPU devices share the host's cores, so wall-clock time on one machine
cannot show a straggler; a synchronous step lasts as long as its slowest
device. So each device program (role, rows: see layout.py) is timed by itself
on one device, all of a run's programs interleaved (`step_measure.time_interleaved`,
so load changes on a shared CPU hit every program alike; median kept), and a
layout's step is the maximum over its devices. On a GPU the same timing
gives real figures.
"""
import statistics

import jax
import numpy as np

from mecefo_jax.neighbour.layout import ROLE_MIXED, Layout, Piece, Program, assemble
from mecefo_jax.parallel import sharding
from mecefo_jax.parallel import state as state_lib
from mecefo_jax.parallel import step as step_lib
from studies.step_measure import StepRunner, time_interleaved


def layout_keys(layout: Layout) -> set[Program]:
    """The distinct device programs of a layout."""
    return set(layout.programs)


class RoleTimer:
    """Caches the measured per-device step time of each program (role, rows)."""

    def __init__(self, model, optimizer, *, seq_len: int, vocab_size: int, rank,
                 warmup: int = 3, iters: int = 50, device=None):
        self._model, self._optimizer = model, optimizer
        self._seq_len, self._vocab, self._rank = seq_len, vocab_size, rank
        self._warmup, self._iters = warmup, iters
        self._mesh = sharding.mesh_from_rows([[device or jax.devices()[0]]])
        self._cache: dict[Program, float] = {}
        self._state = None

    def seconds(self, program: Program) -> float:
        if program not in self._cache:
            self.measure({program})
        return self._cache[program]

    def step_seconds(self, layout: Layout) -> float:
        """The step lasts as long as its slowest device."""
        return max(self.seconds(p) for p in layout_keys(layout))

    def table(self) -> dict:
        return {p.name: t for p, t in sorted(self._cache.items())}

    def measure(self, programs) -> None:
        """Time the given programs (and any already known) interleaved."""
        programs = sorted(set(programs) | set(self._cache))
        if self._state is None:
            self._state, self._shardings = state_lib.create_train_state(
                self._model, self._optimizer, self._mesh, seed=0, rank=self._rank)
        runner = StepRunner(self._state)
        calls = {p: runner.mecefo(*self._compile(p)) for p in programs}
        times = time_interleaved(calls, warmup=self._warmup, iters=self._iters)
        self._state = runner.state
        self._cache.update({p: statistics.median(t) / 1e3 for p, t in times.items()})

    def _compile(self, program: Program):
        """One device running `program` alone: its rows in its role (a mixed one's
        exact rows as its own piece)."""
        pieces = ((Piece(0, 0, program.exact), Piece(0, program.exact, program.rows))
                  if program.role == ROLE_MIXED else (Piece(0, 0, program.rows),))
        layout = Layout(replicas=(0,), roles=(program.role,), pieces=(pieces,))
        rng = np.random.default_rng(0)
        tokens = rng.integers(0, self._vocab, (1, program.rows, self._seq_len + 1),
                              dtype=np.int32)
        # The step number never matches after the first call, so later calls
        # leave the state as it is: the same arithmetic, a constant state.
        host = dict(assemble(layout, tokens), step=np.int32(0))
        batch = jax.device_put(host, sharding.batch_shardings(self._mesh))
        step = step_lib.make_train_step(self._model, self._optimizer, self._mesh,
                                        self._shardings, layout.programs)
        return step.lower(self._state, batch).compile(), batch
