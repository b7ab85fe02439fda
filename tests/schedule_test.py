"""Tests for mecefo_jax.failure_schedule: parsing, validation, liveness queries,
the seeded random failure process and the config entry point."""

import dataclasses
import math

import pytest

from mecefo_jax import failure_schedule as S
from mecefo_jax.config import base_config
from mecefo_jax.config.resolve import resolve
from mecefo_jax.failure_schedule import FailureEvent, FailureSchedule


def make_cfg(**overrides):
    """The base fault section with these fields (unchecked: what only the schedule can check,
    against the replica count it is given, shows; the config's own rules are config_test's)."""
    return dataclasses.replace(resolve(base_config()).fault, **overrides)


def reference_down(events, replica, step):
    """The documented semantics, spelled out: down for steps s .. s+d-1."""
    return any(e.replica == replica and e.step <= step < e.step + e.duration_steps
               for e in events)


def down_counts(events, num_replicas, horizon):
    sched = FailureSchedule(events, num_replicas)
    return [num_replicas - sum(sched.live_mask(t)) for t in range(horizon)]


# ---------------------------------------------------------------- parsing

def test_parse_empty_means_no_failures():
    assert S.parse_events('') == []
    assert S.parse_events('   ') == []


def test_parse_events_and_roundtrip():
    events = S.parse_events('100:1:50, 7:0:3 ,7:3:1')
    assert events == [FailureEvent(100, 1, 50), FailureEvent(7, 0, 3),
                      FailureEvent(7, 3, 1)]
    assert events[0].recovery_step == 150
    assert S.parse_events(S.format_events(events)) == events


@pytest.mark.parametrize('text', [
    'abc', '1:2', '1:2:3:4', '1:0:2,,3:1:1', '1.5:0:2', '1:0:', ':0:2',
    '1;0;2', '1:0:2,',
])
def test_parse_malformed_names_field(text):
    with pytest.raises(ValueError, match=r'fault\.events.*malformed'):
        S.parse_events(text)


# ---------------------------------------------------------------- validation

@pytest.mark.parametrize('text, why', [
    ('5:-1:3', 'replica'),            # negative replica
    ('5:4:3', 'replica'),             # == num_replicas
    ('5:1:0', 'at least 1 step'),     # zero duration
    ('5:1:-2', 'at least 1 step'),    # negative duration
    ('-1:1:2', '>= 0'),               # before the run
    ('100:1:2', 'only 100 steps'),    # == total_steps: beyond the run
    ('5:1:10,9:1:3', 'fails again'),  # overlap on the same replica
    ('5:1:10,5:1:3', 'fails again'),  # same replica, same step
])
def test_validate_rejects_with_field_named(text, why):
    events = S.parse_events(text)
    with pytest.raises(ValueError, match=r'fault\.events') as info:
        S.validate_events(events, num_replicas=4, total_steps=100)
    assert why in str(info.value)


def test_validate_rejects_non_integer_fields():
    with pytest.raises(ValueError, match=r'fault\.events.*integer'):
        S.validate_events([FailureEvent(1.5, 0, 2)], num_replicas=4, total_steps=10)


@pytest.mark.parametrize('text', [
    '99:1:1000',                  # recovery past the end of the run
    '5:0:3,5:1:3,5:2:3,5:3:3',    # every replica down at once
    '5:1:3,5:2:3',                # adjacent replicas together
    '5:1:3,8:1:2',                # back-to-back: fails again at its recovery step
])
def test_validate_accepts_hard_but_legal_schedules(text):
    S.validate_events(S.parse_events(text), num_replicas=4, total_steps=100)


# ---------------------------------------------------------------- liveness

HAND = '10:1:5,10:2:3,12:0:4,12:3:2,15:1:2'
# r1 down 10-14 and again 15-16 (back to back), r2 10-12 (adjacent to r1),
# r0 12-15, r3 12-13: at steps 12 every replica is down.
HAND_EXPECTED = {  # step -> (live mask, failing, recovering)
    9: ((True, True, True, True), [], []),
    10: ((True, False, False, True), [1, 2], []),
    11: ((True, False, False, True), [], []),
    12: ((False, False, False, False), [0, 3], []),
    13: ((False, False, True, False), [], [2]),
    14: ((False, False, True, True), [], [3]),
    15: ((False, False, True, True), [], []),   # r1 stays down: no flicker
    16: ((True, False, True, True), [], [0]),
    17: ((True, True, True, True), [], [1]),
    1000: ((True, True, True, True), [], []),
}


def transitions(sched, step):
    """(replicas failing at `step`, replicas recovering at `step`) from two live masks."""
    before, now = sched.live_mask(step - 1), sched.live_mask(step)
    failing = [r for r in range(sched.num_replicas) if before[r] and not now[r]]
    recovering = [r for r in range(sched.num_replicas) if now[r] and not before[r]]
    return failing, recovering


