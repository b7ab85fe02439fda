"""Modelled step time: the slowest live device's own program, timed alone.

Fake CPU devices share the host's cores, so wall-clock time on one machine
cannot show a straggler. A synchronous step on real hardware lasts as long as
its slowest device, so we time each device program (role, slots, slot batch)
by itself on one device and take the maximum over the devices of a layout.
On a GPU the same timing gives real figures.

Programs are timed interleaved, one call of each per round, and the median
per program is kept: timing millisecond-scale programs one after another on a
shared CPU scatters by 2x between repetitions, while interleaving exposes
every program to the same conditions. Every layout of a run is known in
advance (it is a function of the schedule's live masks), so `measure` takes
all of them at once; a program first met later is timed with the normal one.
"""
import statistics
import time

import jax
import numpy as np

from mecefo_jax import sharding
from mecefo_jax import state as state_lib
from mecefo_jax import step as step_lib
from mecefo_jax.layout import ROLE_NORMAL, Layout, Piece, assemble


def layout_keys(layout: Layout) -> set[tuple[int, int, int]]:
    """The distinct device programs of a layout: (role, slots, slot batch)."""
    return {(int(role), len(pieces), layout.slot_batch)
            for role, pieces in zip(layout.roles, layout.slots)}


class RoleTimer:
    """Caches the measured per-device step time by (role, slots, slot batch)."""

    def __init__(self, model, optimizer, *, seq_len: int, vocab_size: int, rank,
                 warmup: int = 3, iters: int = 50, device=None):
        self._model, self._optimizer = model, optimizer
        self._seq_len, self._vocab, self._rank = seq_len, vocab_size, rank
        self._warmup, self._iters = warmup, iters
        self._mesh = sharding.mesh_from_rows([[device or jax.devices()[0]]])
        self._cache: dict[tuple, float] = {}
        self._state = None

    def seconds(self, role: int, num_slots: int, slot_batch: int) -> float:
        key = (int(role), int(num_slots), int(slot_batch))
        if key not in self._cache:
            self.measure({key})
        return self._cache[key]

    def step_seconds(self, layout: Layout) -> float:
        """The step lasts as long as its slowest device."""
        return max(self.seconds(*key) for key in layout_keys(layout))

    def table(self) -> dict:
        return {f'role{r}_slots{s}_batch{b}': t for (r, s, b), t in sorted(self._cache.items())}

    def measure(self, keys) -> None:
        """Time the given programs (and any already known) interleaved."""
        keys = set(keys) | set(self._cache)
        keys |= {(ROLE_NORMAL, 1, b) for _, _, b in keys}  # the reference of each size
        if self._state is None:
            self._state, self._shardings = state_lib.create_train_state(
                self._model, self._optimizer, self._mesh, seed=0, rank=self._rank)
        programs = {key: self._compile(*key) for key in sorted(keys)}
        times = {key: [] for key in programs}
        for i in range(self._warmup + self._iters):
            for key, (step, batch) in programs.items():
                start = time.perf_counter()
                self._state, metrics = step(self._state, batch)
                jax.block_until_ready((self._state, metrics))
                if i >= self._warmup:
                    times[key].append(time.perf_counter() - start)
        self._cache.update({key: statistics.median(t) for key, t in times.items()})

    def _compile(self, role: int, num_slots: int, slot_batch: int):
        layout = Layout(replicas=(0,), roles=(role,),
                        slots=((Piece(0, 0, slot_batch),) * num_slots,), slot_batch=slot_batch)
        rng = np.random.default_rng(0)
        tokens = rng.integers(0, self._vocab, (1, slot_batch, self._seq_len + 1), dtype=np.int32)
        batch = jax.device_put(assemble(layout, tokens), sharding.data_sharded(self._mesh))
        step = step_lib.make_train_step(self._model, self._optimizer, self._mesh, self._shardings)
        return step.lower(self._state, batch).compile(), batch
