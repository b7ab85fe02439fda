"""The verdict study: its points, its seeds, and its report held to the committed records.

The study's runs take hours (`scripts/verdict.py`); what is tested here is what
it is made of: each point moves the axes it names and keeps the tokens per
step, each seed sets its own data order, and the committed report
(`docs/results/verdict.json`) is exactly what the committed records
(`docs/results/verdict_runs/`) give, its map included.
"""
import json
import os

import pytest

from configs.small import get_config
from mecefo_jax.config.resolve import resolve, updated
from studies import verdict_model as vm
from studies import verdict_points as vp
from studies import verdict_report as vr
from studies.runs import run_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, 'docs', 'results')


def _point_cfg(name):
    return resolve(vp.point_config(get_config(), vp.POINTS[name]))


# The points built from configs/small.py alone. paper_like_60m reads a corpus exported
# and carried for its GPU (studies/corpus_export.py): tests/verdict_gpu_test.py builds it.
CPU_POINTS = {name: point for name, point in vp.POINTS.items() if point.late is None}


def test_every_point_keeps_the_tokens_per_step_and_moves_what_it_names():
    small = _point_cfg('small')
    tokens = small.data.global_batch_size * small.data.seq_len
    for name, point in CPU_POINTS.items():
        cfg = _point_cfg(name)
        assert cfg.data.global_batch_size * cfg.data.seq_len == tokens, name
        assert point.min_seeds >= (6 if name == 'paper_like' else 4), name
    paper = _point_cfg('paper_like')
    assert paper.mesh.replicas == 32 and paper.fault.max_concurrent == 1
    assert paper.data.source == 'python_docs' and paper.train.steps == 4 * small.train.steps
    # 4x the steps, the same failures per fraction of the run
    assert paper.fault.step_time_sec * 4 == small.fault.step_time_sec
    for name in ('small', 'paper_like'):  # mecefo against the control at both ends
        assert vr.CONTROL in [run_name(*r) for r in vp.runs_of(vp.POINTS[name])]


def test_the_capped_plan_differs_from_mecefo_at_every_point():
    """With one failure, each point's capped plan approximates fewer rows than mecefo's two
    shards: a cap of 8 splits a 4-row shard over helpers; where shards are 1 row (and cap 8
    would plan mecefo's layout), cap 1 takes a mixed helper that computes its own row exactly."""
    from mecefo_jax.faults.planner import Planner
    from mecefo_jax.faults.strategies import layout_for
    for name, point in CPU_POINTS.items():
        cfg = _point_cfg(name)
        replicas = cfg.mesh.replicas or cfg.mesh.num_cpu_devices
        shard = cfg.data.global_batch_size // replicas
        live = [r != 5 for r in range(replicas)]
        plan = Planner(shard, max_neighbour_rows=point.cap).layout(live)
        mecefo = layout_for('mecefo', live, shard)
        assert plan.neighbour_mode_rows() < mecefo.neighbour_mode_rows(), name
        if shard == 1:
            assert Planner(shard, max_neighbour_rows=8).layout(live).neighbour_mode_rows() == 2


def test_each_seed_sets_the_data_order_and_every_strategy_of_a_seed_shares_it(tokenizer_cache):
    """run_config sets data.seed to the seed: the first batches differ between seeds and are
    the same for every strategy of one seed."""
    import numpy as np

    from configs.tiny import get_config as tiny
    from mecefo_jax.config.resolve import updated
    from mecefo_jax.data.pipeline import make_pipeline
    from studies.runs import Run, run_config
    base = updated(resolve(tiny()), {'data.cache_dir': tokenizer_cache})

    def first_batches(run, seed):
        cfg = run_config(base, run, seed, evals=1)
        pipeline = iter(make_pipeline(cfg.data, vocab_size=cfg.model.vocab_size, num_shards=1))
        return np.stack([next(pipeline) for _ in range(2)])
    batches = {(strategy, seed): first_batches(Run(strategy, 'high'), seed)
               for strategy in ('drop', 'mecefo') for seed in (0, 1)}
    for seed in (0, 1):
        np.testing.assert_array_equal(batches['drop', seed], batches['mecefo', seed])
    assert not np.array_equal(batches['drop', 0], batches['drop', 1])


