"""The time-to-target experiment: its smoke run end to end, the runs it derives instead of
training, its arithmetic, and the learning-rate horizon that lets a run go on.

The smoke run (`time_to_target.smoke`: configs/tiny.py, 8 steps, 2 seeds;
`high` takes replica 4 down at step 5 in seed 0 and fails seed 1 only after
8 steps) trains fault_free and mecefo (seed 0) and derives the rest. Then
elastic and checkpoint_restart are trained for real under explicit events
(replica 4 down for steps 3 to 5) and must equal the fault-free run of seed 0
and the replay of their controllers; and mecefo, trained from step 0 instead
of from the fault-free state, must equal the smoke run's; and elastic, trained on the
wall clock, must equal its replay on the trace as its own steps meet it. The
failures share one live set, so few programs compile.
"""
import json
import math
import os

import pytest

from configs.tiny import get_config
from mecefo_jax.config.defaults import ConfigError
from mecefo_jax.config.resolve import resolve, updated
from mecefo_jax.failure_schedule import events_from_config, parse_events
from mecefo_jax.model import optim
from studies import goodput
from studies import time_to_target as ttt
from studies import time_to_target_report as report_lib
from studies import time_to_target_settings as setup
from studies.replay import replay
from studies.runs import Run, run_name


@pytest.fixture(scope='module')
def smoke(tmp_path_factory, tokenizer_cache):
    base = updated(resolve(get_config()), {'data.cache_dir': tokenizer_cache})
    cfg, seeds, runs, default, settings = setup.smoke(base)
    out = str(tmp_path_factory.mktemp('ttt'))
    lines = []
    report = ttt.time_to_target(cfg, out, seeds=seeds, runs=runs, default=default,
                                settings=settings, config_name='tiny', log=lines.append)
    return report, out, cfg, settings, lines


def _record(out, seed, name):
    with open(os.path.join(out, f'seed{seed}', f'{name}.json')) as f:
        return json.load(f)


def test_smoke_report_has_every_figure(smoke):
    report, out, cfg, _, lines = smoke
    for ext in ('json', 'md', 'png'):
        assert os.path.getsize(os.path.join(out, f'time_to_target.{ext}')) > 0
    assert report['seeds'] == [0, 1] and report['default'] == 'mecefo_high'
    assert list(report['runs']) == ['fault_free', 'mecefo_high', 'elastic_high',
                                    'checkpoint_restart_high']
    free = report['runs']['fault_free']
    assert free['goodput']['per_seed'] == [1.0, 1.0] and free['reached'] == [0, 1]
    for name, r in report['runs'].items():
        for key in ('goodput', 'ppl_increase_pct'):
            s = r[key]
            assert len(s['per_seed']) == 2 and s['lo'] <= s['mean'] <= s['hi'], (name, key)
        for seed in r['seeds']:
            # Every run reaches at least train.steps; goodput is 0 exactly when not reached.
            assert seed['stopped_at'] >= cfg.train.steps
            assert (seed['goodput'] > 0) == seed['reached']
    assert set(report['paired']) == {'elastic_high', 'checkpoint_restart_high'}
    for p in report['paired'].values():
        d = p['vs_default']
        assert p['significant'] == (d['lo'] > 0 or d['hi'] < 0)
    table = open(os.path.join(out, 'time_to_target.md')).read()
    assert table.index('## Goodput') < table.index('## Paired') < table.index('## Validation perplexity')
    # One line per run start and end.
    assert sum(': start (' in line for line in lines) == 8 and len(lines) == 16
    assert report['runs']['mecefo_high']['seeds'][1]['how'].startswith('fault_free: no failure')


