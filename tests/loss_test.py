"""Tests for mecefo_jax.model.loss: the chunked fused cross-entropy against optax on full logits."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.ad_checkpoint import print_saved_residuals

from mecefo_jax.model.loss import chunked_cross_entropy

N, D, V = 37, 16, 50  # 37 tokens: no chunk size below divides it evenly


def _inputs(seed=0, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((N, D)), dtype)
    head = jnp.asarray(rng.standard_normal((D, V)) / np.sqrt(D), jnp.float32)
    targets = jnp.asarray(rng.integers(0, V, N), jnp.int32)
    weights = jnp.asarray(rng.integers(0, 2, N), jnp.float32).at[0].set(1.0)  # some padding
    return x, head, targets, weights


def _reference(x, head, targets, weights):
    """The plain loss: full float32 logits, optax's cross-entropy."""
    logits = jnp.matmul(x, head.astype(x.dtype), preferred_element_type=jnp.float32)
    return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, targets) * weights)


@pytest.mark.parametrize('chunk', [0, 1, 5, 16, 37, 100])
def test_value_and_gradients_equal_the_unchunked_loss(chunk):
    x, head, targets, weights = _inputs()
    got, (gx, ghead) = jax.value_and_grad(
        lambda x, h: chunked_cross_entropy(x, h, targets, weights, chunk_tokens=chunk),
        argnums=(0, 1))(x, head)
    want, (wx, whead) = jax.value_and_grad(_reference, argnums=(0, 1))(x, head, targets,
                                                                        weights)
    # float32: the same terms summed in another order (per chunk, then over
    # chunks), so agreement to a few ulps of the largest term.
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(gx, wx, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ghead, whead, rtol=1e-5, atol=1e-6)
    # Padding (weight 0) tokens get exactly no gradient.
    np.testing.assert_array_equal(np.asarray(gx)[np.asarray(weights) == 0], 0.0)


def test_unrolled_chunks_are_the_same_arithmetic():
    x, head, targets, weights = _inputs(1)
    def loss(unroll):
        return jax.value_and_grad(lambda h: chunked_cross_entropy(
            x, h, targets, weights, chunk_tokens=8, unroll=unroll))(head)
    (a, ga), (b, gb) = loss(False), loss(True)
    np.testing.assert_allclose(a, b, rtol=1e-6)
    np.testing.assert_allclose(ga, gb, rtol=1e-5, atol=1e-7)


def test_the_cotangent_scales_the_gradients():
    x, head, targets, weights = _inputs(2)
    g = jax.grad(lambda h: 3.0 * chunked_cross_entropy(x, h, targets, weights,
                                                       chunk_tokens=8))(head)
    g1 = jax.grad(lambda h: chunked_cross_entropy(x, h, targets, weights, chunk_tokens=8))(head)
    np.testing.assert_allclose(g, 3.0 * g1, rtol=1e-6)


def test_bfloat16_inputs_match_the_float32_reference_to_bfloat16_precision():
    x, head, targets, weights = _inputs(3, jnp.bfloat16)
    got, gx = jax.value_and_grad(lambda x: chunked_cross_entropy(
        x, head, targets, weights, chunk_tokens=8))(x)
    want, wx = jax.value_and_grad(_reference)(x, head, targets, weights)
    assert got.dtype == jnp.float32 and gx.dtype == jnp.bfloat16
    # Loss: float32 softmax over bf16 matmul outputs accumulated in float32,
    # like the reference: only the summation order differs.
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # Gradient: the reference rounds the cotangent to bf16 at the same point
    # (dlogits in x's dtype); 2^-7 relative is bf16's rounding step.
    np.testing.assert_allclose(np.asarray(gx, np.float32), np.asarray(wx, np.float32),
                               rtol=2 ** -7, atol=2 ** -7 * float(jnp.max(jnp.abs(wx))))


def test_no_full_logits_are_saved_for_backward(capsys):
    x, head, targets, weights = _inputs(4)
    print_saved_residuals(lambda x, h: chunked_cross_entropy(x, h, targets, weights,
                                                             chunk_tokens=8), x, head)
    saved = capsys.readouterr().out
    # What backward keeps: dx [N, D] and dhead [D, V], never [N, V] (or chunks of it).
    assert f'[{N},{D}]' in saved and f'[{D},{V}]' in saved, saved
    assert f',{V}]' not in saved.replace(f'[{D},{V}]', ''), saved
