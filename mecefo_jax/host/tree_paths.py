"""Names of pytree key paths, the same way everywhere a tree is saved or compared.

Orbax writes dataclass fields as dict keys and tuples as lists, and snapshots name leaves
alike, so attribute, dict and sequence keys all become plain strings.
"""
import jax


def key_names(path: tuple) -> tuple[str, ...]:
    """('params', 'layers', 'ffn', 'w_up', 'kernel') for a pytree key path."""
    out = []
    for k in path:
        if isinstance(k, jax.tree_util.DictKey | jax.tree_util.FlattenedIndexKey):
            out.append(str(k.key))
        elif isinstance(k, jax.tree_util.GetAttrKey):
            out.append(k.name)
        elif isinstance(k, jax.tree_util.SequenceKey):
            out.append(str(k.idx))
        else:
            out.append(str(k))
    return tuple(out)