def change_steps(sched, horizon=1000):
    """Steps in [0, horizon) where the live set changes."""
    return [s for s in range(horizon) if sched.live_mask(s) != sched.live_mask(s - 1)]


def test_hand_made_schedule_live_mask_and_transitions():
    events = S.parse_events(HAND)
    sched = FailureSchedule(events, 4)
    for step, (mask, failing, recovering) in HAND_EXPECTED.items():
        assert sched.live_mask(step) == mask, step
        assert transitions(sched, step) == (failing, recovering), step
    assert change_steps(sched) == [10, 12, 13, 14, 16, 17]
    # Cross-check every step against the semantics written out naively.
    for step in range(-2, 25):
        assert sched.live_mask(step) == tuple(
            not reference_down(events, r, step) for r in range(4)), step


def test_empty_schedule_is_always_live():
    sched = FailureSchedule([], 3)
    assert sched.live_mask(0) == (True, True, True)
    assert transitions(sched, 0) == ([], [])
    assert change_steps(sched) == []


def test_schedule_rejects_invalid_events():
    with pytest.raises(ValueError, match=r'fault\.events'):
        FailureSchedule([FailureEvent(3, 5, 1)], 4)


# ---------------------------------------------------------------- random process

def rand(**kw):
    args = dict(mtbf_steps=20.0, mttr_steps=60.0, num_replicas=8,
                total_steps=5_000, seed=0, max_concurrent=0)
    args.update(kw)
    return S.random_events(**args)


def test_random_is_deterministic_per_seed_and_differs_across_seeds():
    assert rand(seed=3) == rand(seed=3)
    assert rand(seed=3) != rand(seed=4)


def test_random_events_are_valid_sorted_python_ints():
    events = rand(seed=1)
    assert events
    S.validate_events(events, num_replicas=8, total_steps=5_000)
    assert events == sorted(events, key=lambda e: (e.step, e.replica))
    assert all(type(v) is int for e in events
               for v in (e.step, e.replica, e.duration_steps))


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_random_empirical_means_match_mtbf_mttr(seed):
    # 64 replicas with ~mttr/mtbf = 3 down on average: the cap (63) never
    # binds, so accepted events are exactly the Poisson arrivals.
    mtbf, mttr, total = 50.0, 150.0, 400_000
    events = rand(mtbf_steps=mtbf, mttr_steps=mttr, num_replicas=64,
                  total_steps=total, seed=seed)
    n = len(events)
    expected_n = total / mtbf  # 8000
    # Poisson count: sd = sqrt(mean); 5 sd is ~1.4 %.
    assert abs(n - expected_n) < 5 * math.sqrt(expected_n)
    # Exponential samples have sd == mean, so the sample mean of n of them has
    # standard error mean / sqrt(n) (~1.1 % here). Allow 4 standard errors;
    # rounding arrival times moves the mean gap by < 1 / (n - 1) step and
    # rounding / the 1-step floor move the mean duration by < 0.05 step.
    # Unit mix-ups (rate vs scale, minutes vs hours) miss by far more.
    mean_gap = (events[-1].step - events[0].step) / (n - 1)
    assert abs(mean_gap - mtbf) < 4 * mtbf / math.sqrt(n)
    mean_dur = sum(e.duration_steps for e in events) / n
    assert abs(mean_dur - mttr) < 4 * mttr / math.sqrt(n) + 0.05
    assert min(e.duration_steps for e in events) >= 1


@pytest.mark.parametrize('max_concurrent, cap', [(1, 1), (2, 2), (0, 3), (4, 4)])
def test_random_never_exceeds_max_concurrent(max_concurrent, cap):
    # Outages 20x longer than gaps: the cap binds almost all the time.
    events = rand(mtbf_steps=5.0, mttr_steps=100.0, num_replicas=4,
                  total_steps=3_000, max_concurrent=max_concurrent)
    counts = down_counts(events, 4, 3_000 + 2_000)
    assert max(counts) == cap


def test_random_with_one_replica_and_default_cap_has_no_failures():
    # max_concurrent=0 -> num_replicas - 1 = 0: the only replica must stay up.
    assert rand(num_replicas=1) == []


@pytest.mark.parametrize('kw, match', [
    (dict(mtbf_steps=0.0), 'mtbf_steps'),
    (dict(mttr_steps=-1.0), 'mttr_steps'),
    (dict(max_concurrent=9), r'fault\.max_concurrent'),
    (dict(max_concurrent=-1), r'fault\.max_concurrent'),
    (dict(mtbf_steps=1e-4), r'fault\.step_time_sec'),  # runaway arrival count
])
def test_random_rejects_bad_parameters(kw, match):
    with pytest.raises(ValueError, match=match):
        rand(**kw)


