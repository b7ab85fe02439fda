"""The perplexity-under-failures script end to end on a tiny run, and its summary logic.

The end-to-end run is a subprocess of scripts/reproduce_quality.py (its own
flags and device setup, as a user runs it) on configs/tiny.py for 4 steps.
fault.step_time_sec=900 and fault.seed=8 give the `high` regime one outage
(replica 1 from step 1 on) inside those 4 steps; the schedule is recomputed
here, not copied. Three runs keep the module short: fault_free (reference),
mecefo:high (neighbour mode, gradient error) and ndb_naive:high (exact
gradients, so it must match fault_free). A persistent compilation cache lets
the runs share the programs they have in common.
"""
import json
import math
import os
import subprocess
import sys

import pytest

from configs.tiny import get_config
from mecefo_jax.config_resolve import resolve, updated
from mecefo_jax.faults import schedule as schedule_lib
from studies import quality

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, STEP_TIME, SEED, EVERY = 4, 900.0, 8, 2
RUNS = 'fault_free,mecefo:high,ndb_naive:high'


@pytest.fixture(scope='module')
def report(tmp_path_factory, tokenizer_cache):
    out = str(tmp_path_factory.mktemp('quality'))
    env = dict(os.environ, PYTHONPATH=ROOT,  # this checkout's package, not an installed one
               JAX_COMPILATION_CACHE_DIR=str(tmp_path_factory.mktemp('xla_cache')),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0')
    cmd = [sys.executable, os.path.join(ROOT, 'scripts', 'reproduce_quality.py'),
           '--config', os.path.join(ROOT, 'configs', 'tiny.py'), '--out', out, '--seeds', '1',
           '--runs', RUNS, '--grad_error_every', str(EVERY), '--evals', '1',
           f'--config.train.steps={STEPS}', f'--config.fault.step_time_sec={STEP_TIME}',
           f'--config.fault.seed={SEED}',
           f'--config.data.cache_dir={tokenizer_cache}']
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(os.path.join(out, 'quality.json')) as f:
        return json.load(f), out


def _high_schedule():
    fault = updated(resolve(get_config()), {
        'fault.regime': 'high', 'fault.step_time_sec': STEP_TIME, 'fault.seed': SEED}).fault
    events = schedule_lib.events_from_config(fault, num_replicas=8, total_steps=STEPS)
    sched = schedule_lib.FailureSchedule(events, 8)
    degraded = sum(not all(sched.live_mask(step)) for step in range(STEPS))
    return events, degraded


@pytest.mark.subprocess  # scripts/reproduce_quality.py
def test_one_row_per_run_with_the_failures_the_schedule_has(report):
    result, _ = report
    rows = {r['run']: r for r in result['rows']}
    assert list(rows) == ['fault_free', 'mecefo_high', 'ndb_naive_high']
    events, degraded = _high_schedule()
    assert events and degraded > 0  # the fixture's premise: high fails inside the run
    for name, row in rows.items():
        assert row['seed'] == SEED
        assert row['final_val_ppl'] == pytest.approx(math.exp(row['final_val_loss']))
        assert row['val_curve'][-1][0] == STEPS and row['train_curve']
        failing = name != 'fault_free'
        assert row['schedule'] == (schedule_lib.format_events(events) if failing else '')
        assert row['failures'] == (len(events) if failing else 0)
        assert row['degraded_steps'] == (degraded if failing else 0)
        assert row['neighbour_steps'] == (degraded if name == 'mecefo_high' else 0)
        assert row['skipped_examples'] == 0  # no drop run here: every example is computed
        # mecefo's adopter computes 2 of the 8 shards in neighbour mode while degraded.
        assert row['neighbour_row_pct'] == pytest.approx(
            100 * degraded * 2 / (STEPS * 8) if name == 'mecefo_high' else 0.0)
    assert rows['fault_free']['ppl_vs_fault_free_pct'] == 0.0
    assert result['runs']['mecefo_high']['final_val_ppl']['values'] == [
        rows['mecefo_high']['final_val_ppl']]


@pytest.mark.subprocess  # scripts/reproduce_quality.py
def test_exact_gradients_under_failures_match_fault_free(report):
    result, _ = report
    # ndb_naive computes the same examples exactly; only the float32 reduction
    # order over 7 instead of 8 devices differs, far below 0.01% after 4 steps.
    ndb = result['runs']['ndb_naive_high']['ppl_vs_fault_free_pct']['mean']
    assert abs(ndb) < 1e-2
    mecefo = result['runs']['mecefo_high']['ppl_vs_fault_free_pct']['mean']
    assert mecefo != 0.0  # neighbour mode did change training


@pytest.mark.subprocess  # scripts/reproduce_quality.py
def test_gradient_error_fields(report):
    result, _ = report
    row = next(r for r in result['rows'] if r['run'] == 'mecefo_high')
    samples = row['grad_error_samples']
    # The 1st, (EVERY+1)-th, ... neighbour-mode step, one sample per neighbour (one here).
    assert len(samples) == math.ceil(row['neighbour_steps'] / EVERY)
    for s in samples:
        # A neighbour contributes no attention gradient: ||0 - g|| / ||g|| is 1 exactly.
        assert s['attention'] == 1.0
        for group in ('ffn', 'other', 'total_non_attention'):
            assert math.isfinite(s[group]) and s[group] > 0.0
    summary = result['runs']['mecefo_high']['grad_error']
    assert summary['samples'] == len(samples)
    for group in ('attention', 'ffn', 'other', 'total_non_attention'):
        values = [s[group] for s in samples]
        assert summary[group]['mean'] == pytest.approx(sum(values) / len(values))
        assert summary[group]['max'] == max(values)
    for name in ('fault_free', 'ndb_naive_high'):
        assert result['runs'][name]['grad_error'] is None


@pytest.mark.subprocess  # scripts/reproduce_quality.py
def test_markdown_plot_and_target(report):
    result, out = report
    table = open(os.path.join(out, 'quality.md')).read()
    assert os.path.getsize(os.path.join(out, 'quality.png')) > 0
    for name in ('fault_free', 'mecefo_high', 'ndb_naive_high'):
        assert f'| {name} |' in table
    target = result['target']
    assert target['ours_pct'] == result['runs']['mecefo_high']['ppl_vs_fault_free_pct']['mean']
    assert target['met'] == (target['ours_pct'] <= target['bound_pct'])
    assert ('NOT met' in table) == (not target['met'])
    assert '| high | ' in table and '19.04 (+1.60%)' in table


# ------------------------------------------------------------ summary logic


def _row(run, seed, ppl, **extra):
    strategy, regime = ('fault_free', '') if run == 'fault_free' else run.rsplit('_', 1)
    return dict({'run': run, 'strategy': strategy, 'regime': regime, 'seed': seed,
                 'final_val_ppl': ppl, 'final_val_loss': math.log(ppl), 'failures': 2,
                 'degraded_steps': 5, 'neighbour_steps': 0, 'mean_live_replicas': 7.5,
                 'skipped_examples': 0, 'grad_error_samples': [], 'train_curve': [[1, 5.0]],
                 'val_curve': [[1, math.log(ppl)]]}, **extra)


def test_summary_pairs_each_run_with_the_fault_free_run_of_its_seed():
    cfg = updated(resolve(get_config()), {'train.steps': 300, 'fault.step_time_sec': 60.0})
    err = {'attention': 1.0, 'ffn': 0.5, 'other': 0.1, 'total_non_attention': 0.3}
    rows = [_row('fault_free', 0, 20.0), _row('fault_free', 1, 25.0),
            _row('mecefo_high', 0, 20.2, grad_error_samples=[dict(err, step=3)]),
            _row('mecefo_high', 1, 25.75, grad_error_samples=[dict(err, ffn=0.7, step=5)])]
    report = quality.summarise(rows, cfg=cfg, seeds=[0, 1], grad_error_every=10,
                               config_name='x')
    inc = report['runs']['mecefo_high']['ppl_vs_fault_free_pct']
    assert inc['values'] == pytest.approx([1.0, 3.0])  # 20.2 / 20, 25.75 / 25
    assert inc['mean'] == pytest.approx(2.0) and inc['std'] == pytest.approx(2 ** 0.5)
    bound = 100.0 * (19.04 / 18.74 - 1.0)
    assert report['target']['bound_pct'] == pytest.approx(bound)
    assert report['target']['met'] is False  # +2.0% > +1.60%
    grad = report['runs']['mecefo_high']['grad_error']
    assert grad['samples'] == 2 and grad['ffn'] == {'mean': pytest.approx(0.6), 'max': 0.7}
    # high: 300 steps of 60 s over a 0.5 h MTBF.
    assert report['expected_arrivals']['high'] == pytest.approx(10.0)
    assert '| mecefo | +1.60 | +2.00 | NOT met |' in quality.markdown(report)


def test_expected_arrivals_follow_the_regime_reading():
    """fault.regime_replicas=32 on 8 replicas: each replica fails as often as on
    32, so the cluster MTBF is 4x the regime's and a quarter of the arrivals."""
    cfg = updated(resolve(get_config()), {'train.steps': 300, 'fault.step_time_sec': 60.0,
                                         'fault.regime_replicas': 32})
    report = quality.summarise([_row('mecefo_high', 0, 20.0, replicas=8)], cfg=cfg, seeds=[0],
                               grad_error_every=10, config_name='x')
    assert report['mtbf_scale'] == 4.0
    assert report['expected_arrivals']['high'] == pytest.approx(2.5)  # 300 * 60 s / (4 * 0.5 h)
    assert 'fault.regime_replicas=32' in quality.markdown(report)


def test_summary_without_fault_free_leaves_the_target_unevaluated():
    cfg = updated(resolve(get_config()), {'train.steps': 10, 'fault.step_time_sec': 60.0})
    report = quality.summarise([_row('mecefo_high', 0, 20.0)], cfg=cfg, seeds=[0],
                               grad_error_every=10, config_name='x')
    assert report['runs']['mecefo_high']['ppl_vs_fault_free_pct'] is None
    assert report['target']['met'] is None
    assert '| mecefo | +1.60 | n/a | n/a |' in quality.markdown(report)


def test_runs_flag_is_checked():
    assert quality.parse_runs('fault_free, mecefo:high, mecefo_planned:high:cap=8') == (
        quality.Run('fault_free', ''), quality.Run('mecefo', 'high'),
        quality.Run('mecefo_planned', 'high', 8))
    assert quality.parse_runs('mecefo:high:attn=exact:w=0.25:top=2:proj=none') == (
        quality.Run('mecefo', 'high', projection='none', attention='exact', weight=0.25, top=2),)
    for bad, words in (('mecefo', 'needs a regime'), ('mecefo:extreme', 'needs a regime'),
                       ('fault_free:high', 'takes no regime'), ('magic:high', 'unknown'),
                       ('mecefo:high:cap=8', 'mecefo_planned plans only'),
                       ('mecefo_planned:high:cap=0', 'cap=N'),
                       ('mecefo_planned:high:8', 'cap=N'), ('mecefo:high:w=1.5', 'w=W'),
                       ('mecefo:high:attn=skip', 'attn=exact'), ('', 'empty')):
        with pytest.raises(ValueError, match=words):
            quality.parse_runs(bad)


def test_a_capped_planned_run_gets_its_own_name_and_cap_and_no_other_run_does():
    """The cap reaches the planned run's config only; the base config's is not inherited."""
    cfg = resolve(get_config())
    capped, plain = quality.parse_runs('mecefo_planned:high:cap=8, drop:high')
    assert quality.run_name(*capped) == 'mecefo_planned_high_cap8'
    assert quality.run_name(*plain) == 'drop_high'
    run_cfg = quality.run_config(cfg, capped, seed=3, evals=2)
    assert (run_cfg.fault.strategy, run_cfg.fault.max_neighbour_rows) == ('mecefo_planned', 8)
    assert quality.run_config(cfg, plain, seed=3, evals=2).fault.max_neighbour_rows == 0


def test_a_run_of_its_own_rank_gets_its_name_and_rank_and_no_other_run_does():
    cfg = resolve(get_config())
    ranked, capped_ranked, plain = quality.parse_runs(
        'mecefo:high:rank=16, mecefo_planned:high:cap=8:rank=16, drop:high')
    assert (ranked.rank, capped_ranked.cap, capped_ranked.rank) == (16, 8, 16)
    assert quality.run_name(*ranked) == 'mecefo_high_rank16'
    assert quality.run_name(*capped_ranked) == 'mecefo_planned_high_cap8_rank16'
    assert quality.run_config(cfg, ranked, seed=3, evals=2).mecefo.rank == 16
    assert quality.run_config(cfg, plain, seed=3, evals=2).mecefo.rank == cfg.mecefo.rank
    for bad in ('mecefo:high:rank=0', 'mecefo:high:rank=4:rank=5', 'mecefo:high:width=4'):
        with pytest.raises(ValueError, match="'rank=R'"):
            quality.parse_runs(bad)


def test_a_run_of_its_own_projection_rule_gets_its_name_and_rule_and_no_other_run_does():
    cfg = resolve(get_config())
    assert cfg.mecefo.projection == 'weights'
    sketched, ranked, plain = quality.parse_runs(
        'mecefo:high:proj=gradient, mecefo:high:rank=16:proj=gradient, drop:high')
    assert (sketched.projection, ranked.rank, ranked.projection) == ('gradient', 16, 'gradient')
    assert quality.run_name(*sketched) == 'mecefo_high_projgradient'
    assert quality.run_name(*ranked) == 'mecefo_high_rank16_projgradient'
    assert quality.run_config(cfg, sketched, seed=3, evals=2).mecefo.projection == 'gradient'
    assert quality.run_config(cfg, plain, seed=3, evals=2).mecefo.projection == 'weights'
    with pytest.raises(ValueError, match="'proj=svd': the projection rule \\(mecefo.projection\\) "
                                         "is one of weights, gradient"):
        quality.parse_runs('mecefo:high:proj=svd')
    for bad in ('mecefo:high:proj=gradient:proj=weights', 'mecefo:high:projection=gradient'):
        with pytest.raises(ValueError, match="'proj=P'"):
            quality.parse_runs(bad)
