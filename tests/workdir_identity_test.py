"""A workdir reached through a symlink is the same job: one namespace, one local cluster, one lock."""
import os

import pytest

from mecefo_jax.launch import ray_cluster
from mecefo_jax.workdir_lock import WorkdirLock, WorkdirLockedError


@pytest.fixture
def two_paths(tmp_path):
    real = tmp_path / 'runs' / 'job'
    real.mkdir(parents=True)
    os.symlink(tmp_path / 'runs', tmp_path / 'alias')
    return str(real), str(tmp_path / 'alias' / 'job')


def test_the_same_namespace_and_local_cluster_record_through_a_symlink(two_paths):
    real, alias = two_paths
    assert ray_cluster.namespace_of(alias) == ray_cluster.namespace_of(real)
    assert ray_cluster.namespace_of(real + '/') == ray_cluster.namespace_of(real)
    assert ray_cluster._state_path(alias) == ray_cluster._state_path(real)  # noqa: SLF001


def test_the_lock_taken_through_one_path_refuses_the_other(two_paths):
    real, alias = two_paths
    with WorkdirLock(real):
        with pytest.raises(WorkdirLockedError):
            WorkdirLock(alias).acquire()
