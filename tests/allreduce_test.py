"""The all-reduce in a data-parallel step: its bytes, its ring time and how it dilutes a
slower device (studies/allreduce.py)."""
import math

import flax
import jax
import pytest

from configs.llama_350m import get_config as llama_350m
from configs.small import get_config as small
from configs.tiny import get_config as tiny
from mecefo_jax.config.resolve import resolve
from mecefo_jax.faults.step_clock import diluted
from mecefo_jax.model.llama import build_model, init_params
from studies import allreduce


def _counted(cfg) -> int:
    """The model's parameters, counted from its abstract initialisation."""
    model = build_model(cfg)
    tree = flax.linen.unbox(jax.eval_shape(lambda: init_params(model, jax.random.key(0))))
    return sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(tree))


@pytest.mark.parametrize('get_config', [tiny, small, llama_350m])
def test_the_parameter_count_is_the_models(get_config):
    cfg = resolve(get_config())  # tiny has grouped KV heads; 350M is the paper's shape
    assert allreduce.param_count(cfg.model) == _counted(cfg)


def test_the_gradient_bytes_of_the_350m_shape():
    """d 1024, 24 blocks, FFN 2736, vocabulary 32000: 367,969,280 parameters, bf16 gradients."""
    cfg = resolve(llama_350m())
    per_block = 4 * 1024 * 1024 + 3 * 1024 * 2736 + 2 * 1024
    assert allreduce.param_count(cfg.model) == 24 * per_block + 2 * 32000 * 1024 + 1024 == 367_969_280
    step = allreduce.step_allreduce(cfg, 32)
    assert step['grad_bytes'] == 2 * 367_969_280
    assert step['bus_gbps'] == 200.0  # 4 nodes: the ring crosses the network
    assert step['ring_sec'] == pytest.approx(2 * 31 / 32 * 2 * 367_969_280 / 200e9)


def test_the_ring_time_is_nccls_bus_bandwidth_factor():
    assert allreduce.ring_sec(1e9, 2, 100.0) == pytest.approx(1e9 / 100e9)  # 2 (n - 1) / n = 1
    assert allreduce.ring_sec(1e9, 32, 100.0) == pytest.approx(62 / 32 * 1e9 / 100e9)
    assert allreduce.ring_sec(1e9, 1, 100.0) == 0.0  # one replica reduces nothing
    cluster = allreduce.Cluster()
    assert cluster.bus_gbps(8) == cluster.nvlink_gbps  # one node: NVLink
    assert cluster.bus_gbps(9) == cluster.node_network_gbps


@pytest.mark.parametrize('c, compute, exposed', [(1.042, 0.036, 0.007), (2.0, 1.0, 3.0),
                                                 (0.88, 0.05, 0.02), (1.3, 0.01, 0.0)])
def test_a_slower_device_stretches_the_step_by_its_compute_only(c, compute, exposed):
    """c_eff = (c t + e) / (t + e) = 1 + (c - 1)(1 - phi), phi = e / (t + e)."""
    phi = allreduce.exposed_share(compute, exposed)
    assert diluted(c, phi) == pytest.approx((c * compute + exposed) / (compute + exposed))


def test_overlap_hides_part_of_the_ring_and_the_step_says_where_its_seconds_come_from():
    cfg = resolve(small())
    plain = allreduce.step_allreduce(cfg, 32)
    half = allreduce.step_allreduce(cfg, 32, allreduce.Cluster(overlap=0.5))
    assert half['exposed_sec'] == pytest.approx(plain['ring_sec'] / 2) and half['phi'] < plain['phi']
    assert plain['phi'] == pytest.approx(plain['exposed_sec'] / (plain['exposed_sec'] + plain['compute_sec']))
    assert 'analytic FLOPs at MFU 0.4' in plain['compute_source']
    # A bench of this very shape on a GPU gives the compute its measured step.
    shape = {k: getattr(cfg.model, k) for k in ('d_model', 'num_layers', 'ffn_hidden', 'vocab_size')}
    bench = {'ratios': {m: {'step_ms': 1.0} for m in ('ndb_naive', 'mecefo')}, 'device': 'gpu:test',
             'modes': {'normal': {'step_ms': 10.0}},
             'config': {**shape, 'per_device_batch': 1, 'seq_len': cfg.data.seq_len}}
    measured = allreduce.step_allreduce(cfg, 32, bench=bench)
    assert measured['compute_sec'] == pytest.approx(0.010) and 'GPU bench' in measured['compute_source']


def test_a_cluster_figure_out_of_range_names_itself():
    with pytest.raises(ValueError, match='Cluster.overlap'):
        allreduce.Cluster(overlap=1.5)
    with pytest.raises(ValueError, match='Cluster.mfu'):
        allreduce.Cluster(mfu=0.0)