def test_the_fault_free_run_stops_at_train_steps_and_fails_runs_go_on(smoke):
    _, out, cfg, settings, _ = smoke
    steps = cfg.train.steps
    for seed in (0, 1):
        free = _record(out, seed, 'fault_free')
        assert [e[1] for e in free['executed']] == list(range(steps))
        due = settings.evaluate_at(steps)
        assert [s for s, _ in free['val_curve']] == [n for n in range(1, steps + 1) if due(n)]
        mecefo = _record(out, seed, 'mecefo_high')
        target = free['val_curve'][-1][1]
        last_step, last_loss = mecefo['val_curve'][-1]
        # Stopped at the first evaluation from train.steps on that reached the target, or at the limit.
        assert (last_loss <= target) or last_step == settings.limit(steps)
        assert all(v > target for s, v in mecefo['val_curve'] if steps <= s < last_step)


def test_derived_runs_are_the_fault_free_curve_on_their_own_clock(smoke):
    report, out, *_ = smoke
    for seed in (0, 1):
        free = _record(out, seed, 'fault_free')
        for name in ('elastic_high', 'checkpoint_restart_high'):
            record = _record(out, seed, name)
            assert record['val_curve'] == free['val_curve'] and record['how'].startswith('derived')
    assert report['runs']['elastic_high']['ppl_increase_pct']['per_seed'] == [0.0, 0.0]


def _layouts(record):
    """The executed steps with their layouts spelled out (layout numbers are per record)."""
    return [(clock, step, record['layouts'][i]) for clock, step, i in record['executed']]


EVENTS = '3:4:3'  # replica 4 down for steps 3, 4 and 5


@pytest.fixture(scope='module')
def trained(smoke, tmp_path_factory, monkeypatch_module):
    """elastic and checkpoint_restart under EVENTS, and mecefo from step 0 instead of from
    the fault-free state; and the steps checkpoint/restart saved."""
    from mecefo_jax.checkpointing.checkpoint import Checkpointer
    report, out, cfg, settings, _ = smoke
    cfg = updated(cfg, {'train.eval_batches': report['eval']['eval_batches']})  # as the smoke ran
    saved = []
    original = Checkpointer.maybe_save

    def recording(self, step, state, data_state, *, force=False):
        if os.path.basename(self.directory) == 'restart_checkpoints' and (
                force or step % self.save_every == 0) and step not in self.all_steps():
            saved.append(step)
        return original(self, step, state, data_state, force=force)
    monkeypatch_module.setattr(Checkpointer, 'maybe_save', recording)
    work = tmp_path_factory.mktemp('trained')
    records = {}
    for strategy in ('elastic', 'checkpoint_restart', 'mecefo'):
        run_cfg = ttt.experiment_config(cfg, Run(strategy, 'high'), 0, settings)
        if strategy != 'mecefo':
            run_cfg = updated(run_cfg, {'fault.regime': '', 'fault.events': EVENTS})
        target = None if strategy != 'mecefo' else _record(out, 0, 'fault_free')['val_curve'][-1][1]
        records[strategy] = ttt.train_record(run_cfg, str(work / strategy), steps=cfg.train.steps,
                                             target=target, settings=settings)
    wall_cfg = updated(ttt.experiment_config(cfg, Run('elastic', 'high'), 0, settings), WALL_CLOCK)
    records['elastic_wall_clock'] = ttt.train_record(wall_cfg, str(work / 'elastic_wall_clock'),
                                                     steps=cfg.train.steps, target=None,
                                                     settings=settings)
    return records, saved


# elastic on the wall clock: replica 4 down for 5 fault-free steps from step 2, which its
# slower steps (1.5 normal shards, diluted by phi 0.3) live through in 4.
WALL_CLOCK = {'fault.regime': '', 'fault.events': '2:4:5', 'fault.time_model': 'wall_clock',
              'fault.allreduce_exposed': 0.3}


@pytest.fixture(scope='module')
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_trained_elastic_and_checkpoint_restart_equal_the_fault_free_run(smoke, trained):
    _, out, *_ = smoke
    records, _ = trained
    free = dict(_record(out, 0, 'fault_free')['val_curve'])
    for strategy in ('elastic', 'checkpoint_restart'):
        assert records[strategy]['events'], 'the premise: failures inside the run'
        curve = dict(records[strategy]['val_curve'])
        assert sorted(curve) == sorted(free)
        # The same samples, exact gradients: only float32 summation order differs (shards
        # of another size, over fewer devices), a few ulps of the loss after 8 steps.
        for step, loss in curve.items():
            assert loss == pytest.approx(free[step], abs=1e-5), (strategy, step)


