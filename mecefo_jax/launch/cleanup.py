"""`python -m mecefo_jax.launch --workdir DIR --cleanup`: remove what a killed launcher left.

A launcher that is killed leaves its keepers (detached actors holding the
snapshots in shared memory) and, when it started one, its local Ray cluster,
so that rerunning the same command resumes from their memory. For a job that
will not be rerun, this removes them: every actor of the workdir's namespace,
their shared-memory segments, and the local cluster.
"""
from __future__ import annotations

from mecefo_jax.launch import ray_cluster
from mecefo_jax.snapshot import shm
from mecefo_jax.snapshot.keeper_actor import find_keeper, stop_keeper


def cleanup(workdir: str, address: str | None = None) -> dict:
    """Remove `workdir`'s detached actors, their segments and its local cluster; what went."""
    import ray
    removed = {'keepers': [], 'segments': [], 'local_cluster': False}
    joined = ray_cluster.join(address, workdir, start=False, log=lambda _: None)
    if joined is not None:
        namespace = ray_cluster.namespace_of(workdir)
        names = sorted(a['name'] for a in ray.util.list_named_actors(all_namespaces=True)
                       if a['namespace'] == namespace)
        for name in names:
            handle = find_keeper(name, namespace)
            if handle is not None:
                removed['segments'] += stop_keeper(handle)
                removed['keepers'].append(name)
        ray.shutdown()
        if joined.local_pid is not None:
            removed['local_cluster'] = ray_cluster.stop_local(workdir)
    removed['segments'] += shm.remove_stale(ray_cluster.namespace_of(workdir))
    return removed
