"""How often to snapshot: what costs least in expectation, within a budget on the slowdown.

REFT (Wang et al., arXiv 2310.12670) snapshots as often as its saving cost
allows, because the work lost to a crash is about half an interval. A fixed
`snapshot.every` is either wasteful (a tiny model whose step is shorter than
its snapshot) or loses more than it must (a large model whose snapshot hides
behind its step). `AutoCadence` measures both. With `k` steps between
snapshots, a snapshot's modelled cost is

    cost(k) = snapshot_sec + max(0, write_sec - k * step_sec)

and the interval (`choose_interval`) is the smallest `k` whose cost stays
within `budget_pct` of `k` steps, shortened where failures make a shorter one
cheaper in expectation: per second of training, the snapshots cost
`cost(k) / (k * step_sec)` and failures cost `failures_per_sec * (k *
step_sec / 2 + recovery)`, half an interval redone plus the recovery. The
`k` that minimises their sum is Young and Daly's optimum (Young 1974, Daly
2006: about `sqrt(2 * cost / failures_per_sec)` seconds); the recovery term
is the same at every `k`, so it does not move the choice. The failure rate
is the one the config states (`fault.regime` or `fault.mtbf_hours`), else
the one the launcher observed so far, else none (the budget alone). Last, the
interval is never longer than the disk checkpoint's (`max_interval`). The two
need not fall on the same steps; a recovery restores whichever tier holds the
newer step (the launcher's `recovery_plan`).

`step_sec` is the plain step, timed as training runs it (dispatched ahead,
synchronised only at the end of a `WINDOW`-step window). `snapshot_sec` is
what one snapshot adds to such a window: the median, over `PAIRS` pairs of
windows (one plain, one snapshotting its first step), of their difference.
Where the background write shares the step's CPU cores (`shares_cores`, the
CPU backend), every CPU-second of the snapshot is a second of step lost, so
its own time is a floor under that figure: the training loop's blocked time
(dispatching the copies, handing them over) plus the write's work (copying
and checksumming, not waiting for the step's output). `write_sec` is the
background write: it is free while it fits behind the next `k` steps, and
back-pressure otherwise (one write in flight at most). A window ends at its
last step's output, before the write's tail, which the caller awaits between
windows, untimed. Waiting for it inside the window, and taking the tail back
out, hid the snapshot's real cost on an H200: the next step donates the
state that the device-to-host copy reads, so it waits for that copy (about
77 ms of an 84 ms copy behind 36 ms steps), and that wait lay inside a
417 ms write. The probe read about 10 ms, chose every 15 steps, and those
cost +14 % against a 2 % budget (docs/gpu.md).

On `configs/tiny.py` (8 to 9 ms steps on 2 cores, 0.4 MiB snapshots) the
window pairs alone are too noisy: three crash drills read 1.7 to 8.8 ms for
a snapshot whose measured cost is about 12 ms, chose intervals of 8 to 47,
and measured +3.8 to +13.5 % against a 2 % budget. Timing the step on its
own (synchronised, every step snapshotted) overstated it instead (12 to
16 ms). After every topology change it measures again: a failure changes
the step time and the shards a process holds.

Every process of a job must snapshot the same steps, or the keepers would
share no step to resume from: the caller agrees on the chosen interval
(process 0's) before using it.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable

# Steps after a topology change that are not measured: they include compiling.
# Each is snapshotted, so the state right after a change is held at once.
SETTLE_STEPS = 2
# Steps per measured window, and (plain, snapshotting) window pairs measured.
WINDOW = 4
PAIRS = 5
# Steps measured before an interval is chosen.
PROBE_STEPS = 2 * PAIRS * WINDOW
MAX_INTERVAL = 10_000


def snapshot_cost(k: int, step_sec: float, snapshot_sec: float, write_sec: float) -> float:
    """Seconds one snapshot costs at `k` steps apart: its own time plus the write's back-pressure."""
    return snapshot_sec + max(0.0, write_sec - k * step_sec)


def expected_waste(k: int, step_sec: float, snapshot_sec: float, write_sec: float,
                   failures_per_sec: float) -> float:
    """Seconds lost per second of training at `k` steps apart: snapshots, and failures
    redoing half an interval (their recovery costs the same at every `k`: left out)."""
    period = k * step_sec
    return (snapshot_cost(k, step_sec, snapshot_sec, write_sec) / period
            + failures_per_sec * period / 2)


def choose_interval(step_sec: float, snapshot_sec: float, write_sec: float,
                    budget_pct: float, *, failures_per_sec: float = 0.0,
                    max_interval: int = MAX_INTERVAL) -> int:
    """The interval in steps: the smallest within budget, shortened to the Young/Daly
    optimum where failures make that cheaper, at most `max_interval` (module docstring)."""
    if step_sec <= 0:
        return 1
    budget = budget_pct / 100.0
    within = next((k for k in range(1, MAX_INTERVAL + 1)
                   if snapshot_cost(k, step_sec, snapshot_sec, write_sec)
                   <= budget * k * step_sec), MAX_INTERVAL)
    chosen = within
    if failures_per_sec > 0:
        chosen = min(range(1, within + 1), key=lambda k: expected_waste(
            k, step_sec, snapshot_sec, write_sec, failures_per_sec))
    return max(1, min(chosen, max_interval))


