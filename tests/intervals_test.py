"""Student-t intervals, the seeds a difference needs, and Fieller's ratio interval
(studies/intervals.py), against published quantiles and their own definitions."""
import math
import statistics

import pytest

from studies import intervals


@pytest.mark.parametrize('p, df, quantile', [
    (0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 3, 3.182), (0.975, 5, 2.571),
    (0.975, 10, 2.228), (0.975, 30, 2.042), (0.995, 10, 3.169), (0.8, 3, 0.978),
    (0.95, 4, 2.132), (0.975, 1000, 1.962)])
def test_t_quantiles_match_the_published_table(p, df, quantile):
    assert intervals.t_quantile(p, df) == pytest.approx(quantile, abs=1e-3)
    assert intervals.t_quantile(1 - p, df) == pytest.approx(-quantile, abs=1e-3)


def test_a_bad_quantile_request_names_what_is_wrong():
    with pytest.raises(ValueError, match='df=0'):
        intervals.t_quantile(0.975, 0)
    with pytest.raises(ValueError, match='p=1.0'):
        intervals.t_quantile(1.0, 3)


def test_the_t_interval_and_its_side_of_zero():
    values = [0.01, 0.03, 0.05, 0.07]
    got = intervals.t_interval(values)
    half = 3.1824 * statistics.stdev(values) / 2
    assert got['mean'] == pytest.approx(0.04) and got['n'] == 4
    assert (got['lo'], got['hi']) == pytest.approx((0.04 - half, 0.04 + half), abs=1e-6)
    assert intervals.side(got) == '='  # a bootstrap would have put it above 0
    assert intervals.side(intervals.t_interval([0.1, 0.12, 0.11])) == '+'
    assert intervals.side(intervals.t_interval([-0.1, -0.12, -0.11])) == '−'
    one = intervals.t_interval([0.2, None])  # a seed without a value is left out
    assert one['lo'] == one['hi'] == 0.2 and intervals.side(one) == 'one seed'
    assert intervals.t_interval([None]) is None and intervals.side(None) == 'n/a'


@pytest.mark.parametrize('diffs', [[0.01, 0.03, 0.05, 0.07], [0.03, 0.04, 0.02, 0.05, 0.03, 0.04],
                                   [0.1, -0.05, 0.2, 0.0]])
def test_seeds_to_separate_is_where_a_t_interval_of_the_measured_mean_and_sd_excludes_0(diffs):
    """At n seeds with the measured mean d and sd s, sqrt(n) d / s reaches
    t(0.975, n - 1) + t(0.8, n - 1) (80% power), so the t interval excludes 0; at n - 1 it
    falls short of that."""
    n = intervals.seeds_to_separate(diffs)
    d, s = statistics.fmean(diffs), statistics.stdev(diffs)

    def power_reached(k):
        return math.sqrt(k) * d / s >= intervals.t_quantile(0.975, k - 1) + intervals.t_quantile(0.8, k - 1)
    assert power_reached(n) and (n == 2 or not power_reached(n - 1))
    assert math.sqrt(n) * d / s > intervals.t_quantile(0.975, n - 1)  # the interval excludes 0
    # More than the normal approximation asks, which ignores that s is estimated.
    z = statistics.NormalDist().inv_cdf(0.975) + statistics.NormalDist().inv_cdf(0.8)
    assert n >= math.ceil((z * s / d) ** 2)


def test_seeds_to_separate_edge_cases():
    assert intervals.seeds_to_separate([0.1]) is None
    assert intervals.seeds_to_separate([0.1, -0.1]) == math.inf  # the mean difference is 0
    assert intervals.seeds_to_separate([0.1, 0.1, 0.1]) == 2  # no spread


def test_fiellers_interval_is_where_the_paired_t_interval_holds_zero():
    lost = [18.5, 6.0, 51.3, 39.6, 30.0, 25.0]
    control = [28.8, 10.1, 93.1, 81.4, 60.0, 45.0]
    lo, hi = intervals.ratio_interval(lost, control)
    ratio = statistics.fmean(lost) / statistics.fmean(control)
    assert lo < ratio < hi
    for r, inside in ((lo, True), (hi, True), (lo - 0.01, False), (hi + 0.01, False),
                      (ratio, True)):
        diff = intervals.t_interval([a - r * b for a, b in zip(lost, control)])
        holds = diff['lo'] <= 1e-9 and diff['hi'] >= -1e-9
        assert holds == inside, r
    # A denominator not told apart from 0 leaves the ratio unbounded.
    assert intervals.ratio_interval([1.0, 2.0, 1.5], [5.0, -4.0, 1.0]) is None
    assert intervals.ratio_interval([1.0], [2.0]) is None


def test_an_interval_reads_as_mean_bounds_and_side():
    """The one cell format of both reports: bounds only where the interval has them, its side
    only where it was set (paired differences), n/a where there is no interval."""
    got = intervals.paired({'drop': [0.9, 0.9, 0.9], 'run': [0.8, 0.86, None], 'fault_free': [1.0] * 3}, 'drop')
    assert list(got) == ['run'] and got['run']['n'] == 2  # the seed without a value is left out
    assert intervals.cell(got['run'], '+.2f') == f"+0.07 [{got['run']['lo']:+.2f}, {got['run']['hi']:+.2f}] (=)"
    assert intervals.cell({'mean': 0.4, 'lo': None, 'hi': None}, '.2f') == '0.40 [unbounded]'
    assert intervals.cell(intervals.t_interval([1.0, 3.0]), '.1f').startswith('2.0 [') and intervals.cell(None) == 'n/a'
