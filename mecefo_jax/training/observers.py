"""Observers: what measures a training run, kept apart from what trains it.

`training.loop.train(observers=...)` calls every observer at four points: `on_plan`
before a step is dispatched (the state entering it, where it runs, its global
batch), `on_step` after it is dispatched (its output state and metrics, not
waited for), `on_event` when the controller reports a failure or recovery
with what handling it cost, and `summary` at the end. Observers measure;
they never change what is trained: the loop hands them arrays they may read
(reading waits for the device, which changes timing, never values) and
ignores anything they return except their summary figures. One thing they
may decide is when a run has measured enough: after every step the loop asks
`stop_requested`, and stops as `stop_at` would (an experiment that trains
until the model reaches a target loss), never changing what a step computes.

Measurement lives here, not in the controllers, so that one run can carry
any mix of timing, accounting, probes and launcher hooks without a
controller subclass per combination.
"""
import dataclasses

import numpy as np


@dataclasses.dataclass
class PlannedStep:
    """What observers are told before a step is dispatched (`Observer.on_plan`).

    `state` is the state entering step `step` (after the controller moved,
    restored or refreshed it), `plan` where the step runs (`plan.data_state`
    is set when the controller rolled training back), `tokens_nbt` the global
    batch it trains on; `clock` counts executed steps, redone ones included.
    """
    clock: int
    step: int
    state: object
    plan: object  # a training.controller.Plan: topology, layout, live mask, data_state
    tokens_nbt: np.ndarray


@dataclasses.dataclass
class StepDone:
    """What observers are told after each step is dispatched (`Observer.on_step`).

    `state` is the step's output (not yet computed: reading it waits), the
    state the checkpoint of step `step + 1` would hold; `data_position` the
    data iterator's position after this step's batch, which belongs with it;
    `tokens_nbt` the global batch and `plan` where its shards were computed;
    `metrics` the step's metric arrays (`loss.is_ready()` tells, without
    waiting, whether the step has finished: its state may be donated by then).
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

    def stop_requested(self) -> bool:
        """Whether the run may end after the step just done (asked after its `on_step`)."""
        return False

    def summary(self, report: dict) -> dict:
        """Figures to add to `train`'s summary.

        `report` is what the loop, the controller and the observers before
        this one reported (read it, do not change it).
        """
        return {}


class TokenCount(Observer):
    """Useful tokens: the examples each step's layout computed, times `seq_len`.

    A step redone after a rollback counts once (its last execution), so
    `useful_tokens` is what the finished model was trained on; examples a
    strategy dropped are not counted.
    """

    def __init__(self, seq_len: int):
        self.seq_len = seq_len
        self.step_tokens: dict[int, float] = {}

    def on_step(self, done) -> None:
        self.step_tokens[done.step] = float(done.layout.examples() * self.seq_len)

    def summary(self, report: dict) -> dict:
        return {'useful_tokens': sum(self.step_tokens.values())}
