"""The contract between a controller and the loop, and the fault-free controller.

Before every step the loop asks `prepare(clock, step, state)` for a `Plan` (topology and
layout); after dispatching it, `after_dispatch` reports failures and recoveries, and at
the end `summary` what they cost. The fault controllers (`faults/controller.py`) keep the
same contract.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from mecefo_jax.neighbour.layout import Layout, full_layout
from mecefo_jax.neighbour.row_packing import Packing
from mecefo_jax.parallel.topology import Topology

if TYPE_CHECKING:
    from mecefo_jax.training.run_setup import Run


@dataclasses.dataclass
class Plan:
    """Where the next step runs, and what the controller did to get there."""
    topology: Topology
    layout: Layout
    live: tuple[bool, ...]  # which replicas are up (absent ones of a relaunch are down)
    data_state: dict | None = None  # set when the controller rolled training back
    # Replicas as rows (mesh.replicas > 0): `layout`'s rows packed onto the mesh's devices.
    packing: Packing | None = None

    @property
    def step_layout(self) -> Layout | Packing:
        """What the step computes where: the packing of replicas as rows, else the layout."""
        return self.layout if self.packing is None else self.packing


class StaticController:
    """Fault-free data parallelism on the full mesh."""

    def __init__(self, run: Run):
        if not all(run.present):
            raise ValueError('Some replicas have no devices in this job: train it under the '
                             'fault controller (mecefo_jax.run.run picks it).')
        self._topology = run.topologies.get(run.present_rows)
        self._layout = full_layout(run.num_shards, run.shard_batch)
        self._live = (True,) * run.num_shards
        self._packing = run.packing(self._layout)

    def prepare(self, clock: int, step: int, state):
        del clock, step
        return state, Plan(self._topology, self._layout, self._live, packing=self._packing)

    def after_dispatch(self, clock: int, step: int, state, dispatched: float) -> list:
        """No failure or recovery to report (`state`: the step's output, which reading waits
        for; `dispatched`: `time.perf_counter()` at its launch)."""
        del clock, step, state, dispatched
        return []

    def summary(self) -> dict:
        """What failures cost: nothing, as the fault controller would report it."""
        return {'events': [], 'lost_steps': 0, 'refresh_steps': [], 'compiles': 0,
                'refresh_sec': 0.0, 'measured_overhead_sec': 0.0,
                'checkpoint_block_sec': 0.0, 'relaunch_sec_modelled': 0.0, 'cluster_sec': None}
