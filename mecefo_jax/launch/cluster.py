"""The launcher's Ray cluster: one it joins (`--address`), or a local one that outlives it; its token.

Without an address a one-node cluster runs in a process of its own (`ray_host`), so a
killed launcher leaves it and its keepers up; `<workdir>/launch/ray_local.json` records
it and a rerun joins it again. A job's actors live in the namespace `namespace_of(workdir)`,
so a rerun finds its keepers by name. `--cleanup` removes what a job that will not be
rerun left. Ray admits any client holding its token and writes the token file readable
by all; here it is made 0600 in a 0700 directory, and a file others can read is refused
with the `chmod` that fixes it (`ensure_token`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import secrets
import signal
import stat
import subprocess
import sys
import time

from mecefo_jax.host import files, processes
from mecefo_jax.snapshot import shm
from mecefo_jax.snapshot.keeper_actor import find_keeper, stop_keeper

STATE_FILE = 'ray_local.json'


@dataclasses.dataclass(frozen=True)
class Joined:
    """The cluster the launcher joined, and what it cost."""
    address: str
    local_pid: int | None  # the ray_host process, when this job's local cluster
    started: bool  # this call started that local cluster
    start_sec: float  # starting it (0 when joined as it was)
    connect_sec: float  # ray.init(address=...)


@dataclasses.dataclass(frozen=True)
class Node:
    node_id: str
    ip: str
    is_head: bool


def namespace_of(workdir: str) -> str:
    """The Ray namespace of the job in `workdir` (its keepers and workers are named in it)."""
    digest = hashlib.sha1(os.path.realpath(workdir).encode()).hexdigest()[:16]
    return f'mecefo-{digest}'


def use_token_auth() -> None:
    """Token authentication for this process's Ray client, unless RAY_AUTH_MODE is set.

    Ray reads the mode when it is imported; like Ray itself when it enables
    the mode for a new local cluster, refresh its config after setting it.
    """
    if os.environ.get('RAY_AUTH_MODE'):
        return
    os.environ['RAY_AUTH_MODE'] = 'token'
    from ray._raylet import Config
    Config.initialize('')


def _state_path(workdir: str) -> str:
    return os.path.join(os.path.realpath(workdir), 'launch', STATE_FILE)


def _read_state(workdir: str) -> dict | None:
    return files.read_json(_state_path(workdir))


def _is_our_host(pid: int, workdir: str) -> bool:
    """Whether `pid` is a running ray_host holding `workdir`'s cluster (not a reused pid)."""
    if not processes.alive(pid):
        return False
    cmdline = processes.cmdline(pid)
    if cmdline is None:
        return True  # no /proc: trust the pid
    return 'mecefo_jax.launch.ray_host' in cmdline and _state_path(workdir) in cmdline


def local_cluster(workdir: str) -> dict | None:
    """The live local cluster recorded for `workdir` ({'address', 'pid', ...}), or None."""
    state = _read_state(workdir)
    if state is None or not _is_our_host(int(state['pid']), workdir):
        return None
    return state


