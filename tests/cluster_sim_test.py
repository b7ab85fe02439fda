"""The cluster simulator: closed forms, traces, costs, layouts and the script.

Pure numpy under test; these run in about a second (the end-to-end script
run is a subprocess with a 2 h horizon and 2 seeds).
"""
import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from mecefo_jax.faults import costs as costs_lib
from studies import bench_costs
from studies import fault_plan as plan_lib
from studies.cluster import recovery as recovery_lib
from studies.cluster import report as report_lib
from studies.cluster import sim
from studies.cluster import traces as traces_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOUR = 3600.0

# A cost table of known ratios: two exact shards 2x, neighbour 0.8x per
# shard alone and 1.3x for two (so 1.5 shards cost 1.05x).
KNOWN = costs_lib.CostTable(source='test', exact=((1.0, 1.0), (2.0, 2.0)),
                            neighbour=((1.0, 0.8), (2.0, 1.3)), step_sec=1.0,
                            step_sec_source='test')
ZERO = recovery_lib.recovery_table(overrides={
    name: {'recovery_sec': 0.0, 'restore_sec': 0.0, 'lost_steps': 0.0}
    for name in recovery_lib.ENTRIES})


def _drop(strategy, iv, cost=KNOWN, recovery=ZERO, assumption='in_process', every=1000):
    return sim.simulate(strategy, iv, cost, recovery, assumption=assumption,
                        global_tokens=100.0, checkpoint_every=every)['drop_pct']


def _permanent(n=8, replica=3, horizon=10 * HOUR, shard_seqs=None):
    return traces_lib.intervals(n, horizon, [(replica, 0.0, 1e12)], shard_seqs=shard_seqs)


# ---------------------------------------------------------------- closed forms


@pytest.mark.parametrize('assumption', sim.ASSUMPTIONS)
def test_no_failures_every_strategy_drops_nothing(assumption):
    # Default recovery table and the analytic costs: nothing may be charged
    # without a failure (a stray plain_dp factor or an event at t=0 would).
    table = costs_lib.analytic_table(costs_lib.PAPER_MODELS['350M'], seq_len=256,
                                     replica_seqs=16, rank=128, recompute_ffn=True, mfu=0.4)
    iv = traces_lib.intervals(32, 24 * HOUR)
    for strategy in sim.STRATEGIES:
        assert _drop(strategy, iv, table, recovery_lib.recovery_table(),
                     assumption) == pytest.approx(0.0, abs=1e-9), strategy


def test_fault_free_ignores_the_trace():
    out = sim.simulate('fault_free', _permanent(), KNOWN, recovery_lib.recovery_table(),
                       assumption='real_crash', global_tokens=1.0, checkpoint_every=10)
    assert (out['drop_pct'], out['events'], out['lost_steps']) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize('strategy,expected', [
    ('mecefo', 1 - 1 / 1.3),  # the neighbour does two shards in neighbour mode
    ('ndb_naive', 1 - 1 / 2.0),  # two exact shards
    ('elastic', 1 - 1 / (1 + 1 / 7)),  # 1 + 1/(n-1) in one larger batch
    ('drop', 1 / 8),  # full speed, one shard in eight skipped
    ('checkpoint_restart', 1 - 1 / (1 + 1 / 7)),  # as elastic; nothing to redo at t=0
])
def test_single_permanent_failure_matches_the_closed_form(strategy, expected):
    assert _drop(strategy, _permanent()) == pytest.approx(100 * expected, rel=1e-9)


def test_elastic_splits_whole_sequences():
    # 16 sequences over 7 survivors: the busiest takes ceil(16/7) = 3 more.
    assert _drop('elastic', _permanent(shard_seqs=16)) == pytest.approx(
        100 * (1 - 1 / (1 + 3 / 16)), rel=1e-9)


def test_real_crash_pays_one_relaunch_per_change():
    rec = recovery_lib.recovery_table(overrides={'memory': {'recovery_sec': 90.0,
                                                            'lost_steps': 0.0}})
    horizon = 10 * HOUR
    got = _drop('mecefo', _permanent(horizon=horizon), recovery=rec, assumption='real_crash')
    assert got == pytest.approx(100 * (1 - (1 - 90.0 / horizon) / 1.3), rel=1e-9)


