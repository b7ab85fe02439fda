"""Replicas as rows (`mesh.replicas`), roles as data, and failures on the wall clock.

The reference is the device-per-replica step and run: packing many logical
replicas onto fewer devices only reorders sums, so gradients and whole runs
must agree to float32 round-off. The bound used, 1e-5 of each leaf's scale
for one gradient and 2e-5 (absolute, on O(1) parameters and losses) after 20
Adam steps, is a few hundred float32 ulps: what summation order moves, and
far below any real difference (a dropped row moves the first step's loss by
about 1e-2 here).
"""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import linen as nn
from tree_asserts import assert_tree_close

from configs import tiny
from mecefo_jax import run as run_lib
from mecefo_jax.config.resolve import resolve
from mecefo_jax.faults.step_clock import WallClock, diluted
from mecefo_jax.faults.strategies import layout_for
from mecefo_jax.model.llama import build_model, init_params
from mecefo_jax.neighbour.layout import ROLE_MIXED, ROLE_NEIGHBOUR, ROLE_NORMAL, Layout, Piece, Program
from mecefo_jax.neighbour.projections import compute_projections
from mecefo_jax.neighbour.row_packing import pack
from mecefo_jax.parallel import sharding, step
from mecefo_jax.training import run_setup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_BOUND = 2e-5


def _cfg(**changes):
    """configs/tiny.py with one block: every block takes the same path through the packing,
    and the runs' compiles are what these tests pay for."""
    c = tiny.get_config()
    c.train.steps, c.train.log_every, c.train.eval_every, c.train.checkpoint_every = 20, 1, 0, 0
    c.model.num_layers = 1
    for dotted, value in changes.items():
        section, field = dotted.split('__')
        c[section][field] = value
    return resolve(c)


# ------------------------------------------------------------------ packing


