"""Modelled step time: the slowest live device's own program, timed alone.

Fake CPU devices share the host's cores, so wall-clock time on one machine
cannot show a straggler. A synchronous step on real hardware lasts as long as
its slowest device, so we time each device program (role, slots, slot batch)
by itself on one device (median after warm-up) and take the maximum over the
devices of a layout. On a GPU the same timing gives real figures.
"""
import statistics
import time

import jax
import numpy as np

from mecefo_jax import sharding
from mecefo_jax import state as state_lib
from mecefo_jax import step as step_lib
from mecefo_jax.layout import Layout, Piece, assemble


class RoleTimer:
    """Caches the measured per-device step time by (role, slots, slot batch)."""

    def __init__(self, model, optimizer, *, seq_len: int, vocab_size: int, rank,
                 warmup: int = 3, iters: int = 25, device=None):
        self._model, self._optimizer = model, optimizer
        self._seq_len, self._vocab, self._rank = seq_len, vocab_size, rank
        self._warmup, self._iters = warmup, iters
        self._mesh = sharding.mesh_from_rows([[device or jax.devices()[0]]])
        self._cache: dict[tuple, float] = {}
        self._state = None

    def seconds(self, role: int, num_slots: int, slot_batch: int) -> float:
        key = (int(role), int(num_slots), int(slot_batch))
        if key not in self._cache:
            self._cache[key] = self._measure(*key)
        return self._cache[key]

    def step_seconds(self, layout: Layout) -> float:
        """The step lasts as long as its slowest device."""
        return max(self.seconds(role, len(pieces), layout.slot_batch)
                   for role, pieces in zip(layout.roles, layout.slots))

    def table(self) -> dict:
        return {f'role{r}_slots{s}_batch{b}': t for (r, s, b), t in sorted(self._cache.items())}

    def _measure(self, role: int, num_slots: int, slot_batch: int) -> float:
        if self._state is None:
            self._state, self._shardings = state_lib.create_train_state(
                self._model, self._optimizer, self._mesh, seed=0, rank=self._rank)
        layout = Layout(replicas=(0,), roles=(role,),
                        slots=((Piece(0, 0, slot_batch),) * num_slots,), slot_batch=slot_batch)
        rng = np.random.default_rng(0)
        tokens = rng.integers(0, self._vocab, (1, slot_batch, self._seq_len + 1), dtype=np.int32)
        batch = jax.device_put(assemble(layout, tokens), sharding.data_sharded(self._mesh))
        step = step_lib.make_train_step(self._model, self._optimizer, self._mesh, self._shardings)
        step = step.lower(self._state, batch).compile()
        times = []
        for i in range(self._warmup + self._iters):
            start = time.perf_counter()
            self._state, metrics = step(self._state, batch)
            jax.block_until_ready(metrics)
            if i >= self._warmup:
                times.append(time.perf_counter() - start)
        return statistics.median(times)
