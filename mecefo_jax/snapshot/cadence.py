"""How often to snapshot: what costs least in expectation, within a budget on the slowdown.

REFT (Wang et al., arXiv 2310.12670) snapshots as often as saving allows, since a crash
loses about half an interval. A fixed `snapshot.every` wastes time (a step shorter than
its snapshot) or loses more than it must (a snapshot that hides behind its step), so
`AutoCadence` measures both. A snapshot every `k` steps costs

    cost(k) = snapshot_sec + max(0, write_sec - k * step_sec)

and `choose_interval` takes the smallest `k` within `budget_pct` of `k` steps, shortened
where failures make a shorter one cheaper (Young 1974, Daly 2006: snapshots cost
`cost(k) / (k * step_sec)` a second, failures `failures_per_sec * k * step_sec / 2`), and
never longer than the disk checkpoint's (`max_interval`).

`step_sec` is a plain step as training runs it, synchronised at the end of a
`WINDOW`-step window; `snapshot_sec` the median difference over `PAIRS` pairs of windows
(plain, then snapshotting its first step). A window ends at its last step's output,
before the write's tail: waiting for the tail hid the snapshot's cost on a GPU, where the
next step waits for the copy of the state it donates (docs/gpu.md). Where the write
shares the step's CPU cores (`shares_cores`), its CPU time plus the loop's blocked time
is a floor under that figure: window pairs alone are too noisy on a tiny model
(docs/crash_drill.md). Every process must snapshot the same steps, or the keepers would
share no step to resume from: the caller agrees on process 0's interval.
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
    """Decides, step by step, whether to snapshot. After a topology change: `SETTLE_STEPS`
    (each snapshotted), then `PAIRS` pairs of `WINDOW`-step windows. The caller asks `due`
    before each step and, when `window_ends`, synchronises and reports the window's seconds
    (`record_window`). At the same step on every process it reads the writes' time from
    `flush`, chooses, and passes the choice through `agree` (process 0's)."""

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
