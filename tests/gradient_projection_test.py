"""`mecefo.projection='gradient'` outside the rule itself (tests/lowrank_test.py has that):
what it costs in the FLOP model and in XLA's count, and that nothing refreshes or charges
projections it never reads (the fault controller, the time-to-target arithmetic)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import small, tiny
from mecefo_jax.config.resolve import resolve, updated
from mecefo_jax.failure_schedule import FailureSchedule, parse_events
from mecefo_jax.faults import controller as controller_lib
from mecefo_jax.faults import costs as costs_lib
from mecefo_jax.faults.costs import thin_qr_flops
from mecefo_jax.faults.planner import config_planner
from mecefo_jax.neighbour.layout import ROLE_NEIGHBOUR, ROLE_NORMAL
from mecefo_jax.neighbour.lowrank import lowrank_dense, sketch_matrix, sketched_dense
from studies import fidelity as projection_rules
from studies import goodput
from studies import time_to_target_report as report_lib
from studies.xla_costs import flops_of

N_IN, M_OUT, RANK = 32, 48, 8


def _xla_kernel_grad_flops(rule: str, tokens: int) -> float:
    """XLA's FLOPs of one kernel's gradient (forward residuals included) under `rule`."""
    x, k, g = jnp.ones((tokens, N_IN)), jnp.ones((N_IN, M_OUT)), jnp.ones((tokens, M_OUT))
    v = jnp.ones((N_IN, RANK))
    dense = {'weights': lambda x, k: lowrank_dense(x, k, v),
             'gradient': lambda x, k: sketched_dense(x, k, RANK)}[rule]
    grad = jax.jit(lambda x, k, g: jax.vjp(lambda k: dense(x, k), k)[1](g))
    return flops_of(grad.lower(x, k, g).compile())


def test_the_cost_model_counts_what_xla_compiles_for_each_rule():
    # Every matmul FLOP of the compiled kernel gradient is counted: XLA's count minus
    # drawing Omega (elementwise, which the model leaves out) is the model's minus the
    # thin QR (a LAPACK custom call XLA counts as nothing). Bound 4: XLA's custom call
    # reports -2.
    omega = flops_of(jax.jit(lambda: sketch_matrix(N_IN, M_OUT, RANK)).lower().compile())
    for tokens in (64, 256):
        kw = dict(rank=RANK, tokens=tokens)
        weights = costs_lib.ffn_wgrad_flops(N_IN, M_OUT, projection='weights', **kw)
        assert _xla_kernel_grad_flops('weights', tokens) == weights
        gradient = costs_lib.ffn_wgrad_flops(N_IN, M_OUT, projection='gradient', **kw)
        assert _xla_kernel_grad_flops('gradient', tokens) - omega == pytest.approx(
            gradient - thin_qr_flops(N_IN, RANK), abs=4)
    # By hand: the sketch adds 2t(n+m)r and the QR, nothing else.
    assert gradient - weights == pytest.approx(
        2 * 256 * (N_IN + M_OUT) * RANK + thin_qr_flops(N_IN, RANK), rel=1e-12)
    with pytest.raises(ValueError, match='projection'):
        costs_lib.ffn_wgrad_flops(N_IN, M_OUT, projection='svd', **kw)


def test_the_planner_weighs_the_configs_own_rule():
    cfg = resolve(small.get_config())
    sketched = updated(cfg, {'mecefo.projection': 'gradient'})
    shard, shape = 4, costs_lib.shape_of(cfg.model)
    tokens = 2 * shard * cfg.data.seq_len  # a neighbour's two shards, one batch
    kw = dict(mode='neighbour', seq_len=cfg.data.seq_len, rank=32, batch_tokens=tokens,
              recompute_ffn=False)
    extra = (costs_lib.block_flops_per_token(shape, projection='gradient', **kw)
             - costs_lib.block_flops_per_token(shape, **kw))
    d, h, r = cfg.model.d_model, cfg.model.ffn_hidden, 32
    assert extra == pytest.approx(3 * 2 * r * (d + h) + (2 * thin_qr_flops(d, r)
                                                         + thin_qr_flops(h, r)) / tokens)
    normal = costs_lib.flops_per_token(shape, mode='normal', seq_len=cfg.data.seq_len)
    cost_w, cost_g = config_planner(cfg, shard).cost, config_planner(sketched, shard).cost
    assert cost_g(ROLE_NORMAL, shard) == cost_w(ROLE_NORMAL, shard) == 1.0
    assert cost_g(ROLE_NEIGHBOUR, 2 * shard) - cost_w(ROLE_NEIGHBOUR, 2 * shard) == pytest.approx(
        2 * cfg.model.num_layers * extra / normal)


class _Topology:
    """A topology whose programs cost nothing; its refresh counts its calls."""
    state_shardings = None
    refreshed = 0

    def batch_spec(self, layout, length):
        return None

    def compiled_step(self, state, spec, layout):
        return None, 0.0

    def refresh(self, state):
        self.refreshed += 1
        return state


@dataclasses.dataclass
class _Run:
    """What the fault controller reads of a training run, and nothing to train."""
    cfg: object
    full_rows: tuple = tuple(range(8))
    checkpointer: object = None

    def __post_init__(self):
        self.topology = _Topology()
        self.topologies = type('Cache', (), {'get': lambda _, rows: self.topology})()
        self.metrics = type('Metrics', (), {'write': lambda _, row: None})()
        self.num_shards, self.present = len(self.full_rows), (True,) * len(self.full_rows)
        self.present_rows, self.shard_batch = self.full_rows, 2

    def rows_for(self, live):
        return tuple(row for row, up in zip(self.full_rows, live) if up)

    def packing(self, layout):
        return None  # one replica per device row


@pytest.mark.parametrize('projection, refreshed', [('weights', [2, 3, 6]), ('gradient', [])])
def test_the_controller_refreshes_only_the_projections_a_neighbour_reads(
        projection, refreshed, monkeypatch):
    # Replica 3 down for steps 2 to 6 with tau 3: the paper's rule refreshes at the
    # onset and at multiples of tau (the control), the gradient rule never.
    monkeypatch.setattr(controller_lib, 'move_state', lambda state, shardings: state)
    cfg = updated(resolve(tiny.get_config()), {'mecefo.tau': 3, 'mecefo.projection': projection})
    run = _Run(cfg)
    controller = controller_lib.FaultController(
        run, FailureSchedule(parse_events('2:3:5'), run.num_shards), 'mecefo')
    for step in range(9):
        state = type('State', (), {'step': step})()
        controller.prepare(step, step, state)
    summary = controller.summary()
    assert summary['refresh_steps'] == refreshed
    assert run.topology.refreshed == len(refreshed)
    assert [e['kind'] for e in summary['events']] == ['failure', 'recovery']


def test_modelled_time_weighs_each_run_by_its_own_rule_and_charges_no_refresh():
    cfg = resolve(small.get_config())
    model_for = report_lib.time_models(cfg, 8, goodput.TimeCosts())
    degraded = {'live': [False] + [True] * 7, 'programs': [[0, 4, 0], [1, 8, 0]]}
    base = {'rank': cfg.mecefo.rank}  # a record written before mecefo.projection existed
    weights, gradient = model_for(base), model_for(dict(base, projection='gradient'))
    assert model_for(dict(base, projection='weights')) is weights
    assert weights.step_ratio(degraded) == goodput.TimeModel(cfg, 8).step_ratio(degraded)
    assert gradient.step_ratio(degraded) > weights.step_ratio(degraded) > 1.0
    assert weights.refresh_sec(7) > 0.0 and gradient.refresh_sec(7) == 0.0
    assert 'gradient' in gradient.refresh['refresh_source']


def test_the_reports_projections_are_the_rules_own():
    # projection_rules measures each rule from the exact kernel gradient G alone: for
    # 'gradient' that is sketched_dense's own result (x^T (G_y Omega) = G Omega), for
    # 'weights' lowrank_dense's; no rank-r rule beats the SVD truncation ('best').
    kx, kk, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (40, N_IN))
    k = jax.random.normal(kk, (N_IN, M_OUT)) / np.sqrt(N_IN)
    g = jax.random.normal(kg, (40, M_OUT))
    exact, kernel = np.asarray(x.T @ g, np.float64), np.asarray(k, np.float64)
    sketched = jax.vjp(lambda k: sketched_dense(x, k, RANK), k)[1](g)[0]
    v = jnp.linalg.svd(k, full_matrices=False)[0][:, :RANK]
    weights = jax.vjp(lambda k: lowrank_dense(x, k, v), k)[1](g)[0]
    for rule, library in (('gradient', sketched), ('weights', weights)):
        np.testing.assert_allclose(projection_rules.projected(rule, kernel, exact, RANK), library,
                                   rtol=1e-4, atol=1e-4)
    errors = {rule: np.linalg.norm(exact - projection_rules.projected(rule, kernel, exact, RANK))
              for rule in projection_rules.RULES}
    assert errors['best'] <= min(errors.values()) and errors['gradient_power1'] < errors['gradient']

