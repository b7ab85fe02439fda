"""Test harness: 8 fake CPU devices, set before jax is imported anywhere.

Many tests compile the same tiny-config programs through different `jit`
objects; a compilation cache private to this test session (shared by its
pytest-xdist workers) lets XLA compile each distinct program once. The
embedded corpus's tokenizers are trained once per session too
(`tokenizer_cache`), and the Ray tests of each pytest-xdist worker share one
simulated cluster (`ray_cluster`) unless they need one of their own.
"""
import os
import shutil
import tempfile
import uuid

import pytest
from fast_xla import FLAGS as FAST_XLA_FLAGS

# The suite's faster-compiling XLA flags (tests/fast_xla.py): subprocesses and the
# launcher's Ray workers inherit them (launch/actors.py).
os.environ['XLA_FLAGS'] = (
    os.environ.get('XLA_FLAGS', '') + f' --xla_force_host_platform_device_count=8 {FAST_XLA_FLAGS}'
).strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# One BLAS thread per LAPACK call, as every script (sharding.simulate_cpu_devices) and
# launcher worker runs: the same bits in this process as in theirs.
os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')

import jax  # noqa: E402  (after XLA_FLAGS on purpose)

# One directory of each kind for the session's pytest-xdist workers together (they
# share its run id); the controller removes them when the session ends.
_RUN = os.environ.get('PYTEST_XDIST_TESTRUNUID')


_KINDS = ('xla_cache', 'tokenizers', 'launcher_xla_cache')


def _named_dir(kind: str, run: str) -> str:
    return os.path.join(tempfile.gettempdir(), f'mecefo_jax_test_{kind}_{run}')


def _session_dir(kind: str) -> str:
    path = _named_dir(kind, _RUN) if _RUN else tempfile.mkdtemp(prefix=f'mecefo_jax_test_{kind}_')
    os.makedirs(path, exist_ok=True)
    return path


_CACHE_DIR, _TOKENIZER_DIR, _LAUNCHER_CACHE_DIR = map(_session_dir, _KINDS)
jax.config.update('jax_compilation_cache_dir', _CACHE_DIR)
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
# The scripts, drivers and launchers the tests start read the same cache from their
# environment (JAX reads these at import): a program this session compiled once,
# under the same flags and devices (both in XLA's cache key), is not compiled again
# in a child. A process that names a cache of its own (`launch.compilation_cache`,
# a script's --out) still uses that one.
os.environ.update(JAX_COMPILATION_CACHE_DIR=_CACHE_DIR, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
                  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0')


# The Ray modules in two groups, each run on one pytest-xdist worker in this
# order, the two groups side by side. Within a group: the modules on the
# shared cluster first, then one that loses a node of a cluster of its own,
# then one that starts a cluster under a fresh HOME, then the chaos soak (a process
# that owns its cluster); a module not listed runs last in the second group. The
# groups take about as long as each other.
RAY_GROUPS = {
    'ray-a': ('snapshot_keeper_test', 'snapshot_test', 'parity_test', 'launch_test',
              'launch_deaths_test', 'sharded_launch_test', 'gpu_crash_test'),
    'ray-b': ('launcher_process_test', 'compile_ahead_test', 'node_loss_test',
              'sim_cluster_test', 'chaos_soak_test'),
}
_RAY_ORDER = [(group, module) for group, modules in RAY_GROUPS.items() for module in modules]


def _ray_place(item) -> tuple[str, int] | None:
    """(its group, its place in the Ray order) for a Ray test; None for the rest."""
    if not item.get_closest_marker('ray'):
        return None
    module = _module(item)
    for place, (group, listed) in enumerate(_RAY_ORDER):
        if listed == module:
            return group, place
    return 'ray-b', len(_RAY_ORDER)


# The modules that take longest outside the Ray groups (10 to 50 s each here),
# handed out first so that the two workers end together.
SLOW_MODULES = ('gpu_report_test', 'controller_test', 'step_test', 'time_to_target_test',
                'bench_test', 'resume_test', 'multihost_test', 'model_test', 'train_test',
                'replicas_as_rows_test', 'fidelity_test', 'tensorboard_test', 'hf_llama_test')


def _module(item) -> str:
    return item.module.__name__.rpartition('.')[2]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """Every module is one xdist group, the Ray tests two; the Ray groups run first.

    The suite runs on 2 pytest-xdist workers (`-n 2 --dist loadgroup
    --no-loadscope-reorder` in pyproject.toml), which take the groups in the
    order sorted here: the two Ray groups first, one on each worker (each
    runs its Ray tests one at a time: at most one simulated cluster per
    worker process), then the slowest modules, then the rest. The Ray tests
    mostly wait on processes (starts, heartbeats, timeouts), so the two
    groups overlap well. A module is never split between the workers, so its
    module-scoped fixtures (a smoke run, a trained run) run once.
    """
    del config
    places = {}
    for item in items:
        place = _ray_place(item)
        group = place[0] if place is not None else _module(item)
        item.add_marker(pytest.mark.xdist_group(group))
        places[item.nodeid] = (
            (0, place[1]) if place is not None
            else (1, SLOW_MODULES.index(_module(item))) if _module(item) in SLOW_MODULES
            else (2, 0))
    items.sort(key=lambda item: places[item.nodeid])  # stable: modules stay together


def pytest_configure(config):
    """The controller of an xdist run names the run itself, to remove what its workers share."""
    if (not hasattr(config, 'workerinput') and config.getoption('numprocesses', None)
            and config.getoption('testrunuid', None) is None):
        config.option.testrunuid = uuid.uuid4().hex


def pytest_sessionfinish(session):
    """The controller (or a run without xdist) removes the session's directories."""
    if hasattr(session.config, 'workerinput'):
        return
    paths = [_CACHE_DIR, _TOKENIZER_DIR, _LAUNCHER_CACHE_DIR]
    run = session.config.getoption('testrunuid', None)
    paths += [_named_dir(kind, run) for kind in _KINDS] if run else []
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope='session')
def tokenizer_cache() -> str:
    """A `data.cache_dir` whose tokenizers every test of the session shares (trained once)."""
    return _TOKENIZER_DIR


