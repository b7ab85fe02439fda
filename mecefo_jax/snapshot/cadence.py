"""How often to snapshot: as often as a budget on the training slowdown allows.

REFT (Wang et al., arXiv 2310.12670) snapshots as often as its saving cost
allows, because the work lost to a crash is about half an interval. A fixed
`snapshot.every` is either wasteful (a tiny model whose step is shorter than
its snapshot) or loses more than it must (a large model whose snapshot hides
behind its step). `AutoCadence` measures both and picks the smallest interval
`k` whose modelled cost stays within `budget_pct` of `k` steps:

    cost(k) = copy_sec + host_sec + max(0, write_sec - k * step_sec)

`copy_sec` is what the training loop blocks for (dispatching the
device-to-host copies), `write_sec` the background write: it is free while it
fits behind the next `k` steps, and back-pressure otherwise (one write in
flight at most). `host_sec` is the part of that write spent working (copying,
checksumming, publishing) rather than waiting for the step's output, charged
only where the step runs on the same CPU cores (`shares_cores`, the CPU
backend): there the write is not free even when it hides behind the steps.
On `configs/tiny.py` (12 ms steps on 2 cores) leaving it out chose every 24
steps and measured +3.7 % against a 2 % budget; with it, three crash drills
chose 39 to 66 steps and measured +2.3 / +4.9 / +3.6 % (the measurement's
quartiles span 3 to 9 points at that step length; on `configs/small.py`,
0.5 s steps, +0.3 to +1.0 %). After every topology change
it measures again: a failure changes the step time and the shards a process
holds.

Every process of a job must snapshot the same steps, or the keepers would
share no step to resume from: the caller agrees on the chosen interval
(process 0's) before using it.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable

# Steps after a topology change that are not measured: they include compiling.
SETTLE_STEPS = 2
# Steps measured (snapshotting each) before an interval is chosen.
PROBE_STEPS = 4
MAX_INTERVAL = 10_000


def choose_interval(step_sec: float, copy_sec: float, write_sec: float,
                    budget_pct: float, host_sec: float = 0.0) -> int:
    """The smallest interval whose modelled snapshot cost is within budget (see module doc)."""
    if step_sec <= 0:
        return 1
    budget = budget_pct / 100.0
    for k in range(1, MAX_INTERVAL + 1):
        if copy_sec + host_sec + max(0.0, write_sec - k * step_sec) <= budget * k * step_sec:
            return k
    return MAX_INTERVAL


class AutoCadence:
    """Decides, step by step, whether to snapshot (see the module docstring).

    After a topology change it lets `SETTLE_STEPS` pass, then snapshots each
    of `PROBE_STEPS` steps while the caller reports step times
    (`record_step`) and blocking copy times (`record_copy`); at a fixed count
    of steps after the change (the same step on every process, since every
    process sees the same topologies) it asks `flush` for the background
    writes' total time and count, chooses, and passes the choice through
    `agree` (process 0's choice, in a multi-process job).
    """

    def __init__(self, budget_pct: float, *, flush: Callable[[], tuple[float, int, float]],
                 agree: Callable[[int], int] = lambda k: k,
                 log: Callable[[str], None] | None = None, shares_cores: bool = False):
        if budget_pct <= 0:
            raise ValueError(f'snapshot.overhead_budget_pct={budget_pct}: use a percentage > 0, '
                             'e.g. --config.snapshot.overhead_budget_pct=2.')
        self.budget_pct = budget_pct
        self._flush, self._agree, self._log = flush, agree, log
        self.shares_cores = shares_cores
        self.history: list[dict] = []  # every choice made: step, interval, its inputs
        self._topology = None
        self._reset()

    def _reset(self) -> None:
        self.interval: int | None = None  # None while measuring
        self._seen = 0
        self._steps: list[float] = []
        self._copies: list[float] = []
        self._writes_before: tuple[float, int, float] | None = None

    @property
    def probing(self) -> bool:
        """Whether the steps now are measured (the caller then times them)."""
        return self.interval is None and self._seen > SETTLE_STEPS

    def due(self, step: int, topology) -> bool:
        """Whether the state entering `step` should be snapshotted."""
        if topology != self._topology:
            self._topology = topology
            self._reset()
        self._seen += 1
        if self.interval is None and self._seen == SETTLE_STEPS + 1:
            self._writes_before = self._flush()  # writes before probing are not measured
        if self.interval is None and self._seen > SETTLE_STEPS + PROBE_STEPS:
            self._choose(step)
        return self.interval is None or step % self.interval == 0

    def record_step(self, seconds: float) -> None:
        if self.probing:
            self._steps.append(seconds)

    def record_copy(self, seconds: float) -> None:
        if self.probing:
            self._copies.append(seconds)

    def _choose(self, step: int) -> None:
        total, count, waited = self._flush()
        before_total, before_count, before_waited = self._writes_before or (0.0, 0, 0.0)
        writes = count - before_count
        write = (total - before_total) / writes if writes > 0 else 0.0
        wait = (waited - before_waited) / writes if writes > 0 else 0.0
        figures = {'step_sec': statistics.median(self._steps) if self._steps else 0.0,
                   'copy_sec': statistics.median(self._copies) if self._copies else 0.0,
                   'write_sec': write,
                   'host_sec': max(0.0, write - wait) if self.shares_cores else 0.0}
        local = choose_interval(figures['step_sec'], figures['copy_sec'], figures['write_sec'],
                                self.budget_pct, figures['host_sec'])
        self.interval = int(self._agree(local))
        self.history.append({'step': step, 'interval': self.interval, **figures})
        if self._log is not None:
            self._log(f'snapshot.every=auto: every {self.interval} step(s) from step {step} '
                      f'(step {figures["step_sec"] * 1e3:.1f} ms, copy '
                      f'{figures["copy_sec"] * 1e3:.1f} ms, write '
                      f'{figures["write_sec"] * 1e3:.1f} ms of which '
                      f'{figures["host_sec"] * 1e3:.1f} ms charged as shared-core work, '
                      f'budget {self.budget_pct:g}%)')
