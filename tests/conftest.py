"""Test harness: 8 fake CPU devices, set before jax is imported anywhere.

Many tests compile the same tiny-config programs through different `jit`
objects; a compilation cache private to this test session lets XLA compile
each distinct program once.
"""
import os
import tempfile

os.environ['XLA_FLAGS'] = (
    os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'
).strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax  # noqa: E402  (after XLA_FLAGS on purpose)

_CACHE_DIR = tempfile.mkdtemp(prefix='mecefo_jax_test_xla_cache_')
jax.config.update('jax_compilation_cache_dir', _CACHE_DIR)
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
