"""How the step turns per-row gradient sums into one update: MeCeFO's rule and its trust.

MeCeFO's rule (Hu et al., NeurIPS 2025, arXiv 2510.16415): the attention branch's
parameters (MHA and its norm) are averaged over the rows computed exactly, everything
else over every row. Generalised by the *trust* w_p in [0, 1] a neighbour-mode row gets
for parameter p,

    g_p = (S_exact,p + w_p S_neighbour,p) / (T_exact + w_p T_neighbour),

S the gradient sums, T the token counts: w = 1 everywhere is the paper's rule, w = 0
treats the rows as dropped for p (and is a parameter's w where the neighbour computes no
gradient for it). `mecefo.neighbour_weight` and `mecefo.trust_top_blocks` choose w
(docs/algorithm.md): the attention skip drops part of every cotangent below the top block,
so the lower blocks' gradients are the least exact. The weight is applied in backward
(`scale_cotangents`), so a mixed program's rows share one backward.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mecefo_jax.neighbour.contract import LAYERS, block_of, is_attention_branch, is_ffn_kernel


def is_paper_rule(rules) -> bool:
    """Every neighbour gradient fully trusted (the paper's rule), so no weights are applied."""
    return (rules.neighbour_weight == 1.0 and rules.trust_top_blocks == 0
            and rules.projection != 'none' and not _attention_per_block(rules))


def _attention_per_block(rules) -> bool:
    """Some blocks' attention gets neighbour gradients, others none."""
    return rules.skip_attention and rules.attention_top_blocks > 0


def trust_tree(rules, layers: int, params):
    """Params-shaped weights w (a float, or [L, 1, ...] for scanned blocks) under the `mecefo`
    section `rules`; None under the paper's rule."""
    if is_paper_rule(rules):
        return None
    w, top = rules.neighbour_weight, rules.trust_top_blocks
    trusted = np.array([w if not top or i >= layers - top else 0.0 for i in range(layers)],
                       np.float32)
    # Attention gradients exist where the neighbour computes its attention backward.
    computed = np.array([not rules.skip_attention or i >= layers - rules.attention_top_blocks
                         for i in range(layers)], np.float32)

    def weight(path, leaf):
        if is_ffn_kernel(path) and rules.projection == 'none':
            return 0.0
        per_block = trusted * computed if is_attention_branch(path) else trusted
        name = str(getattr(path[0], 'key', path[0]))
        if name == LAYERS:  # scanned: one weight per block, broadcast over the leaf
            return per_block.reshape((layers,) + (1,) * (np.ndim(leaf) - 1))
        block = block_of(path)
        if block is not None:
            return float(per_block[block])
        return 0.0 if top and name == 'embedding' else w
    return jax.tree_util.tree_map_with_path(weight, params)


@jax.custom_vjp
def _scaled(x, w):
    return x


def _scaled_fwd(x, w):
    return x, w


def _scaled_bwd(w, g):
    return (g * jnp.asarray(w, g.dtype)).astype(g.dtype), jnp.zeros_like(w)


_scaled.defvjp(_scaled_fwd, _scaled_bwd)


def scale_cotangents(params, trust):
    """`params` unchanged forward; their cotangents multiplied by `trust` in backward."""
    if trust is None:
        return params
    return jax.tree.map(lambda p, w: _scaled(p, jnp.asarray(w, jnp.float32)), params, trust)


def combine(grad_sums, exact_tokens, neighbour_tokens, trust, skip_attention: bool):
    """Divide the summed gradients by each parameter's count (module docstring); with no count
    (no exact row for the attention branch, say) a parameter gets no gradient this step."""
    if trust is None:
        trust = jax.tree_util.tree_map_with_path(
            lambda path, _: 0.0 if skip_attention and is_attention_branch(path) else 1.0,
            grad_sums)

    def average(g, w):
        count = exact_tokens + jnp.asarray(w, jnp.float32) * neighbour_tokens
        return jnp.where(count > 0, g / jnp.maximum(count, 1.0), 0.0).astype(g.dtype)
    return jax.tree.map(average, grad_sums, trust)
