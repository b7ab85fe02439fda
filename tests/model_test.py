"""Tests for mecefo_jax.model.llama: the exact LLaMA and its MeCeFO neighbour mode.

The neighbour-mode checks compare against `_ref_*`, a plain-jnp LLaMA written
here from the textbook formulas (no Flax, no custom_vjp, no remat), so a
mistake in model.py cannot cancel against the same mistake in the reference.

The model under test is the production one: blocks under `nn.scan`. Tests
hold parameters per layer (`layers_<i>`, the reference's form) and the jitted
wrappers below stack them for the scanned model, so gradients come back per
layer too (tests/layer_trees.py).
"""
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from jax import lax
from jax.ad_checkpoint import print_saved_residuals
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from layer_trees import stack_layers
from tree_asserts import assert_tree_close

from configs import tiny
from mecefo_jax.config.resolve import resolve
from mecefo_jax.model.llama import Block, Llama, build_model, init_params
from mecefo_jax.neighbour.contract import is_attention_branch
from mecefo_jax.neighbour.projections import compute_projections
from mecefo_jax.parallel import sharding

# tiny config: D=32, 2 layers, H=4, K=2 (G=2), E=8, F=64, V=256. Batch and
# length are chosen distinct from every model dim so shapes identify tensors.
B, L = 3, 10
RANK = 8  # low rank for the generic neighbour-mode checks (< D and < F)

# Compile-time budget: on CPU, XLA's LLVM backend dominates the compile time of
# these tiny programs; optimisation level 0 roughly halves it. It changes only
# machine-code generation, not the HLO graph or its op order, so every property
# checked with it holds as well at the default level. The bitwise-forward test
# uses the default options, since that is the claim about production.
FAST = {'xla_backend_optimization_level': 0}


def _jit(fn, **kwargs):
    return jax.jit(fn, compiler_options=FAST, **kwargs)


def _model(**changes) -> Llama:
    model = build_model(resolve(tiny.get_config()), **changes)
    assert model.cfg.dtype == 'float32'
    return model


MODEL = _model()
CFG = MODEL.cfg
assert CFG.scan_layers  # the production path
D, F, H, K, E = CFG.d_model, CFG.ffn_hidden, CFG.num_heads, CFG.num_kv_heads, CFG.d_model // CFG.num_heads
G = H // K


def _init(model, seed):
    """(boxed shapes, float32 per-layer params) without compiling Flax's RNG initialisers.

    `init_params` under `jax.eval_shape` gives the real tree and logical axis
    boxes at no compile cost; values are drawn with numpy at the init scales
    (1/sqrt(fan-in)). Norm scales are spread around 1 so a wrong scale path shows.
    The boxes are the model's own (scanned: a leading layer axis); the values
    are drawn for the per-layer (looped) tree of the same parameters.
    """
    boxed = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
    looped = model.variant(scan_layers=False)
    per_layer = jax.eval_shape(lambda: init_params(looped, jax.random.key(0)))
    rng = np.random.default_rng(seed)

    def fill(path, sds):
        name = jax.tree_util.keystr(path)
        if name.endswith("['scale']"):
            value = 1.0 + 0.3 * rng.standard_normal(sds.shape)
        elif name == "['embedding']":
            value = rng.standard_normal(sds.shape)
        else:
            fan_in = sds.shape[0] * (sds.shape[1] if name.endswith("['wo']") else 1)
            value = rng.standard_normal(sds.shape) / np.sqrt(fan_in)
        return jnp.asarray(value, jnp.float32)

    return boxed, jax.tree_util.tree_map_with_path(fill, nn.unbox(per_layer))


_projections = _jit(compute_projections, static_argnums=1)


@pytest.fixture(scope='module')
def setup():
    model = MODEL
    boxed, params = _init(model, seed=0)
    tokens = np.random.default_rng(1).integers(0, CFG.vocab_size, (B, L), dtype=np.int32)
    return model, boxed, params, tokens


def _variables(model, p, v):
    """Per-layer trees in the form `model` takes (stacked when scanned)."""
    if model.cfg.scan_layers:
        p, v = stack_layers(p), stack_layers(v)
    return {'params': p, 'projections': v}


