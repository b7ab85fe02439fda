"""Whether a requested state tree fits a saved one: paths, shapes and dtypes.

Checked from the saved metadata before restoring, so a mismatch names the leaves that
differ (Orbax's own messages bury them under tree dumps) and is never taken for damage.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from mecefo_jax.host.tree_paths import key_names

_MAX_LISTED_PATHS = 10


def fmt_path(path: tuple[str, ...]) -> str:
    return '.'.join(path) if path else '<root>'


def _listing(paths: list, limit: int = _MAX_LISTED_PATHS) -> str:
    shown = ', '.join(paths[:limit])
    more = len(paths) - limit
    return shown + (f', ... (+{more} more)' if more > 0 else '')


def _stored_form(sds: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    """Shape/dtype Orbax writes for a leaf: typed PRNG keys go as key data."""
    if jax.dtypes.issubdtype(sds.dtype, jax.dtypes.prng_key):
        return jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(sds.shape, sds.dtype))
    return sds


def _by_path(tree: Any) -> dict:
    return {key_names(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def tree_problems(saved_tree: Any, abstract_state: Any) -> list[str]:
    """What keeps `abstract_state` from restoring `saved_tree`; empty if nothing."""
    saved, wanted = _by_path(saved_tree), _by_path(abstract_state)
    problems = []
    missing = sorted(fmt_path(p) for p in wanted.keys() - saved.keys())
    extra = sorted(fmt_path(p) for p in saved.keys() - wanted.keys())
    if missing:
        problems.append(f'not in checkpoint: {_listing(missing)}')
    if extra:
        problems.append(f'in checkpoint but not requested: {_listing(extra)}')
    diffs = []
    for p in sorted(wanted.keys() & saved.keys()):
        w, s = _stored_form(wanted[p]), saved[p]
        s_shape = getattr(s, 'shape', None)
        s_dtype = getattr(s, 'dtype', None)
        if s_shape is not None and tuple(s_shape) != tuple(w.shape):
            diffs.append(f'{fmt_path(p)} shape saved {tuple(s_shape)} vs requested '
                         f'{tuple(w.shape)}')
        elif s_dtype is not None and np.dtype(s_dtype) != np.dtype(w.dtype):
            diffs.append(f'{fmt_path(p)} dtype saved {np.dtype(s_dtype)} vs requested '
                         f'{np.dtype(w.dtype)}')
    if diffs:
        problems.append(f'mismatched leaves: {_listing(diffs)}')
    return problems