@pytest.mark.parametrize('mecefo, side', [((0.85, 0.86, 0.84, 0.85), '+'),
                                          ((0.95, 0.96, 0.94, 0.95), '−'),
                                          ((0.80, 1.00, 0.85, 0.95), '='),
                                          ((0.85,), 'one seed')])
def test_the_map_says_which_side_of_zero_a_paired_t_interval_is_on(mecefo, side):
    goodput = {'fault_free': [1.0] * len(mecefo), 'drop_high': [0.9] * len(mecefo),
               'mecefo_high': list(mecefo)}
    drop_minus = vr.paired(goodput, 'drop_high')
    means = {n: {'mean': sum(v) / len(v)} for n, v in goodput.items()}
    row = vr.point_map(means, drop_minus, None, {'mecefo': 'mecefo_high', 'capped plan': 'not_run'})
    assert list(row['drop_minus']) == ['mecefo']  # a contender the point has not run is left out
    assert row['drop_minus']['mecefo']['side'] == side
    assert row['best'] == ('mecefo_high' if means['mecefo_high']['mean'] > 0.9 else 'drop_high')
    assert row['mecefo_minus_control'] is None


def test_steps_and_perplexity_are_paired_against_drop_seed_by_seed():
    """Above 0 means drop is ahead for every figure; a seed where a run never reached the
    target leaves the steps' pair, not the perplexity's."""
    steps = {'fault_free': [300, 300, 300], 'drop_high': [310, 320, 330], 'mecefo_high': [315, None, 340]}
    ppl = {'drop_high': [1.0, 2.0, 3.0], 'mecefo_high': [2.0, 2.5, 3.0]}
    paired_steps = vr.paired(steps, 'drop_high', -1)['mecefo_high']
    assert paired_steps['mean'] == pytest.approx((5 + 10) / 2) and paired_steps['n'] == 2
    paired_ppl = vr.paired(ppl, 'drop_high', -1)['mecefo_high']
    assert paired_ppl['mean'] == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    assert paired_ppl['lo'] <= paired_ppl['mean'] <= paired_ppl['hi']


def test_the_report_says_how_many_seeds_would_separate_a_run_from_drop():
    """The seeds a paired t test at 80% power needs (intervals.seeds_to_separate); infinite
    where the mean difference is 0, 2 where the differences do not spread."""
    goodput = {'drop_high': [0.9, 0.9, 0.9, 0.9], 'mecefo_high': [0.89, 0.87, 0.85, 0.83],
               'elastic_high': [0.8, 0.8, 0.8, 0.8], 'drop_adopters_high': [0.91, 0.89, 0.91, 0.89]}
    paired = vr.paired(goodput, 'drop_high')
    assert vr._seeds_needed(paired['mecefo_high']) == '6'  # the normal approximation says 4
    assert vr._seeds_needed(paired['drop_adopters_high']) == '∞'
    assert vr._seeds_needed(paired['elastic_high']) == '2'
    assert vr._seeds_needed(None) == 'n/a'


def test_only_the_runs_every_seed_has_are_reported(tmp_path):
    for seed, runs in ((0, ('fault_free', 'drop_high', 'mecefo_high')),
                       (1, ('fault_free', 'drop_high')), (2, ('drop_high',))):
        os.makedirs(tmp_path / f'seed{seed}')
        for run in runs:
            (tmp_path / f'seed{seed}' / f'{run}.json').write_text(json.dumps({'run': run}))
    records = vr.load_records(str(tmp_path), order=('fault_free', 'drop_high'))
    assert list(records) == [0, 1]  # seed 2 has no fault-free run yet
    assert all(list(runs) == ['fault_free', 'drop_high'] for runs in records.values())
    # a seed still training (only its fault-free run) does not hide the finished seeds' runs
    os.makedirs(tmp_path / 'seed3')
    (tmp_path / 'seed3' / 'fault_free.json').write_text(json.dumps({'run': 'fault_free'}))
    records = vr.load_records(str(tmp_path), require=('drop_high',))
    assert list(records) == [0, 1] and list(records[0]) == ['drop_high', 'fault_free']