@functools.cache
def _apply_fn(model):
    """Jitted logits (default compiler options); `neighbour` is static."""
    return jax.jit(
        lambda p, v, t, neighbour: model.apply(_variables(model, p, v), t, neighbour=neighbour),
        static_argnames='neighbour')


def _loss_weights(seed=2):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((B, L, CFG.vocab_size)).astype(np.float32)


@functools.cache
def _value_and_grad(model, neighbour):
    """fn(params, projections, tokens, w) -> value and grads of sum(logits * w)."""
    def loss(p, v, t, w):
        return jnp.sum(model.apply(_variables(model, p, v), t, neighbour=neighbour) * w)
    return _jit(jax.value_and_grad(loss))


def _grads(model, neighbour, params, v, tokens, w=None):
    w = _loss_weights() if w is None else w
    return _value_and_grad(model, neighbour)(params, v, tokens, w)[1]


# ---------------------------------------------------------------------------
# Independent plain-jnp reference.
# ---------------------------------------------------------------------------

def _ref_rms(x, scale, eps=CFG.norm_eps):
    return x / jnp.sqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps) * scale


def _ref_rope(x_blhe, theta=CFG.rope_theta):
    """RoPE pairing element i with i + E/2 (the LLaMA 'rotate_half' convention)."""
    e = x_blhe.shape[-1]
    inv_freq = 1.0 / (theta ** (np.arange(0, e, 2, dtype=np.float64) / e))
    angle = np.arange(x_blhe.shape[1], dtype=np.float64)[:, None] * inv_freq[None, :]
    cos = np.concatenate([np.cos(angle)] * 2, axis=-1).astype(np.float32)[None, :, None, :]
    sin = np.concatenate([np.sin(angle)] * 2, axis=-1).astype(np.float32)[None, :, None, :]
    first, second = x_blhe[..., :e // 2], x_blhe[..., e // 2:]
    rotate_half = jnp.concatenate([-second, first], axis=-1)
    return x_blhe * cos + rotate_half * sin


def _ref_attention(x_bld, p):
    """Causal GQA: query head h reads kv head h // G."""
    q = _ref_rope(jnp.einsum('bld,dhe->blhe', x_bld, p['wq']))
    k = jnp.repeat(_ref_rope(jnp.einsum('bld,dke->blke', x_bld, p['wk'])), G, axis=2)
    v = jnp.repeat(jnp.einsum('bld,dke->blke', x_bld, p['wv']), G, axis=2)
    length = x_bld.shape[1]
    scores = jnp.einsum('blhe,bmhe->bhlm', q, k) / np.sqrt(E)
    scores = jnp.where(np.tril(np.ones((length, length), bool)), scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum('bhlm,bmhe->blhe', probs, v)
    return jnp.einsum('blhe,hed->bld', out, p['wo'])


def _ref_ffn(x_bld, p):
    gate = x_bld @ p['w_gate']['kernel']
    return ((gate * jax.nn.sigmoid(gate)) * (x_bld @ p['w_up']['kernel'])) @ p['w_down']['kernel']


def _ref_block(x_bld, p, stop_attention):
    a = _ref_attention(_ref_rms(x_bld, p['attn_norm']['scale']), p['attn'])
    if stop_attention:
        a = lax.stop_gradient(a)
    h = x_bld + a
    return h + _ref_ffn(_ref_rms(h, p['ffn_norm']['scale']), p['ffn'])


def _ref_logits(p, tokens, stop_attention=False):
    x = p['embedding'][tokens]
    for i in range(CFG.num_layers):
        x = _ref_block(x, p[f'layers_{i}'], stop_attention)
    return _ref_rms(x, p['final_norm']['scale']) @ p['head']


@functools.cache
def _ref_value_and_grad(stop_attention):
    def loss(p, t, w):
        return jnp.sum(_ref_logits(p, t, stop_attention) * w)
    return _jit(jax.value_and_grad(loss))


def _ref_grads(stop_attention, params, tokens):
    return _ref_value_and_grad(stop_attention)(params, tokens, _loss_weights())[1]


def _ffn_kernel_name(path):
    keys = [getattr(k, 'key', k) for k in path]
    if keys[-1] == 'kernel' and keys[-2] in ('w_gate', 'w_up', 'w_down'):
        return keys[-2]
    return None


def _at(tree, path):
    for k in path:
        tree = tree[getattr(k, 'key', k)]
    return tree


# ---------------------------------------------------------------------------
# Exact model.
# ---------------------------------------------------------------------------

def test_param_and_logit_shapes(setup):
    model, boxed, params, tokens = setup
    n = CFG.num_layers
    layer_shapes = {'attn': {'wq': (D, H, E), 'wk': (D, K, E), 'wv': (D, K, E), 'wo': (H, E, D)},
                    'attn_norm': {'scale': (D,)}, 'ffn_norm': {'scale': (D,)},
                    'ffn': {'w_gate': {'kernel': (D, F)}, 'w_up': {'kernel': (D, F)},
                            'w_down': {'kernel': (F, D)}}}
    # Scanned: one tree per block type, every leaf with a leading layer axis.
    shapes = jax.tree.map(lambda x: x.shape, nn.unbox(boxed))
    assert shapes['embedding'] == (CFG.vocab_size, D)
    assert shapes['head'] == (D, CFG.vocab_size)
    assert shapes['final_norm']['scale'] == (D,)
    assert shapes['layers'] == jax.tree.map(lambda s: (n,) + s, layer_shapes,
                                            is_leaf=lambda x: isinstance(x, tuple))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nn.unbox(boxed)))
    # Boxes carry logical axis names for every parameter, the layer axis first.
    specs = nn.get_partition_spec(boxed)
    assert specs['layers']['attn']['wq'] == P('layers', 'embed', 'heads', 'head_dim')
    assert specs['layers']['ffn']['w_down']['kernel'] == P('layers', 'mlp', 'embed')
    # Looped (the tests' per-layer form): the same leaves, one tree per block.
    looped = jax.tree.map(lambda x: x.shape, params)
    for i in range(n):
        assert looped[f'layers_{i}'] == layer_shapes
    assert f'layers_{n}' not in looped

    logits = _apply_fn(model)(params, {}, tokens, neighbour=False)
    assert logits.shape == (B, L, CFG.vocab_size) and logits.dtype == jnp.float32
    assert np.all(np.isfinite(logits))