def start_local(workdir: str, *, object_store_mb: int, timeout: float = 180.0) -> dict:
    """Start `workdir`'s local cluster in its own session (a launcher's death leaves it up)."""
    path = _state_path(workdir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        os.unlink(path)  # a dead host's record
    except FileNotFoundError:
        pass
    log_path = os.path.join(os.path.dirname(path), 'ray_host.log')
    env = dict(os.environ)
    env.setdefault('RAY_AUTH_MODE', 'token')
    with open(log_path, 'w') as log:
        proc = subprocess.Popen([sys.executable, '-m', 'mecefo_jax.launch.ray_host',
                                 f'--state_file={path}', f'--object_store_mb={object_store_mb}'],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
    deadline = time.monotonic() + timeout
    while (state := _read_state(workdir)) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
            with open(log_path, errors='replace') as f:
                tail = ''.join(f.readlines()[-15:])
            why = (f'its process exited with code {proc.poll()}' if proc.poll() is not None
                   else f'it was not up within {timeout:.0f} s')
            raise RuntimeError(f'The local Ray cluster did not start: {why}. The end of '
                               f'{log_path}:\n{tail}')
        time.sleep(0.1)
    return state


def stop_local(workdir: str, timeout: float = 60.0) -> bool:
    """Stop `workdir`'s local cluster if one runs; whether there was one."""
    state = local_cluster(workdir)
    if state is None:
        return False
    pid = int(state['pid'])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while processes.alive(pid):
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)  # its own session: the cluster's processes with it
            break
        time.sleep(0.1)
    return True


def join(address: str | None, workdir: str, *, object_store_mb: int = 256,
         start: bool = True, log=print) -> Joined | None:
    """Connect this process to the job's cluster (see the module docstring).

    With no address and no live local cluster: start one if `start`, else None.
    """
    import ray
    address = address or os.environ.get('RAY_ADDRESS') or None
    use_token_auth()
    if os.environ['RAY_AUTH_MODE'] == 'token':
        ensure_token()  # private, before ray_host's ray.init would make a world-readable one
    local_pid, started, start_sec = None, False, 0.0
    if address is None:
        state = local_cluster(workdir)
        if state is None:
            if not start:
                return None
            t0 = time.perf_counter()
            state = start_local(workdir, object_store_mb=object_store_mb)
            started, start_sec = True, time.perf_counter() - t0
            log(f"[launch] started a local Ray cluster at {state['address']} ({start_sec:.1f} s)")
        address, local_pid = state['address'], int(state['pid'])
    t0 = time.perf_counter()
    ray.init(address=address, namespace=namespace_of(workdir), log_to_driver=False,
             logging_level='WARNING')
    return Joined(address, local_pid, started, start_sec, time.perf_counter() - t0)


def health_check() -> dict:
    """The connected cluster's node health check (a driver gets the head's settings), in ms."""
    from ray._raylet import Config
    return {'period_ms': Config.health_check_period_ms(),
            'timeout_ms': Config.health_check_timeout_ms(),
            'failure_threshold': Config.health_check_failure_threshold()}


def node_loss_warning(check: dict, heartbeat_timeout_sec: float) -> str | None:
    """What to tell a user whose cluster reports a lost node later than the launcher's own
    heartbeat timeout (Ray's default, 3 s x 5 checks of up to 10 s, takes 15 to 65 s)."""
    worst = check['failure_threshold'] * (check['period_ms'] + check['timeout_ms']) / 1000
    if worst <= heartbeat_timeout_sec:
        return None
    return (f'[launch] warning: this Ray cluster reports a lost node after up to {worst:.0f} s '
            f"(health check every {check['period_ms']} ms, {check['timeout_ms']} ms timeout, "
            f"{check['failure_threshold']} failures), longer than launch.heartbeat_timeout_sec="
            f'{heartbeat_timeout_sec:g}: start its head with ray start --head --system-config='
            '\'{"health_check_period_ms":500,"health_check_timeout_ms":500,'
            '"health_check_failure_threshold":3}\' (docs/launch.md, "On a cluster").')


def describe(joined: Joined | None) -> dict:
    """The cluster, and what joining it cost (never part of a recovery)."""
    j = joined
    return {'nodes': len(alive_nodes()), 'address': j and j.address,
            'started_local_cluster': bool(j and j.started),
            'ray_start_sec': j.start_sec if j else None,
            'ray_connect_sec': j.connect_sec if j else None}


def alive_nodes() -> list[Node]:
    """The cluster's live nodes, the head last (losing it loses the cluster: workers go elsewhere first)."""
    import ray
    nodes = [Node(n['NodeID'], n['NodeManagerAddress'],
                  bool(n.get('Resources', {}).get('node:__internal_head__')))
             for n in ray.nodes() if n['Alive']]
    return sorted(nodes, key=lambda n: (n.is_head, n.node_id))


def live_keepers(namespace: str) -> list:
    """The live keepers of a job's `namespace` (its only named actors), by name, in a cluster
    this process has joined."""
    import ray
    names = sorted(a['name'] for a in ray.util.list_named_actors(all_namespaces=True)
                   if a['namespace'] == namespace)
    return [h for h in (find_keeper(name, namespace) for name in names) if h is not None]


def cleanup(workdir: str, address: str | None = None) -> dict:
    """Remove `workdir`'s detached actors, their segments and its local cluster; what went."""
    import ray
    removed = {'keepers': [], 'segments': [], 'local_cluster': False}
    joined = join(address, workdir, start=False, log=lambda _: None)
    if joined is not None:
        for handle in live_keepers(namespace_of(workdir)):
            removed['segments'] += stop_keeper(handle)
            removed['keepers'].append(handle.name)
        ray.shutdown()
        if joined.local_pid is not None:
            removed['local_cluster'] = stop_local(workdir)
    removed['segments'] += shm.remove_stale(namespace_of(workdir))
    return removed


# ------------------------------------------------------------------ the token

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
