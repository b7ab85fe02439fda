"""The snapshot path's timings, each against a plain copy of the same bytes in the same run.

    python -m studies.snapshot_bench [--mb 256] [--leaves 8] [--repeats 3]

The one measurement of what the memory tier's byte path costs (REFT-style
in-memory snapshots, Wang et al., arXiv 2310.12670). `path_figures(tree,
keeper)`, for a keeper on this node (a Ray actor, or a `LocalKeeper` in this
process), reports medians of: the snapshot write (copy + checksum + publish;
`write_cold_sec` is the first, which allocates the segment), reading it back
through shared memory (raw shards, then a full `restore` to jax arrays;
`_cold` ones map the keeper's slot afresh, as a relaunched worker does), the
async writer's cost per step (its `device_put` to pinned_host included) and
the caller's blocked time when fed back to back or with a step 1.5x longer
than a write; and the same bytes moved the plainest way, `copy_sec`
(`np.copyto` into a preallocated buffer), and checksummed (`checksum_sec`),
since a machine's timings vary with its load. `with_ratios` adds each
figure's GB/s and `<name>_vs_copy`, `copy_sec` over its time (1.0: as fast
as the copy). The command runs it on a float32 pytree of `--mb` MiB (one CPU
device) into a keeper actor on a one-node Ray cluster and prints one JSON
object. Reads and restores are medians after one warm-up.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mecefo_jax.snapshot import async_writer, blob, jax_io, shm
from mecefo_jax.snapshot.client import KeeperClient, SnapshotWriter, open_snapshots


def _median(fn, repeats, warmup=0) -> float:
    for _ in range(warmup):  # first touches of fresh memory are not the steady state
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _tree(mb, leaves):
    n = (mb << 20) // 4 // leaves
    rng = np.random.default_rng(0)
    sharding = NamedSharding(jax.sharding.Mesh(np.array(jax.devices()[:1]), ('data',)), P())
    return jax.device_put({f'leaf{i}': rng.standard_normal(n, dtype=np.float32) for i in range(leaves)}, sharding)


def _copies(parts: list[np.ndarray], repeats) -> dict:
    """The same bytes copied into a preallocated buffer, and checksummed as a snapshot is."""
    dst = np.empty(sum(p.nbytes for p in parts), np.uint8)
    offsets = np.cumsum([0] + [p.nbytes for p in parts])

    def copy():
        for p, lo in zip(parts, offsets):
            np.copyto(dst[lo:lo + p.nbytes], p)
    return {'copy_sec': _median(copy, repeats, warmup=1),
            'checksum_sec': _median(lambda: blob.sums(parts), repeats, warmup=1)}


def _reads(keeper, abstract, repeats) -> dict:
    """Raw reads and full restores of the keeper's newest snapshot through shared memory."""
    def read_raw():
        snaps = open_snapshots(keeper, via='shm')
        snaps[0].read(snaps[0].entries)
        for s in snaps:
            s.close()

    def restore():
        snaps = open_snapshots(keeper, via='shm')
        jax.block_until_ready(jax_io.restore(abstract, snaps[:1])[0])
        for s in snaps:
            s.close()
    out = {}
    for name, fn in (('read', read_raw), ('restore', restore)):
        shm.unmap_all()  # as a relaunched worker reads: its first mapping of the keeper's slots
        out[f'{name}_shm_cold_sec'] = _median(fn, 1)
    out['read_shm_sec'] = _median(read_raw, repeats, warmup=1)
    out['restore_shm_sec'] = _median(restore, repeats, warmup=1)
    return out


def _writes(writer, shards, step, repeats) -> dict:
    first = time.perf_counter()
    writer.write(next(step), shards, {})
    out = {'write_cold_sec': time.perf_counter() - first}  # the keeper allocates, this process maps
    for _ in range(2):  # warm the other slots
        writer.write(next(step), shards, {})
    out['write_sec'] = _median(lambda: writer.write(next(step), shards, {}), repeats)
    return out


def _async(writer, tree, step, repeats) -> dict:
    """The async writer fed back to back (each submit waits for the previous write), then
    with a simulated step 1.5x as long as a write (the writer keeps up)."""
    host_sh = jax_io.pinned_host_shardings(jax.tree.map(lambda x: x.sharding, tree))
    out = {}
    with async_writer.AsyncSnapshotter(writer) as snap:
        snap.submit(next(step), jax.device_put(tree, host_sh), {})
        snap.wait()
        for mode in ('back_to_back', 'overlapped'):
            s0 = dataclasses.replace(snap.stats)
            for _ in range(repeats):
                snap.submit(next(step), jax.device_put(tree, host_sh), {})
                if mode == 'overlapped':
                    time.sleep(1.5 * out['async_write_per_step_sec'])
            snap.wait()
            s1 = snap.stats
            out[f'async_{mode}_blocked_per_step_sec'] = (s1.blocked_sec - s0.blocked_sec) / repeats
            if mode == 'back_to_back':
                out['async_write_per_step_sec'] = (s1.write_sec - s0.write_sec) / repeats
                out['async_materialize_per_step_sec'] = (s1.materialize_sec - s0.materialize_sec) / repeats
    return out


def path_figures(tree, keeper, *, repeats: int = 3) -> dict:
    """The snapshot path on `tree` into `keeper`, each part timed beside a plain copy of the same
    bytes (module docstring). The host copies of `tree`'s shards are taken once, so the writes
    time the host path alone; the async writer and the restores include the copies between
    device and host, as a worker's do."""
    shards = jax_io.host_shards(tree)
    parts = [blob.flat_bytes(s.data) for s in shards]
    out = {'bytes': sum(p.nbytes for p in parts)}
    step = iter(range(1, 10**6))
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
    with KeeperClient(keeper) as client:
        writer = SnapshotWriter(client)
        out.update(_writes(writer, shards, step, repeats))
        out.update(_reads(keeper, abstract, repeats))
        out.update(_async(writer, tree, step, repeats))
    out.update(_copies(parts, repeats))
    return out


def with_ratios(out: dict) -> dict:
    """`out` with each time's GB/s and its ratio to the copy (blocked times have neither)."""
    gib, out = out['bytes'] / 2**30, dict(out)
    timed = [k for k in out if k.endswith('_sec') and 'blocked' not in k]
    for key in timed:
        out[key.replace('_sec', '_gbps')] = round(gib / out[key], 2) if out[key] else None
    for key in timed:
        if key != 'copy_sec' and out[key]:
            out[key.replace('_sec', '_vs_copy')] = round(out['copy_sec'] / out[key], 3)
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--mb', type=int, default=256)
    p.add_argument('--leaves', type=int, default=8)
    p.add_argument('--repeats', type=int, default=3)
    args = p.parse_args(argv)
    from mecefo_jax.snapshot.keeper_actor import start_keeper, stop_keeper
    from tests.drills.sim_cluster import SimulatedCluster
    tree = _tree(args.mb, args.leaves)
    cluster = SimulatedCluster(1, object_store_mb=max(96, 3 * args.mb))
    keeper = start_keeper('bench0', slots=3, detached=False, node_id=cluster.head)
    try:
        out = {'mb': args.mb, 'leaves': args.leaves, 'repeats': args.repeats,
               **path_figures(tree, keeper, repeats=args.repeats)}
    finally:
        stop_keeper(keeper)
        cluster.shutdown()
    out = with_ratios(out)
    print(json.dumps(out, indent=1))
    return out


if __name__ == '__main__':
    main()