def test_the_replay_is_what_the_controllers_did(smoke, trained):
    _, _, cfg, _, _ = smoke
    records, saved = trained
    model = goodput.TimeModel(cfg, 8, goodput.TimeCosts())
    for strategy in ('elastic', 'checkpoint_restart'):
        derived = replay(strategy, parse_events(EVENTS), num_replicas=8, shard_batch=2,
                         steps=cfg.train.steps, checkpoint_every=cfg.fault.checkpoint_every)
        real = records[strategy]
        assert _layouts(derived) == _layouts(real)
        assert derived['events'] == real['events']
        assert derived['refresh_steps'] == real['refresh_steps'] == []
        if strategy == 'checkpoint_restart':  # the steps the trained controller saved
            assert saved == derived['saves'] and derived['events'][0]['lost_steps'] > 0
        else:
            assert derived['saves'] == []
        real_saves = saved if strategy == 'checkpoint_restart' else []
        assert model.timeline(dict(real, saves=real_saves))[0] == model.timeline(derived)[0]


def test_the_wall_clock_replay_is_what_the_controller_did(smoke, trained):
    """A derived run on the wall clock: the trace as its own steps meet it
    (`wall_clock_events`), replayed, gives the trained controller's layouts and events."""
    _, _, cfg, settings, _ = smoke
    real = trained[0]['elastic_wall_clock']
    run_cfg = updated(ttt.experiment_config(cfg, Run('elastic', 'high'), 0, settings), WALL_CLOCK)
    events = ttt.wall_clock_events('elastic', parse_events(WALL_CLOCK['fault.events']), run_cfg, 8)
    assert [(e.step, e.replica, e.duration_steps) for e in events] == [(2, 4, 4)]
    derived = replay('elastic', events, num_replicas=8, shard_batch=2, steps=cfg.train.steps,
                     checkpoint_every=cfg.fault.checkpoint_every)
    assert _layouts(derived) == _layouts(real) and derived['events'] == real['events']


def test_a_run_started_from_the_fault_free_state_is_the_run_from_step_0(smoke, trained):
    _, out, *_ = smoke
    forked = _record(out, 0, 'mecefo_high')
    assert forked['how'].startswith('trained from the fault-free state at step')
    scratch = trained[0]['mecefo']
    assert _layouts(scratch) == _layouts(forked)
    assert [list(x) for x in scratch['val_curve']] == forked['val_curve']
    assert scratch['refresh_steps'] == forked['refresh_steps']


def test_a_seeds_figures_do_not_depend_on_the_other_seeds(smoke):
    report, out, cfg, settings, _ = smoke
    names = list(report['runs'])
    one = {0: {name: _record(out, 0, name) for name in names}}
    alone = report_lib.summarise(one, cfg=cfg, settings=settings, default='mecefo_high',
                                 val_split_batches=report['val_noise']['val_split_batches'])
    for name in names:
        assert alone['runs'][name]['goodput']['per_seed'] == \
            report['runs'][name]['goodput']['per_seed'][:1]


def test_a_finished_run_is_not_run_again_and_an_interrupted_one_is(smoke):
    report, out, cfg, settings, _ = smoke
    # As a command killed while training seed 0's mecefo_high leaves it: no result, and
    # a work directory holding part of a run.
    os.remove(os.path.join(out, 'seed0', 'mecefo_high.json'))
    with open(os.path.join(out, 'seed0', 'work', 'mecefo_high', 'metrics.jsonl'), 'a') as f:
        f.write('{"step": 99, "loss": 1.0}\n')
    lines = []
    again = ttt.time_to_target(cfg, out, seeds=(0, 1), runs=setup.smoke(cfg)[2],
                               default='mecefo_high', settings=settings, config_name='tiny',
                               log=lines.append)
    assert [line.split(':')[:2] for line in lines] == [['[ttt] seed 0', ' mecefo_high']] * 2
    # Trained again (from the fault-free state), it gives the same figures.
    assert json.dumps(again['runs'], sort_keys=True) == json.dumps(report['runs'], sort_keys=True)