def test_a_change_during_a_recovery_restarts_it():
    # Fails at 0, returns at 10 s: the relaunch for the return ends at 10 + 65 s,
    # not 65 + 65 s (restart, not queue); all live afterwards.
    rec = recovery_lib.recovery_table(overrides={'memory': {'recovery_sec': 65.0,
                                                            'lost_steps': 0.0}})
    horizon = HOUR
    iv = traces_lib.intervals(8, horizon, [(3, 0.0, 10.0)])
    got = _drop('elastic', iv, recovery=rec, assumption='real_crash')
    assert got == pytest.approx(100 * 75.0 / horizon, rel=1e-9)


def test_checkpoint_restart_redoes_the_steps_since_its_checkpoint():
    # 1 s steps, a checkpoint every 300 steps, 40 s per restore. Replica 3
    # fails at 1000.5 s: 100.5 steps since the checkpoint at 900 are lost.
    # It returns at 2000.5 s: a planned restart saves first (at step 1740),
    # so the failure of replica 5 at 2090.5 s loses only the 50 steps since.
    horizon, restore = 3 * HOUR, 40.0
    rec = recovery_lib.recovery_table(overrides={'disk': {'restore_sec': restore}})
    iv = traces_lib.intervals(8, horizon, [(3, 1000.5, 2000.5), (5, 2090.5, 1e12)])
    out = sim.simulate('checkpoint_restart', iv, KNOWN, rec,
                       assumption='in_process', global_tokens=100.0, checkpoint_every=300)
    one_down = 1 + 1 / 7  # elastic step while one replica is down
    executed = (1000.5 + (1000.0 - restore) / one_down + (2090.5 - 2000.5 - restore)
                + (horizon - 2090.5 - restore) / one_down)
    assert out['lost_steps'] == pytest.approx(100.5 + 50.0)
    assert out['tokens_per_sec'] == pytest.approx(
        100.0 * (executed - 150.5) / horizon, rel=1e-9)


def test_lost_steps_from_a_drill_are_capped_by_the_work_done():
    rec = recovery_lib.recovery_table(overrides={'memory': {'recovery_sec': 0.0,
                                                            'lost_steps': 5.0}})
    early = traces_lib.intervals(8, HOUR, [(3, 2.0, 100.0)])
    out = sim.simulate('mecefo', early, KNOWN, rec,
                       assumption='real_crash', global_tokens=1.0, checkpoint_every=1000)
    assert out['lost_steps'] == pytest.approx(2.0)  # only 2 steps existed to lose


# --------------------------------------------------------------------- traces


def test_traces_are_reproducible_from_their_seed():
    kw = dict(num_replicas=32, mtbf_hours=0.5, mttr_hours=2.0, horizon_hours=24.0)
    a = traces_lib.sample_trace(seed=7, **kw)
    b = traces_lib.sample_trace(seed=7, **kw)
    c = traces_lib.sample_trace(seed=8, **kw)
    assert len(a) > 5
    np.testing.assert_array_equal(a, b)
    assert a.shape != c.shape or not np.array_equal(a, c)


def test_mean_replicas_down_matches_littles_law():
    # Mean replicas down = MTTR / MTBF (cluster-wide arrivals) = 4 for `high`.
    # Over 2,000 h the estimate's std is ~0.1 (autocorrelation time ~ MTTR), so
    # 0.4 is a 4-sigma bound; the healthy start biases it by ~MTTR/horizon.
    trace = traces_lib.sample_trace(num_replicas=32, mtbf_hours=0.5,
                                    mttr_hours=2.0, horizon_hours=2000.0, seed=0)
    stats = sim.trace_stats(traces_lib.intervals(32, 2000 * HOUR, trace))
    assert stats['mean_replicas_down'] == pytest.approx(4.0, abs=0.4)
    # Per-replica scaling: 64 replicas see twice the cluster-wide rate.
    trace = traces_lib.sample_trace(num_replicas=64, mtbf_hours=0.5,
                                    mttr_hours=2.0, horizon_hours=2000.0, seed=0)
    assert sim.trace_stats(traces_lib.intervals(64, 2000 * HOUR, trace))['mean_replicas_down'] == pytest.approx(
        8.0, abs=0.8)


