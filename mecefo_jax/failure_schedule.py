"""The failure schedule: which data-parallel replica is down during which step.

Pure Python (numpy only for the seeded RNG), so every host builds the same schedule with
no communication. Sources, first match wins: `fault.events` (``"step:replica:duration,..."``),
`fault.regime` (the paper's cluster-wide MTBF/MTTR for 32 GPUs, `REGIMES`), or
`fault.mtbf_hours` / `fault.mttr_hours`. Hours become steps at `fault.step_time_sec` (a
knob, not a measurement). Failures arrive as a Poisson process (arrival times rounded to
steps, so the mean gap stays unbiased) on a live replica, dropped when `max_concurrent`
are down (0: all but one); an outage lasts an exponential number of steps, at least one.
Explicit schedules may take every replica down: the controller then stops with a clear error.
"""

from __future__ import annotations

import bisect
import dataclasses
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

# name -> (mtbf_hours, mttr_hours), cluster-wide, from the MeCeFO paper.
REGIMES: dict[str, tuple[float, float]] = {
    'low': (2.0, 4.0),
    'mid': (1.0, 3.0),
    'high': (0.5, 2.0),
}

# Guards the arrival loop against configs that make it endless; real schedules are far below.
_MAX_ARRIVALS = 5_000_000

_EVENTS_FORMAT = '"step:replica:duration_steps,step:replica:duration_steps"'


@dataclasses.dataclass(frozen=True)
class FailureEvent:
    """Replica `replica` is down for steps `step .. step + duration_steps - 1`."""

    step: int
    replica: int
    duration_steps: int

    @property
    def recovery_step(self) -> int:
        """First step at which the replica is live again."""
        return self.step + self.duration_steps

    def __str__(self) -> str:
        # `fault.events` syntax: error messages and logs paste back into a config.
        return f'{self.step}:{self.replica}:{self.duration_steps}'


def format_events(events: Iterable[FailureEvent]) -> str:
    """Inverse of `parse_events`: lets a random schedule be logged and replayed."""
    return ','.join(str(e) for e in events)


def hours_to_steps(hours: float, step_time_sec: float) -> float:
    """Cluster hours -> training steps, at `step_time_sec` seconds per step."""
    return float(hours) * 3600.0 / float(step_time_sec)


def parse_events(text: str) -> list[FailureEvent]:
    """Parses `fault.events` syntax only; range checks live in `validate_events`."""
    if text is None or not str(text).strip():
        return []
    events = []
    for item in str(text).split(','):
        fields = item.strip().split(':')
        try:
            if len(fields) != 3:
                raise ValueError
            step, replica, duration = (int(f.strip()) for f in fields)
        except ValueError:
            raise ValueError(
                f"fault.events: malformed entry {item.strip()!r} in {text!r}; "
                f"expected comma-separated integer triples {_EVENTS_FORMAT} "
                f"(e.g. '100:1:50'), or '' for no failures.") from None
        events.append(FailureEvent(step, replica, duration))
    return events


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_events(events: Sequence[FailureEvent], num_replicas: int,
                  total_steps: int | None) -> None:
    """Shared by `validate_events` and `FailureSchedule` (which has no run length)."""
    if not _is_int(num_replicas) or num_replicas < 1:
        raise ValueError(f'num_replicas must be a positive int, got {num_replicas!r}.')
    for e in events:
        if not all(_is_int(v) for v in (e.step, e.replica, e.duration_steps)):
            raise ValueError(f'fault.events: event {e!r} has non-integer fields; step, '
                             f'replica and duration_steps must all be integers.')
        if not 0 <= e.replica < num_replicas:
            raise ValueError(f"fault.events: event '{e}' names replica {e.replica}, but there are "
                             f"{num_replicas} replicas; use a replica index in [0, {num_replicas - 1}].")
        if e.duration_steps < 1:
            raise ValueError(f"fault.events: event '{e}' has duration {e.duration_steps}; "
                             f"the outage length must be at least 1 step.")
        if e.step < 0:
            raise ValueError(f"fault.events: event '{e}' starts at step {e.step}; failure "
                             f"steps must be >= 0.")
        if total_steps is not None and e.step >= total_steps:
            raise ValueError(
                f"fault.events: event '{e}' starts at step {e.step}, but the run has only "
                f"{total_steps} steps (0..{total_steps - 1}); move it inside the run or drop it. "
                f"(Recovering after the end is fine.)")
    by_replica = sorted(events, key=lambda e: (e.replica, e.step))
    for prev, cur in zip(by_replica, by_replica[1:]):
        if cur.replica == prev.replica and cur.step < prev.recovery_step:
            raise ValueError(
                f"fault.events: replica {cur.replica} fails again at step {cur.step} ('{cur}') "
                f"while still down from '{prev}' (down until step {prev.recovery_step}); merge "
                f"the two events or start the second at step >= {prev.recovery_step}.")


