"""Failures in wall-clock time: one trace in cluster seconds, met by each run at its own pace.

Counted in steps, a strategy whose step is c times slower would be charged c times an
outage's seconds. Under `fault.time_model='wall_clock'` each executed step advances the
run's clock by `fault.step_time_sec` times its layout's step ratio: the slowest program's
analytic cost over a normal one's (`planner.config_planner`), diluted by the exposed
share φ of the gradient all-reduce (`fault.allreduce_exposed`): c_eff = 1 + (c - 1)(1 - φ).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

from mecefo_jax.faults.planner import config_planner, program_cost
from mecefo_jax.neighbour.layout import ROLE_NORMAL, Program


def diluted(ratio: float, exposed: float) -> float:
    """A compute ratio c as a whole step's, when a share `exposed` of the step is all-reduce."""
    if not 0.0 <= exposed < 1.0:
        raise ValueError(f'fault.allreduce_exposed={exposed!r} must be in [0, 1).')
    return 1.0 + (ratio - 1.0) * (1.0 - exposed)


def layout_step_ratio(cfg, num_replicas: int) -> Callable[[Sequence[Program]], float]:
    """fn(programs) -> the step's duration in fault-free steps (see module docstring)."""
    shard = cfg.data.global_batch_size // num_replicas
    cost = config_planner(cfg, shard).cost
    return slowest_program_ratio(cost, float(cost(ROLE_NORMAL, shard)), cfg.fault.allreduce_exposed)


def slowest_program_ratio(cost, normal: float, exposed: float) -> Callable[[Sequence[Program]], float]:
    """fn(programs) -> its slowest program's `cost` over `normal`, diluted by `exposed`; each
    distinct set of programs priced once (a run meets few, and replays ask for each many times)."""
    @functools.cache
    def of_programs(programs: tuple[Program, ...]) -> float:
        return diluted(max(program_cost(cost, p) for p in programs) / normal, exposed)
    return lambda programs: of_programs(tuple(programs))


class WallClock:
    """A run's cluster seconds, read against the schedule at `floor(seconds / step_time_sec)`.

    It starts at the first executed step times `step_time_sec`: exact for a run resuming
    before its first failure (the time-to-target forks), as every earlier step is fault-free.
    """

    def __init__(self, step_time_sec: float, ratio: Callable[[Sequence[Program]], float]):
        self.step_time_sec, self._ratio = step_time_sec, ratio
        self.seconds: float | None = None

    def schedule_step(self, clock: int) -> int:
        """The schedule's step index now; `clock` (executed steps) starts the clock."""
        if self.seconds is None:
            self.seconds = clock * self.step_time_sec
        # A hair of slack: sums of step times land on outage boundaries up to round-off.
        return math.floor(self.seconds / self.step_time_sec + 1e-9)

    def advance(self, programs: Sequence[Program]) -> float:
        """After a step of `programs`: its seconds, added to the clock."""
        seconds = self.step_time_sec * self._ratio(programs)
        self.seconds = (self.seconds or 0.0) + seconds
        return seconds