def test_a_failure_that_would_leave_no_replica_live_is_dropped():
    # Two replicas, failures four times as frequent as repairs: both would often be down.
    trace = traces_lib.sample_trace(num_replicas=2, mtbf_hours=0.5, mttr_hours=2.0,
                                    horizon_hours=200.0, seed=1, rate_scaling='cluster')
    iv = traces_lib.intervals(2, 200 * HOUR, trace)
    assert set(np.unique(iv.failed)) == {0, 1}


# ---------------------------------------------------------------- live sets


def test_loads_agree_with_the_projects_layout():
    # The simulator's loads must be the layouts the controller would build
    # (faults/strategies.py): adopters exactly, and the elastic re-split exactly
    # (each survivor takes at most ceil(orphans / live) sequences).
    from mecefo_jax.faults.strategies import adopters, layout_for
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.choice([2, 3, 5, 8, 16, 32, 40, 64]))
        down = rng.choice(n, int(rng.integers(1, n)), replace=False)
        mask = np.ones(n, bool)
        mask[down] = False
        iv = traces_lib.intervals(n, HOUR, [(r, 1.0, 2 * HOUR) for r in down], shard_seqs=4)
        load = {}
        for adopter in adopters(list(mask)).values():
            load[adopter] = load.get(adopter, 0) + 1
        assert (iv.failed[-1], iv.adopt_shards[-1]) == (down.size, 1 + max(load.values())), mask
        np.testing.assert_array_equal(traces_lib.adopter_loads(mask),
                                      [load.get(i, 0) for i in range(n)])
        layout = layout_for('elastic', list(mask), 4)
        busiest = max(layout.rows(i) for i in range(len(layout.replicas))) / 4
        assert iv.elastic_shards[-1] == busiest, mask
        assert (iv.adopt_shards[0], iv.elastic_shards[0]) == (1.0, 1.0)  # all live before t = 1 s


# ---------------------------------------------------------------------- costs


def test_analytic_ratio_matches_the_measured_350m_figures():
    # Measured (CPU, XLA cost analysis, 350M width, seq 256, r=128, 4 sequences
    # per shard, no FFN recompute): the whole train step with two shards joined
    # into one batch, 1.269x at 24 blocks (scripts/bench_step.py --iters 0);
    # the earlier benchmark's two shards as two separate batches, 1.52x at 4
    # blocks. Bound 0.02: the model leaves out elementwise work (norms, SwiGLU
    # gate, softmax, RoPE, the optimizer update), about 1% of a block.
    shape = costs_lib.PAPER_MODELS['350M']
    for layers, tokens, measured in ((24, 2 * 4 * 256, 1.269), (4, 4 * 256, 1.52)):
        kw = dict(seq_len=256, rank=128, num_layers=layers)
        normal = costs_lib.flops_per_token(shape, mode='normal', **kw)
        neighbour = costs_lib.flops_per_token(shape, mode='neighbour', batch_tokens=tokens,
                                              recompute_ffn=False, **kw)
        assert 2 * neighbour / normal == pytest.approx(measured, abs=0.02), layers
    # Per token: a normal block 78.6 MFLOP, a neighbour block 48 MFLOP, the head
    # 196.6 MFLOP (docs/algorithm.md section 6); 1% bound for the same reason.
    block = lambda mode: costs_lib.block_flops_per_token(  # noqa: E731
        shape, mode=mode, seq_len=256, rank=128, batch_tokens=1024, recompute_ffn=False)
    assert block('normal') == pytest.approx(78.6e6, rel=0.01)
    assert block('neighbour') == pytest.approx(48.0e6, rel=0.01)
    table = costs_lib.analytic_table(shape, seq_len=256, replica_seqs=16, rank=128,
                                     recompute_ffn=False, mfu=0.4)
    assert table.ratio('ndb_naive') == 2.0


def test_recompute_adds_one_ffn_forward_per_block():
    shape = costs_lib.PAPER_MODELS['1B']
    kw = dict(mode='neighbour', seq_len=256, rank=128, batch_tokens=4096)
    extra = (costs_lib.block_flops_per_token(shape, recompute_ffn=True, **kw)
             - costs_lib.block_flops_per_token(shape, recompute_ffn=False, **kw))
    assert extra == 6 * shape.d_model * shape.ffn_hidden


