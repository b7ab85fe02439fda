"""`mecefo_planned`: where each failed shard goes so that no step waits for a neighbour.

Why, with measured costs: docs/failures.md, "The `mecefo_planned` planner". Every live
replica keeps its shard; *helpers* also take orphaned rows, all in one role: *neighbour*
(every row in neighbour mode) or *mixed* (only the adopted rows; more memory than a
normal device, so weighed only without a memory bound `max_rows`). Among plans computing
every orphaned row once, lexicographically: (1) the smallest slowest cost max(1, helper /
normal), plans within one step tying; (2) the fewest neighbour-mode rows; (3) the fewest
helpers; (4) the shortest ring transport; (5) the smallest helper program; only plans
within `fault.max_neighbour_rows` count where any is. (1) to (3) are closed-form
(`budget`); (4) is an exact dynamic programme over the ring cut at every edge, or above
`EXACT_STATES` a greedy nearest-first fill keeping (1) to (3) exact. Pure numpy.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from mecefo_jax.faults import costs as costs_lib
from mecefo_jax.neighbour.layout import ROLE_MIXED, ROLE_NEIGHBOUR, ROLE_NORMAL, Layout, Piece, Program

# cost(role, rows) in any unit; rows an int or an int array (then an array of costs).
Cost = Callable[[int, 'int | np.ndarray'], 'float | np.ndarray']
EXACT_STATES = 4_000_000  # cuts x flow values x helper counts x replicas
_TOL = 1e-9

# A neighbour-mode shard over a normal one: XLA's FLOP ratio at 350M, seq 256, rank 128
# (`mecefo_per_batch` of scripts/bench_step.py; docs/usage.md, "What the step costs").
DEFAULT_NEIGHBOUR_RATIO = 0.649


def linear_cost(neighbour_ratio: float = DEFAULT_NEIGHBOUR_RATIO) -> Cost:
    """cost(role, rows): 1 per exact row, `neighbour_ratio` per neighbour-mode row."""
    def cost(role: int, rows):
        out = np.asarray(rows, float) * (neighbour_ratio if role == ROLE_NEIGHBOUR else 1.0)
        return float(out) if out.ndim == 0 else out
    return cost


class PlanError(ValueError):
    """No placement computes every orphaned row within the memory bound."""


@dataclasses.dataclass(frozen=True)
class Budget:
    """The best plan: `helpers` replicas in `role` take at most `max_extra` orphaned rows
    each; the busiest device costs `slowest_cost` normal steps (1.0: within one step)."""
    helpers: int
    max_extra: int
    slowest_cost: float
    orphaned_rows: int
    shard: int
    role: int = ROLE_NEIGHBOUR

    @property
    def neighbour_rows(self) -> int:
        if not self.helpers:
            return 0
        own = self.helpers * self.shard if self.role == ROLE_NEIGHBOUR else 0
        return own + self.orphaned_rows


def program_cost(cost: Cost, program: Program) -> float:
    """What `program` costs: its exact rows exactly, the rest in neighbour mode."""
    exact, approx = program.exact_rows, program.rows - program.exact_rows
    return ((float(cost(ROLE_NORMAL, exact)) if exact else 0.0)
            + (float(cost(ROLE_NEIGHBOUR, approx)) if approx else 0.0))


def budget(num_live: int, num_failed: int, shard: int, cost: Cost,
           max_rows: int | None = None, max_neighbour_rows: int | None = None) -> Budget:
    """Objectives (1) to (3) in closed form: the helpers' role, how many, how many rows each.

    A busiest helper taking `e` extra rows needs ceil(orphaned / e) helpers; every `e` from
    ceil(orphaned / live) to the memory bound is weighed in each role, and plans over the
    `max_neighbour_rows` cap are set aside unless every plan is over it.
    """
    if num_live < 1:
        raise PlanError('every replica is down: nothing can take a failed shard.')
    orphaned = num_failed * shard
    if orphaned == 0:
        return Budget(0, 0, 1.0, 0, shard)
    normal = float(cost(ROLE_NORMAL, shard))
    top = orphaned if max_rows is None else min(orphaned, max_rows - shard)
    least = -(-orphaned // num_live)  # every live replica helps
    if top < least:
        raise PlanError(
            f'{orphaned} orphaned rows do not fit on {num_live} live replicas with at most '
            f'{max_rows} rows per neighbour (the memory bound); allow more rows per neighbour '
            f'or use fault.strategy=drop.')
    extra = np.arange(least, top + 1)
    helpers = -(-orphaned // extra)
    approx = np.asarray(cost(ROLE_NEIGHBOUR, shard + extra), float) / normal
    plans = [(np.full(extra.size, ROLE_NEIGHBOUR), approx, helpers * shard + orphaned)]
    if max_rows is None:  # a mixed helper holds more than a normal device (see module)
        mixed = 1.0 + np.asarray(cost(ROLE_NEIGHBOUR, extra), float) / normal
        plans.append((np.full(extra.size, ROLE_MIXED), mixed, np.full(extra.size, orphaned)))
    role, slow, rows = (np.concatenate(x) for x in zip(*plans))
    extra, helpers = np.tile(extra, len(plans)), np.tile(helpers, len(plans))
    slow = np.maximum(1.0, slow)
    keep = np.ones(slow.size, bool)
    if max_neighbour_rows:
        keep = rows <= max_neighbour_rows
        keep = keep if keep.any() else rows == rows.min()
    keep &= slow <= slow[keep].min() + _TOL
    keep &= rows == rows[keep].min()
    keep &= helpers == helpers[keep].min()
    best = int(np.flatnonzero(keep)[np.argmax(extra[keep])])  # (5) then picks the smallest
    return Budget(int(helpers[best]), int(extra[best]), float(slow[best]), orphaned, shard,
                  int(role[best]))


def _ring_dp(live: np.ndarray, shard: int, helpers: int, cap: int):
    """Exact (4): min transport with exactly `helpers` helpers of 1..cap rows each; (distance,
    pieces). The ring is cut at every edge at once (axis 0: cut k starts the line at replica
    k); the state is (carried rows, helpers opened)."""
    n = live.size
    total = int(np.count_nonzero(~live)) * shard
    width = 2 * total + 1
    dp = np.full((n, width, helpers + 1), np.inf)
    dp[:, total, 0] = 0.0
    carried = np.abs(np.arange(width) - total)[None, :, None].astype(float)
    choice = np.zeros((n, n, width, helpers + 1), np.int32)
    cuts = np.arange(n)
    for t in range(n):
        pos = (cuts + t) % n
        moved = np.full_like(dp, np.inf)
        moved[:, shard:] = dp[:, :width - shard]  # a failed replica adds its shard
        took = dp.copy()
        pick = np.zeros(dp.shape, np.int32)
        for x in range(1, cap + 1):  # a helper takes x rows: carried - x, opened + 1
            cand = np.full_like(dp, np.inf)
            cand[:, :width - x, 1:] = dp[:, x:, :-1]
            better = cand < took
            took = np.where(better, cand, took)
            pick = np.where(better, x, pick)
        failed = ~live[pos][:, None, None]
        dp = np.where(failed, moved, took)
        choice[t] = np.where(failed, 0, pick)
        if t < n - 1:
            dp = dp + carried
    cut = int(np.argmin(dp[:, total, helpers]))
    distance = dp[cut, total, helpers]
    if not np.isfinite(distance):
        return math.inf, None
    extra = np.zeros(n, np.int64)
    q, u = total, helpers
    for t in range(n - 1, -1, -1):
        pos = (cut + t) % n
        if not live[pos]:
            q -= shard
        elif choice[t, cut, q, u]:
            x = int(choice[t, cut, q, u])
            extra[pos] = x
            q, u = q + x, u - 1
    return float(distance), _matching(live, shard, extra, cut)


def _matching(live: np.ndarray, shard: int, extra: np.ndarray, cut: int):
    """Orphaned rows to helpers in line order from `cut`: the i-th orphaned row
    goes to the i-th free helper slot (monotone, so the line's transport)."""
    n = live.size
    order = [(cut + t) % n for t in range(n)]
    rows = [(r, i) for r in order if not live[r] for i in range(shard)]
    slots = [h for h in order if live[h] for _ in range(int(extra[h]))]
    return _pieces(zip(rows, slots), live)


def _pieces(assignment, live: np.ndarray) -> dict[int, list[Piece]]:
    """{helper: pieces} from (failed replica, row) -> helper pairs, merging runs."""
    out: dict[int, list[Piece]] = {int(r): [] for r in np.flatnonzero(live)}
    for (shard_id, row), helper in assignment:
        pieces = out[helper]
        last = pieces[-1] if pieces else None
        if last is not None and last.shard == shard_id and last.stop == row:
            pieces[-1] = Piece(shard_id, last.start, row + 1)
        else:
            pieces.append(Piece(int(shard_id), row, row + 1))
    for helper in out:
        out[helper].sort(key=lambda p: (p.shard, p.start))
    return out


def ring_distance(a: int, b: int, n: int) -> int:
    return min((a - b) % n, (b - a) % n)


def _greedy(live: np.ndarray, shard: int, helpers: int, cap: int) -> dict[int, list[Piece]]:
    """Nearest-first fill for large rings: exactly (1) to (3), (4) approximately."""
    n = live.size
    free: dict[int, int] = {}
    assignment = []
    for failed in np.flatnonzero(~live):
        row = 0
        candidates = sorted(np.flatnonzero(live), key=lambda h: (ring_distance(failed, h, n),
                                                                 (h - failed) % n))
        for h in candidates:
            if row == shard:
                break
            h = int(h)
            if h not in free:
                if len(free) == helpers:
                    continue
                free[h] = cap
            take = min(free[h], shard - row)
            assignment += [((int(failed), row + i), h) for i in range(take)]
            free[h] -= take
            row += take
    return _pieces(assignment, live)


def place(live_mask, shard: int, plan: Budget) -> dict[int, list[Piece]]:
    """{live replica: adopted pieces} meeting `plan`, transport minimal (see module)."""
    live = np.asarray(live_mask, bool)
    if plan.helpers == 0:
        return {int(r): [] for r in np.flatnonzero(live)}
    states = live.size ** 2 * (2 * plan.orphaned_rows + 1) * (plan.helpers + 1)
    least = -(-plan.orphaned_rows // plan.helpers)  # <= max_extra, by `budget`
    if states > EXACT_STATES:
        return _greedy(live, shard, plan.helpers, least)
    best, pieces = _ring_dp(live, shard, plan.helpers, plan.max_extra)
    for cap in range(least, plan.max_extra):  # (5): the smallest cap that keeps (4)
        distance, smaller = _ring_dp(live, shard, plan.helpers, cap)
        if distance <= best + _TOL:
            return smaller
    return pieces


def plan_layout(live_mask, shard: int, cost: Cost, max_rows: int | None = None,
                max_neighbour_rows: int | None = None) -> Layout:
    """The `mecefo_planned` layout for `live_mask` (see module docstring)."""
    live = np.asarray(live_mask, bool)
    plan = budget(int(live.sum()), int((~live).sum()), shard, cost, max_rows,
                  max_neighbour_rows)
    adopted = place(live, shard, plan)
    replicas = tuple(int(r) for r in np.flatnonzero(live))
    return Layout(replicas=replicas,
                  roles=tuple(plan.role if adopted[r] else ROLE_NORMAL for r in replicas),
                  pieces=tuple((Piece(r, 0, shard),) + tuple(adopted[r]) for r in replicas))


class Planner:
    """`plan_layout` and `budget` for one shard size and cost, cached: the simulator and the
    controller ask for the same few live sets again and again."""

    def __init__(self, shard: int, cost: Cost | None = None, max_rows: int | None = None,
                 max_neighbour_rows: int | None = None):
        if shard < 1:
            raise ValueError(f'shard={shard!r} must be >= 1 sequence.')
        if max_rows is not None and max_rows < shard:
            raise ValueError(f'max_rows={max_rows!r} must hold at least one shard ({shard}).')
        if max_neighbour_rows is not None and max_neighbour_rows < 0:
            raise ValueError(f'fault.max_neighbour_rows={max_neighbour_rows!r} must be >= 0 '
                             '(0: no cap).')
        self.shard, self.max_rows = shard, max_rows
        self.max_neighbour_rows = max_neighbour_rows or None
        self.cost = cost or linear_cost()
        self._layouts: dict[tuple, Layout] = {}
        self._budgets: dict[tuple, Budget] = {}

    def layout(self, live_mask) -> Layout:
        key = tuple(bool(x) for x in live_mask)
        if key not in self._layouts:
            self._layouts[key] = plan_layout(key, self.shard, self.cost, self.max_rows,
                                             self.max_neighbour_rows)
        return self._layouts[key]

    def budget(self, num_live: int, num_failed: int) -> Budget:
        key = (num_live, num_failed)
        if key not in self._budgets:
            self._budgets[key] = budget(num_live, num_failed, self.shard, self.cost,
                                        self.max_rows, self.max_neighbour_rows)
        return self._budgets[key]


def attention_share(mecefo, num_layers: int) -> float:
    """The share of blocks whose attention backward a neighbour computes (`mecefo` section)."""
    return 1.0 if not mecefo.skip_attention else mecefo.attention_top_blocks / num_layers


def config_planner(cfg, shard: int) -> Planner:
    """A training run's planner: the analytic FLOP costs of its model and FFN gradient rule,
    not timed, so every host computes the same layout from the config alone."""
    from mecefo_jax.neighbour.projections import resolve_rank  # jax: only for a training run
    rank = resolve_rank(cfg.mecefo.rank, cfg.model.d_model, cfg.model.ffn_hidden)
    table = costs_lib.analytic_table(
        costs_lib.shape_of(cfg.model), seq_len=cfg.data.seq_len, replica_seqs=shard, rank=rank,
        recompute_ffn=cfg.mecefo.remat_ffn, mfu=1.0, projection=cfg.mecefo.projection,
        attention_backward=attention_share(cfg.mecefo, cfg.model.num_layers))
    return Planner(shard, costs_lib.role_cost(table, shard),
                   max_neighbour_rows=cfg.fault.max_neighbour_rows)