def test_scanned_layers_equal_the_loop(setup):
    """nn.scan over blocks is the same computation as the Python loop of blocks."""
    model, _, params, tokens = setup
    loop = MODEL.variant(scan_layers=False)
    v = _projections(params, RANK)
    for neighbour in (False, True):
        # Same ops per block; only how XLA schedules them around the loop differs.
        np.testing.assert_allclose(_apply_fn(model)(params, v, tokens, neighbour=neighbour),
                                   _apply_fn(loop)(params, v, tokens, neighbour=neighbour),
                                   rtol=1e-5, atol=1e-5)
        assert_tree_close(_grads(model, neighbour, params, v, tokens),
                          _grads(loop, neighbour, params, v, tokens), 1e-5,
                          f'scan vs loop (neighbour={neighbour}) ')


def test_is_attention_branch_selects_attn_and_attn_norm(setup):
    _, boxed, params, _ = setup
    scanned = sorted(jax.tree_util.keystr(path) for path, _ in
                     jax.tree_util.tree_leaves_with_path(nn.unbox(boxed))
                     if is_attention_branch(path))
    assert scanned == sorted(f"['layers']['{m}']['{n}']" for m, n in
                             [('attn', 'wq'), ('attn', 'wk'), ('attn', 'wv'), ('attn', 'wo'),
                              ('attn_norm', 'scale')])
    selected = sorted(jax.tree_util.keystr(path) for path, _ in
                      jax.tree_util.tree_leaves_with_path(params) if is_attention_branch(path))
    expected = sorted(f"['layers_{i}']['{m}']['{n}']" for i in range(CFG.num_layers)
                      for m, n in [('attn', 'wq'), ('attn', 'wk'), ('attn', 'wv'),
                                   ('attn', 'wo'), ('attn_norm', 'scale')])
    assert selected == expected