def test_the_committed_report_is_what_the_committed_records_give():
    with open(os.path.join(RESULTS, 'verdict.json')) as f:
        committed = json.load(f)
    built = json.loads(json.dumps(vr.build(os.path.join(RESULTS, 'verdict_runs'))))
    assert built == committed
    assert built['interval'] == 't' and built['command'] == vr.COMMAND
    for name, point in built['points'].items():
        cfg = _point_cfg(name)
        assert point['interval'] == 't' and point['time_model'] in ('steps', 'wall_clock'), name
        assert point['tokens_per_step'] == cfg.data.global_batch_size * cfg.data.seq_len
        assert point['model_params'] == point['allreduce']['clock']['model_params']
        assert set(point['runs']) >= {'fault_free', vp.DEFAULT}, name
        costs = point['costs']
        assert set(costs) == set(vr.COSTS) and costs['h200']['phi'] == 0.0
        # Each cost names the phi that priced it and the one its records' clock ran at: the point's own 1M step's
        # (as the runs took it, `verdict_points.wall_clock`) for the FLOP column, the bench's 350M step's beside the
        # H200's ratios.
        clock = point['allreduce']['clock']
        assert clock['ran_at'] == round(clock['phi'], 4) == costs['flops_allreduce']['phi']
        assert costs['h200_allreduce']['phi'] == point['allreduce']['bench']['phi'] > 0
        assert point['allreduce']['bench']['model_params'] > 300e6 > point['model_params']
        # The rate model prices one failure at the column's own diluted step.
        one = {label: entry['model']['one_failure_steps']['mecefo'] for label, entry in costs.items()}
        assert one['h200_allreduce'] - 1 == pytest.approx((one['h200'] - 1) * (1 - costs['h200_allreduce']['phi']))
        for label, entry in costs.items():
            assert entry['clock_phi'] == clock['ran_at']
            assert (f"φ {entry['phi']:.3f}" in entry['name']) == bool(entry['phi']), entry['name']
            assert vm.break_even_v(point['replicas'], one[label]) == entry['model']['break_even_v']
            goodput = {n: r['goodput'][label] for n, r in point['runs'].items()}
            best = entry['map']['best']
            assert goodput[best]['mean'] == max(g['mean'] for n, g in goodput.items()
                                                if g and n != 'fault_free'), (name, label)
            for diff in entry['paired'].values():  # enough seeds at 80% power: 0 is excluded
                if diff['seeds_needed'] is not None and diff['seeds_needed'] <= diff['n']:
                    assert diff['side'] in '+−', (name, label, diff)
        assert point['hours']['wall'] > 0


def test_the_readme_and_docs_lead_with_the_committed_map():
    """README.md's verdict table is `map_table(readme=True)` (at most 6 columns), docs/verdict.md's map is
    `map_table`; paste what `python scripts/verdict.py --report_only` prints."""
    with open(os.path.join(RESULTS, 'verdict.json')) as f:
        report = json.load(f)
    lines = vr.map_table(report, readme=True).split('\n')
    assert len(lines) == 2 + len(report['points']) and lines[0].count('|') - 1 <= 6
    for doc, want in (('README.md', lines), (os.path.join('docs', 'verdict.md'),
                                             vr.map_table(report).split('\n'))):
        with open(os.path.join(ROOT, doc)) as f:
            text = f.read()
        missing = [line for line in want if line not in text]
        assert not missing, f'{doc} lacks the map of docs/results/verdict.json: {missing}'


@pytest.mark.parametrize('replicas, step', [(8, 1.0), (8, 1.293), (32, 1.042), (32, 1.0 + 1 / 31)])
def test_at_the_break_even_v_mecefo_progresses_as_fast_as_drop(replicas, step):
    """The rates of verdict_model's docstring, computed here from their definition."""
    v = vm.break_even_v(replicas, step)
    mecefo_rate = (replicas - 2 + 2 * v) / replicas / step
    drop_rate = (replicas - 1) / replicas
    assert mecefo_rate == pytest.approx(drop_rate, rel=1e-12)
    if step == 1.0:
        assert v == 0.5  # an approximated row must be worth half an exact one
    if step == 1.0 + 1 / 31:
        assert v == pytest.approx(1.0)  # 32 replicas: 1/31 slower needs a perfect row


@pytest.mark.parametrize('replicas, v', [(8, 0.46), (32, 0.66), (32, 0.5), (8, 1.0)])
def test_at_the_break_even_step_mecefo_progresses_as_fast_as_drop(replicas, v):
    """The step c* read from a measured v, checked on the rates' definitions; it inverts
    break_even_v, and a row worth under half an exact one needs a neighbour faster than free."""
    step = vm.break_even_step(replicas, v)
    assert (replicas - 2 + 2 * v) / replicas / step == pytest.approx((replicas - 1) / replicas,
                                                                     rel=1e-12)
    assert (step < 1.0) == (v < 0.5)
    if step >= 1.0:
        assert vm.break_even_v(replicas, step) == pytest.approx(v, rel=1e-12)
    else:  # no neighbour is faster than the normal replicas it waits for
        assert vm.break_even_v(replicas, step) == 0.5 > v


