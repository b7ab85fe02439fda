"""MeCeFO's skip-connection for attention: the branch `x + MHA(norm(x))` as identity in backward.

Rule 2 of docs/algorithm.md section 3. `jax.lax.stop_gradient` is its exact form: XLA
finds the branch's linearisation dead and drops it, attention activations included. The
branch's parameters then get no gradient from a neighbour's rows, and `combination.py`
averages them over exact rows only.
"""
import jax

ATTENTION_BRANCH_MODULES = ('attn', 'attn_norm')  # averaged over exact rows only


def is_attention_branch(path) -> bool:
    """True for parameters of `x + MHA(norm(x))`: MHA weights and their norm."""
    names = [getattr(k, 'key', getattr(k, 'name', k)) for k in path]
    return any(name in ATTENTION_BRANCH_MODULES for name in names)


def skip_in_backward(attn_bld: jax.Array, gate=None) -> jax.Array:
    """The attention branch's output, unchanged in forward, cut in backward; a `gate` g
    (mecefo.attention_top_blocks: 1 in the top blocks, 0 below) returns
    `frozen + g (attn - frozen)`: `attn` bit for bit in forward, its cotangent scaled by g."""
    frozen_bld = jax.lax.stop_gradient(attn_bld)
    if gate is None:
        return frozen_bld
    return frozen_bld + gate.astype(attn_bld.dtype) * (attn_bld - frozen_bld)
