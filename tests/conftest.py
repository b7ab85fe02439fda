"""Test harness: 8 fake CPU devices, set before jax is imported anywhere.

Many tests compile the same tiny-config programs through different `jit`
objects; a compilation cache private to this test session (shared by its
pytest-xdist workers) lets XLA compile each distinct program once.
"""
import os
import tempfile

import pytest

# XLA's backend at optimisation level 0 compiles a tiny config's programs about
# twice as fast and runs them about as fast (their steps are dispatch-bound),
# with the same results: the suite tests behaviour, never speed. Subprocesses
# and the launcher's Ray workers inherit the flag (launch/actors.py).
os.environ['XLA_FLAGS'] = (
    os.environ.get('XLA_FLAGS', '')
    + ' --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0'
).strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax  # noqa: E402  (after XLA_FLAGS on purpose)

# One cache for the session's pytest-xdist workers together (they share its run id).
_RUN = os.environ.get('PYTEST_XDIST_TESTRUNUID')
_CACHE_DIR = (os.path.join(tempfile.gettempdir(), f'mecefo_jax_test_xla_cache_{_RUN}') if _RUN
              else tempfile.mkdtemp(prefix='mecefo_jax_test_xla_cache_'))
os.makedirs(_CACHE_DIR, exist_ok=True)
jax.config.update('jax_compilation_cache_dir', _CACHE_DIR)
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """The Ray tests form one xdist group, run first.

    The suite runs on 2 pytest-xdist workers (`-n 2 --dist loadgroup` in
    pyproject.toml): every test marked `ray` goes to one worker, one at a
    time, so that no two Ray clusters or launchers share the machine at once.
    They are the suite's longest stretch, so they start first while the other
    worker takes the rest.
    """
    del config
    for item in items:
        if item.get_closest_marker('ray'):
            item.add_marker(pytest.mark.xdist_group('ray'))
    items.sort(key=lambda item: item.get_closest_marker('ray') is None)  # stable
