"""Per-layer -> scanned parameter trees, for tests written against per-layer references.

A scanned model keeps every block's parameters in `params['layers']` with a
leading layer axis; the looped model (and the plain-jnp references in the
tests) use `params['layers_<i>']`. Stacking inside a jitted function lets a
test feed per-layer trees to the scanned model and get per-layer gradients
back (the gradient of a stack is the unstack), so the same assertions check
the production (scanned) path.
"""
import jax
import jax.numpy as jnp


def _layer_keys(tree) -> list[str]:
    keys = [k for k in tree if k.startswith('layers_')]
    return sorted(keys, key=lambda k: int(k.split('_')[1]))


def stack_layers(tree):
    """{'layers_0': t0, 'layers_1': t1, ...} -> {'layers': stack(t0, t1, ...)}; rest kept."""
    if not isinstance(tree, dict):
        return tree
    keys = _layer_keys(tree)
    out = {k: v for k, v in tree.items() if k not in keys}
    if keys:
        out['layers'] = jax.tree.map(lambda *xs: jnp.stack(xs), *[tree[k] for k in keys])
    return out
