"""The `mecefo_planned` placement planner against an independent brute force."""
import functools
import itertools

import numpy as np
import pytest

from mecefo_jax.faults import costs as costs_lib
from mecefo_jax.faults import planner as planner_lib
from mecefo_jax.neighbour.layout import ROLE_MIXED, ROLE_NEIGHBOUR, ROLE_NORMAL


def analytic_350m(shard: int):
    table = costs_lib.analytic_table(costs_lib.PAPER_MODELS['350M'], seq_len=256,
                                     replica_seqs=shard, rank=128, recompute_ffn=False, mfu=0.4)
    return costs_lib.role_cost(table, shard)


@functools.cache
def compositions(total: int, parts: int, cap: int) -> np.ndarray:
    """Every vector of `parts` integers in [0, cap] summing to `total`."""
    rows = [c for c in itertools.product(range(min(cap, total) + 1), repeat=parts)
            if sum(c) == total] if parts <= 4 else [
        (first,) + rest for first in range(min(cap, total) + 1)
        for rest in map(tuple, compositions(total - first, parts - 1, cap))]
    return np.array(rows, np.int64).reshape(-1, parts)


def brute_force(mask, shard, cost, max_rows=None, max_neighbour_rows=None):
    """min over every assignment of extra rows to live replicas, its helpers all
    neighbours or (without a memory bound) all mixed, of (slowest cost, neighbour
    rows, helpers, ring transport); with `max_neighbour_rows`, over the plans
    within it, or else those with the fewest neighbour rows."""
    mask = np.asarray(mask, bool)
    n, live = mask.size, np.flatnonzero(mask)
    orphaned = int((~mask).sum()) * shard
    if orphaned == 0:
        return 1.0, 0, 0, 0
    cap = orphaned if max_rows is None else max_rows - shard
    extra = compositions(orphaned, live.size, cap)
    busiest = extra.max(1)
    helpers = (extra > 0).sum(1)
    normal = cost(ROLE_NORMAL, shard)
    # Transport on a cycle: flows are prefix imbalances plus a circulation,
    # the best circulation is minus their median.
    net = np.zeros((extra.shape[0], n))
    net[:, ~mask] = shard
    net[:, live] -= extra
    flow = np.cumsum(net, 1)
    transport = np.round(np.abs(flow - np.median(flow, 1, keepdims=True)).sum(1), 6)
    # A neighbour helper runs all its rows in neighbour mode; a mixed one its own exactly.
    slowest = {ROLE_NEIGHBOUR: lambda b: cost(ROLE_NEIGHBOUR, shard + b) / normal,
               ROLE_MIXED: lambda b: (normal + cost(ROLE_NEIGHBOUR, b)) / normal}
    rows = {ROLE_NEIGHBOUR: helpers * shard + orphaned,
            ROLE_MIXED: np.full(helpers.shape, orphaned)}
    keys = []
    for role in (ROLE_NEIGHBOUR,) if max_rows else (ROLE_NEIGHBOUR, ROLE_MIXED):
        by_busiest = {int(b): round(max(1.0, slowest[role](int(b))), 9)
                      for b in np.unique(busiest)}
        slow = [by_busiest[int(b)] for b in busiest]
        keys += zip(slow, rows[role].tolist(), helpers.tolist(), transport.tolist())
    keys.sort()
    if max_neighbour_rows:
        within = [k for k in keys if k[1] <= max_neighbour_rows]
        fewest = min(k[1] for k in keys)
        keys = within or [k for k in keys if k[1] == fewest]
    return keys[0]


def objectives(layout, n, shard, cost):
    """The same four figures, read off a layout."""
    normal = cost(ROLE_NORMAL, shard)
    slow = max(max(1.0, planner_lib.program_cost(cost, p) / normal) for p in layout.programs)
    helpers = sum(role != ROLE_NORMAL for role in layout.roles)
    transport = sum(piece.size * min((piece.shard - r) % n, (r - piece.shard) % n)
                    for r, pieces in zip(layout.replicas, layout.pieces) for piece in pieces)
    return round(slow, 9), layout.neighbour_mode_rows(), helpers, round(float(transport), 6)


def assert_exactly_once(layout, mask, shard):
    assert layout.replicas == tuple(np.flatnonzero(mask))
    seen = np.zeros((len(mask), shard), int)
    for pieces in layout.pieces:
        for p in pieces:
            seen[p.shard, p.start:p.stop] += 1
    assert (seen == 1).all()