# ------------------------------------------------------------ the arithmetic


def test_time_to_target_interpolates_between_the_bracketing_evaluations():
    times = {10: 100.0, 20: 200.0, 30: 400.0}
    curve = [(10, 3.0), (20, 2.5), (30, 2.0)]
    assert goodput.time_to_target(curve, times, 2.25) == pytest.approx(300.0)  # halfway 20 -> 30
    assert goodput.time_to_target(curve, times, 2.5) == 200.0
    assert goodput.time_to_target(curve, times, 3.5) == 100.0  # the first evaluation crosses
    assert goodput.time_to_target(curve, times, 1.9) is None


def test_modelled_time_adds_steps_changes_refreshes_and_saves():
    cfg = resolve(get_config())
    model = goodput.TimeModel(cfg, 8, goodput.TimeCosts(checkpoint_save_sec=7.0))
    normal = {'live': [True] * 8, 'programs': [[0, 2, 0]]}
    degraded = {'live': [False] + [True] * 7, 'programs': [[0, 2, 0], [1, 4, 0]]}
    record = {'layouts': [normal, degraded], 'executed': [[0, 0, 0], [1, 1, 1], [2, 2, 1], [3, 3, 0]],
              'events': [{'clock': 1}, {'clock': 3}], 'refresh_steps': [1], 'saves': [2],
              'relaunch': False}
    times, parts = model.timeline(record)
    step, c = cfg.fault.step_time_sec, goodput.TimeCosts()
    ratio = model.step_ratio(degraded)
    assert ratio > 1.0  # a neighbour computes two shards
    onset = c.detect_sec + c.rebuild_sec + c.compile_sec  # a new layout compiles
    back = c.detect_sec + c.rebuild_sec  # the full mesh was compiled before the run
    assert times[1] == step
    assert times[2] == pytest.approx(step + onset + model.refresh_sec(7) + ratio * step)
    assert times[3] == pytest.approx(times[2] + 7.0 + ratio * step)
    assert times[4] == pytest.approx(times[3] + back + step)
    assert parts['redone_steps'] == 0 and parts['executed_steps'] == 4
    relaunch = model.timeline(dict(record, relaunch=True))[0]
    assert relaunch[4] - relaunch[3] == pytest.approx(
        c.detect_sec + cfg.fault.relaunch_delay_sec + c.restore_sec + c.compile_sec + step)


def test_measured_step_ratios_time_the_same_layouts():
    """--cost bench: a layout's step costs the bench's measured wall-time ratios (two
    neighbour shards: ratios['mecefo']; two exact shards: ratios['ndb_naive']) where the
    analytic model counts FLOPs; the fault-free step costs 1 under both."""
    cfg = resolve(get_config())
    bench = {'ratios': {'normal': {'step_ms': 1.0}, 'mecefo': {'step_ms': 1.25},
                        'ndb_naive': {'step_ms': 1.8}, 'mecefo_per_batch': {'step_ms': 0.7}},
             'config': {}, 'device': 'gpu:test'}
    measured, analytic = goodput.TimeModel(cfg, 8, bench=bench), goodput.TimeModel(cfg, 8)
    shard = measured.shard
    live = [False] + [True] * 7
    normal = {'live': [True] * 8, 'programs': [[0, shard, 0]]}
    neighbour = {'live': live, 'programs': [[0, shard, 0], [1, 2 * shard, 0]]}
    exact = {'live': live, 'programs': [[0, shard, 0], [0, 2 * shard, 0]]}
    assert measured.step_ratio(normal) == analytic.step_ratio(normal) == 1.0
    assert measured.step_ratio(neighbour) == pytest.approx(1.25)
    assert analytic.step_ratio(neighbour) != pytest.approx(1.25)
    assert measured.step_ratio(exact) == pytest.approx(1.8)
    assert analytic.step_ratio(exact) == pytest.approx(2.0)
    assert 'measured wall-time ratios' in measured.step_cost_source
    assert 'analytic' in analytic.step_cost_source
    assert report_lib.output_name(setup.Settings(bench=bench)) == 'time_to_target_bench'
    assert report_lib.output_name(setup.Settings()) == 'time_to_target'


