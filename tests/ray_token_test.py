"""The Ray token is made private and a readable one is refused (no cluster needed)."""
import os
import stat

import pytest

from mecefo_jax.launch import cluster


@pytest.fixture
def token_home(tmp_path, monkeypatch):
    monkeypatch.delenv('RAY_AUTH_TOKEN', raising=False)
    monkeypatch.setenv('RAY_AUTH_TOKEN_PATH', str(tmp_path / 'dot_ray' / 'auth_token'))
    return tmp_path / 'dot_ray'


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_token_is_0600_in_a_0700_directory_whatever_the_umask(token_home):
    old = os.umask(0o022)  # what made Ray's own token 0644 in a 0755 ~/.ray
    try:
        assert cluster.ensure_token() is True
    finally:
        os.umask(old)
    token = token_home / 'auth_token'
    assert _mode(token) == 0o600 and _mode(token_home) == 0o700
    assert len(token.read_text()) == 64  # 256 bits, hex, as Ray's own generator
    assert cluster.ensure_token() is False  # kept, not replaced


def test_a_token_others_can_read_is_refused_with_the_chmod_that_fixes_it(token_home):
    token_home.mkdir()
    token = token_home / 'auth_token'
    token.write_text('a' * 64)
    os.chmod(token, 0o644)
    with pytest.raises(cluster.TokenExposedError, match=f'chmod 600 {token}'):
        cluster.ensure_token()
    os.chmod(token, 0o600)
    assert cluster.ensure_token() is False


def test_a_token_from_the_environment_needs_no_file(token_home, monkeypatch):
    monkeypatch.setenv('RAY_AUTH_TOKEN', 'b' * 64)
    assert cluster.ensure_token() is False and not token_home.exists()
