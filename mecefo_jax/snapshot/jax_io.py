"""Pytrees of `jax.Array`s to snapshot shards and back.

A snapshot stores each leaf's unique shards, keyed by (leaf path, index bounds); with
`shard_over_replicas`, k processes holding one box each write a 1/k part (`share_of`), as
REFT (arXiv 2310.12670) shards over the data-parallel ranks. `restore` rebuilds a pytree
on any mesh, each shard from the first snapshot holding it (the own keeper's, then
peers') or from saved shards that tile it, all at one step (`feasible_steps`).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
import zlib
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from mecefo_jax.host.tree_paths import key_names
from mecefo_jax.snapshot import blob
from mecefo_jax.snapshot.client import Snapshot

_MAX_LISTED = 12


class SnapshotMissingError(LookupError):
    """No step has every shard the restore needs."""


class SnapshotMismatchError(ValueError):
    """A saved leaf's shape or dtype differs from the requested one."""


def path_str(path: tuple) -> str:
    """'params.layers.mlp.kernel' for a pytree key path (dict, attribute and index keys)."""
    return '.'.join(key_names(path)) or '<root>'


def index_bounds(index: tuple, shape: tuple) -> blob.Index:
    """((start, stop), ...) of a shard index (a tuple of slices) in `shape`."""
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def host_shards(tree: Any) -> list[blob.HostShard]:
    """Each leaf's unique addressable shards as numpy, in tree order, once computed (it blocks);
    device, 'pinned_host' and plain numpy leaves (one whole shard)."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = path_str(path)
        if isinstance(leaf, jax.Array):
            if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.extended):
                raise TypeError(f'Leaf {name} has dtype {leaf.dtype}; snapshot jax.random.key_data(...) '
                                'instead of typed PRNG keys.')
            seen = set()
            for shard in leaf.addressable_shards:
                bounds = index_bounds(shard.index, leaf.shape)
                if bounds not in seen:
                    seen.add(bounds)
                    out.append(blob.HostShard(name, tuple(leaf.shape), bounds, np.asarray(shard.data)))
        else:
            arr = np.asarray(leaf)
            out.append(blob.HostShard(name, arr.shape, tuple((0, n) for n in arr.shape), arr))
    return out


def share_of(box: blob.Index, rank: int, count: int, path: str) -> blob.Index | None:
    """Holder `rank` of `count`'s part of `box`: a slab along its longest axis (None if empty);
    a scalar goes whole to one holder, chosen by its path. Every holder computes the same
    partition, so the parts tile the box exactly once."""
    if count == 1:
        return box
    if not box:
        return box if zlib.crc32(path.encode()) % count == rank else None
    axis = max(range(len(box)), key=lambda a: (box[a][1] - box[a][0], -a))
    lo, hi = box[axis]
    start, stop = lo + (hi - lo) * rank // count, lo + (hi - lo) * (rank + 1) // count
    if stop <= start:
        return None
    return box[:axis] + ((start, stop),) + box[axis + 1:]


@functools.lru_cache(maxsize=4096)
def _holders(sharding, shape: tuple) -> dict[blob.Index, tuple[int, ...]]:
    """{box: the processes holding it}, from the sharding's global device map."""
    out: dict[blob.Index, set] = {}
    for device, index in sharding.devices_indices_map(shape).items():
        out.setdefault(index_bounds(index, shape), set()).add(device.process_index)
    return {box: tuple(sorted(ps)) for box, ps in out.items()}


@dataclasses.dataclass(frozen=True)
class ShareCopy:
    """A pinned host copy of a whole box, of which this process writes `part` (a sub-box)."""
    shard: blob.HostShard
    part: blob.Index

    def materialize(self) -> blob.HostShard:
        """The part as a numpy view of the finished copy (waits for it)."""
        whole = np.asarray(self.shard.data)
        cut = tuple(slice(a - s0, b - s0) for (a, b), (s0, _) in zip(self.part, self.shard.index))
        return blob.HostShard(self.shard.path, self.shard.shape, self.part, whole[cut])


