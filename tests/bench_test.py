"""Tests for mecefo_jax.bench: the step-cost benchmark on a tiny model."""
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import tiny
from mecefo_jax import bench


@pytest.fixture(scope='module')
def result(tmp_path_factory):
    """One benchmark run on a 1-block tiny model with square FFN kernels at full rank.

    One block: its FFN's output cotangent comes straight from the head, so the
    only FFN approximation left is the low-rank kernel gradient; square FFN
    kernels at full rank make V V^T = I, so that is exact too.
    """
    cfg = tiny.get_config()
    cfg.model.num_layers = 1
    cfg.model.ffn_hidden = cfg.model.d_model
    cfg.mecefo.rank = 1.0  # full rank: min(n, m) = d_model
    out = tmp_path_factory.mktemp('bench')
    res = bench.run_benchmark(cfg, str(out), batch=2, warmup=1, iters=1,
                              device=jax.devices()[0], with_update=False, log=lambda _: None)
    with open(out / bench.OUTPUT_FILE) as f:
        written = json.load(f)
    return res, written


def test_json_schema(result):
    res, written = result
    assert set(written['modes']) == set(bench.MODES)
    assert set(written['ratios']) == set(bench.MODES)
    for mode in bench.MODES:
        assert set(written['modes'][mode]) == set(bench.METRICS)
        assert set(written['ratios'][mode]) == set(bench.METRICS)
        for metric in bench.METRICS:
            assert math.isfinite(written['modes'][mode][metric])
            assert written['modes'][mode][metric] > 0
        assert written['ratios'][mode] == pytest.approx(
            {k: written['modes'][mode][k] / written['modes']['normal'][k] for k in bench.METRICS})
    assert written['ratios']['normal'] == pytest.approx(dict.fromkeys(bench.METRICS, 1.0))
    assert set(written['grad_rel_error']) == set(bench.GROUPS)
    assert written['modes'] == res['modes']


def test_ndb_naive_is_twice_normal_in_flops(result):
    # Same per-slot program run on two shards: exactly twice the work, plus one
    # add per parameter to accumulate the second slot's gradients (~0.2% here);
    # XLA may share only shape-only constants (causal mask, rotary tables).
    # This also cross-checks the two ways FLOPs are counted: normal (one slot,
    # no loop) is XLA's count of the step program itself, ndb_naive comes from
    # the counting program with the slot loop unrolled.
    res, _ = result
    assert res['details']['normal']['flops_source'] == 'step_program'
    assert res['details']['ndb_naive']['flops_source'] == 'unrolled_slots'
    assert res['ratios']['ndb_naive']['flops'] == pytest.approx(2.0, abs=0.02)


def test_mecefo_is_cheaper_than_naive(result):
    # No attention backward, no attention activations kept: fewer FLOPs and
    # less scratch memory than doing both shards exactly. (A failure on temp
    # memory also means XLA did not fold the role cond.)
    res, _ = result
    assert res['modes']['mecefo']['flops'] < res['modes']['ndb_naive']['flops']
    assert res['modes']['mecefo']['temp_bytes'] < res['modes']['ndb_naive']['temp_bytes']


def test_grad_rel_error(result):
    res, _ = result
    err = res['grad_rel_error']
    # The neighbour contributes no attention-branch gradient: its output is 0 there.
    assert err['attention'] == pytest.approx(1.0, abs=1e-6)
    # Full-rank projections of square kernels and a single block: exact FFN gradient.
    assert err['ffn'] < 1e-4
    # The embedding gradient misses the attention cotangent: inexact, but bounded.
    assert 0.0 < err['other'] < 1.0
    assert 0.0 < err['total_non_attention'] < 1.0


def test_param_group_and_rel_error_on_a_hand_made_tree():
    exact = {'embedding': jnp.ones((2, 2)),
             'layers_0': {'attn': {'wq': jnp.ones((2, 2))}, 'attn_norm': {'scale': jnp.ones(2)},
                          'ffn': {'w_up': {'kernel': jnp.ones((2, 2))}},
                          'ffn_norm': {'scale': jnp.ones(2)}}}
    groups = jax.tree_util.tree_map_with_path(lambda p, _: bench.param_group(p), exact)
    assert groups['layers_0']['attn']['wq'] == 'attention'
    assert groups['layers_0']['attn_norm']['scale'] == 'attention'
    assert groups['layers_0']['ffn']['w_up']['kernel'] == 'ffn'
    assert groups['layers_0']['ffn_norm']['scale'] == 'other'
    assert groups['embedding'] == 'other'
    approx = jax.tree.map(jnp.zeros_like, exact)
    approx['layers_0']['ffn']['w_up']['kernel'] = 2 * jnp.ones((2, 2))  # error = exact
    approx['embedding'] = jnp.ones((2, 2))  # exact
    approx['layers_0']['ffn_norm']['scale'] = jnp.ones(2)
    err = bench.grad_rel_error(approx, exact)
    assert err['attention'] == pytest.approx(1.0)
    assert err['ffn'] == pytest.approx(1.0)
    assert err['other'] == pytest.approx(0.0)
    assert err['total_non_attention'] == pytest.approx(np.sqrt(4 / (4 + 4 + 2)))


class _Compiled:
    def __init__(self, analysis):
        self.analysis = analysis

    def cost_analysis(self):
        return self.analysis


def test_flops_of_accepts_dict_list_and_none():
    assert bench.flops_of(_Compiled({'flops': 3.0})) == 3.0
    assert bench.flops_of(_Compiled([{'flops': 5.0}])) == 5.0
    assert math.isnan(bench.flops_of(_Compiled(None)))
    assert math.isnan(bench.flops_of(_Compiled([])))