@pytest.mark.parametrize('replicas, helpers, step', [(32, 2, 0.877), (32, 2, 1.1), (8, 3, 1.0),
                                                     (32, 1, 1.042)])
def test_a_failed_shard_split_over_k_neighbours_breaks_even_where_the_rates_meet(
        replicas, helpers, step):
    """(k + 1) shards approximated per failure, at the slower of the neighbour's step and a
    normal one: the rates of the definition meet at break_even_v(..., helpers=k)."""
    v = vm.break_even_v(replicas, step, helpers=helpers)
    approximated = helpers + 1
    mecefo_rate = (replicas - approximated + approximated * v) / replicas / max(step, 1.0)
    assert mecefo_rate == pytest.approx((replicas - 1) / replicas, rel=1e-12)
    if step <= 1.0:
        assert v == pytest.approx(helpers / (helpers + 1))  # a free split needs k/(k+1)


def test_the_best_split_takes_the_fewest_neighbours_that_cost_no_time():
    from mecefo_jax.faults.costs import CostTable
    # The H200's 350M ratios: 1 shard 0.663, 2 shards 1.042 in neighbour mode.
    table = CostTable(source='test', exact=((1.0, 1.0), (2.0, 1.65)),
                      neighbour=((1.0, 0.663), (2.0, 1.042)), step_sec=1.0, step_sec_source='')
    best = vm.best_split(table, 32)
    assert best['helpers'] == 2 and best['break_even_v'] == pytest.approx(2 / 3)
    assert best['neighbour_step'] == pytest.approx((0.663 + 1.042) / 2)
    # A neighbour that takes two shards for free needs no second helper.
    free = CostTable(source='test', exact=((1.0, 1.0), (2.0, 2.0)),
                     neighbour=((1.0, 0.4), (2.0, 0.9)), step_sec=1.0, step_sec_source='')
    assert vm.best_split(free, 32) == {'helpers': 1, 'neighbour_step': pytest.approx(0.9),
                                       'break_even_v': pytest.approx(0.5)}
    # An exposed all-reduce (phi 0.5) halves every neighbour's step's distance from 1.
    diluted = vm.best_split(table, 32, exposed=0.5)
    assert diluted['helpers'] == 2 and diluted['break_even_v'] == pytest.approx(2 / 3)
    assert diluted['neighbour_step'] == pytest.approx(1 + ((0.663 + 1.042) / 2 - 1) / 2)


def test_v_has_fiellers_interval_over_the_seeds():
    """v = 1 - r, r mecefo's mean steps lost over the control's: its interval is the set of r
    whose paired differences' t interval holds 0 (intervals.ratio_interval), mirrored."""
    from studies.intervals import ratio_interval
    per_seed = {'fault_free': [300.0, 290.0, 310.0, 300.0, 305.0],
                'mecefo_high': [310.0, 305.0, 318.0, 306.0, 316.0],
                'drop_adopters_high': [320.0, 310.0, 330.0, 322.0, 324.0]}
    v = vm.measured_v_interval(per_seed)
    free, ours, control = (sum(x) / len(x) for x in per_seed.values())
    assert v['mean'] == pytest.approx(1 - (ours - free) / (control - free)) and v['seeds'] == 5
    lost, control = ([a - f for a, f in zip(per_seed[n], per_seed['fault_free'])]
                     for n in ('mecefo_high', 'drop_adopters_high'))
    lo, hi = ratio_interval(lost, control)
    assert (v['lo'], v['hi']) == pytest.approx((1 - hi, 1 - lo)) and v['lo'] < v['mean'] < v['hi']
    one = vm.measured_v_interval({n: x[:1] for n, x in per_seed.items()})
    assert one['mean'] == pytest.approx(0.5) and one['lo'] is one['hi'] is None  # no interval
    # A seed where one of the three runs never reached the target is left out, paired.
    gap = {**per_seed, 'mecefo_high': [None, *per_seed['mecefo_high'][1:]]}
    assert vm.measured_v_interval(gap)['seeds'] == 4


