"""The parameter names MeCeFO's rules read off a model: its contract with any model it trains.

The neighbour's backward and the combination find the attention branch, the FFN kernels
and the blocks by name (docs/architecture.md, "Adding a model"): a model that keeps these
names gets neighbour mode with nothing else to change; `check` names what one lacks.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ATTENTION_BRANCH = ('attn', 'attn_norm')  # `x + MHA(norm(x))`: averaged over exact rows only
FFN = 'ffn'  # each block's FFN, under which the kernels below
FFN_KERNELS = ('w_gate', 'w_up', 'w_down')  # each a `kernel` [n_in, m_out] with a projection V
KERNEL = 'kernel'
LAYERS = 'layers'  # the blocks: scanned (leaves [num_layers, ...]) or looped (`layers_<i>`)
PROJECTIONS = 'projections'  # the variable collection holding each FFN kernel's V


def _names(path) -> list[str]:
    return [str(getattr(k, 'key', getattr(k, 'name', k))) for k in path]


def is_attention_branch(path) -> bool:
    """Whether a parameter lies on `x + MHA(norm(x))`: the attention weights and their norm."""
    return any(name in ATTENTION_BRANCH for name in _names(path))


def is_ffn_kernel(path) -> bool:
    """Whether a parameter (a key path, or a tuple of names) is an FFN kernel V projects."""
    names = _names(path)
    return len(names) >= 2 and names[-1] == KERNEL and names[-2] in FFN_KERNELS


def block_of(path) -> int | None:
    """The block index of a looped block's parameter (`layers_3/...`), else None."""
    name = _names(path)[0]
    return int(name[len(LAYERS) + 1:]) if name.startswith(LAYERS + '_') else None


def check(params: Mapping[str, Any]) -> None:
    """ValueError naming what of the contract a model's (unboxed or abstract) params lack."""
    import jax
    paths = [_names(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]
    blocks = {p[0] for p in paths if p[0] == LAYERS or block_of(p) is not None}
    missing = [what for what, found in (
        (f"blocks under '{LAYERS}' or '{LAYERS}_<i>'", blocks),
        (f'attention under {ATTENTION_BRANCH}', any(set(p) & set(ATTENTION_BRANCH) for p in paths)),
        (f"FFN kernels '{FFN}/<{'|'.join(FFN_KERNELS)}>/{KERNEL}'",
         any(FFN in p and is_ffn_kernel(p) for p in paths))) if not found]
    if missing:
        raise ValueError(f'The model lacks the parameter names neighbour mode reads: '
                         f'{"; ".join(missing)} (docs/architecture.md, "Adding a model").')
