"""A workdir is known by its real path (a symlink reaches the same job), and one that cannot be used is named."""
import os

import pytest

from mecefo_jax.host.workdir_lock import WorkdirLock, WorkdirLockedError
from mecefo_jax.launch import cluster as ray_cluster


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


def test_a_workdir_that_is_a_file_or_not_writable_is_named_with_the_fix(tmp_path, monkeypatch):
    from mecefo_jax.host.workdir_lock import WorkdirUnusableError
    a_file = tmp_path / 'notes.txt'
    a_file.write_text('x')
    with pytest.raises(WorkdirUnusableError, match='is a file, not a directory'):
        WorkdirLock(str(a_file)).acquire()
    assert a_file.read_text() == 'x'
    monkeypatch.setattr(os, 'access', lambda path, mode: False)  # as a read-only directory for a user
    with pytest.raises(WorkdirUnusableError, match=r'is not writable: make it writable \(chmod u\+w'):
        WorkdirLock(str(tmp_path / 'job')).acquire()