def test_interpolation_is_linear_through_the_points_and_extrapolates():
    pts = ((1.0, 0.8), (2.0, 1.3))
    np.testing.assert_allclose(costs_lib.interpolate(pts, [0.5, 1.0, 1.5, 3.0]),
                               [0.4, 0.8, 1.05, 1.8])


def test_bench_table_reads_ratios_and_names_missing_modes():
    bench = {'ratios': {'normal': {'step_ms': 1.0}, 'ndb_naive': {'step_ms': 1.9},
                        'mecefo': {'step_ms': 1.4}, 'mecefo_per_batch': {'step_ms': 0.7},
                        'plain_dp': {'step_ms': 0.95}},
             'config': {'d_model': 32}, 'device': 'cpu:cpu'}
    shape = costs_lib.PAPER_MODELS['350M']
    t = bench_costs.bench_table(bench, shape, metric='step_ms', seq_len=256, replica_seqs=16,
                                mfu=0.4)
    assert (t.ratio('ndb_naive'), t.ratio('mecefo'), t.ratio('mecefo_per_batch'),
            t.plain) == (1.9, 1.4, 0.7, 0.95)
    assert 'analytic' in t.step_sec_source  # a CPU bench of another shape gives no time
    # A GPU bench of this very shape gives the absolute step, scaled to 16 x 256 tokens.
    gpu = dict(bench, device='gpu:NVIDIA H100', modes={'normal': {'step_ms': 50.0}},
               config={'d_model': 1024, 'num_layers': 24, 'ffn_hidden': 2736,
                       'vocab_size': 32000, 'seq_len': 256, 'per_device_batch': 4})
    t = bench_costs.bench_table(gpu, shape, metric='step_ms', seq_len=256, replica_seqs=16,
                                mfu=0.4)
    assert t.step_sec == pytest.approx(0.050 * 16 / 4)
    del bench['ratios']['mecefo']
    with pytest.raises(ValueError, match='bench_json'):
        bench_costs.bench_table(bench, shape, metric='step_ms', seq_len=256, replica_seqs=16,
                                mfu=0.4)


def test_roles_table_from_measured_role_seconds():
    roles = {'role_seconds': {'normalx2': 1.0, 'normalx4': 1.8,
                              'neighbourx4': 1.3, 'neighbourx2': 0.7}}
    t = plan_lib.roles_table(roles, costs_lib.PAPER_MODELS['350M'], seq_len=256,
                              replica_seqs=16, mfu=0.4)
    assert (t.ratio('ndb_naive'), t.ratio('mecefo'), t.ratio('mecefo_per_batch')) == (
        1.8, 1.3, 0.7)


@pytest.mark.parametrize('seeds', [1, 3])
def test_roles_table_reads_a_programs_table_of_one_run_or_of_seeds(seeds):
    def entry(sec):
        return {'seconds': sec if seeds == 1 else {'mean': sec, 'std': 0.0, 'min': sec,
                                                   'max': sec}}
    report = {'regime': 'high', 'programs': {'normalx2': entry(1.0), 'normalx3': entry(1.4),
                                             'neighbourx3': entry(0.9)}}
    t = plan_lib.roles_table(report, costs_lib.PAPER_MODELS['350M'], seq_len=256,
                              replica_seqs=16, mfu=0.4)
    assert t.exact == ((1.0, 1.0), (1.5, 1.4)) and t.neighbour == ((1.5, 0.9),)


# --------------------------------------------------------------- mecefo_planned


def test_planned_drops_nothing_when_half_a_shard_fits_in_one_step():
    # KNOWN: 1 + 1/3 shards in neighbour mode cost 0.97x: three helpers per
    # failed shard (continuous batches) keep every device within a step.
    assert _drop('mecefo_planned', _permanent()) == pytest.approx(0.0, abs=1e-12)
    assert _drop('mecefo_planned', _permanent(shard_seqs=16)) == pytest.approx(0.0, abs=1e-12)


def test_planned_single_permanent_failure_matches_the_closed_form_when_degraded():
    # 0.95x per shard in neighbour mode: even one extra sequence of 16 is
    # 17/16 * 0.95 > 1, so the best plan spreads the 16 over all 7 survivors:
    # the busiest takes ceil(16/7) = 3, and costs 19/16 * 0.95.
    steep = costs_lib.CostTable(source='test', exact=((1.0, 1.0), (2.0, 2.0)),
                                neighbour=((1.0, 0.95), (2.0, 1.9)), step_sec=1.0,
                                step_sec_source='test')
    assert _drop('mecefo_planned', _permanent(shard_seqs=16), steep) == pytest.approx(
        100 * (1 - 1 / (19 / 16 * 0.95)), rel=1e-9)


