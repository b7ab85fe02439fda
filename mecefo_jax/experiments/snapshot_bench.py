"""Timings of the snapshot store on this machine.

    python -m mecefo_jax.experiments.snapshot_bench [--mb 256] [--leaves 8] [--repeats 3] [--group 3]

On a simulated Ray cluster of two nodes on this machine, writes a float32
pytree of `--mb` MiB (one CPU device) into a keeper on this process's node
and reports medians of: the snapshot write (copy + crc + publish; cold =
the first, which allocates the segment), reading it back through shared
memory and from a keeper on the other node through Ray, the way a worker
heals from a peer (raw shards, then a full `restore` to jax arrays), the
async writer's cost per step (its `device_put` to pinned_host included) and
the caller's blocked time when fed back to back or with a step 1.5x longer
than a write, and with `--group` g > 1: the parity push per member (members
spread over both nodes) and the rebuild of one lost member. Prints one JSON
object.
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

from mecefo_jax.snapshot import async_writer, jax_io, parity
from mecefo_jax.snapshot.client import KeeperClient, SnapshotWriter, open_snapshots
from mecefo_jax.snapshot.keeper_actor import start_keeper, stop_keeper


def _median(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def _tree(mb, leaves):
    n = (mb << 20) // 4 // leaves
    rng = np.random.default_rng(0)
    sharding = NamedSharding(jax.sharding.Mesh(np.array(jax.devices()[:1]), ('data',)), P())
    values = {f'leaf{i}': rng.standard_normal(n, dtype=np.float32) for i in range(leaves)}
    return jax.device_put(values, sharding), sharding


def _reads(own, far, abstract, repeats) -> dict:
    """Raw reads and full restores: the own keeper through shared memory, the far one through Ray."""
    out = {}
    for via, keeper in (('shm', own), ('remote', far)):
        def read_raw():
            snaps = open_snapshots(keeper, via=via)
            snaps[0].read(snaps[0].entries)
            for s in snaps:
                s.close()

        def restore():
            snaps = open_snapshots(keeper, via=via)
            jax.block_until_ready(jax_io.restore(abstract, snaps[:1])[0])
            for s in snaps:
                s.close()
        out[f'read_{via}_sec'], _ = _median(read_raw, repeats)
        out[f'restore_{via}_sec'], _ = _median(restore, repeats)
    return out


def _parity(tree, group, repeats) -> dict:
    """The parity push per member and the rebuild of member 0."""
    push = []
    for m in range(len(group)):
        with KeeperClient(group[m]) as c:
            pusher = parity.ParityPusher('bench', m, group)
            info = SnapshotWriter(c, parity=pusher).write(10**6, jax_io.host_shards(tree), {})
            pusher.close()
            push.append(info.parity_sec)
    rebuild, _ = _median(lambda: parity.rebuild_member('bench', [None] + group[1:]), repeats)
    return {'parity_push_sec': statistics.median(push), 'parity_rebuild_sec': rebuild}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--mb', type=int, default=256)
    p.add_argument('--leaves', type=int, default=8)
    p.add_argument('--repeats', type=int, default=3)
    p.add_argument('--group', type=int, default=3, help='parity group size (0: skip parity)')
    args = p.parse_args(argv)
    tree, sharding = _tree(args.mb, args.leaves)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)
    out = {'mb': args.mb, 'leaves': args.leaves, 'repeats': args.repeats}
    from mecefo_jax.experiments.sim_cluster import SimulatedCluster
    cluster = SimulatedCluster(2, object_store_mb=max(96, 3 * args.mb))
    here, there = cluster.head, next(n for n in cluster.nodes if n != cluster.head)
    # Member 0 on this process's node; the others alternate, so the far one is on the other node.
    keepers = [start_keeper(f'bench{m}', slots=3, detached=False, node_id=(here, there)[m % 2])
               for m in range(max(2, args.group))]
    try:
        own, far = keepers[0], keepers[1]
        client = KeeperClient(own)
        writer = SnapshotWriter(client)
        step = iter(range(1, 10**6))
        first = time.perf_counter()
        writer.write(next(step), jax_io.host_shards(tree), {})
        # Cold: the keeper allocates the segment and this process maps it.
        out['write_cold_sec'] = time.perf_counter() - first
        for _ in range(2):  # warm the other slots
            writer.write(next(step), jax_io.host_shards(tree), {})
        out['write_sec'], _ = _median(lambda: writer.write(next(step), jax_io.host_shards(tree), {}),
                                      args.repeats)
        with KeeperClient(far) as c:
            SnapshotWriter(c).write(1, jax_io.host_shards(tree), {})
        out.update(_reads(own, far, abstract, args.repeats))

        host_sh = jax_io.pinned_host_shardings(jax.tree.map(lambda _: sharding, tree))
        with async_writer.AsyncSnapshotter(writer) as snap:
            snap.submit(next(step), jax.device_put(tree, host_sh), {})
            snap.wait()
            # Back to back (every submit waits for the previous write), then with
            # a simulated step 1.5x as long as a write (the writer keeps up).
            for mode in ('back_to_back', 'overlapped'):
                s0 = dataclasses.replace(snap.stats)
                for _ in range(args.repeats):
                    snap.submit(next(step), jax.device_put(tree, host_sh), {})
                    if mode == 'overlapped':
                        time.sleep(1.5 * out['async_write_per_step_sec'])
                snap.wait()
                s1, n = snap.stats, args.repeats
                out[f'async_{mode}_blocked_per_step_sec'] = (s1.blocked_sec - s0.blocked_sec) / n
                if mode == 'back_to_back':
                    out['async_write_per_step_sec'] = (s1.write_sec - s0.write_sec) / n
                    out['async_materialize_per_step_sec'] = (s1.materialize_sec - s0.materialize_sec) / n

        if args.group > 1:
            out.update(_parity(tree, keepers[:args.group], args.repeats))
        client.close()
    finally:
        for k in keepers:
            stop_keeper(k)
        cluster.shutdown()
    for key in [k for k in out if k.endswith('_sec') and 'blocked' not in k]:
        out[key.replace('_sec', '_gbps')] = round(args.mb / 1024 / out[key], 2) if out[key] else None
    print(json.dumps(out, indent=1))
    return out


if __name__ == '__main__':
    main()