def test_packing_keeps_every_row_once_in_its_role():
    # Replica 2 failed; 3 adopts it in neighbour mode (the paper's rule), 5 is mixed.
    layout = Layout(replicas=(0, 1, 3, 4, 5, 6, 7), roles=(0, 0, 1, 0, ROLE_MIXED, 0, 0),
                    pieces=((Piece(0, 0, 2),), (Piece(1, 0, 2),), (Piece(3, 0, 2), Piece(2, 0, 1)),
                            (Piece(4, 0, 2),), (Piece(5, 0, 2), Piece(2, 1, 2)),
                            (Piece(6, 0, 2),), (Piece(7, 0, 2),)))
    for devices in (8, 4, 3, 1):
        packing = pack(layout, devices)
        exact = [(p.shard, i) for run in packing.exact for p in run for i in range(p.start, p.stop)]
        approx = [(p.shard, i) for run in packing.approximate for p in run
                  for i in range(p.start, p.stop)]
        # Shards 0, 1, 4, 6, 7 and 5's own rows exact; 3's rows and both of 2's approximated.
        assert sorted(exact) == sorted([(s, i) for s in (0, 1, 4, 5, 6, 7) for i in range(2)])
        assert sorted(approx) == sorted([(3, 0), (3, 1), (2, 0), (2, 1)])
        # 16 rows, as even as can be: no device holds more than the busiest must.
        assert packing.capacity == -(-16 // devices)
        for d in range(devices):
            e, a = (sum(p.size for p in run[d]) for run in (packing.exact, packing.approximate))
            program = packing.programs[packing.program_index[d]]
            assert e + a <= packing.capacity and program.rows == packing.capacity
            assert program.exact_rows == (packing.capacity if not a else e)
        # Only the devices that hold neighbour-mode rows run a neighbour program.
        neighbour_devices = sum(bool(run) for run in packing.approximate)
        assert sum(packing.programs[k].role != ROLE_NORMAL for k in packing.program_index) == neighbour_devices
    assert pack(layout, 8).capacity == 2 and pack(layout, 8).programs == (
        Program(ROLE_NORMAL, 2), Program(ROLE_NEIGHBOUR, 2))


def test_roles_are_data_one_failure_at_a_time_compiles_one_failure_program():
    """Whichever replica fails, a strategy's packing has one signature: the program depends
    on the counts of rows per role, not on who failed or who adopts."""
    for strategy in ('mecefo', 'mecefo_planned', 'drop', 'elastic', 'ndb_naive'):
        signatures = set()
        for failed in range(32):
            live = tuple(r != failed for r in range(32))
            signatures.add(pack(layout_for(strategy, live, 1), 8).signature)
        assert len(signatures) == 1, (strategy, signatures)
    full = pack(layout_for('mecefo', (True,) * 32, 1), 8)
    assert full.is_plain and full.capacity == 4
    # mecefo: 30 exact rows and 2 in neighbour mode fill 8 devices of 4 rows; one device
    # runs the mixed program, the other seven the plain one.
    one_down = pack(layout_for('mecefo', tuple(r != 5 for r in range(32)), 1), 8)
    assert one_down.capacity == 4 and one_down.programs == (Program(ROLE_NORMAL, 4),
                                                            Program(ROLE_MIXED, 4, 2))
    assert sorted(one_down.program_index) == [0] * 7 + [1]


# ------------------------------------------------------------------ gradients


@pytest.fixture(scope='module')
def model_and_state():
    model = build_model(_cfg())
    params = nn.unbox(init_params(model, jax.random.key(1)))
    projections = jax.jit(compute_projections, static_argnums=1)(params, 8)
    tokens = np.random.default_rng(0).integers(0, 256, (8, 2, 33), dtype=np.int32)
    return model, params, projections, tokens


def _grads(model, params, projections, tokens, step_layout, devices):
    mesh = sharding.mesh_from_rows([[d] for d in jax.devices()[:devices]])
    fn = jax.jit(step.make_grad_fn(model, mesh, step_layout.programs, ordered_reduction=False))
    shardings = sharding.batch_shardings(mesh)
    host = step_layout.assemble(tokens)
    batch = jax.device_put(host, {k: shardings[k] for k in host})
    return jax.device_get(fn(params, projections, batch))


@pytest.mark.parametrize('strategy,device_counts', [('mecefo', (2,)), ('mecefo_planned', (8, 4, 2, 1))])
def test_rows_give_the_device_per_replica_gradient(model_and_state, strategy, device_counts):
    """mecefo's rows on 8, 4, 2 and 1 devices are the 20-step runs' below (a step's
    gradient sets its loss and parameters); here its gradient on one packing, and
    mecefo_planned's, which no run covers, on every count."""
    model, params, projections, tokens = model_and_state
    live = tuple(r != 3 for r in range(8))
    layout = layout_for(strategy, live, 2)
    assert layout.uses_neighbour_mode
    reference, ref_stats = _grads(model, params, projections, tokens, layout, 7)
    for devices in device_counts:
        grads, stats = _grads(model, params, projections, tokens, pack(layout, devices), devices)
        assert_tree_close(grads, reference, 1e-5, f'{strategy} on {devices} devices ')
        np.testing.assert_allclose(stats['loss'], ref_stats['loss'], rtol=1e-6)
        assert float(stats['attn_tokens']) == float(ref_stats['attn_tokens'])


# ------------------------------------------------------------------ whole runs


def _run(cfg, devices, workdir):
    built = run_setup.build_run(cfg, str(workdir), replica_rows=[[d] for d in jax.devices()[:devices]])
    summary = run_lib.run(cfg, str(workdir), run=built)
    losses = [row['loss'] for row in map(json.loads, open(os.path.join(workdir, 'metrics.jsonl')))
              if 'loss' in row]
    compiled = sum(len(built.topologies.get(rows).compiled) for rows in _topologies(built))
    return np.asarray(losses), jax.device_get(summary['state'].params), compiled, summary


def _topologies(built):
    return list(built.topologies._cache)  # every mesh the run built


@pytest.fixture(scope='module')
def device_per_replica(tmp_path_factory):
    cfg = _cfg(fault__events='3:2:6,12:5:4', fault__strategy='mecefo')
    return _run(cfg, 8, tmp_path_factory.mktemp('device_per_replica'))


@pytest.mark.parametrize('devices', [8, 4, 2, 1])
def test_a_20_step_run_as_rows_equals_device_per_replica(device_per_replica, devices, tmp_path):
    ref_losses, ref_params, ref_compiled, _ = device_per_replica
    cfg = _cfg(fault__events='3:2:6,12:5:4', fault__strategy='mecefo', mesh__replicas=8)
    losses, params, compiled, _ = _run(cfg, devices, tmp_path)
    assert losses.shape == ref_losses.shape == (20,)
    assert np.max(np.abs(losses - ref_losses)) <= RUN_BOUND
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
        assert float(np.max(np.abs(a - b))) <= RUN_BOUND
    # Two failures of different replicas: two new meshes before, one failure program now.
    assert ref_compiled == 3 and compiled == 2


@pytest.mark.subprocess
def test_32_replicas_on_8_devices_equal_32_devices():
    """32 replicas of one sequence, one failure at a time: gradients and a 20-step run on 8
    devices equal the device-per-replica job on 32 (a process of its own: 32 fake devices)."""
    done = subprocess.run([sys.executable, os.path.join(ROOT, 'tests', 'rows32_driver.py')],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result['grad_max_rel_err'] <= 1e-5
    assert result['loss_max_abs_err'] <= RUN_BOUND and result['param_max_abs_err'] <= RUN_BOUND
    assert result['compiled_rows'] <= 2 < result['compiled_devices']


# ------------------------------------------------------------------ the wall clock


@pytest.mark.parametrize('c', [1.0, 1.3, 2.0, 3.7])
def test_a_step_c_times_slower_sees_ceil_d_over_ct_steps_of_an_outage(c):
    t, outage_steps = 60.0, 9  # D = 540 cluster seconds, from the run's first step
    clock = WallClock(t, lambda programs: c if programs else 1.0)
    down = 0
    for _ in range(50):
        if clock.schedule_step(0) < outage_steps:  # inside the outage: the slow layout
            down += 1
            clock.advance(['slow'])
        else:
            clock.advance([])
    assert down == int(np.ceil(outage_steps * t / (c * t)))


def test_the_all_reduce_dilutes_a_slower_step():
    assert diluted(1.3, 0.0) == pytest.approx(1.3)
    assert diluted(1.3, 0.25) == pytest.approx(1.0 + 0.3 * 0.75)
    with pytest.raises(ValueError, match='allreduce_exposed'):
        diluted(1.3, 1.0)


def test_on_the_wall_clock_a_slower_strategy_lives_through_fewer_steps_of_an_outage(tmp_path):
    """ndb_naive's neighbour computes two shards exactly (about 2x a step); drop's steps cost
    one. The same 8-step outage then lasts about half as many of ndb_naive's steps."""
    down = {}
    for strategy in ('drop', 'ndb_naive'):
        cfg = _cfg(fault__events='2:1:8', fault__strategy=strategy, fault__time_model='wall_clock',
                   mesh__replicas=8)
        _, _, _, summary = _run(cfg, 2, tmp_path / strategy)
        failure, recovery = summary['events']
        down[strategy] = recovery['clock'] - failure['clock']
    assert down['drop'] == 8
    assert 3 <= down['ndb_naive'] <= 5, down


def test_steps_time_model_is_unchanged_by_the_clock(tmp_path):
    cfg = _cfg(fault__events='2:1:8', fault__strategy='ndb_naive', mesh__replicas=8)
    _, _, _, summary = _run(cfg, 2, tmp_path)
    failure, recovery = summary['events']
    assert recovery['clock'] - failure['clock'] == 8 and summary['cluster_sec'] is None