@pytest.mark.parametrize('strategy', ['mecefo', 'mecefo_planned', 'elastic'])
@pytest.mark.parametrize('split', [False, True])
def test_refresh_is_charged_at_onset_and_every_tau_steps_to_neighbour_modes(strategy, split):
    """One permanent failure of 8 at t = 0, 1 s steps, a 5 s refresh every 100 steps:
    paid whole (`refresh_sec`) or split over the 7 live replicas (`refresh_split_sec`)."""
    horizon, refresh = 10 * HOUR, 5.0
    field = 'refresh_split_sec' if split else 'refresh_sec'
    table = dataclasses.replace(KNOWN, **{field: refresh})
    out = sim.simulate(strategy, _permanent(horizon=horizon), table, ZERO,
                       assumption='in_process', global_tokens=100.0, checkpoint_every=1000,
                       tau=100)
    ratio = {'mecefo': 1.3, 'mecefo_planned': 1.0, 'elastic': 1 + 1 / 7}[strategy]
    paid = refresh / 7 if split else refresh
    if strategy == 'elastic':  # exact strategies keep no projections
        expected = 1 - 1 / ratio
    else:
        expected = 1 - (1 - paid / horizon) / (ratio + paid / 100)
    assert out['drop_pct'] == pytest.approx(100 * expected, rel=1e-9)


def test_default_refresh_charge_states_its_source():
    """The default charges the library's refresh: 3 iterations of subspace iteration per
    FFN kernel (350M: d 1024, h 2736, 24 layers, r 128), counted here by hand: the
    products split over the live replicas, the QRs and the collectives on every one."""
    config = sim.SimConfig(models=('350M',), sizes=())
    table = sim.cost_tables(config)['350M']
    d, h, layers, r, iters = 1024, 2736, 24, 128, 3

    def qr(k):  # Householder thin QR of a k x r block
        return 2.0 * k * r * r - 2.0 * r ** 3 / 3.0

    kernels = ((d, h), (d, h), (h, d))
    products = layers * sum(iters * 4.0 * n * m * r for n, m in kernels)
    qrs = layers * sum(qr(n) + iters * (qr(m) + qr(n)) for n, m in kernels)
    # per kernel and iteration: all-gather h x r, ring all-reduce 2 x d x r, float32
    collective_bytes = layers * 3 * iters * (h + 2 * d) * r * 4
    assert table.refresh_split_sec == pytest.approx(products / 1e12)
    assert table.refresh_sec == pytest.approx(qrs / 1e12 + collective_bytes / 25e9)
    assert 'subspace' in table.refresh_source and 'assumed 1 TFLOP/s' in table.refresh_source
    assert '25 GB/s' in table.refresh_source
    svd = sim.cost_tables(sim.SimConfig(models=('350M',), sizes=(), refresh_method='svd'))
    small, big = d, h  # thin SVD of each m x n kernel, m >= n: 6 m n^2 + 20 n^3, unsplit
    assert svd['350M'].refresh_sec == pytest.approx(
        3 * layers * (6.0 * big * small ** 2 + 20.0 * small ** 3) / 1e12)
    assert svd['350M'].refresh_split_sec == 0.0
    config = sim.SimConfig(models=('350M',), sizes=(), refresh_sec=0.5)
    assert sim.cost_tables(config)['350M'].refresh_sec == 0.5
    assert sim.cost_tables(config)['350M'].refresh_split_sec == 0.0


# ------------------------------------------------------------------- recovery


