"""The break-even helper step, read off the committed paper_like records by re-timing them."""
import functools
import os
import statistics

import pytest

from configs.small import get_config
from mecefo_jax.config.resolve import resolve
from studies import time_to_target_report as ttt_report
from studies import verdict_breakeven as vb
from studies import verdict_model as vm
from studies import verdict_points as vp
from studies import verdict_report as vr
from studies.goodput import TimeModel
from studies.runs import run_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POINT = vp.POINTS['paper_like']
CAPPED = run_name(*vp.capped_plan(POINT))


@pytest.fixture(scope='module')
def paper_like():
    cfg = resolve(vp.point_config(get_config(), POINT))
    names = [run_name(*r) for r in vp.runs_of(POINT)]
    records = vr.load_records(os.path.join(ROOT, 'docs', 'results', 'verdict_runs', 'paper_like'),
                              order=names, require=(vp.DEFAULT,))
    assert len(records) >= 2
    return records, cfg, cfg.mesh.replicas or cfg.mesh.num_cpu_devices, cfg.train.steps  # one sequence per replica


def test_layouts_no_slower_than_a_normal_step_keep_their_time(paper_like):
    """drop's and the fault-free run's steps are all normal-speed: any helper step leaves
    their timelines as the analytic model has them."""
    records, cfg, replicas, _ = paper_like
    seed = next(iter(records.values()))
    for run in ('fault_free', vp.DEFAULT):
        want = TimeModel(cfg, replicas).timeline(seed[run])
        for c in (0.5, 3.0):
            assert vb.HelperStepModel(cfg, replicas, helper_step=c).timeline(seed[run]) == want


def test_at_the_break_even_step_the_capped_plan_keeps_up_with_drop(paper_like):
    """Its mean goodput, re-timed at c, equals drop's to within what the bisection's
    tolerance on c moves it; a step 1% dearer leaves it behind, 1% cheaper ahead."""
    records, cfg, replicas, _ = paper_like
    c = vb.break_even_helper_step(records, CAPPED, vp.DEFAULT, cfg, replicas)
    drop = vb.mean_goodput(records, vp.DEFAULT, cfg, replicas)
    at = functools.partial(vb.mean_goodput, records, CAPPED, cfg, replicas)
    assert at(c) == pytest.approx(drop, abs=1e-4)
    assert at(c * 1.01) < drop < at(c * 0.99)


def test_the_records_and_the_rate_model_agree_on_the_papers_rule(paper_like):
    """Two independent routes to mecefo's break-even neighbour step at paper_like (one
    failure at a time, where the rate model's assumption holds): re-timing the records,
    and c* = 1 + (2v - 1) f/(n - f) from the measured v. They agree to 0.01: the model
    leaves out what the runs pay besides steps (changes, compiles, refreshes)."""
    records, cfg, replicas, steps = paper_like
    timed = vb.break_even_helper_step(records, vp.MECEFO_RUN, vp.DEFAULT, cfg, replicas)
    rows = ttt_report.figures_per_seed(records, ttt_report.time_models(cfg, replicas, None), steps)
    v = vm.measured_v_interval({name: [statistics.fmean(r['steps_to_target'] for r in runs)]
                                for name, runs in rows.items()})['mean']
    assert timed == pytest.approx(vm.break_even_step(replicas, v), abs=0.01)


def test_a_run_behind_drop_at_any_helper_step_has_no_break_even(paper_like):
    """The control's steps are all normal-speed, so no helper step moves it: it stays
    behind drop across the whole bracket, and there is no break-even to report."""
    records, cfg, replicas, _ = paper_like
    assert vb.break_even_helper_step(records, vr.CONTROL, vp.DEFAULT, cfg, replicas) is None