def test_paired_differences_have_t_intervals_and_the_seeds_they_need():
    from studies.intervals import seeds_to_separate, t_interval
    runs = {'drop_high': {'goodput': {'per_seed': [0.9, 0.92, 0.88, 0.91]}},
            'mecefo_high': {'goodput': {'per_seed': [0.85, 0.9, 0.8, 0.86]}}}
    got = report_lib.paired(runs, 'drop_high')['mecefo_high']
    diffs = [0.05, 0.02, 0.08, 0.05]
    assert got['per_seed'] == pytest.approx(diffs)
    want = t_interval(diffs)
    assert got['vs_default'] == pytest.approx({k: want[k] for k in ('mean', 'lo', 'hi')})
    assert got['significant'] == (want['lo'] > 0) and got['seeds_needed'] == seeds_to_separate(diffs)


def test_the_time_model_charges_steps_on_the_fault_controllers_clock():
    """Under fault.time_model='wall_clock' a record's steps cost what the controller's clock
    advanced by (one function: step_clock.layout_step_ratio), diluted by the all-reduce."""
    from mecefo_jax.faults import step_clock
    from mecefo_jax.neighbour.layout import Program
    cfg = updated(resolve(get_config()), {'fault.time_model': 'wall_clock',
                                         'fault.allreduce_exposed': 0.3})
    model = goodput.TimeModel(cfg, 8)
    clock = step_clock.WallClock(cfg.fault.step_time_sec, step_clock.layout_step_ratio(cfg, 8))
    clock.schedule_step(0)
    normal = {'live': [True] * 8, 'programs': [[0, 2, 0]]}
    degraded = {'live': [False] + [True] * 7, 'programs': [[0, 2, 0], [1, 4, 0]]}
    record = {'layouts': [normal, degraded], 'executed': [[0, 0, 0], [1, 1, 1], [2, 2, 1], [3, 3, 0]],
              'events': [], 'refresh_steps': [], 'saves': [], 'relaunch': False}
    for _, _, index in record['executed']:
        clock.advance([Program(*p) for p in record['layouts'][index]['programs']])
    assert model.timeline(record)[1]['compute_sec'] == pytest.approx(clock.seconds)
    plain = goodput.TimeModel(cfg, 8, exposed=0.0).step_ratio(degraded)
    assert model.step_ratio(degraded) == pytest.approx(1 + (plain - 1) * 0.7) and plain > 1


def test_a_stored_record_of_another_data_seed_or_clock_is_another_run():
    cfg = resolve(get_config())
    wall = updated(ttt.experiment_config(cfg, Run('drop', 'high'), 1, setup.Settings()),
                   {'fault.time_model': 'wall_clock', 'fault.allreduce_exposed': 0.3})
    now = {'strategy': 'drop', 'data_seed': 1, 'time_model': 'wall_clock', 'allreduce_exposed': 0.3}
    assert ttt._stale(now, wall) == ''
    assert 'data.seed=0' in ttt._stale({'strategy': 'drop'}, wall)  # written before the field
    assert 'clock' in ttt._stale(dict(now, allreduce_exposed=0.0), wall)
    assert ttt._stale({'strategy': 'fault_free', 'data_seed': 1}, wall) == ''  # no failure to meet