def test_matches_independent_reference(setup):
    model, _, params, tokens = setup
    logits = _apply_fn(model)(params, {}, tokens, neighbour=False)
    ref = _jit(_ref_logits)(params, tokens)
    # float32; only the association order differs (einsum grouping, rope, mask).
    np.testing.assert_allclose(logits, ref, rtol=1e-4, atol=1e-4)
    grads = _grads(model, False, params, {}, tokens)
    assert_tree_close(grads, _ref_grads(False, params, tokens), 1e-4, 'exact grad vs reference ')


def test_causality_of_logits(setup):
    model, _, params, tokens = setup
    fn = _apply_fn(model)
    v = _projections(params, RANK)
    t = 4
    changed = tokens.copy()
    changed[:, t] = (changed[:, t] + 17) % CFG.vocab_size
    for neighbour in (False, True):
        before = fn(params, v, tokens, neighbour=neighbour)
        after = fn(params, v, changed, neighbour=neighbour)
        # Masked probabilities are exactly 0, so earlier positions don't move at all;
        # 1e-6 only guards against a backend reassociating a reduction.
        np.testing.assert_allclose(after[:, :t], before[:, :t], rtol=0, atol=1e-6)
        diff = np.max(np.abs(after - before), axis=-1)  # [B, L]
        assert np.all(diff[:, t:] > 1e-4), diff


def test_causality_of_gradients(setup):
    # Every token id is used at exactly one (example, position), so the
    # embedding-row gradient of a loss on position s shows which inputs
    # position s's backward reaches: rows of later positions must get exactly zero.
    model, _, params, _ = setup
    v = _projections(params, RANK)
    tokens = np.random.default_rng(3).permutation(CFG.vocab_size)[:B * L].reshape(B, L)
    tokens = tokens.astype(np.int32)
    s = 5
    w = np.zeros((B, L, CFG.vocab_size), np.float32)
    w[:, s] = _loss_weights()[:, s]
    for neighbour in (False, True):
        g_emb = np.asarray(_grads(model, neighbour, params, v, tokens, w)['embedding'])
        row_norm = np.linalg.norm(g_emb[tokens], axis=-1)  # [B, L]
        np.testing.assert_array_equal(row_norm[:, s + 1:], 0.0)
        assert np.all(row_norm[:, s] > 0), (neighbour, row_norm)
        if neighbour:
            # Attention is the only cross-position path and it is cut from
            # backward: the gradient reaches position s's own token only.
            np.testing.assert_array_equal(row_norm[:, :s], 0.0)
        else:
            assert np.all(row_norm[:, :s] > 0), row_norm
        unused = np.setdiff1d(np.arange(CFG.vocab_size), tokens[:, :s + 1].ravel())
        np.testing.assert_array_equal(g_emb[unused], 0.0)


