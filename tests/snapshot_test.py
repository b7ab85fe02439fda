"""Tests for mecefo_jax.snapshot: pytree snapshots in keeper actors and back.

Round trips are bitwise, on the 8 fake CPU devices from conftest.py; keepers
are real Ray actors (two per module: the worker's own and a peer's) on one
local Ray cluster.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from mecefo_jax.snapshot import async_writer, jax_io
from mecefo_jax.snapshot.client import KeeperClient, KeeperError, SnapshotWriter, open_snapshots, open_sources
from mecefo_jax.snapshot.keeper_actor import start_keeper, stop_keeper
from tests.fault_points import BeforePublish

pytestmark = [pytest.mark.subprocess, pytest.mark.ray]  # keepers are Ray actors
NAMESPACE = 'snapshot_test'

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SPECS = {
    'w': P(None, 'model'),  # replicated over data, split over model (a kernel)
    'b': P('data', 'model'),  # split over both: restoring onto 3 rows needs assembly
    'emb': P('model', None),
    'count': P(),
}


def _mesh(data, model=2):
    return Mesh(np.array(jax.devices()[:data * model]).reshape(data, model), ('data', 'model'))


def _values(seed=0):
    rng = np.random.default_rng(seed)
    return {
        'w': rng.standard_normal((8, 6)).astype(np.float32),
        'b': rng.standard_normal((12, 4)).astype(ml_dtypes.bfloat16),
        'emb': rng.integers(-1000, 1000, (4, 4)).astype(np.int32),
        'count': np.asarray(seed + 7, np.int32),
    }


def _shardings(mesh):
    return {k: NamedSharding(mesh, s) for k, s in SPECS.items()}


def _put(values, mesh):
    return jax.device_put(values, _shardings(mesh))


def _abstract(values, mesh):
    sh = _shardings(mesh)
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sh[k]) for k, v in values.items()}


def _bytes(x):
    return np.asarray(x).reshape(-1).view(np.uint8)


def _assert_bitwise(tree, values, mesh):
    for k, v in values.items():
        got = tree[k]
        assert got.sharding == NamedSharding(mesh, SPECS[k]), k
        assert got.dtype == v.dtype, k
        np.testing.assert_array_equal(_bytes(got), _bytes(v), err_msg=k)
        for shard in got.addressable_shards:  # every device's copy, not just the assembled view
            np.testing.assert_array_equal(_bytes(shard.data), _bytes(np.asarray(v)[shard.index]), err_msg=k)


@pytest.fixture(scope='module')
def cluster(ray_cluster):
    return ray_cluster  # the session's shared cluster (tests/conftest.py)


def _keeper(name):
    k = start_keeper(name, namespace=NAMESPACE)  # detached: other drivers find it by name
    yield k
    stop_keeper(k)


@pytest.fixture(scope='module')
def own(cluster):
    yield from _keeper('own')


@pytest.fixture(scope='module')
def peer(cluster):
    yield from _keeper('peer')


def _write(keeper, step, tree, data_state=None, *, keep=lambda shard: True):
    with KeeperClient(keeper) as c:
        shards = [s for s in jax_io.host_shards(tree) if keep(s)]
        return SnapshotWriter(c).write(step, shards, data_state or {'pos': step})


def _restore(abstract, sources, **kw):
    snaps = [s for keeper, via in sources for s in open_snapshots(keeper, via=via)]
    try:
        return jax_io.restore(abstract, snaps, **kw)
    finally:
        for s in snaps:
            s.close()


def test_host_shards_are_unique_per_index():
    mesh = _mesh(4)
    shards = jax_io.host_shards(_put(_values(), mesh))
    per_leaf = {}
    for s in shards:
        per_leaf.setdefault(s.path, []).append(s.index)
    # 'w' and 'emb' are replicated over the 4 data rows: 2 unique shards, not 8.
    assert {k: len(v) for k, v in per_leaf.items()} == {'w': 2, 'b': 8, 'emb': 2, 'count': 1}
    assert all(len(set(v)) == len(v) for v in per_leaf.values())


@pytest.mark.parametrize('via, tag', [('shm', 'shm'), ('remote', 'peer')])
def test_round_trip_is_bitwise(own, via, tag):
    mesh, values = _mesh(4), _values(1)
    _write(own, 1, _put(values, mesh), {'pos': 123, 'epoch': 0})
    tree, data_state, report = _restore(_abstract(values, mesh), [(own, via)])
    assert report.step == 1 and data_state == {'pos': 123, 'epoch': 0}
    assert list(report.bytes_by_source) == [f'{tag}:own']
    _assert_bitwise(tree, values, mesh)


def test_restore_onto_a_smaller_mesh(own):
    values = _values(2)
    _write(own, 2, _put(values, _mesh(4)))
    small = _mesh(3)
    tree, _, report = _restore(_abstract(values, small), [(own, 'shm')])
    assert report.step == 2
    _assert_bitwise(tree, values, small)


def test_missing_shards_heal_from_a_peer_or_are_listed(own, peer):
    mesh, values = _mesh(4), _values(3)
    tree = _put(values, mesh)
    # The own keeper lost the second half of 'w' (say that process's shards);
    # the peer holds a full snapshot of the same step.
    _write(own, 3, tree, keep=lambda s: not (s.path == 'w' and s.index[1][0] == 3))
    _write(peer, 3, tree)
    abstract = _abstract(values, mesh)
    restored, _, report = _restore(abstract, [(own, 'shm'), (peer, 'remote')], step=3)
    _assert_bitwise(restored, values, mesh)
    assert report.healed_shards == 1
    assert report.bytes_by_source['peer:peer'] == 8 * 3 * 4
    with pytest.raises(jax_io.SnapshotMissingError, match=r'step 3 lacks 1 shard\(s\): w\[\[0, 8\], \[3, 6\]\]'):
        _restore(abstract, [(own, 'shm')], step=3)
    # A dead peer is skipped; the live one still heals.
    dead = start_keeper('dead', namespace=NAMESPACE, detached=False)
    stop_keeper(dead)
    snaps = open_sources(own, [dead, peer])
    try:
        restored, _, report = jax_io.restore(abstract, snaps, step=3)
        _assert_bitwise(restored, values, mesh)
        assert report.healed_shards == 1
    finally:
        for s in snaps:
            s.close()


def test_a_worker_restores_the_launchers_step_healing_from_a_peer_or_names_the_fallback(own, peer):
    """The launcher chooses the step (no collective): a worker whose own keeper
    lacks part of it heals from a peer; a step nobody holds is a clear error."""
    import types

    from mecefo_jax.launch.worker_state import keeper_restore
    mesh, values = _mesh(4), _values(5)
    tree = _put(values, mesh)
    _write(own, 41, tree, keep=lambda s: s.path != 'b')  # the own keeper lost all of 'b'
    _write(peer, 41, tree)
    run = types.SimpleNamespace(abstract_state={k: jax.ShapeDtypeStruct(v.shape, v.dtype)
                                                for k, v in values.items()})
    topology = types.SimpleNamespace(state_shardings=_shardings(mesh))
    info = {}
    state, data_state, source = keeper_restore([own, peer], 0, info, step=41)(run, topology)
    _assert_bitwise(state, values, mesh)
    assert data_state == {'pos': 41} and source == 'memory'
    assert info['restore'].step == 41 and info['restore'].healed_bytes == 12 * 4 * 2  # bf16 'b'
    with pytest.raises(jax_io.SnapshotMissingError, match=r'step 42 .*newest Orbax checkpoint'):
        keeper_restore([own, peer], 0, {}, step=42)(run, topology)


def test_restore_rejects_a_changed_leaf(own):
    mesh, values = _mesh(4), _values(4)
    _write(own, 4, _put(values, mesh))
    changed = dict(values, w=values['w'].astype(ml_dtypes.bfloat16))
    with pytest.raises(jax_io.SnapshotMismatchError, match=r'w was saved as float32\[8, 6\]'):
        _restore(_abstract(changed, mesh), [(own, 'remote')])


# A writer in a process of its own, reaching the keeper as any driver of the cluster does.
_CONNECT = """
    import sys, time
    from mecefo_jax.launch.cluster import use_token_auth
    use_token_auth()
    import ray
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
    from mecefo_jax.snapshot.keeper_actor import find_keeper
    own = find_keeper("own", sys.argv[2])