def test_a_derived_run_meets_an_outage_in_seconds_at_its_own_pace():
    """elastic re-splits a failed replica's rows: its steps are c times a normal one, so an
    outage of 6 fault-free steps lasts ceil(6 / c) of its steps on the wall clock, and it
    comes back where the clock passes the outage's end."""
    from mecefo_jax.faults import step_clock
    from mecefo_jax.faults.strategies import layout_for
    cfg = updated(resolve(get_config()), {'fault.time_model': 'wall_clock', 'train.steps': 20})
    events = parse_events('3:4:6')
    live = [r != 4 for r in range(8)]
    c = step_clock.layout_step_ratio(cfg, 8)(layout_for('elastic', live, 2).programs)
    assert c > 1.2
    (event,) = ttt.wall_clock_events('elastic', events, cfg, 8)
    assert (event.step, event.replica, event.duration_steps) == (3, 4, math.ceil(6 / c))
    assert ttt.wall_clock_events('drop', events, cfg, 8) == events  # drop's step is a normal one


def test_a_derived_runs_pauses_advance_the_clock_the_trace_is_read_by():
    """With a time model, each live-set change stands the run still for its seconds while the
    trace goes on: the change into an outage of 6 fault-free steps (detect, rebuild, compile)
    leaves ceil((6 s - P) / (c s)) of elastic's steps in it, s a step's seconds, P the pause."""
    from mecefo_jax.faults.strategies import layout_for
    cfg = updated(resolve(get_config()), {'fault.time_model': 'wall_clock', 'train.steps': 20})
    model = goodput.TimeModel(cfg, 8)
    live = [r != 4 for r in range(8)]
    c = model.programs_ratio(layout_for('elastic', live, 2).programs)
    pause, step = model.change_sec(False, True), cfg.fault.step_time_sec
    assert 0 < pause < 6 * step
    (event,) = ttt.wall_clock_events('elastic', parse_events('3:4:6'), cfg, 8, model)
    assert (event.step, event.duration_steps) == (3, math.ceil((6 * step - pause) / (c * step)))
    record = ttt.derived_record('elastic', parse_events('3:4:6'), cfg, 8, 12, model)
    assert record['pauses_on_clock'] and [e['clock'] for e in record['events']] == [3, 3 + event.duration_steps]
    assert not ttt.derived_record('elastic', parse_events('3:4:6'), cfg, 8, 12)['pauses_on_clock']
    # A stored derived record whose pauses did not advance its clock is replayed again.
    run_cfg = updated(ttt.experiment_config(resolve(get_config()), Run('elastic', 'high'), 1, setup.Settings()),
                      {'fault.time_model': 'wall_clock'})
    now = {'strategy': 'elastic', 'data_seed': 1, 'time_model': 'wall_clock', 'allreduce_exposed': 0.0}
    assert 'off the clock' in ttt._stale(now, run_cfg) and ttt._stale(dict(now, pauses_on_clock=True), run_cfg) == ''


def test_every_strategy_sees_the_same_trace_and_it_covers_the_continuation():
    cfg = updated(resolve(get_config()), {'fault.regime': 'high', 'fault.step_time_sec': 600.0,
                                         'fault.regime_replicas': 32, 'fault.seed': 3})
    traces = set()
    for strategy in ('mecefo', 'mecefo_planned', 'drop', 'elastic', 'checkpoint_restart'):
        fault = updated(cfg, {'fault.strategy': strategy}).fault
        traces.add(tuple(events_from_config(fault, num_replicas=8, total_steps=60)))
    capped = updated(cfg, {'fault.strategy': 'mecefo_planned', 'fault.max_neighbour_rows': 2}).fault
    traces.add(tuple(events_from_config(capped, num_replicas=8, total_steps=60)))
    assert len(traces) == 1
    longer = events_from_config(cfg.fault, num_replicas=8, total_steps=90)
    (trace,) = traces
    assert trace and tuple(e for e in longer if e.step < 60) == trace and len(longer) > len(trace)


