"""Tests for the sharded snapshot (REFT): each holder of a replicated box writes one part.

`share_of` and `_holders` decide the parts; a restore tiles every box from all
keepers' parts and keeps one writer per step; the hook never waits for a slow
write. Keepers are real Ray actors on the session's local cluster.
"""
import dataclasses
import itertools
import threading
import types

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from mecefo_jax.snapshot import blob, jax_io
from mecefo_jax.snapshot.client import KeeperClient, SnapshotWriter, open_sources
from mecefo_jax.snapshot.keeper_actor import start_keeper, stop_keeper

NAMESPACE = 'snapshot_share_test'


def _volume(box):
    return int(np.prod([b - a for a, b in box])) if box else 1


def _overlap(a, b):
    return all(max(a0, b0) < min(a1, b1) for (a0, a1), (b0, b1) in zip(a, b))


@pytest.mark.parametrize('box', [((0, 8), (0, 6)), ((3, 4), (0, 10)), ((2, 5),), ((0, 1), (0, 1)),
                                 ()])
def test_the_holders_parts_tile_each_box_exactly_once(box):
    for count in range(1, 6):
        parts = [jax_io.share_of(box, rank, count, 'leaf') for rank in range(count)]
        kept = [p for p in parts if p is not None]
        assert sum(_volume(p) for p in kept) == _volume(box), (box, count, parts)
        for a, b in itertools.combinations(kept, 2):
            assert not (a and _overlap(a, b)), (box, count, a, b)
        for p in kept:  # inside the box
            assert all(b0 <= a0 < a1 <= b1 for (a0, a1), (b0, b1) in zip(p, box))


@dataclasses.dataclass(frozen=True)
class _Device:
    id: int
    process_index: int


class _Sharding:
    """A global device map like a ('data', 'model') NamedSharding's over 4 processes, 2 devices
    each, splitting columns over 'model': every column block is held by all 4 processes."""

    def devices_indices_map(self, shape):
        cols = shape[1] // 2
        return {_Device(2 * p + m, p): (slice(None), slice(m * cols, (m + 1) * cols))
                for p in range(4) for m in range(2)}


def test_every_process_holding_a_box_is_one_of_its_holders():
    holders = jax_io._holders(_Sharding(), (8, 6))
    assert holders == {((0, 8), (0, 3)): (0, 1, 2, 3), ((0, 8), (3, 6)): (0, 1, 2, 3)}


def test_one_writer_per_step_the_newest_generation():
    def snap(step, generation):
        meta = {} if generation is None else {'generation': generation}
        return types.SimpleNamespace(step=step, header=types.SimpleNamespace(meta=meta))
    snaps = [snap(5, 0), snap(5, 2), snap(5, 2), snap(4, 0), snap(4, None)]
    assert jax_io.newest_writer_only(snaps) == [snaps[1], snaps[2], snaps[3]]


@pytest.fixture(scope='module')
def keepers(ray_cluster):
    made = [start_keeper(f'share{i}', namespace=NAMESPACE) for i in range(3)]
    yield made
    for k in made:
        stop_keeper(k)


def _replicated(mesh):
    rng = np.random.default_rng(0)
    values = {'w': rng.standard_normal((9, 4)).astype(np.float32),
              'scale': rng.standard_normal((5,)).astype(np.float32),
              'step': np.asarray(3, np.int32)}
    sharding = NamedSharding(mesh, P())
    return values, jax.device_put(values, sharding), sharding


