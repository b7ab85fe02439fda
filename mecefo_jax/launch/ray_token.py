"""The Ray cluster's authentication token: made private, kept private.

Ray's token authentication (on for local clusters since Ray 2.59) admits any
client holding the token, which Ray reads from `RAY_AUTH_TOKEN`, else the
file `RAY_AUTH_TOKEN_PATH`, else `~/.ray/auth_token`. Ray writes that file
with the default umask (0644 in a 0755 directory on most machines), so any
local user could read it and drive the job's cluster: its keepers hold the
run's only fast copy. Here the token is created 0600 in a 0700 directory,
and a token file that other users can read is refused, with the `chmod`
that fixes it, before any cluster is started or joined.
"""
from __future__ import annotations

import os
import secrets
import stat

from mecefo_jax.host import files


class TokenExposedError(PermissionError):
    """The token file (or its directory) can be read by users other than its owner."""


def token_path() -> str:
    """Where Ray reads the token from when `RAY_AUTH_TOKEN` is not set."""
    return os.environ.get('RAY_AUTH_TOKEN_PATH') or os.path.join(
        os.path.expanduser('~'), '.ray', 'auth_token')


def check_private(path: str) -> None:
    """Raise TokenExposedError naming the fix if group or others can read `path`."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        raise TokenExposedError(
            f'The Ray token {path} can be read by other users (mode {mode:o}): anyone on this '
            f"machine could join the job's cluster and stop its keepers. Fix: chmod 600 {path}")


def ensure_token() -> bool:
    """A private token file, made (0600, in a 0700 directory) if there is none; whether made.

    `ray.init()` makes one when it starts a local cluster, but world-readable,
    and a cluster started otherwise (`ray.cluster_utils.Cluster`,
    `ray start --head`) makes none: on a fresh machine its GCS server then
    aborts. An existing token readable by others is refused (TokenExposedError).
    """
    if os.environ.get('RAY_AUTH_TOKEN'):
        return False  # no file: the token comes from the environment
    path = token_path()
    if os.path.exists(path):
        check_private(path)
        return False
    directory = os.path.dirname(path)
    made = not os.path.isdir(directory)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    if made:
        os.chmod(directory, 0o700)  # makedirs' mode is filtered by the umask
    created = files.create_bytes(path, secrets.token_hex(32).encode(), mode=0o600)
    check_private(path)  # a concurrent creator's token must be private too
    _forget_cached_token()
    return created


def _forget_cached_token() -> None:
    """Ray caches the token it loaded (or found missing) in this process: read it again."""
    from ray._raylet import AuthenticationTokenLoader
    AuthenticationTokenLoader.instance().reset_cache()