@pytest.fixture(scope='session')
def launcher_caches(tokenizer_cache) -> tuple[str, str]:
    """(data.cache_dir, launch.compilation_cache) for the launcher tests' Ray workers, shared
    by the session's pytest-xdist workers: the jobs of one shape (tests/launch_jobs.py's)
    compile their programs once."""
    return tokenizer_cache, _LAUNCHER_CACHE_DIR


class _Clusters:
    """At most one simulated Ray cluster at a time in this process (a Ray group's worker).

    `shared(nodes)` is kept from module to module; `private(nodes)` closes it
    first and belongs to one module (one that loses a node of it).
    """

    def __init__(self):
        self.current, self.nodes = None, 0

    def close(self) -> None:
        if self.current is not None:
            self.current.shutdown()
            self.current, self.nodes = None, 0

    def shared(self, nodes: int):
        if self.current is None or self.nodes != nodes:
            self.close()
            from tests.drills.sim_cluster import SimulatedCluster
            self.current, self.nodes = SimulatedCluster(nodes), nodes
        return self.current

    def private(self, nodes: int):
        self.close()
        from tests.drills.sim_cluster import SimulatedCluster
        return SimulatedCluster(nodes)


@pytest.fixture(scope='session')
def _clusters():
    clusters = _Clusters()
    yield clusters
    clusters.close()


SHARED_CLUSTER_NODES = 2  # the launcher tests' two workers, each on its own node


@pytest.fixture(scope='module')
def ray_cluster(_clusters):
    """The session's shared simulated Ray cluster of SHARED_CLUSTER_NODES nodes."""
    return _clusters.shared(SHARED_CLUSTER_NODES)


@pytest.fixture(scope='module')
def cluster(ray_cluster):
    """The launcher tests' cluster: the shared one, a worker on each node (a module
    that needs another defines its own `cluster`)."""
    assert len(ray_cluster.nodes) == SHARED_CLUSTER_NODES
    return ray_cluster


@pytest.fixture(scope='module')
def private_ray_cluster(_clusters, request):
    """A cluster of the module's own `CLUSTER_NODES` nodes, which it may damage."""
    with _clusters.private(request.module.CLUSTER_NODES) as cluster:
        yield cluster
