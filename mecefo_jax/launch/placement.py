"""Where a job's processes run: which worker holds which replica, on which node, with what.

Worker w of N holds devices [w * local, (w + 1) * local) of the job's order, replica r
the r-th run of `mesh.model` of them; a replica with a device on an absent worker is
absent whole, and the replica count never changes (it fixes the batch's shards).
Consecutive workers go to different nodes, and a placement one node's loss would end is
refused. An actor applies its environment itself (`enter`: XLA flags, device count,
single-threaded OpenBLAS), before JAX starts, rather than through a Ray `runtime_env`,
whose set-up process imports Ray once more per actor.
"""
from __future__ import annotations

import dataclasses
import os
import sys


@dataclasses.dataclass(frozen=True)
class Placement:
    workers: int
    local_devices: int
    model: int  # mesh.model: devices per replica

    def __post_init__(self):
        total = self.workers * self.local_devices
        if self.workers < 1 or self.local_devices < 1:
            raise ValueError(f'--nprocs={self.workers} and launch.local_devices='
                             f'{self.local_devices} must both be >= 1.')
        if self.model < 1 or total % self.model:
            raise ValueError(f'mesh.model={self.model} must divide the {total} devices of '
                             f'{self.workers} workers x launch.local_devices={self.local_devices}.')

    @property
    def replicas(self) -> int:
        return self.workers * self.local_devices // self.model

    def devices_of(self, replica: int) -> range:
        """Global device indices of a replica."""
        return range(replica * self.model, (replica + 1) * self.model)

    def workers_of(self, replica: int) -> tuple[int, ...]:
        return tuple(sorted({d // self.local_devices for d in self.devices_of(replica)}))

    def present(self, members) -> tuple[bool, ...]:
        members = set(members)
        return tuple(set(self.workers_of(r)) <= members for r in range(self.replicas))

    def survives(self, members) -> bool:
        """Whether `members` still hold at least one whole replica to train on."""
        return any(self.present(members))

    def check_mesh(self, mesh_cfg, global_batch_size: int) -> None:
        """The mesh and the batch split these workers make; ValueError naming the fix."""
        data = mesh_cfg.data
        shape = (f'{self.workers} workers x launch.local_devices={self.local_devices} / '
                 f'mesh.model={self.model}')
        if data not in (-1, self.replicas):
            raise ValueError(f'mesh.data={data}: the launcher runs {self.replicas} replicas '
                             f'({shape}); set mesh.data=-1.')
        if global_batch_size % self.replicas:
            devices = [n for n in range(1, 2 * self.workers + 1)
                       if (n * self.local_devices) % self.model == 0]
            fits = [n for n in devices if global_batch_size % (n * self.local_devices // self.model)
                    == 0]
            raise ValueError(f'data.global_batch_size={global_batch_size} does not split over the '
                             f'{self.replicas} replicas of {shape}: use --nprocs '
                             f'{" or ".join(map(str, fits[-3:]))}, or a multiple of '
                             f'{self.replicas} as data.global_batch_size.')


def replica_rows(placement: Placement, members, devices) -> list:
    """Each replica's jax devices in this generation, None where absent.

    `members[p]` is the worker id running as process p; `devices` are
    `jax.devices()` (every process's, each with its `process_index`).
    """
    by_process: dict[int, list] = {}
    for d in devices:
        by_process.setdefault(d.process_index, []).append(d)
    local = {}
    for process, worker in enumerate(members):
        found = sorted(by_process.get(process, []), key=lambda d: d.id)
        if len(found) != placement.local_devices:
            raise ValueError(f'worker {worker} (process {process}) has {len(found)} devices, '
                             f'launch.local_devices={placement.local_devices} expected.')
        for j, d in enumerate(found):
            local[worker * placement.local_devices + j] = d
    present = placement.present(members)
    return [tuple(local[i] for i in placement.devices_of(r)) if up else None
            for r, up in enumerate(present)]


def assign_nodes(workers, nodes, keep: dict | None = None) -> dict:
    """Each worker's node: `keep[w]` where given and live (its keeper is there), the rest in
    worker order onto the node that hosts the fewest workers so far (ties: `nodes` order).

    Consecutive workers, and so the members of a parity group and the
    holders of neighbouring replicas, land on different nodes whenever there
    are enough of them.
    """
    nodes = list(nodes)
    if not nodes:
        raise ValueError('The Ray cluster has no live node to place workers on.')
    assignment = {w: n for w, n in (keep or {}).items() if n in nodes}
    load = {n: sum(1 for a in assignment.values() if a == n) for n in nodes}
    for w in sorted(set(workers) - set(assignment)):
        node = min(nodes, key=lambda n: (load[n], nodes.index(n)))
        assignment[w] = node
        load[node] += 1
    return assignment


def parity_group(worker: int, workers: int, size: int) -> range:
    """The workers of `worker`'s XOR parity group: consecutive runs of `size`, a last run of
    one joining the run before it (a group of one could rebuild nothing); empty when the
    job has a single worker."""
    if workers < 2:
        return range(0)
    last = (workers - 1) // size
    if workers - last * size == 1:
        last -= 1  # the lone last worker joins the group before it
    index = min(worker // size, last)
    return range(index * size, workers if index == last else (index + 1) * size)


def node_loss_problems(placement: Placement, assignment: dict, parity_group: int = 0,
                       sharded: bool = False) -> list[str]:
    """Why losing a node (its workers and keepers together) would lose state; [] if none would.

    A loss is survived when the other nodes' workers still hold a whole
    replica (every data-parallel copy holds the whole state; not so where the
    snapshot is `sharded` over them: each keeper holds only its part), or when
    XOR parity (`parity_group` > 0) loses at most one member of each group.
    """
    problems = []
    for node in sorted(set(assignment.values())):
        lost = sorted(w for w, n in assignment.items() if n == node)
        rest = [w for w in range(placement.workers) if w not in lost]
        if not sharded and placement.survives(rest):
            continue
        if parity_group:
            groups = {_group_start(w, placement.workers, parity_group) for w in lost}
            if len(groups) == len(lost):  # one member per group: parity rebuilds each
                continue
            problems.append(f'node {node[:12]} holds workers {lost}, two or more of one parity '
                            f'group of {parity_group}, and no other node holds a whole replica')
        elif sharded:
            problems.append(f'node {node[:12]} holds workers {lost}, whose keepers hold their '
                            'parts of the sharded snapshot (snapshot.shard), and no parity '
                            'covers them')
        else:
            problems.append(f'node {node[:12]} holds workers {lost}; without them no whole '
                            'replica of the state is left, and no parity covers them')
    return problems


WHOLE_SNAPSHOTS = ('snapshot.shard: on this placement a lost node would lose parts of the '
                   'sharded snapshot no parity group covers; every worker writes its whole '
                   'state instead')


def node_loss_plan(placement: Placement, assignment: dict, snapshot) -> tuple[list[str], bool]:
    """(problems, shard) for the config's `snapshot` section: sharded snapshots where a lost
    node's parts come back from parity, whole ones where only those survive its loss."""
    parity = snapshot.parity_group if snapshot.parity else 0
    problems = node_loss_problems(placement, assignment, parity, sharded=snapshot.shard)
    if problems and snapshot.shard:
        whole = node_loss_problems(placement, assignment, parity)
        if not whole:
            return whole, False
    return problems, snapshot.shard


def _group_start(worker: int, workers: int, size: int) -> int:
    group = parity_group(worker, workers, size)
    return group.start if group else worker


def actor_env(local_devices: int, *, gpus: bool = False) -> dict:
    """The environment variables of a worker or compile-ahead actor."""
    flags = [f for f in os.environ.get('XLA_FLAGS', '').split()
             if 'xla_force_host_platform_device_count' not in f]
    if not gpus:
        flags.append(f'--xla_force_host_platform_device_count={local_devices}')
    return {'XLA_FLAGS': ' '.join(flags),
            'OPENBLAS_NUM_THREADS': os.environ.get('OPENBLAS_NUM_THREADS', '1')}


def enter(env: dict) -> None:
    """Apply `actor_env`'s variables in this actor's process, before JAX starts a backend.

    XLA reads its flags when JAX first starts a backend, and the OpenBLAS that
    JAX's LAPACK calls use (SciPy's) its thread count when the first such call
    loads it, so they apply as long as this runs first: in the actor's
    `__init__`. (NumPy's own OpenBLAS, loaded with the actor's module, keeps
    the node's setting; a worker does no NumPy linear algebra.) A process
    whose backend has already started under other flags (one Ray reused after
    it ran JAX) would train on them: refused.
    """
    current = os.environ.get('XLA_FLAGS', '')
    if 'jax' in sys.modules and env.get('XLA_FLAGS', current) != current:
        from jax._src import xla_bridge
        if xla_bridge.backends_are_initialized():
            raise RuntimeError(
                f'this Ray worker process (pid {os.getpid()}) already started JAX with XLA_FLAGS='
                f"{current!r}, not the actor's {env['XLA_FLAGS']!r}: an actor needs a process of its own")
    os.environ.update(env)


def node_has_gpus(node_id: str) -> bool:
    import ray
    return any(n['NodeID'] == node_id and n.get('Resources', {}).get('GPU', 0) > 0
               for n in ray.nodes())


def actor_options(*, node_id: str | None = None, gpus: int = 0, concurrency: int = 1) -> dict:
    """`.options(...)` of a worker or compile-ahead actor: on `node_id` if given, never restarted
    by Ray (the launcher decides what comes back), no CPU reserved (the node's devices are
    what it uses). Its environment is `actor_env`'s, passed to its constructor (`enter`)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    out = {'num_cpus': 0, 'num_gpus': gpus, 'max_restarts': 0, 'max_concurrency': concurrency}
    if node_id is not None:
        out['scheduling_strategy'] = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return out