def test_sharded_mesh_gives_same_logits(setup):
    model, boxed, params, tokens = setup
    devices = np.array(jax.devices()[:8]).reshape(4, 2)
    mesh = sharding.mesh_from_rows(devices)
    assert dict(mesh.shape) == {'data': 4, 'model': 2}
    scanned = stack_layers(params)
    sharded_params = jax.device_put(scanned, sharding.logical_shardings(boxed, mesh))
    # The tensor-parallel placement really splits heads / FFN hidden / vocab
    # (the stacked layer axis stays whole).
    layers = sharded_params['layers']
    assert layers['attn']['wq'].sharding.spec == P(None, None, 'model', None)
    assert layers['attn']['wk'].sharding.spec == P(None, None, 'model', None)
    assert layers['ffn']['w_down']['kernel'].sharding.spec == P(None, 'model', None)
    assert sharded_params['head'].sharding.spec == P(None, 'model')
    tokens4 = np.concatenate([tokens, tokens[:1]], axis=0)  # 4 rows for data=4
    sharded_tokens = jax.device_put(tokens4, NamedSharding(mesh, P('data')))

    fn = jax.jit(lambda p, t: model.apply({'params': p}, t))
    logits_sharded = fn(sharded_params, sharded_tokens)
    assert logits_sharded.sharding.mesh.shape == mesh.shape
    single = jax.devices()[0]
    logits = fn(jax.device_put(scanned, single), jax.device_put(tokens4, single))
    # Tensor parallelism splits the head/FFN/attention-output contractions into
    # partial sums, so agreement is to float32 rounding, not bitwise.
    np.testing.assert_allclose(logits_sharded, logits, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# Neighbour mode.
# ---------------------------------------------------------------------------

def test_neighbour_forward_is_bitwise_exact(setup):
    # Expected bitwise: stop_gradient is the identity in forward, nn.remat only
    # changes what the backward recomputes, and lowrank_dense's primal is the
    # same `x @ kernel.astype(x.dtype)` as the normal FFNLinear. Both modes
    # lower to the same forward ops in the same order, so XLA has nothing to
    # reassociate differently.
    model, _, params, tokens = setup
    fn = _apply_fn(model)
    v = _projections(params, RANK)
    np.testing.assert_array_equal(fn(params, v, tokens, neighbour=True),
                                  fn(params, v, tokens, neighbour=False))
    # Also when the forward runs under differentiation (what a neighbour's step does).
    w = _loss_weights()
    values = [_value_and_grad(model, n)(params, v, tokens, w)[0] for n in (False, True)]
    assert values[0] == values[1], values


def test_neighbour_mode_needs_projections(setup):
    model, _, params, tokens = setup
    with pytest.raises(ValueError, match='projections'):
        jax.eval_shape(lambda p: model.apply({'params': stack_layers(p)}, tokens,
                                             neighbour=True), params)


def test_gradient_projection_lowers_the_ffn_error_and_leaves_normal_mode_bitwise(setup):
    """`mecefo.projection='gradient'`: the neighbour's FFN error (grad_error's measure,
    against the exact gradient of the same rows) falls below the paper's rule's at the
    same rank; normal mode is the same program; no projections are read."""
    from studies.fidelity import grad_rel_error, token_grad_fn
    model, _, params, _ = setup
    sketched = _model(projection='gradient', rank=float(RANK))
    params = stack_layers(params)
    v = compute_projections(params, RANK)
    tokens = np.random.default_rng(3).integers(0, CFG.vocab_size, (4, 17), dtype=np.int32)
    weights = np.ones(len(tokens), np.float32)
    grad_w, grad_g = token_grad_fn(model), token_grad_fn(sketched)
    exact = grad_w(params, v, tokens, weights, neighbour=False)
    jax.tree.map(np.testing.assert_array_equal,
                 grad_g(params, v, tokens, weights, neighbour=False), exact)
    error_w = grad_rel_error(grad_w(params, v, tokens, weights, neighbour=True), exact)['ffn']
    error_g = grad_rel_error(grad_g(params, {}, tokens, weights, neighbour=True), exact)['ffn']
    # Measured: 0.75 against 0.92 (64 tokens, r = 8, random weights; both include the
    # attention cotangent a neighbour drops).
    assert error_g < error_w - 0.1, (error_g, error_w)


def test_neighbour_gradients_match_reference(setup):
    """Every neighbour-mode gradient, written out from the reference model.

    With the attention branch stop-gradiented and exact activation gradients
    everywhere, the only approximation left is the FFN kernel gradient, which
    must be V V^T times the exact kernel gradient of that same reference.
    """
    model, _, params, tokens = setup
    v = _projections(params, RANK)
    grads = _grads(model, True, params, v, tokens)
    ref = _ref_grads(True, params, tokens)

    def expected(path, g_ref):
        if is_attention_branch(path):
            return jnp.zeros_like(g_ref)
        if _ffn_kernel_name(path):
            v_nr = _at(v, path)
            assert v_nr.shape == (g_ref.shape[0], RANK)
            return v_nr @ (v_nr.T @ g_ref)
        return g_ref

    # Tolerance: float32 reassociation through 2 blocks, relative to each leaf's max.
    assert_tree_close(grads, jax.tree_util.tree_map_with_path(expected, ref), 1e-4,
                       'neighbour grad ')
    # The low rank really bites: projected kernel grads differ from the exact ones.
    g_gate = grads['layers_0']['ffn']['w_gate']['kernel']
    r_gate = ref['layers_0']['ffn']['w_gate']['kernel']
    assert np.max(np.abs(g_gate - r_gate)) > 0.05 * np.max(np.abs(r_gate))


def test_neighbour_attention_gradients_are_exactly_zero(setup):
    model, _, params, tokens = setup
    v = _projections(params, RANK)
    g_neigh = _grads(model, True, params, v, tokens)
    g_exact = _grads(model, False, params, v, tokens)
    for path, g in jax.tree_util.tree_leaves_with_path(g_neigh):
        name = jax.tree_util.keystr(path)
        assert np.any(np.asarray(_at(g_exact, path)) != 0), name  # control: exact mode trains it
        if is_attention_branch(path):
            np.testing.assert_array_equal(g, np.zeros_like(g), err_msg=name)
        else:
            assert np.any(np.asarray(g) != 0), name


@_jit
def _block_cotangents(p0, v0, x, g):
    """x-cotangents of: neighbour Block, exact Block, and the residual-only reference."""
    # Attention output computed by the reference and closed over below: the vjp
    # is taken wrt the inner function's argument only, so `a` is a constant there.
    a = _ref_attention(_ref_rms(x, p0['attn_norm']['scale']), p0['attn'])

    def residual_only(x_bld):
        h = x_bld + a
        return h + _ref_ffn(_ref_rms(h, p0['ffn_norm']['scale']), p0['ffn'])

    def block(neighbour):
        return lambda x_bld: Block(CFG, MODEL.rules, neighbour=neighbour).apply(
            {'params': p0, 'projections': v0}, x_bld)[0]

    out = {}
    for name, fn in [('reference', residual_only), ('neighbour', block(True)),
                     ('exact', block(False))]:
        y, vjp_fn = jax.vjp(fn, x)
        out[name] = (y, vjp_fn(g)[0])
    return out


def test_block_input_cotangent_takes_residual_path_only(setup):
    """vjp wrt a block's input equals that of h + FFN(norm(h)), h = x + A, A constant."""
    _, _, params, _ = setup
    p0 = params['layers_0']
    v0 = _projections(params, RANK)['layers_0']  # low rank: must not touch x-grads
    rng = np.random.default_rng(4)
    x = rng.standard_normal((B, L, D)).astype(np.float32)
    g = rng.standard_normal((B, L, D)).astype(np.float32)

    out = _block_cotangents(p0, v0, x, g)
    (ref_y, ref_gx), (y, gx), (exact_y, exact_gx) = (
        out['reference'], out['neighbour'], out['exact'])
    np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(exact_y, ref_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gx, ref_gx, rtol=1e-5, atol=1e-5)
    # Control: the exact block's cotangent also flows through attention and differs.
    assert np.max(np.abs(exact_gx - ref_gx)) > 1e-2 * np.max(np.abs(ref_gx))


def _saved(capsys, fn, *args):
    """Saved-residual report lines as (shape tuple, description)."""
    print_saved_residuals(fn, *args)
    rows = []
    for line in capsys.readouterr().out.splitlines():
        m = re.match(r'\s*\w+\[([\d,]*)\]\s*(.*)', line)
        if m:
            shape = tuple(int(d) for d in m.group(1).split(',') if d)
            rows.append((shape, m.group(2)))
    assert rows, 'print_saved_residuals printed nothing parseable'
    return rows


@pytest.mark.parametrize('scan', [True, False])
@pytest.mark.parametrize('remat', [True, False])
def test_saved_residuals(capsys, remat, scan):
    # Tracing only (no compile). One block so every residual is attributable;
    # under nn.scan a block's residuals carry a leading layer axis of 1, which
    # is dropped here (B = 3, so a leading 1 is never the batch).
    model = _model(num_layers=1, remat_ffn=remat, scan_layers=scan)
    _, params = _init(model, seed=5)
    v = jax.eval_shape(lambda p: compute_projections(p, RANK), params)
    v = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), v)
    tokens = np.random.default_rng(6).integers(0, CFG.vocab_size, (B, L), dtype=np.int32)

    def loss(neighbour):
        return lambda p: jnp.sum(model.apply(_variables(model, p, v), tokens,
                                             neighbour=neighbour))

    def shapes(rows):
        return [s[1:] if scan and len(s) >= 3 and s[0] == 1 else s for s, _ in rows]

    normal = _saved(capsys, loss(False), params)
    neigh = _saved(capsys, loss(True), params)
    normal_shapes, neigh_shapes = shapes(normal), shapes(neigh)

    # Exact mode keeps attention-score-sized tensors ([..., L, L]) and the
    # FFN inner activations.
    assert any(len(s) >= 4 and s[-2:] == (L, L) for s in normal_shapes), normal
    assert (B, L, F) in normal_shapes, normal
    # Neighbour mode keeps nothing attention-sized and nothing from inside attention.
    assert not any(len(s) >= 4 and s[-2:] == (L, L) for s in neigh_shapes), neigh
    for shape in [(B, L, H, E), (B, L, K, E), (B, L, K, G, E)]:
        assert shape not in neigh_shapes, (shape, neigh)
    assert not any('Attention' in src or 'rotary' in src or 'dot_product_attention' in src
                   for _, src in neigh), neigh
    assert not any(path in src for _, src in neigh
                   for path in ("['attn']", "['attn_norm']")), neigh
    if remat:
        # Only the FFN input survives: no [B, L, F] inner activation and no
        # projected [B, L, r] activation (both are recomputed in backward).
        assert (B, L, F) not in neigh_shapes, neigh
        assert (B, L, RANK) not in neigh_shapes, neigh
        assert any(s == (B, L, D) and 'RMSNorm' in src
                   for s, (_, src) in zip(neigh_shapes, neigh)), neigh
    else:
        # Control for the check above: without remat the FFN activations stay.
        assert (B, L, F) in neigh_shapes, neigh