@pytest.mark.subprocess  # keepers are Ray actors
@pytest.mark.ray
def test_a_restore_tiles_each_box_from_every_keepers_part(keepers):
    """Three 'processes' each write their part of a replicated state into their own keeper;
    any one keeper alone cannot restore it, all three together restore it bitwise."""
    mesh = Mesh(np.array(jax.devices()[:2]).reshape(2, 1), ('data', 'model'))
    values, tree, sharding = _replicated(mesh)
    whole = jax_io.host_shards(tree)
    for rank, keeper in enumerate(keepers):
        parts = []
        for s in whole:
            part = jax_io.share_of(s.index, rank, len(keepers), s.path)
            if part is not None:
                cut = tuple(slice(a, b) for a, b in part)
                parts.append(blob.HostShard(s.path, s.shape, part, s.data[cut]))
        with KeeperClient(keeper) as c:
            SnapshotWriter(c).write(11, parts, {'pos': 11}, {'generation': 1})
        written = sum(p.data.nbytes for p in parts)
        assert written < sum(s.data.nbytes for s in whole) / 2  # about a third each
    abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding)
                for k, v in values.items()}
    alone = open_sources(keepers[0])
    try:
        assert jax_io.feasible_steps(abstract, alone) == []
    finally:
        for s in alone:
            s.close()
    snaps = open_sources(keepers[0], keepers[1:])
    try:
        restored, data_state, _ = jax_io.restore(abstract, snaps, step=11)
    finally:
        for s in snaps:
            s.close()
    assert data_state == {'pos': 11}
    for k, v in values.items():
        np.testing.assert_array_equal(np.asarray(restored[k]), v, err_msg=k)


@pytest.mark.subprocess  # keepers are Ray actors
@pytest.mark.ray
def test_under_auto_a_slow_write_never_stalls_the_step_and_the_newest_snapshot_wins(keepers):
    """The writer is held inside the publish of step 1; steps 2 and 3 come due meanwhile.
    Neither waits: 2 waits its turn, 3 replaces it (2 is dropped), and once the writer
    goes on, 1 and 3 are published."""
    from mecefo_jax.launch.worker_state import SnapshotHook
    from mecefo_jax.snapshot.client import KeeperClient
    from tests.fault_points import BeforePublish
    mesh = Mesh(np.array(jax.devices()[:2]).reshape(2, 1), ('data', 'model'))
    _, tree, _ = _replicated(mesh)
    held, release = threading.Event(), threading.Event()

    def before_publish(step):
        if step == 1:
            held.set()
            release.wait()  # a write slower than any step

    def done(step):
        return types.SimpleNamespace(step=step, state=tree, data_position={'pos': step},
                                     loss=tree['w'], layout=types.SimpleNamespace(signature='full'))

    hook = SnapshotHook(BeforePublish(KeeperClient(keepers[2]), before_publish), 'auto')
    try:
        hook.cadence.due(0, 'full')  # its topology seen; then an interval, as if measured
        hook.cadence.interval = 1
        hook.on_step(done(0))
        assert held.wait(60)
        stepping = threading.Thread(target=lambda: [hook.on_step(done(s)) for s in (1, 2)])
        stepping.start()
        stepping.join(60)  # returns while the writer is still held: neither step waited
        assert not stepping.is_alive() and not release.is_set()
        assert (hook.submitted, hook.stats.dropped) == (3, 1)
    finally:
        release.set()
        hook.close()
    with KeeperClient(keepers[2]) as c:
        steps = {r.step for r in c.snapshots()}
    assert {1, 3} <= steps and 2 not in steps


def test_a_node_loss_of_a_sharded_snapshot_needs_parity_even_where_replicas_remain():
    """Two workers on two nodes each hold a whole replica, so a whole-state snapshot
    survives either node's loss; sharded, each keeper holds half, and only parity
    (one member per group on each node) covers the lost half."""
    from mecefo_jax.launch.placement import Placement, node_loss_problems
    placement, assignment = Placement(2, 2, 1), {0: 'node-a', 1: 'node-b'}
    assert node_loss_problems(placement, assignment) == []
    problems = node_loss_problems(placement, assignment, sharded=True)
    assert len(problems) == 2 and all('snapshot.shard' in p for p in problems)
    assert node_loss_problems(placement, assignment, parity_group=2, sharded=True) == []
