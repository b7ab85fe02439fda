"""The strategy comparison end to end on a short schedule, its cost model and its seed statistics."""
import json
import os

import pytest

from configs.tiny import get_config
from mecefo_jax.config_resolve import resolve
from mecefo_jax.faults.strategies import layout_for
from studies import compare, compare_over_seeds
from studies.role_timer import layout_keys

STEPS = 6


@pytest.fixture(scope='module')
def report(tmp_path_factory, tokenizer_cache):
    cfg = get_config()
    cfg.data.cache_dir = tokenizer_cache
    cfg.train.steps = STEPS
    cfg.fault.events = '2:3:2'  # replica 3 down for steps 2 and 3
    cfg = resolve(cfg)
    out = str(tmp_path_factory.mktemp('compare'))
    # One seed through compare_seeds: the per-seed report and the aggregate both get written.
    aggregate = compare_over_seeds.compare_seeds(cfg, '', out, seeds=[0],
                                                 runs=('fault_free', 'mecefo'), log=lambda _: None)
    with open(os.path.join(out, 'seed0', 'compare_faults.json')) as f:
        single = json.load(f)
    return single, os.path.join(out, 'seed0'), cfg, aggregate, out


def test_writes_json_and_markdown(report):
    result, out, *_ = report
    table = open(os.path.join(out, 'compare_faults.md')).read()
    assert '| fault_free |' in table and '| mecefo |' in table
    for entry in result['strategies'].values():
        for key in ('modeled_tokens_per_sec', 'throughput_drop_pct', 'wall_tokens_per_sec',
                    'final_val_loss', 'lost_steps', 'events', 'program_steps',
                    'slowest_program_steps', 'mean_step_ratio', 'worst_step_ratio'):
            assert key in entry


def test_fault_free_timeline_is_the_configured_step_time(report):
    result, _, cfg, *_ = report
    free = result['strategies']['fault_free']
    # Normalisation: a fault-free step lasts exactly fault.step_time_sec.
    assert free['modelled_compute_sec'] == pytest.approx(STEPS * cfg.fault.step_time_sec)
    assert free['throughput_drop_pct'] == 0.0
    assert free['events'] == []
    assert free['program_steps'] == {'normalx2': STEPS}
    assert free['mean_step_ratio'] == pytest.approx(1.0)


def _failed_programs():
    mask = [True] * 8
    mask[3] = False
    return [p.name for p in layout_keys(layout_for('mecefo', mask, 2))]


def test_failure_events_carry_timings_and_the_neighbour_program_was_timed(report):
    result, _, cfg, *_ = report
    events = result['strategies']['mecefo']['events']
    assert [(e['kind'], e['step'], e['replicas']) for e in events] == [
        ('failure', 2, [3]), ('recovery', 4, [3])]
    for e in events:
        for key in ('detect_sec', 'rebuild_sec', 'compile_sec', 'restore_sec', 'first_step_sec'):
            assert e[key] >= 0.0
    failed_keys = _failed_programs()
    # One neighbour joins its own and the adopted shard (2 + 2 rows); the rest stay normal.
    assert sorted(failed_keys) == ['neighbourx4', 'normalx2']
    seconds = {name: p['seconds'] for name, p in result['programs'].items()}
    assert all(key in seconds for key in failed_keys)
    # Steps 2 and 3 last step_time_sec x (slowest device / normal device);
    # the other four last step_time_sec.
    ratio = max(seconds[k] for k in failed_keys) / seconds['normalx2']
    expected = cfg.fault.step_time_sec * ((STEPS - 2) + 2 * ratio)
    assert result['strategies']['mecefo']['modelled_compute_sec'] == pytest.approx(expected)


def test_program_table_shows_ratios_and_each_strategys_programs(report):
    result, out, *_ = report
    programs = result['programs']
    assert result['normal_program'] == 'normalx2'
    assert programs['normalx2']['ratio_to_normal'] == 1.0
    for p in programs.values():
        assert p['ratio_to_normal'] == pytest.approx(p['seconds'] / programs['normalx2']['seconds'])
    mecefo = result['strategies']['mecefo']
    # All six steps run the normal program somewhere; steps 2 and 3 also the neighbour's.
    assert mecefo['program_steps'] == {'normalx2': STEPS, 'neighbourx4': 2}
    slowest_when_failed = max(_failed_programs(), key=lambda n: programs[n]['seconds'])
    expected_slowest = {'normalx2': STEPS - 2}
    expected_slowest[slowest_when_failed] = expected_slowest.get(slowest_when_failed, 0) + 2
    assert mecefo['slowest_program_steps'] == expected_slowest
    assert mecefo['worst_step_ratio'] == pytest.approx(
        programs[slowest_when_failed]['ratio_to_normal'])
    assert (mecefo['neighbour_steps'], mecefo['degraded_steps']) == (2, 2)
    table = open(os.path.join(out, 'compare_faults.md')).read()
    assert f"| neighbourx4 | {programs['neighbourx4']['seconds']:.5f} | " \
           f"{programs['neighbourx4']['ratio_to_normal']:.3f} |" in table
    assert '| mecefo | neighbourx4 (2), normalx2 (6) |' in table


def test_one_seed_aggregate_has_no_spread_and_says_so(report):
    single, _, _, aggregate, out = report
    with open(os.path.join(out, 'compare_faults.json')) as f:
        assert json.load(f) == json.loads(json.dumps(aggregate))
    drop = aggregate['strategies']['mecefo']['throughput_drop_pct']
    assert drop['mean'] == single['strategies']['mecefo']['throughput_drop_pct']
    assert drop['std'] is None and drop['values'] == [drop['mean']]
    assert [r['strategy'] for r in aggregate['ranking']] == ['fault_free', 'mecefo']
    assert aggregate['ranking'][0]['significant'] is None
    assert aggregate['ranking'][0]['spread'] is None  # one seed: no spread
    table = open(os.path.join(out, 'compare_faults.md')).read()
    assert '| 1 | fault_free |' in table and '| n/a | n/a | n/a |' in table