def test_v_is_measured_against_the_drop_the_same_rows_control():
    steps = {'fault_free': [300.0], 'mecefo_high': [310.0], 'drop_adopters_high': [320.0]}
    assert vm.measured_v_interval(steps)['mean'] == pytest.approx(0.5)
    assert vm.measured_v_interval({**steps, 'drop_adopters_high': [300.0]}) is None  # the control lost none
    assert vm.measured_v_interval({k: v for k, v in steps.items() if k != 'drop_adopters_high'}) is None
    assert vm.measured_v_interval({**steps, 'mecefo_high': [None]}) is None  # no seed has all three


def test_one_failure_steps_price_drop_elastic_and_the_neighbour():
    for name in ('small', 'paper_like'):
        cfg = _point_cfg(name)
        n = cfg.mesh.replicas or cfg.mesh.num_cpu_devices
        steps = vm.model_row(cfg, n, 'analytic')['one_failure_steps']
        assert steps['drop'] == 1.0 and steps['elastic'] >= 1 + 1 / (n - 1)
        assert 1.0 < steps['mecefo'] < 2.0  # two shards, cheaper than two exact ones


def _paper_like_records():
    point = vp.POINTS['paper_like']
    return point, vr.load_records(os.path.join(RESULTS, 'verdict_runs', 'paper_like'),
                                  order=[run_name(*r) for r in vp.runs_of(point)], require=(vp.DEFAULT,))


def test_the_stored_derived_records_are_their_replay_on_the_controllers_clock():
    """elastic's and checkpoint_restart's stored records are `derived_record` on their trace with steps alone
    advancing the clock, as they were made; the report replays them again with the pauses on it
    (`verdict_clock.replayed`, its cost entries' `replay_moves`)."""
    from mecefo_jax.failure_schedule import parse_events
    from studies import time_to_target as ttt
    from studies.runs import Run
    from studies.time_to_target_settings import Settings
    point, records = _paper_like_records()
    cfg, settings = _point_cfg('paper_like'), Settings(**point.settings)
    for seed, runs in records.items():
        for name in ('elastic_high', 'checkpoint_restart_high'):
            stored = runs[name]
            run_cfg = ttt.experiment_config(cfg, Run(stored['strategy'], 'high'), seed, settings)
            run_cfg = updated(run_cfg, {'fault.time_model': stored['time_model'],
                                           'fault.allreduce_exposed': stored['allreduce_exposed']})
            replayed = ttt.derived_record(stored['strategy'], parse_events(stored['schedule']), run_cfg,
                                          cfg.mesh.replicas, cfg.train.steps)
            assert {k: stored[k] for k in ('executed', 'layouts', 'events', 'saves')} == \
                {k: replayed[k] for k in ('executed', 'layouts', 'events', 'saves')}, (seed, name)
            assert not stored.get('pauses_on_clock')


def test_the_clock_bound_is_nothing_where_the_column_is_the_clock_and_nothing_pauses():
    """A trained run priced on its own clock with changes that cost no time has nothing to re-clock; with the
    changes' stated seconds, or at the H200's ratios, its bound is positive and small."""
    import dataclasses

    from studies import time_to_target_report as ttt_report
    from studies import verdict_clock
    from studies.goodput import TimeCosts
    _, records = _paper_like_records()
    cfg = _point_cfg('paper_like')
    free = {f.name: 0.0 for f in dataclasses.fields(TimeCosts) if f.name.endswith('_sec')}
    still = ttt_report.time_models(updated(cfg, {'fault.relaunch_delay_sec': 0.0}), 32, TimeCosts(**free))
    clock = ttt_report.time_models(cfg, 32, None)
    with open(vr.BENCH) as f:
        h200 = ttt_report.time_models(cfg, 32, None, json.load(f), exposed=0.0)
    seed = {s: {n: r[n] for n in ('fault_free', vp.MECEFO_RUN)} for s, r in records.items()}
    for model_for, zero in ((still, True), (clock, False), (h200, False)):
        rows = ttt_report.figures_per_seed(seed, model_for, cfg.train.steps)
        bounds = verdict_clock.mean_bounds(seed, rows, model_for, clock, 32)
        assert bounds['fault_free'] == 0.0
        assert (bounds[vp.MECEFO_RUN] == 0.0) == zero and bounds[vp.MECEFO_RUN] < 0.05
