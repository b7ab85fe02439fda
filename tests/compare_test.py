"""The strategy comparison end to end on a short schedule, and its cost model."""
import json
import os

import pytest

from configs.tiny import get_config
from mecefo_jax import compare
from mecefo_jax.faults.cost_model import layout_keys
from mecefo_jax.faults.strategies import layout_for

STEPS = 6


@pytest.fixture(scope='module')
def report(tmp_path_factory):
    cfg = get_config()
    cfg.data.cache_dir = str(tmp_path_factory.mktemp('tokenizer_cache'))
    cfg.train.steps = STEPS
    cfg.fault.events = '2:3:2'  # replica 3 down for steps 2 and 3
    out = str(tmp_path_factory.mktemp('compare'))
    return compare.compare(cfg, '', out, runs=('fault_free', 'mecefo')), out, cfg


def test_writes_json_markdown_and_plot(report):
    result, out, _ = report
    with open(os.path.join(out, 'compare_faults.json')) as f:
        assert json.load(f) == json.loads(json.dumps(result))
    assert os.path.getsize(os.path.join(out, 'compare_faults.png')) > 0
    table = open(os.path.join(out, 'compare_faults.md')).read()
    assert '| fault_free |' in table and '| mecefo |' in table
    for entry in result['strategies'].values():
        for key in ('modeled_tokens_per_sec', 'throughput_drop_pct', 'wall_tokens_per_sec',
                    'final_val_loss', 'lost_steps', 'events'):
            assert key in entry


def test_fault_free_timeline_is_the_configured_step_time(report):
    result, _, cfg = report
    free = result['strategies']['fault_free']
    # Normalisation: a fault-free step lasts exactly fault.step_time_sec.
    assert free['modelled_compute_sec'] == pytest.approx(STEPS * cfg.fault.step_time_sec)
    assert free['throughput_drop_pct'] == 0.0
    assert free['events'] == []


def test_failure_events_carry_timings_and_the_neighbour_program_was_timed(report):
    result, _, cfg = report
    events = result['strategies']['mecefo']['events']
    assert [(e['kind'], e['step'], e['replicas']) for e in events] == [
        ('failure', 2, [3]), ('recovery', 4, [3])]
    for e in events:
        for key in ('detect_sec', 'rebuild_sec', 'compile_sec', 'restore_sec', 'first_step_sec'):
            assert e[key] >= 0.0
    mask = [True] * 8
    mask[3] = False
    seconds = result['role_seconds']
    failed_keys = [p.name for p in layout_keys(layout_for('mecefo', mask, 2))]
    # One neighbour joins its own and the adopted shard (2 + 2 rows); the rest stay normal.
    assert sorted(failed_keys) == ['neighbourx4', 'normalx2']
    assert all(key in seconds for key in failed_keys)
    # Steps 2 and 3 last step_time_sec x (slowest device / normal device);
    # the other four last step_time_sec.
    ratio = max(seconds[k] for k in failed_keys) / seconds['normalx2']
    expected = cfg.fault.step_time_sec * ((STEPS - 2) + 2 * ratio)
    assert result['strategies']['mecefo']['modelled_compute_sec'] == pytest.approx(expected)


def test_a_comparison_without_fault_free_reports_no_drop_instead_of_crashing():
    entry = {'modeled_tokens_per_sec': 7.5, 'unscaled_tokens_per_sec': 800.0,
             'wall_tokens_per_sec': 400.0, 'final_val_loss': 4.3, 'lost_steps': 0,
             'events': [], 'measured_overhead_sec': 1.0, 'relaunch_sec_modelled': 0.0}
    results = {'mecefo': dict(entry)}
    compare.add_relative_figures(results)
    assert results['mecefo']['throughput_drop_pct'] is None
    table = compare.markdown_table({'regime': 'high', 'schedule': '2:3:2', 'steps': 6,
                                    'strategies': results})
    assert '| mecefo | 7.50 | n/a |' in table and 'fault_free was not run' in table
