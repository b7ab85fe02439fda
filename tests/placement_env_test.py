"""launch/placement.py: a worker's environment, applied in its own process before JAX starts.

The launcher tests' workers show the applied path (each trains on its 2 fake
devices of the 8 this session's processes inherit); here, the refusal where
a process has already started JAX under other flags.
"""
import os

import jax
import pytest
from fast_xla import FLAGS as FAST_XLA_FLAGS

from mecefo_jax.launch import placement


def test_the_actor_env_names_its_device_count_and_keeps_the_other_flags():
    env = placement.actor_env(2)
    flags = env['XLA_FLAGS'].split()
    assert '--xla_force_host_platform_device_count=2' in flags
    assert not [f for f in flags if f.startswith('--xla_force_host_platform_device_count=8')]
    assert set(FAST_XLA_FLAGS.split()) <= set(flags)  # conftest's, inherited
    assert placement.actor_env(2, gpus=True)['XLA_FLAGS'].split() == [
        f for f in flags if 'device_count' not in f]


def test_a_process_whose_backend_started_under_other_flags_is_refused(monkeypatch):
    assert len(jax.devices()) == 8  # this process's backend: started, 8 devices
    before = os.environ['XLA_FLAGS']
    with pytest.raises(RuntimeError, match='already started JAX with XLA_FLAGS'):
        placement.enter(placement.actor_env(2))
    assert os.environ['XLA_FLAGS'] == before  # nothing applied
    monkeypatch.setenv('OPENBLAS_NUM_THREADS', os.environ.get('OPENBLAS_NUM_THREADS', '1'))
    placement.enter({'XLA_FLAGS': before, 'OPENBLAS_NUM_THREADS': '1'})  # the flags it runs on
    assert os.environ['OPENBLAS_NUM_THREADS'] == '1'
