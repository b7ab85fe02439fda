"""What every train step must be, checked on a tiny config on every commit (no GPU needed).

* A bf16 step multiplies bf16 operands: no dot takes a float32 operand but
  the ones listed in `ALLOWED_F32_DOTS`, each asked for by the code that
  builds it. The check reads the lowered program (what any backend is asked
  to compute): XLA:CPU's optimized program computes every bf16 dot in
  float32, so the compiled text would show nothing but float32 dots here.
  The loss's dots take bf16 operands and accumulate in float32
  (`preferred_element_type`); that is not a float32 operand.
* The train state is donated: after a step, every buffer of the state it was
  given is gone (its memory became the new state's).
* Nothing but the state and scalars leaves a step: its outputs are the state
  (same shapes and dtypes) and scalar metrics, and its program calls no host
  callback and sends nothing to the host (no outfeed, send or host copy).
* `train.flat_optimizer` (Adam's moments as one vector) updates as the per-leaf
  optimizer does, and holds the attention's moments where a step has no
  attention gradient, as the per-leaf optimizer holds its leaves.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mecefo_jax.config.defaults import ConfigError
from mecefo_jax.model.optim import FlatMoments, hold_where, make_optimizer
from mecefo_jax.parallel import step as step_lib
from mecefo_jax.parallel.sharding import abstract_batch
from studies import step_modes
from studies.gpu import configs
from studies.gpu.programs import Setup, mode_layout

BATCH = 2
# Dots allowed a float32 operand in a bf16 step, by op name fragment, and who asks for them.
XLA_ATTENTION = 'BTNH,BSNH->BNTS'  # jax's XLA attention keeps the logits in float32, so the
# gradient of q k^T multiplies a float32 cotangent (cuDNN attention, the GPU variant's, has none)
LOW_RANK = 'ffn/w_'  # MeCeFO's low-rank kernel gradient, summed over tokens in float32 on
# purpose (neighbour/lowrank.py): the neighbour's program only
ALLOWED_F32_DOTS = {'normal': (XLA_ATTENTION,), 'mecefo': (XLA_ATTENTION, LOW_RANK)}
_DOT = re.compile(r'stablehlo\.dot_general .*: \((tensor<[^>]*>), (tensor<[^>]*>)\) -> .*'
                  r'loc\(#(loc\d+)\)')
_LOC = re.compile(r'^#(loc\d+) = loc\("([^"]*)"', re.M)


def _setup(**overrides):
    fields = {'model.dtype': 'bfloat16', 'model.attention': 'xla', **overrides}
    return Setup.build(configs.load('tiny', fields))


@pytest.fixture(scope='module')
def setup():
    return _setup()


def _lowered(setup, mode: str):
    programs = mode_layout(mode, BATCH).programs
    fn = step_lib.make_train_step(setup.model, setup.optimizer, setup.mesh, setup.shardings,
                                  programs, ordered_reduction=False)
    return fn.lower(setup.state_abs, abstract_batch(setup.mesh, programs[0].rows, setup.seq))


def f32_dots(lowered) -> tuple[list[str], int]:
    """(op names of the dots with a float32 operand, how many dots there are)."""
    text = lowered.as_text(debug_info=True)
    names = dict(_LOC.findall(text))
    dots = _DOT.findall(text)
    return [names.get(loc, loc) for lhs, rhs, loc in dots if 'xf32>' in lhs + rhs], len(dots)


@pytest.mark.parametrize('mode', ['normal', 'mecefo'])
def test_a_bf16_step_has_no_float32_dot_but_the_allowed_ones(setup, mode):
    found, dots = f32_dots(_lowered(setup, mode))
    assert dots >= 10  # the block's matmuls, the attention's, the loss's, in both passes
    unexplained = [n for n in found if not any(a in n for a in ALLOWED_F32_DOTS[mode])]
    assert not unexplained, f'{mode}: float32 dots nobody asked for: {unexplained}'
    assert len(found) < dots / 2


def test_a_float32_dot_in_a_bf16_step_is_found():
    """The check itself: a matmul of float32 parameters in a bf16 model is reported."""
    def step(w, x):
        return (x.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16)).sum() + (x @ w).sum()
    x = jax.ShapeDtypeStruct((4, 8), jnp.float32)
    found, dots = f32_dots(jax.jit(step).lower(jax.ShapeDtypeStruct((8, 8), jnp.float32), x))
    assert dots == 2 and len(found) == 1


def _run_once(setup, mode: str):
    compiled = _lowered(setup, mode).compile()
    state = setup.timing_state()
    batch = setup.batch(mode, BATCH, step_modes.random_tokens(setup.cfg, BATCH, seed=0))
    given = jax.tree.leaves(state)
    new_state, metrics = compiled(state, batch)
    return compiled, given, new_state, metrics


@pytest.mark.parametrize('mode', ['normal', 'mecefo'])
def test_the_state_is_donated_and_only_scalars_come_back(setup, mode):
    compiled, given, new_state, metrics = _run_once(setup, mode)
    assert all(leaf.is_deleted() for leaf in given)
    shapes = jax.tree.map(lambda a: (a.shape, a.dtype), new_state)
    assert shapes == jax.tree.map(lambda a: (a.shape, a.dtype), setup.state_abs)
    assert metrics and all(np.shape(v) == () for v in metrics.values())
    text = compiled.as_text().lower()
    for host_op in ('outfeed', ' send(', ' recv(', 'callback', ':s(5)'):
        assert host_op not in text, f'{mode}: the step has {host_op!r}'


def test_a_flat_optimizer_updates_as_the_per_leaf_one():
    results = []
    for flat in (False, True):
        setup = _setup(**{'train.flat_optimizer': flat, 'model.dtype': 'float32'})
        _, _, state, metrics = _run_once(setup, 'mecefo')
        results.append((state.params, float(metrics['loss'])))
    (per_leaf, loss_a), (flat, loss_b) = results
    assert loss_a == loss_b
    assert jax.tree.all(jax.tree.map(lambda a, b: np.allclose(a, b, rtol=1e-6, atol=1e-7),
                                     per_leaf, flat))


def _train_cfg(flat: bool):
    return configs.load('tiny', {'train.flat_optimizer': flat}).train


def test_a_flat_optimizer_holds_the_masked_stretches_of_its_moments():
    params = {'attn': {'w': jnp.ones((2, 3))}, 'ffn': {'w': jnp.ones((4,))},
              'norm': {'scale': jnp.ones((3,))}}
    mask = {'attn': {'w': True}, 'ffn': {'w': False}, 'norm': {'scale': True}}
    grads = jax.tree.map(lambda p: jnp.arange(p.size, dtype=jnp.float32).reshape(p.shape) + 1,
                         params)
    held = {}
    for flat in (False, True):
        optimizer = make_optimizer(_train_cfg(flat))
        old = optimizer.init(params)
        updates, new = optimizer.update(grads, old, params)
        new_params = optax.apply_updates(params, updates)
        held[flat] = hold_where(optimizer, jnp.bool_(True), mask, (new_params, new),
                                (params, old))
    (p_leaf, s_leaf), (p_flat, s_flat) = held[False], held[True]
    assert jax.tree.all(jax.tree.map(np.array_equal, p_leaf, p_flat))
    moments = [s for s in jax.tree.leaves(s_flat, is_leaf=lambda x: isinstance(x, FlatMoments))
               if isinstance(s, FlatMoments)][0].inner
    leaf_moments = s_leaf[1][0]
    for name in ('mu', 'nu'):
        flat_vector = np.asarray(getattr(moments, name))
        per_leaf = np.concatenate([np.ravel(a) for a in jax.tree.leaves(getattr(leaf_moments,
                                                                                name))])
        np.testing.assert_array_equal(flat_vector, per_leaf)
        assert flat_vector[:6].sum() == 0 and flat_vector[6:10].sum() > 0  # attn held, ffn not


def test_a_flat_optimizer_needs_one_model_column():
    with pytest.raises(ConfigError, match=r'train\.flat_optimizer.*mesh\.model=1'):
        configs.load('tiny', {'train.flat_optimizer': True, 'mesh.model': 2})
