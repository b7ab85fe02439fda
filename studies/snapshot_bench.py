"""The snapshot path's timings, each against a plain copy of the same bytes in the same run.

    python -m studies.snapshot_bench [--mb 256] [--leaves 8] [--repeats 3] [--group 3]

This is the one measurement of what the snapshot path costs; the GPU
report's snapshot section (`studies/gpu/snapshot.py`) calls `path_figures`
on its train state rather than timing the path again.

`path_figures(tree, keeper)`, for any keeper on this node (a Ray actor, or
a `LocalKeeper` in this process), reports medians of: the snapshot write
(copy + checksum + publish; `write_cold_sec` is the first, which allocates
the segment), reading it back through shared memory (raw shards, then a full
`restore` to jax arrays; `_cold` ones map the keeper's slot afresh, as a
relaunched worker does), the async writer's cost per step (its `device_put`
to pinned_host included) and the caller's blocked time when fed back to
back or with a step 1.5x longer than a write; and the same bytes moved the
plainest way, `copy_sec` (`np.copyto` into a preallocated buffer), and
checksummed (`checksum_sec`, the snapshot's xxh3 hash lists), since a
machine's timings vary with its load.

The command runs it on a float32 pytree of `--mb` MiB (one CPU device) on a
simulated Ray cluster of two nodes, and adds `zlib_crc32_sec` (the checksum
the hash lists replaced) and what needs the cluster: reads
from a keeper on the other node through Ray, the way a worker heals from a
peer; `tcp_sec`, a loopback TCP transfer between two threads; `ray_transfer_sec`,
an actor on the other node handing the bytes over through Ray's object
store (the most a remote read through Ray can reach); and with `--group`
g > 1, the parity push per member (members spread over both nodes) and the
rebuild of one lost member. Every figure's `<name>_vs_copy` is `copy_sec`
over its time (1.0: as fast as the copy), the remote reads' `_vs_tcp` and
`_vs_ray` likewise. Reads and restores are medians after one warm-up.
Prints one JSON object.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import statistics
import threading
import time
import zlib

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mecefo_jax.snapshot import async_writer, checksum, jax_io, parity, shm
from mecefo_jax.snapshot.client import KeeperClient, SnapshotWriter, open_snapshots


def _median(fn, repeats, warmup=0):
    for _ in range(warmup):  # first touches of fresh memory (the object stores' too) are not the steady state
        fn()
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
    return jax.device_put(values, sharding)


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _tcp(parts: list[np.ndarray]) -> float:
    """Seconds to send `parts` over one loopback TCP connection to another thread."""
    total = sum(p.nbytes for p in parts)
    dst = memoryview(np.empty(total, np.uint8))
    with socket.create_server(('127.0.0.1', 0)) as server:
        def send():
            conn, _ = server.accept()
            with conn:
                for p in parts:
                    conn.sendall(p)
        start = time.perf_counter()
        sender = threading.Thread(target=send)
        sender.start()
        with socket.create_connection(server.getsockname()) as conn:
            got = 0
            while got < total:
                n = conn.recv_into(dst[got:], min(total - got, 16 << 20))
                if not n:
                    raise ConnectionError(f'Loopback sender stopped after {got} of {total} bytes.')
                got += n
        sender.join()
        return time.perf_counter() - start


def _copies(parts: list[np.ndarray], repeats) -> dict:
    """The same bytes copied into a preallocated buffer, and checksummed as a snapshot is."""
    dst = np.empty(sum(p.nbytes for p in parts), np.uint8)
    offsets = np.cumsum([0] + [p.nbytes for p in parts])

    def copy():
        for p, lo in zip(parts, offsets):
            np.copyto(dst[lo:lo + p.nbytes], p)
    out = {}
    out['copy_sec'], _ = _median(copy, repeats, warmup=1)
    out['checksum_sec'], _ = _median(lambda: checksum.sums(parts), repeats, warmup=1)
    return out


def _transports(parts: list[np.ndarray], far_node, repeats) -> dict:
    """The same bytes sent over loopback TCP, and handed over by Ray from the other node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    out = {'tcp_sec': statistics.median([_tcp(parts) for _ in range(repeats + 1)][1:])}  # after a warm-up

    @ray.remote(num_cpus=0)
    class Holder:
        def __init__(self, parts):
            self.parts = [p.copy() for p in parts]

        def get(self):
            return [ray.put(self.parts)]
    holder = Holder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(far_node, soft=False)
                            ).remote(parts)
    ray.get(holder.get.remote())
    out['ray_transfer_sec'], _ = _median(lambda: ray.get(ray.get(holder.get.remote())[0]), repeats, warmup=1)
    ray.kill(holder)
    return out