def test_recovery_sources_override_field_by_field():
    drill = {'memory': {'recovery_sec': 42.0, 'restore_sec': 3.0, 'lost_steps': 2},
             'disk': {'recovery_sec': 300.0}}
    rec = recovery_lib.recovery_table(drill=drill, overrides={'disk': {'lost_steps': 7}})
    assert (rec['memory']['recovery_sec'], rec['memory']['lost_steps']) == (42.0, 2.0)
    assert rec['memory']['source'] == 'crash drill'
    assert (rec['disk']['recovery_sec'], rec['disk']['lost_steps']) == (300.0, 7.0)
    assert rec['disk']['source'] == 'crash drill + flag'
    assert rec['disk']['restore_sec'] == recovery_lib.DEFAULTS['disk']['restore_sec']
    assert rec['in_process']['recovery_sec'] == 0.0
    with pytest.raises(ValueError, match='memory.recovery_sec'):
        recovery_lib.recovery_table(drill={'memory': {'recovery_sec': -1}})
    with pytest.raises(ValueError, match='recovery_json'):
        recovery_lib.recovery_table(drill={'timings': []})


def test_needed_mttr_inverts_the_downtime():
    mttr = report_lib.needed_mttr_hours(1 - math.exp(-0.25), mtbf_hours=0.5, num_replicas=32,
                                        rate_scaling='per_replica')
    assert mttr == pytest.approx(0.125)


# ------------------------------------------------------------------ end to end


@pytest.mark.subprocess
def test_script_runs_end_to_end_without_jax(tmp_path):
    out = tmp_path / 'simc'
    code = (
        'import runpy, sys\n'
        f'sys.argv = ["simulate_cluster.py", "--out", {str(out)!r}, "--hours", "2",'
        ' "--seeds", "2", "--models", "350M,7B", "--regimes", "none,high",'
        ' "--sizes", "8,16"]\n'
        f'runpy.run_path({os.path.join(ROOT, "scripts", "simulate_cluster.py")!r},'
        ' run_name="__main__")\n'
        'assert not [m for m in sys.modules if m == "jax" or m.startswith("jax.")]\n')
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert '[simulate] done' in proc.stdout
    result = json.loads((out / 'simulate_cluster.json').read_text())
    keys = ('model', 'regime', 'strategy', 'drop_pct', 'drop_pct_std', 'tokens_per_sec',
            'assumption', 'cost_source', 'step_time_source')
    rows = result['rows']
    assert rows and all(all(k in r for k in keys) for r in rows)
    combos = {(r['assumption'], r['model'], r['regime'], r['strategy']) for r in rows}
    assert len(combos) == len(rows) == 2 * 2 * 2 * len(sim.STRATEGIES)
    assert {r['num_replicas'] for r in result['sweep_rows']} == {8, 16}
    md = (out / 'simulate_cluster.md').read_text()
    assert '| in_process | 350M | high | 1186.0 | 1.07 |' in md  # the paper's figures beside ours
    assert result['explanation']['in_process/350M']['paper_drop_pct'] == 1.07
    assert (out / 'simulate_cluster.png').stat().st_size > 0


def test_bad_config_names_the_flag():
    with pytest.raises(ValueError, match='--global_batch'):
        sim.SimConfig(global_batch=500).validate()
    with pytest.raises(ValueError, match='--models'):
        sim.SimConfig(models=('3B',)).validate()
    with pytest.raises(ValueError, match='--checkpoint_every=0 must be > 0'):
        sim.SimConfig(checkpoint_every=0).validate()
    with pytest.raises(ValueError, match='--mtbf_hours and --mttr_hours > 0'):
        sim.SimConfig(regimes=('custom',), mtbf_hours=1.0).validate()


def test_kernels_under_the_split_threshold_are_charged_whole_on_every_replica():
    """refresh_split_min_elements above 350M's d x h: no product is split and no
    collective is charged; every replica pays the products and the QRs."""
    d, h, layers, r, iters = 1024, 2736, 24, 128, 3
    split = sim.cost_tables(sim.SimConfig(models=('350M',), sizes=()))['350M']
    whole = sim.cost_tables(sim.SimConfig(models=('350M',), sizes=(),
                                          refresh_split_min_elements=d * h + 1))['350M']
    products = layers * 3 * iters * 4.0 * d * h * r
    assert whole.refresh_split_sec == 0.0
    assert split.refresh_split_sec == pytest.approx(products / 1e12)
    collective_bytes = layers * 3 * iters * (h + 2 * d) * r * 4
    assert whole.refresh_sec == pytest.approx(
        split.refresh_sec - collective_bytes / 25e9 + products / 1e12)
    with pytest.raises(ValueError, match='--refresh_split_min_elements=-1'):
        sim.SimConfig(models=('350M',), sizes=(), refresh_split_min_elements=-1).validate()