def test_remat_changes_no_gradient(setup):
    _, _, params, tokens = setup
    v = _projections(params, RANK)
    g_remat = _grads(_model(remat_ffn=True), True, params, v, tokens)
    g_plain = _grads(_model(remat_ffn=False), True, params, v, tokens)
    # Recomputation replays the same forward ops; only fusion may differ.
    assert_tree_close(g_remat, g_plain, 1e-5, 'remat vs no remat ')


def test_full_rank_projection_gives_exact_ffn_input_grads(setup):
    """rank = D: V is square orthogonal for w_gate/w_up (n = D <= F), so V V^T = I."""
    model, _, params, tokens = setup
    v = _projections(params, D)
    assert v['layers_0']['ffn']['w_gate']['kernel'].shape == (D, D)
    assert v['layers_0']['ffn']['w_down']['kernel'].shape == (F, D)  # n = F > r: still low rank
    grads = _grads(model, True, params, v, tokens)
    ref = _ref_grads(True, params, tokens)
    for i in range(CFG.num_layers):
        for name in ('w_gate', 'w_up'):
            # V V^T = I up to the float32 orthogonality of the SVD (~1e-6), plus
            # float32 reassociation through the blocks.
            assert_tree_close(grads[f'layers_{i}']['ffn'][name]['kernel'],
                               ref[f'layers_{i}']['ffn'][name]['kernel'], 1e-4,
                               f'layers_{i}/{name} ')
        g_down = grads[f'layers_{i}']['ffn']['w_down']['kernel']
        r_down = ref[f'layers_{i}']['ffn']['w_down']['kernel']
        assert np.max(np.abs(g_down - r_down)) > 1e-3 * np.max(np.abs(r_down))