@pytest.mark.parametrize('n', [6, 7, 8])
def test_planner_matches_brute_force_on_every_live_mask(n):
    for shard in range(1, 5):
        cost = analytic_350m(shard)
        for mask in itertools.product([True, False], repeat=n):
            if not any(mask):
                continue
            layout = planner_lib.plan_layout(mask, shard, cost)
            assert_exactly_once(layout, mask, shard)
            assert objectives(layout, n, shard, cost) == brute_force(mask, shard, cost), (
                mask, shard)


def test_planner_matches_brute_force_with_a_memory_bound_and_a_steep_cost():
    # A helper may hold 1.5 shards at most, and neighbour mode is 0.9x per row:
    # many masks cannot stay within one step, and the bound decides the spread.
    cost = planner_lib.linear_cost(0.9)
    for mask in itertools.product([True, False], repeat=7):
        if 2 * sum(mask) < 4 * (7 - sum(mask)):
            continue  # 2 spare rows per live replica cannot hold the orphans
        layout = planner_lib.plan_layout(mask, 4, cost, max_rows=6)
        assert_exactly_once(layout, mask, 4)
        assert max(layout.rows(i) for i in range(len(layout.replicas))) <= 6
        assert objectives(layout, 7, 4, cost) == brute_force(mask, 4, cost, max_rows=6), mask


@pytest.mark.parametrize('n', [6, 8])
def test_planner_matches_brute_force_under_a_neighbour_row_cap(n):
    """Every cap from below the fewest possible rows to above the uncapped plan's, with
    and without a memory bound: the cap binds, then decides, then is met."""
    cost = analytic_350m(4)
    for mask in itertools.product([True, False], repeat=n):
        failed = n - sum(mask)
        if not failed or 2 * sum(mask) < 4 * failed:
            continue  # nothing to plan, or the memory bound cannot hold the orphans
        for max_rows in (None, 6):
            for cap in range(4, 4 * failed + 4 * sum(mask) + 1, 3):
                layout = planner_lib.plan_layout(mask, 4, cost, max_rows=max_rows,
                                                 max_neighbour_rows=cap)
                assert_exactly_once(layout, mask, 4)
                assert objectives(layout, n, 4, cost) == brute_force(
                    mask, 4, cost, max_rows=max_rows, max_neighbour_rows=cap), (mask, max_rows,
                                                                                cap)


def test_a_neighbour_row_cap_trades_the_step_for_fewer_approximated_rows():
    # 350M, one failure of 32, 16 sequences per shard: uncapped, two neighbour helpers in
    # one normal step (48 rows in neighbour mode). Capped at 32 without a memory bound:
    # mixed helpers, each its own shard exact and one adopted row in neighbour mode (16
    # rows), faster than the paper's single neighbour (32 rows at 1.25x). Under a memory
    # bound a mixed helper holds too much: the paper's single neighbour.
    shard, mask = 16, np.ones(32, bool)
    mask[5] = False
    cost = analytic_350m(shard)
    normal = cost(ROLE_NORMAL, 16)
    free = planner_lib.Planner(shard, cost).budget(31, 1)
    capped = planner_lib.Planner(shard, cost, max_neighbour_rows=32).budget(31, 1)
    bounded = planner_lib.Planner(shard, cost, max_rows=32, max_neighbour_rows=32).budget(31, 1)
    assert (free.role, free.helpers, free.neighbour_rows) == (ROLE_NEIGHBOUR, 2, 48)
    assert free.slowest_cost <= 1.0 + 1e-9  # within a normal step (to round-off)
    assert (capped.role, capped.helpers, capped.neighbour_rows) == (ROLE_MIXED, 16, 16)
    assert capped.slowest_cost == pytest.approx((normal + cost(ROLE_NEIGHBOUR, 1)) / normal)
    assert (bounded.role, bounded.helpers, bounded.neighbour_rows) == (ROLE_NEIGHBOUR, 1, 32)
    assert bounded.slowest_cost == pytest.approx(cost(ROLE_NEIGHBOUR, 32) / normal)
    assert 1.0 < capped.slowest_cost < bounded.slowest_cost
    layout = planner_lib.plan_layout(mask, shard, cost, max_neighbour_rows=32)
    assert_exactly_once(layout, mask, shard)
    assert layout.neighbour_mode_rows() == 16
    assert {p.name for p in layout.programs} == {'normalx16', 'mixedx16+1'}


def test_memory_bound_that_cannot_hold_the_orphans_names_the_fix():
    mask = (True, False, False, False)
    with pytest.raises(planner_lib.PlanError, match='rows per neighbour'):
        planner_lib.plan_layout(mask, 4, planner_lib.linear_cost(), max_rows=6)