def validate_events(events: Sequence[FailureEvent], *, num_replicas: int,
                    total_steps: int) -> None:
    """Raises ValueError naming `fault.events` if the schedule cannot be run (every replica
    down at once is valid: handling it is the controller's job)."""
    if not _is_int(total_steps) or total_steps < 0:
        raise ValueError(f'total_steps must be a non-negative int, got {total_steps!r}.')
    _check_events(events, num_replicas, total_steps)


def random_events(*, mtbf_steps: float, mttr_steps: float, num_replicas: int,
                  total_steps: int, seed: int,
                  max_concurrent: int) -> list[FailureEvent]:
    """The cluster-wide Poisson failure process (module docstring), sorted by (step, replica);
    a function of its arguments only, so every host derives the same schedule."""
    if not mtbf_steps > 0 or not mttr_steps > 0:
        raise ValueError(f'mtbf_steps and mttr_steps must be > 0, got {mtbf_steps!r} and '
                         f'{mttr_steps!r}; check fault.mtbf_hours / fault.mttr_hours / '
                         f'fault.step_time_sec.')
    if not _is_int(num_replicas) or num_replicas < 1:
        raise ValueError(f'num_replicas must be a positive int, got {num_replicas!r}.')
    if not _is_int(max_concurrent) or not 0 <= max_concurrent <= num_replicas:
        raise ValueError(f'fault.max_concurrent must be in [0, {num_replicas}] for {num_replicas} '
                         f'replicas, got {max_concurrent!r} (0 means num_replicas - 1).')
    expected_arrivals = total_steps / mtbf_steps
    if expected_arrivals > _MAX_ARRIVALS:
        raise ValueError(f'A mean failure gap of {mtbf_steps:.3g} steps over {total_steps} steps '
                         f'means ~{expected_arrivals:.3g} failure arrivals; lower '
                         f'fault.step_time_sec or raise fault.mtbf_hours.')
    cap = max_concurrent if max_concurrent > 0 else num_replicas - 1

    rng = np.random.default_rng(seed)
    # down_until[r] is the first step replica r is live again (0: never down).
    down_until = [0] * num_replicas
    events: list[FailureEvent] = []
    t = 0.0
    while True:
        t += rng.exponential(mtbf_steps)
        step = int(round(t))
        if step >= total_steps:
            break
        live = [r for r in range(num_replicas) if down_until[r] <= step]
        if num_replicas - len(live) >= cap:
            continue
        victim = live[int(rng.integers(len(live)))]
        duration = max(1, int(round(rng.exponential(mttr_steps))))
        down_until[victim] = step + duration
        events.append(FailureEvent(step, victim, duration))
    # Arrivals rounding onto one step come out in draw order.
    return sorted(events, key=lambda e: (e.step, e.replica))


def regime_scale(fault_cfg, num_replicas: int) -> float:
    """MTBF factor that keeps each replica's failure rate of a `regime_replicas` cluster: with
    32 (the paper's) the cluster MTBF grows by 32 / replicas, so the same fraction is down;
    0 applies the cluster-wide rate as it is, so each of fewer replicas fails more often."""
    size = fault_cfg.regime_replicas
    return size / num_replicas if size else 1.0