def _reads(keeper, via: str, abstract, repeats) -> dict:
    """Raw reads and full restores of the keeper's newest snapshot (`via` 'shm' or 'remote')."""
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
    out = {}
    if via == 'shm':  # as a relaunched worker reads: its first mapping of the keeper's slots
        for name, fn in (('read', read_raw), ('restore', restore)):
            shm.unmap_all()
            out[f'{name}_shm_cold_sec'], _ = _median(fn, 1)
    out[f'read_{via}_sec'], _ = _median(read_raw, repeats, warmup=1)
    out[f'restore_{via}_sec'], _ = _median(restore, repeats, warmup=1)
    return out


def _writes(writer, shards, step, repeats) -> dict:
    first = time.perf_counter()
    writer.write(next(step), shards, {})
    out = {'write_cold_sec': time.perf_counter() - first}  # the keeper allocates, this process maps
    for _ in range(2):  # warm the other slots
        writer.write(next(step), shards, {})
    out['write_sec'], _ = _median(lambda: writer.write(next(step), shards, {}), repeats)
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
    """The snapshot path on `tree` into `keeper` (on this node), each part timed beside a
    plain copy of the same bytes (module docstring); ratios and GB/s by `with_ratios`.

    The host copies of `tree`'s shards are taken once, so the writes time the
    host path alone; the async writer and the restores include the copies
    between device and host, as a worker's do.
    """
    shards = jax_io.host_shards(tree)
    parts = [checksum.flat_bytes(s.data) for s in shards]
    out = {'bytes': sum(p.nbytes for p in parts)}
    step = iter(range(1, 10**6))
    with KeeperClient(keeper) as client:
        writer = SnapshotWriter(client)
        out.update(_writes(writer, shards, step, repeats))
        out.update(_reads(keeper, 'shm', _abstract(tree), repeats))
        out.update(_async(writer, tree, step, repeats))
    out.update(_copies(parts, repeats))
    return out


def with_ratios(out: dict) -> dict:
    """`out` with each time's GB/s, its ratio to the copy, and the remote reads' to TCP and Ray."""
    gib = out['bytes'] / 2**30
    out = dict(out)
    for key in [k for k in out if k.endswith('_sec') and 'blocked' not in k]:
        out[key.replace('_sec', '_gbps')] = round(gib / out[key], 2) if out[key] else None
    for key in [k for k in out if k.endswith('_sec') and 'blocked' not in k and k != 'copy_sec']:
        if out[key]:
            out[key.replace('_sec', '_vs_copy')] = round(out['copy_sec'] / out[key], 3)
    for key in ('read_remote', 'restore_remote'):
        for base in ('tcp', 'ray_transfer'):
            if f'{key}_sec' in out and f'{base}_sec' in out:
                out[f'{key}_vs_{base.split("_")[0]}'] = round(out[f'{base}_sec'] / out[f'{key}_sec'], 3)
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
    from mecefo_jax.snapshot.keeper_actor import start_keeper, stop_keeper
    from tests.drills.sim_cluster import SimulatedCluster
    tree = _tree(args.mb, args.leaves)
    cluster = SimulatedCluster(2, object_store_mb=max(96, 3 * args.mb))
    here, there = cluster.head, next(n for n in cluster.nodes if n != cluster.head)
    # Member 0 on this process's node; the others alternate, so the far one is on the other node.
    keepers = [start_keeper(f'bench{m}', slots=3, detached=False, node_id=(here, there)[m % 2])
               for m in range(max(2, args.group))]
    try:
        out = {'mb': args.mb, 'leaves': args.leaves, 'repeats': args.repeats,
               **path_figures(tree, keepers[0], repeats=args.repeats)}
        with KeeperClient(keepers[1]) as c:
            SnapshotWriter(c).write(1, jax_io.host_shards(tree), {})
        out.update(_reads(keepers[1], 'remote', _abstract(tree), args.repeats))
        parts = [checksum.flat_bytes(s.data) for s in jax_io.host_shards(tree)]
        out['zlib_crc32_sec'], _ = _median(lambda: [zlib.crc32(p) for p in parts], args.repeats, warmup=1)
        out.update(_transports(parts, there, args.repeats))
        if args.group > 1:
            out.update(_parity(tree, keepers[:args.group], args.repeats))
    finally:
        for k in keepers:
            stop_keeper(k)
        cluster.shutdown()
    out = with_ratios(out)
    print(json.dumps(out, indent=1))
    return out


if __name__ == '__main__':
    main()