def pinned_local_copies(tree: Any, *, shard_over_replicas: bool = False) -> list:
    """This process's unique shards of `tree`, each being copied to pinned host memory:
    `blob.HostShard`s, or with `shard_over_replicas` `ShareCopy`s of the boxes it writes a
    non-empty part of (`share_of`). `data` is a jax.Array still being copied (`np.asarray` waits).

    Each copy is device-local, ordered before any later step that donates its source: a
    `device_put` of the global arrays would be a program spanning processes, which beside
    the train steps deadlocked a 4-process CPU job. All go in one batched `device_put`: the
    loop blocks for the dispatch, and one call per shard cost several times more.
    """
    found, sources, targets = [], [], []
    me = jax.process_index()
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = path_str(path)
        holders = _holders(leaf.sharding, tuple(leaf.shape)) if shard_over_replicas else {}
        seen = set()
        for shard in leaf.addressable_shards:
            bounds = index_bounds(shard.index, leaf.shape)
            if bounds in seen:
                continue
            seen.add(bounds)
            part = bounds
            if shard_over_replicas:
                ranks = holders[bounds]
                part = share_of(bounds, ranks.index(me), len(ranks), name)
                if part is None:
                    continue
            found.append((name, tuple(leaf.shape), bounds, part))
            sources.append(shard.data)
            targets.append(jax.sharding.SingleDeviceSharding(shard.device,
                                                             memory_kind='pinned_host'))
    copies = jax.device_put(sources, targets) if sources else []
    shards = [(blob.HostShard(name, shape, bounds, data), part)
              for (name, shape, bounds, part), data in zip(found, copies)]
    if shard_over_replicas:
        return [ShareCopy(shard, part) for shard, part in shards]
    return [shard for shard, _ in shards]


def newest_writer_only(snapshots: Sequence[Snapshot]) -> list[Snapshot]:
    """Per step, the snapshots of the newest generation that wrote it: a step redone after a
    recovery is written again with other parts, which must not be tiled with the older ones.
    Snapshots without a generation in `meta` count as the oldest."""
    def generation(s):
        return int((s.header.meta or {}).get('generation', -1))
    newest: dict[int, int] = {}
    for s in snapshots:
        newest[s.step] = max(newest.get(s.step, -1), generation(s))
    return [s for s in snapshots if generation(s) == newest[s.step]]


def pinned_host_shardings(shardings: Any) -> Any:
    """The same shardings in 'pinned_host' memory (targets of the async snapshot copy)."""
    leaves = jax.tree.leaves(shardings)
    if leaves:
        kinds = {m.kind for m in next(iter(leaves[0].device_set)).addressable_memories()}
        if 'pinned_host' not in kinds:
            raise ValueError(f"Devices of this backend offer memories {sorted(kinds)}, not 'pinned_host'; "
                             "snapshot by jax.device_get instead (blocking).")
    return jax.tree.map(lambda s: s.with_memory_kind('pinned_host'), shardings)


# --------------------------------------------------------------------- restore

@dataclasses.dataclass(frozen=True)
class _Leaf:
    path: str
    shape: tuple[int, ...]
    dtype: np.dtype
    sharding: jax.sharding.Sharding
    needed: tuple[blob.Index, ...]


@dataclasses.dataclass
class RestoreReport:
    step: int
    seconds: float = 0.0
    bytes_by_source: dict = dataclasses.field(default_factory=dict)
    healed_shards: int = 0  # shards read from a snapshot other than the first one given


def _leaves(abstract: Any) -> tuple[list[_Leaf], Any]:
    flat, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    leaves = []
    for path, x in flat:
        name = path_str(path)
        sharding = getattr(x, 'sharding', None)
        if not hasattr(x, 'shape') or sharding is None:
            raise ValueError(f'Restore target {name} needs a shape, dtype and sharding; give '
                             'jax.ShapeDtypeStruct(shape, dtype, sharding=...) (see checkpoint.abstract_like).')
        shape = tuple(x.shape)
        needed = {index_bounds(i, shape) for i in sharding.addressable_devices_indices_map(shape).values()}
        leaves.append(_Leaf(name, shape, np.dtype(x.dtype), sharding, tuple(sorted(needed))))
    return leaves, treedef


def _intersect(a: blob.Index, b: blob.Index) -> blob.Index | None:
    out = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))
    return out if all(lo < hi for lo, hi in out) else None


def _volume(box: blob.Index) -> int:
    return math.prod(hi - lo for lo, hi in box)


def _plan(leaves: list[_Leaf], snapshots: Sequence[Snapshot]):
    """Per leaf, per needed box: [(snapshot, entry)] that supply it; and what is missing."""
    by_path: dict[str, dict[blob.Index, tuple[Snapshot, blob.Entry]]] = {}
    for snap in snapshots:
        for e in snap.entries:
            by_path.setdefault(e.path, {}).setdefault(e.index, (snap, e))  # first source wins
    plan, missing = [], []
    for leaf in leaves:
        saved = by_path.get(leaf.path, {})
        _, e = next(iter(saved.values()), (None, None))
        if e is not None and (tuple(e.shape) != leaf.shape or blob.dtype_from_name(e.dtype) != leaf.dtype):
            raise SnapshotMismatchError(
                f'Leaf {leaf.path} was saved as {e.dtype}{list(e.shape)} but is requested as '
                f'{leaf.dtype.name}{list(leaf.shape)}. Fix: build the restore target from the same '
                'model/optimizer config as the run that wrote the snapshot.')
        boxes = {}
        for box in leaf.needed:
            if box in saved:
                boxes[box] = [saved[box]]
            elif _volume(box) == 0:
                boxes[box] = []
            else:
                # One leaf's saved boxes are equal or disjoint: they tile `box` iff their overlaps add up.
                parts = [(s, e) for idx, (s, e) in saved.items() if _intersect(idx, box)]
                if sum(_volume(_intersect(e.index, box)) for _, e in parts) == _volume(box):
                    boxes[box] = parts
                else:
                    missing.append(f'{leaf.path}{[list(b) for b in box]}')
        plan.append(boxes)
    return plan, missing