def test_the_learning_rate_keeps_its_horizon_when_a_run_goes_on():
    cfg = resolve(get_config())
    plain = optim.learning_rate_schedule(cfg.train)
    steps = cfg.train.steps
    longer = optim.learning_rate_schedule(
        updated(cfg, {'train.steps': 2 * steps, 'train.lr_schedule_steps': steps}).train)
    for count in range(steps + 1):
        assert float(longer(count)) == float(plain(count))
    final = cfg.train.learning_rate * cfg.train.final_lr_fraction
    for count in (steps, steps + 1, 2 * steps):
        assert float(longer(count)) == pytest.approx(final)
    with pytest.raises(ConfigError, match='train.lr_schedule_steps'):
        updated(cfg, {'train.lr_schedule_steps': -1})


def test_bad_settings_name_the_flag():
    cfg = resolve(get_config())
    with pytest.raises(ValueError, match='--default'):
        setup.check_runs(setup.default_runs(cfg), 'mecefo_typo')
    with pytest.raises(ValueError, match='twice'):
        setup.check_runs((Run('drop', 'high'), Run('drop', 'high')), 'drop_high')
    with pytest.raises(ValueError, match='--costs'):
        setup.parse_costs('compile_secs=3')
    with pytest.raises(ValueError, match='--dense_from'):
        setup.Settings(dense_from=1.5)
    assert setup.parse_costs('compile_sec=3').compile_sec == 3.0
    names = [r for r in setup.default_runs(cfg)]
    assert Run('drop', 'low') in names and Run('mecefo_planned', 'high', setup.DEFAULT_CAP) in names
    assert Run('mecefo', 'high') in names and Run('mecefo', 'low') not in names
    assert setup.default_name(cfg) == 'drop_high'
    due = setup.Settings(eval_every=50, dense_eval_every=10, dense_from=0.8).evaluate_at(300)
    assert [n for n in range(1, 451) if due(n)] == [50, 100, 150, 200] + list(range(240, 451, 10))


@pytest.mark.subprocess
@pytest.mark.parametrize('flags, message', [
    (['--default', 'mecefo_typo'], "--default='mecefo_typo' is not among the runs"),
    (['--seeds', '0'], 'flag --seeds=0: 0 is not a positive integer'),
    (['--cost', 'bench'], '--cost=bench needs --bench_json PATH'),
    (['--cost', 'bench', '--bench_json', 'no_such.json'], '--bench_json=no_such.json: no such file'),
])
def test_the_script_refuses_bad_flags_before_training(tmp_path, flags, message):
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, os.path.join(root, 'scripts', 'time_to_target.py'),
                           '--config', os.path.join(root, 'configs', 'small.py'),
                           '--out', str(tmp_path / 'out'), *flags],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-2000:]
    assert not os.path.exists(tmp_path / 'out' / 'seed0')


def test_the_default_strategy_is_the_best_at_the_largest_point_with_four_seeds():
    """The config's default fault.strategy (and cap) is the run with the best mean goodput
    under the H200's measured costs (verdict_report.GPU) at one point of the verdict study:
    of the points with at least 4 seeds, the one at the largest shape (model parameters),
    the last in the study's order among equal shapes (verdict_points.POINTS runs towards
    the paper's regime)."""
    from studies import verdict_points as vp
    from studies import verdict_report as vr
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, 'docs', 'results', 'verdict.json')) as f:
        report = json.load(f)
    eligible = [(p['model_params'], list(vp.POINTS).index(n), n)
                for n, p in report['points'].items() if len(p['seeds']) >= 4]
    name = max(eligible)[2]
    assert vr.MIN_DEFAULT_SEEDS == 4 and report['default_point'] == vr.default_point(report) == name
    point = report['points'][name]
    best = point['costs'][vr.GPU]['map']['best']
    run = {run_name(*r): r for r in vp.runs_of(vp.POINTS[name])}[best]
    cfg = resolve(get_config())
    assert (run.strategy, run.cap) == (cfg.fault.strategy, cfg.fault.max_neighbour_rows)