class AutoCadence:
    """Decides, step by step, whether to snapshot (see the module docstring).

    After a topology change it lets `SETTLE_STEPS` pass (each snapshotted),
    then runs `PAIRS` pairs of `WINDOW`-step windows, plain then snapshotting
    its first step. The caller asks `due` before each step's snapshot; when
    `window_ends` is then true, it synchronises (the step's output and any
    write in flight) and reports the seconds since the previous window ended
    (`record_window`). At a fixed count of steps after the change (the same
    step on every process, since every process sees the same topologies) it
    asks `flush` for the background writes' total time and count, chooses,
    and passes the choice through `agree` (process 0's, in a multi-process job).
    """

    def __init__(self, budget_pct: float, *, flush: Callable[[], tuple[float, int, float]],
                 agree: Callable[[int], int] = lambda k: k,
                 log: Callable[[str], None] | None = None, shares_cores: bool = False,
                 failures_per_sec: float = 0.0, max_interval: int = MAX_INTERVAL):
        if budget_pct <= 0:
            raise ValueError(f'snapshot.overhead_budget_pct={budget_pct}: use a percentage > 0, '
                             'e.g. --config.snapshot.overhead_budget_pct=2.')
        self.budget_pct = budget_pct
        self._flush, self._agree, self._log = flush, agree, log
        self.shares_cores = shares_cores
        self.failures_per_sec, self.max_interval = failures_per_sec, max(1, max_interval)
        self.history: list[dict] = []  # every choice made: step, interval, its inputs
        self._topology = None
        self._reset()

    def _reset(self) -> None:
        self.interval: int | None = None  # None while measuring
        self._seen = 0
        self._windows: list[float] = []  # plain, snapshotting, plain, ...
        self._blocked: list[float] = []  # the loop's time per measured snapshot
        self._writes_before: tuple[float, int, float] = (0.0, 0, 0.0)

    @property
    def _probe_index(self) -> int:
        """The last step's place in the probe: < 0 while settling."""
        return self._seen - SETTLE_STEPS - 1

    @property
    def probing(self) -> bool:
        """Whether the steps now are measured."""
        return self.interval is None and self._probe_index >= 0

    @property
    def window_ends(self) -> bool:
        """Whether the step just asked about ends settling or a measured window."""
        j = self._probe_index
        return self.interval is None and (j == -1 or (j >= 0 and j % WINDOW == WINDOW - 1))

    def due(self, step: int, topology) -> bool:
        """Whether the state entering `step` should be snapshotted."""
        if topology != self._topology:
            self._topology = topology
            self._reset()
        self._seen += 1
        if self.interval is None and self._probe_index == PROBE_STEPS:
            self._choose(step)
        if self.interval is not None:
            return step % self.interval == 0
        j = self._probe_index
        return j < 0 or (j // WINDOW % 2 == 1 and j % WINDOW == 0)

    def record_blocked(self, seconds: float) -> None:
        """Seconds the training loop spent on a snapshot it took while probing."""
        if self.probing:
            self._blocked.append(seconds)

    def record_window(self, seconds: float) -> None:
        """Seconds since the previous window ended (ignored at the end of settling)."""
        if self._probe_index == -1:
            self._writes_before = self._flush()  # writes while settling are not measured
        elif self.window_ends:
            self._windows.append(seconds)

    def _choose(self, step: int) -> None:
        total, count, waited = (now - before for now, before in
                                zip(self._flush(), self._writes_before))
        write = total / count if count > 0 else 0.0
        plain, snapshotting = self._windows[0::2], self._windows[1::2]
        step_sec = statistics.median(plain) / WINDOW if plain else 0.0
        # Windows leave the write's tail out (the caller awaits it between windows): what a
        # snapshotting window adds is the snapshot's cost to the steps alone.
        measured = max(0.0, statistics.median(b - a for a, b in zip(plain, snapshotting))
                        if plain else 0.0)
        floor = 0.0
        if self.shares_cores and self._blocked:
            floor = statistics.median(self._blocked) + max(0.0, total - waited) / max(count, 1)
        figures = {'step_sec': step_sec, 'write_sec': write, 'measured_sec': measured,
                   'floor_sec': floor, 'snapshot_sec': max(measured, floor)}
        figures.update(failures_per_sec=self.failures_per_sec, max_interval=self.max_interval)
        local = choose_interval(figures['step_sec'], figures['snapshot_sec'],
                                figures['write_sec'], self.budget_pct,
                                failures_per_sec=self.failures_per_sec,
                                max_interval=self.max_interval)
        self.interval = int(self._agree(local))
        self.history.append({'step': step, 'interval': self.interval, **figures})
        if self._log is not None:
            self._log(f'snapshot.every=auto: every {self.interval} step(s) from step {step} '
                      f'(step {figures["step_sec"] * 1e3:.1f} ms, a snapshot adds '
                      f'{figures["measured_sec"] * 1e3:.1f} ms, costs at least '
                      f'{figures["floor_sec"] * 1e3:.1f} ms of shared cores, its write takes '
                      f'{figures["write_sec"] * 1e3:.1f} ms, budget {self.budget_pct:g}%, '
                      f'{self.failures_per_sec * 3600:.3g} failures/h'
                      + (f", at most the disk checkpoint's {self.max_interval}"
                         if self.max_interval < MAX_INTERVAL else '') + ')')
