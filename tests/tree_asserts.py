"""Shared assertion for comparing parameter/gradient trees in tests."""
import jax
import numpy as np


def assert_tree_close(actual, expected, rel, what=''):
    """max |a - e| <= rel * max |e| (+ 1e-9 floor) per leaf, naming the leaf on failure."""
    def check(path, a, e):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape, (what, jax.tree_util.keystr(path))
        scale = max(float(np.max(np.abs(e))), 1e-12)
        err = float(np.max(np.abs(a - e)))
        assert err <= rel * scale + 1e-9, (
            f'{what}{jax.tree_util.keystr(path)}: max err {err:.3e} vs scale {scale:.3e}')
    jax.tree_util.tree_map_with_path(check, actual, expected)