# ---------------------------------------------------------------------------
# The ablation switches: each neighbour gradient against the reference's jax.grad.
# ---------------------------------------------------------------------------

def _projected_ffn(v, ref, *, zero_attention: bool):
    """The reference gradient with every FFN kernel's projected onto V (V V^T g) and,
    if `zero_attention`, the attention branch's zeroed: what the neighbour computes."""
    def expected(path, g_ref):
        if zero_attention and is_attention_branch(path):
            return jnp.zeros_like(g_ref)
        if _ffn_kernel_name(path):
            v_nr = _at(v, path)
            return v_nr @ (v_nr.T @ g_ref)
        return g_ref
    return jax.tree_util.tree_map_with_path(expected, ref)


def test_attention_backward_on_gives_exact_attention_and_projected_ffn(setup):
    """mecefo.skip_attention=False: jax.grad of the exact reference (no stop_gradient),
    with only the FFN kernels projected."""
    _, _, params, tokens = setup
    v = _projections(params, RANK)
    grads = _grads(_model(skip_attention=False), True, params, v, tokens)
    ref = _ref_grads(False, params, tokens)
    # Tolerance: float32 reassociation through 2 blocks, relative to each leaf's max.
    assert_tree_close(grads, _projected_ffn(v, ref, zero_attention=False), 1e-4,
                      'skip_attention=False ')
    assert np.max(np.abs(grads['layers_0']['attn']['wq'])) > 0  # attention learns


