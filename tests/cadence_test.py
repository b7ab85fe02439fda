"""snapshot.every=auto: the interval within the overhead budget, chosen at a fixed step."""
import pytest

from mecefo_jax.snapshot import cadence
from mecefo_jax.snapshot.cadence import PAIRS, PROBE_STEPS, SETTLE_STEPS, WINDOW, AutoCadence, choose_interval


def brute_force_interval(step, snapshot, write, budget_pct):
    """The first k whose cost snapshot + max(0, write - k step) fits budget% of k steps."""
    return next(k for k in range(1, 100_000)
                if snapshot + max(0.0, write - k * step) <= budget_pct / 100 * k * step)


@pytest.mark.parametrize('step,snapshot,write,budget', [
    (0.1, 0.0001, 0.05, 2.0),   # write hides behind one step, snapshot is cheap: every step
    (0.1, 0.004, 0.05, 2.0),    # a snapshot alone is 4% of a step: every 2nd step
    (0.01, 0.0001, 0.05, 2.0),  # the write outlasts 5 steps: back-pressure sets the interval
    (0.2, 0.03, 0.6, 1.0),
    (0.0094, 0.012, 0.06, 2.0),  # tiny on 2 CPU cores, as three crash drills measured it
])
def test_chosen_interval_is_the_smallest_within_budget(step, snapshot, write, budget):
    k = choose_interval(step, snapshot, write, budget)
    assert k == brute_force_interval(step, snapshot, write, budget)
    assert snapshot + max(0.0, write - k * step) <= budget / 100 * k * step


def _probe(auto, window_sec, *, topology='full', first_step=1):
    """Drive `auto` through settling and its windows as a worker does; the steps it
    snapshotted. `window_sec(i)` is the measured time of window i."""
    snapshotted, windows = [], 0
    for step in range(first_step, first_step + SETTLE_STEPS + PROBE_STEPS + 1):
        if auto.due(step, topology):
            snapshotted.append(step)
        if auto.window_ends:
            settling = not auto.probing
            auto.record_window(0.0 if settling else window_sec(windows))
            windows += not settling
    assert windows == 2 * PAIRS
    return snapshotted


