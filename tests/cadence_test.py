"""snapshot.every=auto: the interval within the overhead budget, chosen at a fixed step."""
import pytest

from mecefo_jax.snapshot import cadence
from mecefo_jax.snapshot.cadence import PROBE_STEPS, SETTLE_STEPS, AutoCadence, choose_interval


def brute_force_interval(step, copy, write, budget_pct, host=0.0):
    """The first k whose cost copy + host + max(0, write - k step) fits budget% of k steps."""
    return next(k for k in range(1, 100_000)
                if copy + host + max(0.0, write - k * step) <= budget_pct / 100 * k * step)


@pytest.mark.parametrize('step,copy,write,budget', [
    (0.1, 0.0001, 0.05, 2.0),   # write hides behind one step, copy is cheap: every step
    (0.1, 0.004, 0.05, 2.0),    # copy alone is 4% of a step: every 2nd step
    (0.01, 0.0001, 0.05, 2.0),  # the write outlasts 5 steps: back-pressure sets the interval
    (0.2, 0.03, 0.6, 1.0),
])
def test_chosen_interval_is_the_smallest_within_budget(step, copy, write, budget):
    k = choose_interval(step, copy, write, budget)
    assert k == brute_force_interval(step, copy, write, budget)
    assert copy + max(0.0, write - k * step) <= budget / 100 * k * step


def test_shared_core_work_is_charged_even_when_the_write_hides_behind_the_steps():
    """tiny on 2 CPU cores: 10 ms steps, 5 ms blocking copy, a 52 ms write of which 6 ms
    is work (the rest waits for the step): the work alone moves k from 25 to 54."""
    without = choose_interval(0.0103, 0.005, 0.052, 2.0)
    charged = choose_interval(0.0103, 0.005, 0.052, 2.0, host_sec=0.006)
    assert without == brute_force_interval(0.0103, 0.005, 0.052, 2.0) == 25
    assert charged == brute_force_interval(0.0103, 0.005, 0.052, 2.0, host=0.006) == 54
    assert (0.005 + 0.006) / (charged * 0.0103) <= 0.02 < (0.005 + 0.006) / (without * 0.0103)


def test_only_a_cadence_sharing_cores_charges_the_writes_work():
    """host_sec = write - wait for the step's output, per write, where cores are shared."""
    chosen = {}
    for shares in (False, True):
        # Cumulative: none before probing; after 4 writes 0.2 s written, 0.16 s of it waiting.
        totals = iter([(0.0, 0, 0.0), (0.2, 4, 0.16)])
        auto = AutoCadence(2.0, flush=lambda: next(totals), shares_cores=shares)
        for step in range(1, SETTLE_STEPS + PROBE_STEPS + 2):
            auto.due(step, 'full')
            auto.record_step(0.01)
            auto.record_copy(0.001)
        chosen[shares] = auto.history[-1]
    assert chosen[False]['host_sec'] == 0.0
    assert chosen[True]['host_sec'] == pytest.approx(0.01)  # (0.2 - 0.16) / 4
    assert chosen[True]['interval'] == choose_interval(0.01, 0.001, 0.05, 2.0,
                                                       chosen[True]['host_sec'])
    assert chosen[True]['interval'] > chosen[False]['interval']


def test_every_step_is_snapshotted_while_measuring_then_the_agreed_interval_applies():
    flushes, agreed = [], []

    def flush():  # total background write seconds and count: 50 ms per write
        flushes.append(len(flushes))
        return 0.05 * len(flushes) * PROBE_STEPS, len(flushes) * PROBE_STEPS, 0.0

    def agree(k):
        agreed.append(k)
        return 7  # process 0 chose 7: every process must use it, whatever it measured

    auto = AutoCadence(2.0, flush=flush, agree=agree)
    topology = ('4 replicas',)
    due = []
    for step in range(1, SETTLE_STEPS + PROBE_STEPS + 1):
        due.append(auto.due(step, topology))
        auto.record_step(0.01)
        auto.record_copy(0.0001)
    assert all(due) and auto.interval is None
    first_chosen = SETTLE_STEPS + PROBE_STEPS + 1
    auto.due(first_chosen, topology)
    assert agreed == [choose_interval(0.01, 0.0001, 0.05, 2.0)] and auto.interval == 7
    assert [s for s in range(first_chosen + 1, first_chosen + 30) if auto.due(s, topology)] == \
        [s for s in range(first_chosen + 1, first_chosen + 30) if s % 7 == 0]
    assert auto.history[-1]['interval'] == 7
    assert auto.history[-1]['write_sec'] == pytest.approx(0.05)


def test_a_topology_change_measures_again():
    auto = AutoCadence(2.0, flush=lambda: (0.0, 0, 0.0))
    for step in range(1, SETTLE_STEPS + PROBE_STEPS + 2):
        auto.due(step, 'full')
        auto.record_step(1.0)
    assert auto.interval == 1  # no write measured: the copy-free step fits any budget
    assert auto.due(100, 'three live replicas') and auto.interval is None


def test_budget_must_be_positive():
    with pytest.raises(ValueError, match='snapshot.overhead_budget_pct'):
        AutoCadence(0, flush=lambda: (0.0, 0, 0.0))


def test_the_interval_is_capped():
    assert choose_interval(1.0, 10.0, 0.0, 0.001) == cadence.MAX_INTERVAL