def test_a_comparison_without_fault_free_reports_no_drop_instead_of_crashing():
    entry = {'modeled_tokens_per_sec': 7.5, 'unscaled_tokens_per_sec': 800.0,
             'wall_tokens_per_sec': 400.0, 'final_val_loss': 4.3, 'lost_steps': 0,
             'events': [], 'measured_overhead_sec': 1.0, 'relaunch_sec_modelled': 0.0}
    results = {'mecefo': dict(entry)}
    compare.add_relative_figures(results)
    assert results['mecefo']['throughput_drop_pct'] is None
    table = compare.markdown({'regime': 'high', 'schedule': '2:3:2', 'steps': 6,
                              'strategies': results})
    assert '| mecefo | 7.50 | n/a |' in table


# ------------------------------------------------ synthetic seed statistics


def _seed_report(seed, figures: dict) -> dict:
    """A per-seed `compare` report with the given {strategy: (tok/s, val loss)}."""
    strategies = {}
    for name, (tok_s, loss) in figures.items():
        strategies[name] = {
            'modeled_tokens_per_sec': tok_s, 'final_val_loss': loss, 'lost_steps': 0,
            'mean_step_ratio': 1.0, 'worst_step_ratio': 1.0, 'measured_overhead_sec': 0.5,
            'relaunch_sec_modelled': 0.0, 'unscaled_tokens_per_sec': 1.0,
            'wall_tokens_per_sec': 1.0, 'degraded_steps': 3, 'neighbour_steps': 0,
            'events': [{}, {}], 'program_steps': {'normalx2': 6},
            'slowest_program_steps': {'normalx2': 6}, 'val_curve': []}
    compare.add_relative_figures(strategies)
    return {'regime': 'high', 'fault_seed': seed, 'schedule': f'1:{seed}:2', 'steps': 6,
            'step_time_sec': 60.0, 'normal_program': 'normalx2',
            'programs': {'normalx2': {'seconds': 0.01 * (1 + seed), 'ratio_to_normal': 1.0}},
            'strategies': strategies}


def test_seed_statistics_and_ranking_significance():
    # Drops: a = 10 and 12 % (mean 11, std 1.414), b = 30 and 31 % (mean 30.5), c = 31 and 29 %.
    reports = [_seed_report(0, {'fault_free': (100.0, 4.0), 'a': (90.0, 4.1),
                                'b': (70.0, 4.2), 'c': (69.0, 4.2)}),
               _seed_report(1, {'fault_free': (100.0, 4.0), 'a': (88.0, 4.1),
                                'b': (69.0, 4.2), 'c': (71.0, 4.2)})]
    report = compare_over_seeds.aggregate(reports)
    drop_a = report['strategies']['a']['throughput_drop_pct']
    assert drop_a['mean'] == pytest.approx(11.0) and drop_a['std'] == pytest.approx(2 ** 0.5)
    assert (drop_a['min'], drop_a['max']) == pytest.approx((10.0, 12.0))
    assert report['strategies']['a']['events']['mean'] == 2
    assert report['programs']['normalx2']['seconds']['mean'] == pytest.approx(0.015)
    rows = {r['strategy']: r for r in report['ranking']}
    assert [r['strategy'] for r in report['ranking']] == ['fault_free', 'a', 'c', 'b']
    # a -> c: gap 19 points, spread sqrt(2) + sqrt(2): significant, and in every seed.
    assert rows['a']['significant'] and rows['a']['same_order_in_every_seed']
    # c -> b: means 30 and 30.5, gap 0.5 within std sum 2.12: not significant, order flips.
    assert rows['c']['significant'] is False and not rows['c']['same_order_in_every_seed']
    table = compare_over_seeds.seeds_markdown(report)
    assert '| 3 | c | 30.00 ± 1.41 [29.00, 31.00] | b | 0.50 | 2.12 | no | no |' in table
    assert '| 2 | a | 11.00 ± 1.41 [10.00, 12.00] | c | 19.00 | 2.83 | yes | yes |' in table
    assert '| a | 11.00 ± 1.41 [10.00, 12.00] |' in table


def test_baseline_wins_are_computed_with_both_figures():
    results = {'mecefo': {'modeled_tokens_per_sec': 80.0, 'final_val_loss': 4.00,
                          'mean_step_ratio': 1.5},
               'elastic': {'modeled_tokens_per_sec': 90.0, 'final_val_loss': 4.10,
                           'mean_step_ratio': 1.2},
               'drop': {'modeled_tokens_per_sec': 70.0, 'final_val_loss': 4.20,
                        'mean_step_ratio': 1.0}}
    wins = compare.baseline_wins(results)
    assert {'strategy': 'elastic', 'figure': 'modeled_tokens_per_sec', 'value': 90.0,
            'mecefo': 80.0, 'relative_pct': pytest.approx(12.5)} in wins
    assert {(w['strategy'], w['figure']) for w in wins} == {
        ('elastic', 'modeled_tokens_per_sec'), ('elastic', 'mean_step_ratio'),
        ('drop', 'mean_step_ratio')}  # both baselines are worse on the final loss
    assert compare.baseline_wins({'mecefo': results['mecefo']}) == []
    assert '| elastic | modeled_tokens_per_sec | 90 | 80 | 12.5 |' in compare.wins_table(wins)
