"""Observers: what measures a training run, kept apart from what trains it.

Observers never change what is trained: they may read arrays (which changes timing, never
values) and decide when a run has measured enough (`stop_requested`). So one run carries
any mix of timing, accounting, probes and launcher hooks without a controller subclass
per combination.
"""
import dataclasses

import numpy as np


@dataclasses.dataclass
class PlannedStep:
    """Before a step is dispatched (`Observer.on_plan`): the state entering `step`, where it
    runs, its global batch; `clock` counts executed steps."""
    clock: int
    step: int
    state: object
    plan: object  # a training.controller.Plan: topology, layout, live mask, data_state
    tokens_nbt: np.ndarray


@dataclasses.dataclass
class StepDone:
    """After a step is dispatched (`Observer.on_step`): its output `state` (reading it waits),
    what a checkpoint of `step + 1` would hold with `data_position`; `metrics` its arrays
    (`loss.is_ready()` tells without waiting whether it finished and its state may be donated).
    """
    clock: int
    step: int
    state: object
    plan: object  # a training.controller.Plan: topology, layout, live mask, data_state
    tokens_nbt: np.ndarray | None
    data_position: dict
    metrics: dict
    dispatched: float  # time.perf_counter() when the step was launched
    compile_sec: float = 0.0  # compiling this step's program in the loop (0: cached)

    @property
    def layout(self):
        return self.plan.layout

    @property
    def live(self) -> tuple[bool, ...]:
        return self.plan.live

    @property
    def loss(self):
        return self.metrics['loss']


class Observer:
    """The hooks `train` calls; each is optional (these defaults do nothing)."""

    def on_plan(self, planned) -> None:
        """A `PlannedStep`: the step about to be dispatched."""

    def on_step(self, done) -> None:
        """A `StepDone`: the step just dispatched (reading its arrays waits)."""

    def on_event(self, event) -> None:
        """A `faults.controller.Event`, once its first step has been timed."""

    def step_scalars(self) -> dict:
        """Figures of the step just done for TensorBoard alone, asked after its `on_step`
        (a snapshot's seconds, say); tags by `summaries.tag`."""
        return {}

    def stop_requested(self) -> bool:
        """Whether the run may end after the step just done (asked after its `on_step`)."""
        return False

    def summary(self, report: dict) -> dict:
        """Figures to add to `train`'s summary; `report` (read-only) holds what the loop, the
        controller and the observers before this one reported."""
        return {}


class TokenCount(Observer):
    """Useful tokens: the examples each step's layout computed, times `seq_len`; a step redone
    after a rollback counts once, so it is what the finished model was trained on."""

    def __init__(self, seq_len: int):
        self.seq_len = seq_len
        self.step_tokens: dict[int, float] = {}

    def on_step(self, done) -> None:
        self.step_tokens[done.step] = float(done.layout.examples() * self.seq_len)

    def summary(self, report: dict) -> dict:
        return {'useful_tokens': sum(self.step_tokens.values())}