def test_one_failure_at_350m_uses_two_helpers_within_one_normal_step():
    shard, mask = 16, np.ones(32, bool)
    mask[5] = False
    cost = analytic_350m(shard)
    layout = planner_lib.plan_layout(mask, shard, cost)
    helpers = [r for r, role in zip(layout.replicas, layout.roles) if role == ROLE_NEIGHBOUR]
    assert helpers == [4, 6]  # the two ring neighbours
    normal = cost(ROLE_NORMAL, shard)
    assert max(cost(p.role, p.rows) for p in layout.programs) <= normal
    assert_exactly_once(layout, mask, shard)


def test_greedy_fallback_keeps_the_budget():
    # Above EXACT_STATES the placement is greedy: still two helpers per failed
    # shard and within one step, every row once.
    shard, mask = 16, np.ones(256, bool)
    mask[[3, 4, 100, 200]] = False
    cost = analytic_350m(shard)
    layout = planner_lib.plan_layout(mask, shard, cost)
    assert_exactly_once(layout, mask, shard)
    assert layout.roles.count(ROLE_NEIGHBOUR) == 8
    assert max(cost(p.role, p.rows) for p in layout.programs) <= cost(ROLE_NORMAL, shard)


def test_budget_degrades_to_the_best_min_max_plan():
    # One sequence per shard cannot be split: the best plan spreads the
    # orphans one per helper, over a normal step.
    cost = analytic_350m(1)
    plan = planner_lib.budget(num_live=4, num_failed=4, shard=1, cost=cost)
    assert (plan.helpers, plan.max_extra) == (4, 1)
    assert plan.slowest_cost > 1.0  # over a normal step
    assert plan.slowest_cost == cost(ROLE_NEIGHBOUR, 2) / cost(ROLE_NORMAL, 1)


def test_planner_caches_by_live_set():
    planner = planner_lib.Planner(2)
    mask = (True, False, True, True)
    assert planner.layout(mask) is planner.layout(list(mask))


@pytest.mark.subprocess  # a fresh interpreter
def test_plan_command_prints_every_strategy_as_json():
    import json
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, os.path.join(root, 'scripts', 'plan_faults.py'), '--config',
         os.path.join(root, 'configs', 'tiny.py'), '--down', '3', '--json'],
        capture_output=True, text=True, check=True, cwd=root).stdout
    report = json.loads(out)
    from mecefo_jax.config.defaults import STRATEGIES
    assert set(report) == set(STRATEGIES)
    planned = report['mecefo_planned']
    assert [x['replica'] for x in planned['replicas']] == [0, 1, 2, 4, 5, 6, 7]
    helpers = [x for x in planned['replicas'] if x['role'] == 'neighbour']
    assert [x['pieces'] for x in helpers] == [['2[0:2]', '3[0:1]'], ['4[0:2]', '3[1:2]']]
    assert planned['slowest_cost'] == max(x['cost'] for x in planned['replicas'])
    assert report['mecefo']['slowest_cost'] > planned['slowest_cost']
    assert report['drop']['slowest_cost'] == 1.0
    assert planned['neighbour_rows'] == 2 * 3 and report['mecefo']['neighbour_rows'] == 4
    assert report['drop']['neighbour_rows'] == 0


def test_plan_command_shows_the_neighbour_row_cap():
    from configs import tiny
    from mecefo_jax.config.resolve import resolve
    from studies import fault_plan as plan
    cfg = resolve(tiny.get_config())
    # tiny: 2 sequences per shard on 8 replicas; one failure, capped at 4 rows: two mixed
    # helpers, each its own shard exact and one adopted row in neighbour mode (2 rows),
    # instead of two neighbour helpers (6 rows); a little faster than the paper's rule.
    report = plan.plan_all(cfg, replicas=8, down=(3,), max_neighbour_rows=4)
    planned = report['mecefo_planned']
    assert (planned['neighbour_rows'], planned['max_neighbour_rows']) == (2, 4)
    assert {r['role'] for r in planned['replicas']} == {'normal', 'mixed'}
    assert 1.0 < planned['slowest_cost'] < report['mecefo']['slowest_cost']
    assert '2 rows in neighbour mode (cap 4)' in plan.format_text(report)


@pytest.mark.subprocess  # a fresh interpreter
def test_fault_library_never_imports_experiments():
    import subprocess
    import sys
    code = ('import sys, mecefo_jax.faults.planner, mecefo_jax.faults.strategies, '
            'mecefo_jax.faults.costs, mecefo_jax.faults.controller; '
            'bad = [m for m in sys.modules if m.startswith("studies")]; '
            'assert not bad, bad')
    subprocess.run([sys.executable, '-c', code], check=True)