# ---------------------------------------------------------------- regimes / config

def test_regime_presets_match_paper():
    assert S.REGIMES == {'low': (2.0, 4.0), 'mid': (1.0, 3.0), 'high': (0.5, 2.0)}


def test_hours_to_steps_conversion():
    # steps = hours * 3600 / step_time_sec
    assert S.hours_to_steps(0.5, 60.0) == 30.0
    assert S.hours_to_steps(2.0, 60.0) == 120.0
    assert S.hours_to_steps(1.0, 1.0) == 3600.0
    assert S.hours_to_steps(0.5, 1.8) == pytest.approx(1000.0)


@pytest.mark.parametrize('regime', sorted(S.REGIMES))
def test_regime_config_uses_documented_conversion(regime):
    mtbf_h, mttr_h = S.REGIMES[regime]
    cfg = make_cfg(regime=regime, step_time_sec=60.0, seed=7)
    got = S.events_from_config(cfg, num_replicas=8, total_steps=2_000)
    want = S.random_events(mtbf_steps=mtbf_h * 60.0, mttr_steps=mttr_h * 60.0,
                           num_replicas=8, total_steps=2_000, seed=7,
                           max_concurrent=0)
    assert got == want and got


def test_regime_replicas_keeps_the_per_replica_failure_rate():
    """A regime defined for a 32-GPU cluster, run on 8 replicas: 4x longer MTBF, same MTTR."""
    mtbf_h, mttr_h = S.REGIMES['high']
    cfg = make_cfg(regime='high', regime_replicas=32, seed=3)
    got = S.events_from_config(cfg, num_replicas=8, total_steps=2_000)
    want = S.random_events(mtbf_steps=mtbf_h * 60.0 * 32 / 8, mttr_steps=mttr_h * 60.0,
                           num_replicas=8, total_steps=2_000, seed=3, max_concurrent=0)
    assert got == want and got
    # 0 (the default) applies the regime's rate to the whole cluster as it is.
    assert S.events_from_config(make_cfg(regime='high', regime_replicas=0, seed=3),
                                num_replicas=8, total_steps=2_000) == S.random_events(
        mtbf_steps=mtbf_h * 60.0, mttr_steps=mttr_h * 60.0, num_replicas=8,
        total_steps=2_000, seed=3, max_concurrent=0)


def test_config_custom_process_matches_random_events():
    cfg = make_cfg(mtbf_hours=1.5, mttr_hours=0.25, step_time_sec=30.0, seed=2,
                   max_concurrent=2)
    got = S.events_from_config(cfg, num_replicas=4, total_steps=3_000)
    assert got == S.random_events(mtbf_steps=180.0, mttr_steps=30.0, num_replicas=4,
                                  total_steps=3_000, seed=2, max_concurrent=2)


def test_config_explicit_events_win_and_come_back_sorted():
    cfg = make_cfg(events='30:2:5,10:1:4,10:0:4', regime='high')
    assert S.events_from_config(cfg, num_replicas=4, total_steps=100) == [
        FailureEvent(10, 0, 4), FailureEvent(10, 1, 4), FailureEvent(30, 2, 5)]


def test_config_nothing_set_means_no_failures():
    assert S.events_from_config(make_cfg(), num_replicas=4, total_steps=100) == []


@pytest.mark.parametrize('overrides, match', [
    (dict(events='5:9:1'), r'fault\.events'),
    (dict(events='5-1-1'), r'fault\.events'),
    (dict(events='200:0:1'), r'fault\.events'),
    (dict(regime='low', max_concurrent=5), r'fault\.max_concurrent'),
])
def test_config_errors_name_the_field(overrides, match):
    with pytest.raises(ValueError, match=match):
        S.events_from_config(make_cfg(**overrides), num_replicas=4, total_steps=100)


def test_the_configured_failure_rate_is_the_regimes_or_the_custom_mtbf_per_hour():
    """What snapshot.every=auto weighs: high is one failure per half hour cluster-wide;
    with regime_replicas=32 on 4 replicas each replica fails as often as on 32, so the
    4-replica cluster fails 8 times less often; explicit events state no rate."""
    assert S.configured_failures_per_hour(make_cfg(regime='high'), 4) == pytest.approx(2.0)
    assert S.configured_failures_per_hour(make_cfg(regime='high', regime_replicas=32),
                                          4) == pytest.approx(0.25)
    assert S.configured_failures_per_hour(make_cfg(mtbf_hours=4.0, mttr_hours=1.0),
                                          4) == pytest.approx(0.25)
    assert S.configured_failures_per_hour(make_cfg(events='3:1:2'), 4) == 0.0
    assert S.configured_failures_per_hour(make_cfg(), 4) == 0.0