def test_a_snapshot_costs_what_it_adds_to_a_window_median_over_pairs():
    """Plain windows of 4 x 10 ms; snapshotting ones 6 to 9.5 ms longer and one noisy
    pair 30 ms: the snapshot costs the median, 9.1 ms, and the writes (5 ms each, inside the
    window) add no back-pressure."""
    writes = iter([(0.0, 0, 0.0), (0.025, PAIRS, 0.0)])
    auto = AutoCadence(2.0, flush=lambda: next(writes))
    extra = [0.006, 0.0091, 0.030, 0.0085, 0.0095]
    _probe(auto, lambda i: 0.040 + (extra[i // 2] if i % 2 else 0.0))
    chosen = auto.history[-1]
    assert chosen['step_sec'] == pytest.approx(0.010)
    assert chosen['snapshot_sec'] == pytest.approx(0.0091)
    assert chosen['write_sec'] == pytest.approx(0.005)
    assert auto.interval == choose_interval(0.010, 0.0091, 0.005, 2.0) == 46


def test_a_write_longer_than_a_window_is_charged_once_as_back_pressure():
    """A 100 ms write behind 4 x 10 ms windows: the windows end before its tail (the
    worker awaits it between windows), so a snapshotting window adds the snapshot's 4.1 ms
    to the steps; the write is back-pressure in the model (free from k = 10 steps)."""
    writes = iter([(0.0, 0, 0.0), (0.1 * PAIRS, PAIRS, 0.0)])
    auto = AutoCadence(2.0, flush=lambda: next(writes))
    _probe(auto, lambda i: 0.040 + (0.0041 if i % 2 else 0.0))
    chosen = auto.history[-1]
    assert chosen['snapshot_sec'] == pytest.approx(0.0041)
    assert auto.interval == brute_force_interval(0.010, 0.0041, 0.100, 2.0) == 21


def test_a_stall_inside_a_long_write_is_a_snapshot_cost_not_back_pressure():
    """The H200's case (docs/gpu.md): 36 ms steps, a 417 ms write, and a device copy the
    next step waits 77 ms for. The window shows the 77 ms stall (its write's tail is
    outside it), so the interval keeps 77 ms within 2 % of k steps: 107 steps, where
    taking the write's tail back out of a window that held it read 10 ms and chose 15."""
    writes = iter([(0.0, 0, 0.0), (0.417 * PAIRS, PAIRS, 0.0)])
    auto = AutoCadence(2.0, flush=lambda: next(writes))
    _probe(auto, lambda i: 0.144 + (0.077 if i % 2 else 0.0))
    assert auto.history[-1]['snapshot_sec'] == pytest.approx(0.077)
    k = auto.interval
    assert k == brute_force_interval(0.036, 0.077, 0.417, 2.0) == 107
    assert 0.077 <= 0.02 * k * 0.036 and 0.077 > 0.02 * (k - 1) * 0.036


def test_where_cores_are_shared_a_snapshot_costs_at_least_its_own_cpu_time():
    """tiny on 2 CPU cores: the window pairs read 2 ms (noise), but the loop blocked 7 ms
    per snapshot and each write worked 5 ms (of 30 ms, 25 waiting for the step's output):
    a snapshot costs at least 12 ms there. Off shared cores the pairs' figure stands."""
    chosen = {}
    for shares in (False, True):
        writes = iter([(0.0, 0, 0.0), (0.03 * PAIRS, PAIRS, 0.025 * PAIRS)])
        auto = AutoCadence(2.0, flush=lambda: next(writes), shares_cores=shares)
        for step in range(1, SETTLE_STEPS + PROBE_STEPS + 2):
            if auto.due(step, 'full'):
                auto.record_blocked(0.007)
            if auto.window_ends:
                window = auto._probe_index // WINDOW
                auto.record_window(0.036 + (0.002 if window % 2 else 0.0))
        chosen[shares] = auto.history[-1]
    assert chosen[False]['snapshot_sec'] == pytest.approx(0.002)
    assert chosen[True]['measured_sec'] == pytest.approx(0.002)
    assert chosen[True]['floor_sec'] == pytest.approx(0.012)
    assert chosen[True]['snapshot_sec'] == pytest.approx(0.012)
    assert chosen[True]['interval'] == brute_force_interval(0.009, 0.012, 0.03, 2.0) == 67
    assert chosen[False]['interval'] == brute_force_interval(0.009, 0.002, 0.03, 2.0)


def test_settling_snapshots_every_step_probing_one_per_pair_then_the_agreed_interval():
    agreed = []

    def agree(k):
        agreed.append(k)
        return 7  # process 0 chose 7: every process must use it, whatever it measured

    writes = iter([(0.0, 0, 0.0), (0.05 * PAIRS, PAIRS, 0.0)])
    auto = AutoCadence(2.0, flush=lambda: next(writes), agree=agree)
    snapshotted = _probe(auto, lambda i: 0.04 + (0.0005 if i % 2 else 0.0))
    first_window = SETTLE_STEPS + 1
    assert snapshotted == list(range(1, SETTLE_STEPS + 1)) + [
        first_window + WINDOW * (2 * p + 1) for p in range(PAIRS)] + (
        [SETTLE_STEPS + PROBE_STEPS + 1] if (SETTLE_STEPS + PROBE_STEPS + 1) % 7 == 0 else [])
    assert agreed == [choose_interval(0.01, 0.0005, 0.05, 2.0)] and auto.interval == 7
    chosen = SETTLE_STEPS + PROBE_STEPS + 1
    assert [s for s in range(chosen + 1, chosen + 30) if auto.due(s, 'full')] == \
        [s for s in range(chosen + 1, chosen + 30) if s % 7 == 0]
    assert auto.history[-1]['interval'] == 7
    assert auto.history[-1]['write_sec'] == pytest.approx(0.05)


def test_a_topology_change_measures_again():
    auto = AutoCadence(2.0, flush=lambda: (0.0, 0, 0.0))
    _probe(auto, lambda i: 1.0)
    assert auto.interval == 1  # a snapshot that adds nothing fits any budget
    assert auto.due(100, 'three live replicas') and auto.interval is None
    assert not auto.probing


def test_budget_must_be_positive():
    with pytest.raises(ValueError, match='snapshot.overhead_budget_pct'):
        AutoCadence(0, flush=lambda: (0.0, 0, 0.0))


def test_the_interval_is_capped():
    assert choose_interval(1.0, 10.0, 0.0, 0.001) == cadence.MAX_INTERVAL


def expected_waste_by_hand(k, step, snapshot, write, failures_per_sec):
    """Per second of training: one snapshot's cost (its time plus the write's tail past k
    steps) over k steps, and failures each redoing half of the k steps."""
    period = k * step
    return (snapshot + max(0.0, write - period)) / period + failures_per_sec * period / 2


@pytest.mark.parametrize('failures_per_sec', [1.0, 0.2, 1 / 60])
def test_failures_shorten_the_interval_to_the_young_daly_optimum_within_the_budget(
        failures_per_sec):
    """tiny's figures on 2 cores (9.4 ms steps, a 12 ms snapshot, a 60 ms write): the budget
    alone allows 64 steps; frequent failures make fewer cheaper in expectation, and the
    choice is the brute-force minimum of the expected waste over 1..64."""
    step, snapshot, write = 0.0094, 0.012, 0.06
    within = choose_interval(step, snapshot, write, 2.0)
    k = choose_interval(step, snapshot, write, 2.0, failures_per_sec=failures_per_sec)
    waste = {j: expected_waste_by_hand(j, step, snapshot, write, failures_per_sec)
             for j in range(1, within + 1)}
    assert k == min(waste, key=waste.get) <= within
    if k < within and k * step >= write:  # no back-pressure: Young's closed form
        young = (2 * snapshot / failures_per_sec) ** 0.5 / step
        assert abs(k - young) <= 1


def test_one_failure_a_second_snapshots_more_often_than_the_budget_alone():
    step, snapshot, write = 0.0094, 0.012, 0.06
    assert choose_interval(step, snapshot, write, 2.0) == 64
    assert choose_interval(step, snapshot, write, 2.0, failures_per_sec=1.0) == 16


def test_the_interval_is_never_longer_than_the_disk_checkpoints():
    step, snapshot, write = 0.0094, 0.012, 0.06
    assert choose_interval(step, snapshot, write, 2.0, max_interval=20) == 20
    assert choose_interval(0.1, 0.0001, 0.05, 2.0, max_interval=20) == 1  # shorter already


def test_auto_chooses_with_the_failure_rate_and_the_disk_cap_and_records_both():
    writes = iter([(0.0, 0, 0.0), (0.025, PAIRS, 0.0)])
    auto = AutoCadence(2.0, flush=lambda: next(writes), failures_per_sec=0.5, max_interval=30)
    _probe(auto, lambda i: 0.040 + (0.0091 if i % 2 else 0.0))
    chosen = auto.history[-1]
    assert chosen['failures_per_sec'] == 0.5 and chosen['max_interval'] == 30
    assert auto.interval == choose_interval(0.010, 0.0091, 0.005, 2.0, failures_per_sec=0.5,
                                            max_interval=30) < 30


def test_a_workers_cadence_options_come_from_the_config_then_the_observed_rate():
    from configs.tiny import get_config
    from mecefo_jax.config.resolve import resolve, updated
    from mecefo_jax.launch.worker_state import cadence_options
    cfg = resolve(get_config())  # no failure process; Orbax every 20 steps
    assert cadence_options(cfg) == {'budget_pct': 2.0, 'failures_per_sec': 0.0,
                                    'max_interval': 20}
    assert cadence_options(cfg, 36.0)['failures_per_sec'] == pytest.approx(0.01)  # observed
    high = updated(cfg, {'fault.regime': 'high', 'train.checkpoint_every': 0})
    assert cadence_options(high, 36.0) == {'budget_pct': 2.0,
                                           'failures_per_sec': pytest.approx(2.0 / 3600),
                                           'max_interval': cadence.MAX_INTERVAL}