"""

_CRASHING_WRITER = textwrap.dedent(_CONNECT + """
    from mecefo_jax.snapshot.client import KeeperClient
    c = KeeperClient(own)
    slot = c.begin(1 << 16)
    buf = c.segment(slot["shm"]).buf
    buf[:4096] = b"\\xab" * 4096  # half a snapshot: preamble and first shards clobbered
    print("HALF", flush=True)
    time.sleep(60)
""")


def _writer(code, cluster):
    return subprocess.Popen([sys.executable, '-c', code, cluster.address, NAMESPACE],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=ROOT, XLA_FLAGS='', JAX_PLATFORMS='cpu'))


def test_writer_killed_mid_copy_leaves_previous_snapshot(own, cluster):
    mesh = _mesh(4)
    for step in (20, 21):
        _write(own, step, _put(_values(step), mesh))
    # Two slots: the crashing writer overwrites the one holding step 20.
    proc = _writer(_CRASHING_WRITER, cluster)
    try:
        assert proc.stdout.readline().strip() == 'HALF'
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    with KeeperClient(own) as c:
        assert [r.step for r in c.snapshots()] == [21]
    tree, data_state, report = _restore(_abstract(_values(21), mesh), [(own, 'shm')])
    assert report.step == 21 and data_state == {'pos': 21}
    _assert_bitwise(tree, _values(21), mesh)


def test_publish_of_an_unwritten_slot_is_refused(own):
    mesh = _mesh(4)
    _write(own, 30, _put(_values(30), mesh))
    with KeeperClient(own) as c:
        slot = c.begin(1000)
        with pytest.raises(KeeperError, match='refusing to publish step 31'):
            c.publish(slot['slot'], slot['token'], step=31, nbytes=500, checksum=1,
                      header_offset=400, header_len=100)
        assert [r.step for r in c.snapshots()] == [30]


def test_async_snapshot_keeps_values_of_a_donated_step(own):
    mesh, values = _mesh(4), _values(5)
    shardings = _shardings(mesh)
    state = _put(values, mesh)
    step_fn = jax.jit(lambda t: jax.tree.map(lambda x: x + 1, t), donate_argnums=0)
    with KeeperClient(own) as c, async_writer.AsyncSnapshotter(SnapshotWriter(c)) as snap:
        host = jax.device_put(state, jax_io.pinned_host_shardings(shardings))
        snap.submit(5, host, {'pos': 5})
        del host
        state = step_fn(state)  # donates the buffers the snapshot was taken from
        snap.submit(6, jax.device_put(state, jax_io.pinned_host_shardings(shardings)), {'pos': 6})
        state = step_fn(state)
        snap.wait()
        assert snap.stats.published == 2 and snap.stats.last_published_step == 6
        assert snap.stats.bytes > 0 and snap.stats.write_sec > 0
    for step, want in ((5, values), (6, jax.tree.map(lambda x: x + 1, values))):
        tree, data_state, _ = _restore(_abstract(values, mesh), [(own, 'shm')], step=step)
        assert data_state == {'pos': step}
        _assert_bitwise(tree, want, mesh)


def test_async_error_surfaces_on_next_call_and_keeps_last_snapshot(own):
    mesh, values = _mesh(4), _values(6)
    host = jax.device_put(_put(values, mesh), jax_io.pinned_host_shardings(_shardings(mesh)))

    def die(step):
        if step == 41:
            raise OSError('worker lost its keeper mid-snapshot')

    with KeeperClient(own) as c:
        snap = async_writer.AsyncSnapshotter(SnapshotWriter(BeforePublish(c, die)))
        snap.submit(40, host, {'pos': 40})
        snap.submit(41, host, {'pos': 41})
        with pytest.raises(async_writer.SnapshotError, match='step 41 failed.*mid-snapshot'):
            snap.wait()
        snap.close()
        assert [r.step for r in c.snapshots()] == [40]
        with pytest.raises(TypeError, match='not JSON-serialisable'):
            async_writer.AsyncSnapshotter(SnapshotWriter(c)).submit(42, host, {'pos': np.int64(1)})


_TRAINING_WORKER = textwrap.dedent(_CONNECT + """
    import jax, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from mecefo_jax.snapshot import AsyncSnapshotter, KeeperClient, SnapshotWriter, pinned_host_shardings
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    sh = {"w": NamedSharding(mesh, P())}
    state = jax.device_put({"w": np.arange(50_000, dtype=np.float32)}, sh)
    step_fn = jax.jit(lambda t: {"w": t["w"] + 1}, donate_argnums=0)
    snap = AsyncSnapshotter(SnapshotWriter(KeeperClient(own)))
    host_sh = pinned_host_shardings(sh)
    for step in range(10**9):
        state = step_fn(state)
        snap.submit(step, jax.device_put(state, host_sh), {"pos": step})
        if step == 20:
            print("RUNNING", flush=True)