def configured_failures_per_hour(fault_cfg, num_replicas: int) -> float:
    """The cluster's failure rate the config states (`fault.regime` or `fault.mtbf_hours`),
    per hour of wall time; 0 where it states none (explicit `fault.events` are steps, not
    a rate). Snapshot cadence reads it (snapshot/cadence.py)."""
    regime = fault_cfg.regime.strip().lower()
    if regime in REGIMES:
        return 1.0 / (REGIMES[regime][0] * regime_scale(fault_cfg, num_replicas))
    return 1.0 / fault_cfg.mtbf_hours if fault_cfg.mtbf_hours > 0 else 0.0


def failures_requested(fault_cfg) -> bool:
    """Whether any failure field is set, so the run needs the fault controller; a field
    `events_from_config` rejects counts too, so a half-configured run fails, never runs
    fault-free."""
    return bool(fault_cfg.events.strip() or fault_cfg.regime.strip()
                or fault_cfg.mtbf_hours or fault_cfg.mttr_hours)


def events_from_config(fault_cfg, *, num_replicas: int, total_steps: int) -> list[FailureEvent]:
    """The run's failure events from the config's (resolved, so checked) `fault` section,
    sorted by (step, replica); checked against `num_replicas` here, where it is known."""
    text = fault_cfg.events.strip()
    regime = fault_cfg.regime.strip().lower()
    mtbf_hours, mttr_hours = fault_cfg.mtbf_hours, fault_cfg.mttr_hours

    if text:
        events = parse_events(text)
    else:
        if regime:
            mtbf_hours, mttr_hours = REGIMES[regime]
            mtbf_hours *= regime_scale(fault_cfg, num_replicas)
        if mtbf_hours == 0:
            return []
        step_time_sec = fault_cfg.step_time_sec
        events = random_events(mtbf_steps=hours_to_steps(mtbf_hours, step_time_sec),
                               mttr_steps=hours_to_steps(mttr_hours, step_time_sec),
                               num_replicas=num_replicas, total_steps=total_steps,
                               seed=fault_cfg.seed, max_concurrent=fault_cfg.max_concurrent)
    validate_events(events, num_replicas=num_replicas, total_steps=total_steps)
    return sorted(events, key=lambda e: (e.step, e.replica))


class FailureSchedule:
    """Per-step liveness of each replica, stored once per change and found by bisection.

    A replica whose next outage starts at its recovery step stays down: no spurious
    recover-and-fail transition.
    """

    def __init__(self, events: Iterable[FailureEvent], num_replicas: int):
        events = sorted(events, key=lambda e: (e.step, e.replica))
        # No run length here: events_from_config checks the upper bound.
        _check_events(events, num_replicas, None)
        self.events: tuple[FailureEvent, ...] = tuple(events)
        self.num_replicas = num_replicas

        delta: dict[int, list[int]] = {}
        for e in events:
            delta.setdefault(e.step, [0] * num_replicas)[e.replica] += 1
            delta.setdefault(e.recovery_step, [0] * num_replicas)[e.replica] -= 1
        down = [0] * num_replicas
        mask = (True,) * num_replicas
        self._steps: list[int] = []
        self._masks: list[tuple[bool, ...]] = []
        for step in sorted(delta):
            down = [d + x for d, x in zip(down, delta[step])]
            new_mask = tuple(d == 0 for d in down)
            if new_mask != mask:
                self._steps.append(step)
                self._masks.append(new_mask)
                mask = new_mask

    def live_mask(self, step: int) -> tuple[bool, ...]:
        """Which replicas are up during `step` (all of them before any event)."""
        i = bisect.bisect_right(self._steps, step) - 1
        return self._masks[i] if i >= 0 else (True,) * self.num_replicas

    def __repr__(self) -> str:
        return (f'FailureSchedule(num_replicas={self.num_replicas}, '
                f'events={format_events(self.events)!r})')