def test_exact_projection_gives_the_stop_gradient_reference(setup):
    """mecefo.projection='exact': jax.grad of the reference with the attention branch
    stop-gradiented, FFN kernels unprojected."""
    _, _, params, tokens = setup
    v = _projections(params, RANK)
    grads = _grads(_model(projection='exact'), True, params, v, tokens)
    ref = _ref_grads(True, params, tokens)
    expected = jax.tree_util.tree_map_with_path(
        lambda path, g: jnp.zeros_like(g) if is_attention_branch(path) else g, ref)
    assert_tree_close(grads, expected, 1e-4, "projection='exact' ")


def test_both_switches_off_give_the_exact_gradient(setup):
    _, _, params, tokens = setup
    v = _projections(params, RANK)
    model = _model(skip_attention=False, projection='exact')
    assert_tree_close(_grads(model, True, params, v, tokens), _ref_grads(False, params, tokens),
                      1e-4, 'both off ')


def test_no_projection_gives_the_stop_gradient_reference_without_ffn_kernels(setup):
    """mecefo.projection='none' (a rule): every gradient of the stop-gradient reference
    but the FFN kernels', which the neighbour does not compute."""
    _, _, params, tokens = setup
    grads = _grads(_model(projection='none'), True, params, {}, tokens)
    ref = _ref_grads(True, params, tokens)
    expected = jax.tree_util.tree_map_with_path(
        lambda path, g: jnp.zeros_like(g) if is_attention_branch(path) or _ffn_kernel_name(path)
        else g, ref)
    assert_tree_close(grads, expected, 1e-4, "projection='none' ")


def test_attention_backward_in_the_top_blocks_only(setup):
    """mecefo.attention_top_blocks=1 of 2: the top block's attention branch has its exact
    backward, the bottom block's is skipped; against jax.grad of the reference with the
    stop-gradient on block 0 only."""
    _, _, params, tokens = setup
    v = _projections(params, RANK)
    model = _model(attention_top_blocks=1, projection='exact')
    grads = _grads(model, True, params, v, tokens)

    def loss(p, t, w):
        x = p['embedding'][t]
        for i in range(CFG.num_layers):
            x = _ref_block(x, p[f'layers_{i}'], stop_attention=i == 0)
        return jnp.sum((_ref_rms(x, p['final_norm']['scale']) @ p['head']) * w)
    ref = _jit(jax.grad(loss))(params, tokens, _loss_weights())
    expected = jax.tree_util.tree_map_with_path(
        lambda path, g: jnp.zeros_like(g) if is_attention_branch(path)
        and getattr(path[0], 'key', None) == 'layers_0' else g, ref)
    assert_tree_close(grads, expected, 1e-4, 'attention_top_blocks=1 ')
    np.testing.assert_array_equal(_apply_fn(model)(params, v, tokens, neighbour=True),
                                  _apply_fn(model)(params, v, tokens, neighbour=False))