def feasible_steps(abstract: Any, snapshots: Sequence[Snapshot]) -> list[int]:
    """Steps (newest first) at which `snapshots` hold every shard this process needs."""
    leaves, _ = _leaves(abstract)
    steps = sorted({s.step for s in snapshots}, reverse=True)
    return [t for t in steps if not _plan(leaves, [s for s in snapshots if s.step == t])[1]]


def restore(abstract: Any, snapshots: Sequence[Snapshot], *, step: int | None = None
            ) -> tuple[Any, dict, RestoreReport]:
    """(tree, data_state, report) rebuilt from `snapshots` at `step` (default: newest feasible).

    `snapshots` may mix steps and sources; for a shard several hold, the earliest is read
    (pass the own keeper's first). Shards are verified as they are read.
    """
    start = time.perf_counter()
    leaves, treedef = _leaves(abstract)
    steps = sorted({s.step for s in snapshots}, reverse=True)
    if step is not None:
        steps = [t for t in steps if t == step]
    first_missing = None
    for t in steps:
        at_t = [s for s in snapshots if s.step == t]
        plan, missing = _plan(leaves, at_t)
        if not missing:
            break
        first_missing = first_missing or (t, missing)
    else:
        held = sorted({(s.source, s.step) for s in snapshots})
        if first_missing is None:
            detail = f'no snapshot of step {step}' if step is not None else 'no snapshots at all'
        else:
            t, missing = first_missing
            shown = ', '.join(missing[:_MAX_LISTED]) + (f', ... (+{len(missing) - _MAX_LISTED} more)'
                                                        if len(missing) > _MAX_LISTED else '')
            detail = f'step {t} lacks {len(missing)} shard(s): {shown}'
        raise SnapshotMissingError(
            f'Cannot restore from in-memory snapshots: {detail}. Snapshots given (source, step): {held}. '
            'Fix: add the keepers of peers holding these shards, rebuild a lost member from parity, '
            'or restart from the Orbax disk checkpoint.')
    report = RestoreReport(step=t)
    arrays = [_build(leaf, boxes, at_t[0], report) for leaf, boxes in zip(leaves, plan)]
    data_state = at_t[0].data_state
    report.seconds = time.perf_counter() - start
    return jax.tree_util.tree_unflatten(treedef, arrays), data_state, report


def _build(leaf: _Leaf, boxes: dict, own: Snapshot, report: RestoreReport) -> jax.Array:
    """One leaf: read its shards (one request per snapshot), then place them."""
    wanted: dict[int, tuple[Snapshot, dict]] = {}
    for parts in boxes.values():
        for snap, e in parts:
            wanted.setdefault(id(snap), (snap, {}))[1][e.index] = e
    arrays = {}
    for key, (snap, entries) in wanted.items():
        es = list(entries.values())
        for e, arr in zip(es, snap.read(es)):
            arrays[(key, e.index)] = arr
        nbytes = sum(e.nbytes for e in es)
        report.bytes_by_source[snap.source] = report.bytes_by_source.get(snap.source, 0) + nbytes
        if snap is not own:
            report.healed_shards += len(es)
    # On CPU `device_put` of an aligned host array aliases it: a shard read in place from a
    # keeper's shared memory would keep living in its slot, pinned while the array lives (a
    # restored worker's slot stayed pinned through its training steps). So it is copied
    # once here; on a GPU the copy to the device is that copy.
    copy = next(iter(leaf.sharding.device_set)).platform == 'cpu'
    local = {}
    for box, parts in boxes.items():
        if len(parts) == 1 and parts[0][1].index == box:
            view = arrays[(id(parts[0][0]), box)]
            local[box] = np.array(view) if copy else view
            continue
        out = np.empty(tuple(hi - lo for lo, hi in box), leaf.dtype)
        for snap, e in parts:
            cut = _intersect(e.index, box)
            src = tuple(slice(lo - s0, hi - s0) for (lo, hi), (s0, _) in zip(cut, e.index))
            dst = tuple(slice(lo - b0, hi - b0) for (lo, hi), (b0, _) in zip(cut, box))
            out[dst] = arrays[(id(snap), e.index)][src]
        local[box] = out
    return jax.make_array_from_callback(
        leaf.shape, leaf.sharding, lambda index: local[index_bounds(index, leaf.shape)])