""")


def test_sigkilled_training_worker_restores_its_last_published_step(own, cluster):
    # The worker snapshots every step until it is SIGKILLed at a random
    # point; whatever step was last published must come back exactly.
    proc = _writer(_TRAINING_WORKER, cluster)
    try:
        assert proc.stdout.readline().strip() == 'RUNNING'
        time.sleep(0.2)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    mesh = _mesh(1, 1)
    abstract = {'w': jax.ShapeDtypeStruct((50_000,), np.float32, sharding=NamedSharding(mesh, P()))}
    tree, data_state, report = _restore(abstract, [(own, 'shm')])
    step = report.step
    assert step >= 20 and data_state == {'pos': step}
    np.testing.assert_array_equal(np.asarray(tree['w']), np.arange(50_000, dtype=np.float32) + step + 1)


def test_a_planned_stop_is_snapshotted_whatever_the_interval(own):
    """A rejoin resumes from the step the survivors stop at: it must be in their keepers."""
    import types

    from mecefo_jax.launch.worker_state import SnapshotHook
    mesh, values = _mesh(4), _values(5)
    state = _put(values, mesh)
    hook = SnapshotHook(KeeperClient(own), 5, stop_at=7)
    try:
        for step in range(7):  # the state after step s enters step s + 1
            hook.on_step(types.SimpleNamespace(step=step, state=state, data_position={'pos': step}))
    finally:
        hook.close()
    with KeeperClient(own) as c:
        assert {r.step for r in c.snapshots()} >= {5, 7}
        assert 6 not in {r.step for r in c.snapshots()}


def test_auto_ends_each_measured_window_with_nothing_in_flight(own):
    """snapshot.every=auto times windows of steps: each ends with the step's output ready
    and no write in flight, so no window holds another's snapshot. Settling snapshots
    every step, the probe one step per pair."""
    import types

    from mecefo_jax.launch.worker_state import SnapshotHook
    from mecefo_jax.snapshot.cadence import PAIRS, PROBE_STEPS, SETTLE_STEPS
    mesh, values = _mesh(4), _values(5)
    state = _put(values, mesh)
    hook = SnapshotHook(KeeperClient(own), 'auto', budget_pct=2.0)
    window_ends = 0
    try:
        for step in range(SETTLE_STEPS + PROBE_STEPS):
            hook.on_step(types.SimpleNamespace(
                step=step, state=state, data_position={'pos': step}, loss=state['w'],
                layout=types.SimpleNamespace(signature='full')))
            if hook.cadence.window_ends:
                window_ends += 1
                assert hook._snapshotter._job is None, f'a write in flight after step {step}'
        assert window_ends == 1 + 2 * PAIRS and hook.interval is None
        assert hook.submitted == SETTLE_STEPS + PAIRS
        assert len(hook.cadence._blocked) == PAIRS  # the loop's time for each probed one
        hook.on_step(types.SimpleNamespace(
            step=SETTLE_STEPS + PROBE_STEPS, state=state, data_position={'pos': 0},
            loss=state['w'], layout=types.SimpleNamespace(signature='full')))
        assert hook.interval is not None
    finally:
        hook.close()


def test_auto_times_a_window_before_its_snapshots_write_ends(own):
    """A probed snapshot's write is held at its publish until the window holding the
    snapshot has been timed: the window's time leaves the write's tail out (awaited
    between windows), so a long write cannot hide what the snapshot costs the steps.
    Plain windows have no write in flight when timed."""
    import threading
    import types

    from mecefo_jax.launch.worker_state import SnapshotHook
    from mecefo_jax.snapshot.cadence import PAIRS, PROBE_STEPS, SETTLE_STEPS, WINDOW
    mesh, values = _mesh(4), _values(5)
    state = _put(values, mesh)
    gate, held = threading.Event(), []

    def before_publish(step):
        if hook.cadence.probing:  # settling's writes run free
            held.append(step)
            assert gate.wait(timeout=5), 'the window was not timed before the write ended'
            gate.clear()

    hook = SnapshotHook(BeforePublish(KeeperClient(own), before_publish), 'auto', budget_pct=2.0)
    timed, record = [], hook.cadence.record_window

    def record_window(seconds):
        window = hook.cadence._probe_index // WINDOW if hook.cadence.probing else None
        if window is not None:
            timed.append((window, hook._snapshotter._job is not None))
        record(seconds)
        if window is not None and window % 2 == 1:  # timed: let its snapshot's write end
            gate.set()
    hook.cadence.record_window = record_window
    try:
        for step in range(SETTLE_STEPS + PROBE_STEPS):
            hook.on_step(types.SimpleNamespace(
                step=step, state=state, data_position={'pos': step}, loss=state['w'],
                layout=types.SimpleNamespace(signature='full')))
    finally:
        gate.set()
        hook.close()
    assert len(held) == PAIRS
    assert timed == [(w, w % 2 == 1) for w in range(2 * PAIRS)]


def test_pinned_local_copies_keep_the_values_of_a_donated_step():
    mesh, values = _mesh(4), _values(5)
    state = _put(values, mesh)
    copies = jax_io.pinned_local_copies(state)
    step_fn = jax.jit(lambda t: jax.tree.map(lambda x: x + 1, t), donate_argnums=0)
    state = jax.block_until_ready(step_fn(state))  # donates the buffers just copied
    # One copy per distinct shard of each leaf, holding the pre-step values.
    assert len(copies) == sum(len({jax_io.index_bounds(s.index, v.shape)
                                   for s in state[k].addressable_shards})
                              for k, v in values.items())
    for copy in copies:
        want = values[copy.path][tuple(slice(a, b) for a, b in copy.index)]
        assert copy.data.sharding.memory_kind == 'pinned_host'
        np.testing.assert_array_equal(_bytes(np.asarray(copy.data)), _bytes(want))
