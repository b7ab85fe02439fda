"""One training worker of a launcher job (`python -m mecefo_jax.launch.worker`, started by launch.py).

A worker is one `jax.distributed` process holding `launch.local_devices`
devices. It heartbeats to the launcher from its first line, joins the job,
restores the state (from the keepers' in-memory snapshots, the Orbax
checkpoint, or a fresh init), and trains under `FaultController` with the
replicas of absent workers marked down, so the strategy (MeCeFO by default)
places their shards on live neighbours. It snapshots the state after every
`snapshot.every` steps and stops at `--stop_at` when the launcher plans a
rejoin.

It writes, under `<workdir>/launch/`: `g<G>_w<W>_start.json` once its first
step has run (how long joining, restoring, compiling and the first step
took), `g<G>_w<W>_end.json` when it finishes, and (process 0)
`provenance.jsonl` (per step: the global batch's hash and which examples of
which shard were computed) and, when the run is complete, `final_params.npz`.
"""
import hashlib
import json
import os
import sys
import time

from absl import app, flags

_CONFIG_JSON = flags.DEFINE_string('config_json', None,
                                   "The job's resolved config (the launcher's launch/config.json).")
_WORKDIR = flags.DEFINE_string('workdir', None, 'The job directory.')
_COORDINATOR = flags.DEFINE_string('coordinator', None, 'host:port of the jax.distributed coordinator.')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Processes in this generation.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'This process in this generation.')
_WORKER = flags.DEFINE_integer('worker', None, 'This worker id (stable across relaunches).')
_MEMBERS = flags.DEFINE_string('members', None, 'Worker ids of this generation, in process order.')
_WORKERS = flags.DEFINE_integer('workers', None, 'Workers of the full job.')
_GENERATION = flags.DEFINE_integer('generation', 0, 'Relaunch count.')
_RESUME = flags.DEFINE_enum('resume', 'fresh', ['fresh', 'memory', 'disk'], 'Where the state comes from.')
_RESUME_STEP = flags.DEFINE_integer(
    'resume_step', 0, 'With --resume=memory: the snapshot step to restore (0: the processes agree).')
_STOP_AT = flags.DEFINE_integer('stop_at', 0, 'Stop after this step (0: train.steps).')
_HEARTBEAT = flags.DEFINE_string('heartbeat', None, 'host:port of the launcher heartbeat socket.')
_KEEPERS = flags.DEFINE_string('keepers', '[]', 'JSON list: each worker keeper [host, port] or null.')
flags.mark_flags_as_required(['config_json', 'workdir', 'coordinator', 'num_processes', 'process_id',
                              'worker', 'members', 'workers', 'heartbeat'])


def _write_json(path: str, value: dict) -> None:
    tmp = f'{path}.tmp'
    with open(tmp, 'w') as f:
        json.dump(value, f, indent=2, default=str)
    os.replace(tmp, path)


def main(argv):
    del argv
    started = time.time()
    # Heartbeats first: the launcher must hear from us while jax imports.
    from mecefo_jax.launch.heartbeat import HeartbeatSender
    host, port = _HEARTBEAT.value.rsplit(':', 1)
    heartbeat = HeartbeatSender((host, int(port)), _WORKER.value, _GENERATION.value)
    from mecefo_jax.settings import load_json
    cfg = load_json(_CONFIG_JSON.value)
    from mecefo_jax.sharding import simulate_cpu_devices
    simulate_cpu_devices(cfg.launch.local_devices)
    import jax
    import numpy as np
    from absl import logging
    logging.set_verbosity(logging.WARNING)
    cache = cfg.launch.compilation_cache
    if cache:
        # Shared by every worker and generation: a program compiled once (the
        # full mesh before a failure, say) loads from disk after a relaunch.
        if cache == 'auto':
            cache = os.path.join(_WORKDIR.value, 'launch', 'xla_cache')
        jax.config.update('jax_compilation_cache_dir', cache)
        jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)

    members = [int(w) for w in _MEMBERS.value.split(',')]
    keepers = json.loads(_KEEPERS.value)
    out_dir = os.path.join(_WORKDIR.value, 'launch')
    tag = f'g{_GENERATION.value}_w{_WORKER.value}'
    t0 = time.perf_counter()
    jax.distributed.initialize(coordinator_address=_COORDINATOR.value,
                               num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value)
    distributed_init_sec = time.perf_counter() - t0

    from mecefo_jax import train as train_lib
    from mecefo_jax.faults.controller import FaultController
    from mecefo_jax.launch import placement as placement_lib
    from mecefo_jax.launch import worker_state as worker_state

    placement = placement_lib.Placement(_WORKERS.value, cfg.launch.local_devices, cfg.mesh.model)
    placement.check_mesh(cfg.mesh)
    rows = placement_lib.replica_rows(placement, members, jax.devices())
    # Orbax checkpoints only where the launcher recovers from disk.
    checkpoint_every = None if cfg.launch.recovery == 'disk' else 0
    run = train_lib.build_run(cfg, _WORKDIR.value, replica_rows=rows,
                              checkpoint_every=checkpoint_every)

    info: dict = {}
    restore = None
    if _RESUME.value == 'memory':
        restore = worker_state.keeper_restore(keepers, _WORKER.value, info,
                                               step=_RESUME_STEP.value or None)
    elif _RESUME.value == 'disk':
        restore = worker_state.disk_restore(info)
    elif _RESUME.value == 'fresh' and run.checkpointer is not None \
            and run.checkpointer.latest_step() is not None:
        raise ValueError(f'{run.checkpointer.directory} already holds checkpoints; '
                         'use a new --workdir for a new job.')
    snapshot_hook = None
    if cfg.snapshot.every > 0 and keepers and keepers[_WORKER.value] is not None:
        parity = None
        if cfg.snapshot.parity:
            parity = _parity_pusher(cfg, keepers, _WORKER.value)
        snapshot_hook = worker_state.SnapshotHook(keepers[_WORKER.value],
                                                   cfg.snapshot.every, parity=parity)

    controllers = []
    provenance = (open(os.path.join(out_dir, 'provenance.jsonl'), 'a')
                  if jax.process_index() == 0 else None)
    first = {}

    def on_step(done):
        heartbeat.dispatched_step(done.step + 1, done.loss)
        if provenance is not None:
            provenance.write(json.dumps({
                'generation': _GENERATION.value, 'step': done.step,
                'batch_sha256': hashlib.sha256(np.ascontiguousarray(done.tokens_nbt)).hexdigest(),
                'covered': {str(k): v for k, v in sorted(done.layout.shards_covered().items())},
                'replicas': list(done.layout.replicas)}) + '\n')
            provenance.flush()
        if snapshot_hook is not None:
            snapshot_hook(done)
        if not first:  # time the way back: everything up to the end of the first step
            jax.block_until_ready(done.loss)
            events = [e for e in controllers[0].events if e.step == done.step]
            first.update(resume_step=done.step, first_step_done=time.time(),
                         compile_sec=done.compile_sec + sum(e.compile_sec for e in events),
                         refresh_sec=sum(e.refresh_sec for e in events),
                         train_start_to_first_step_sec=time.perf_counter() - train_start)
            restored = info.get('restore')
            _write_json(os.path.join(out_dir, f'{tag}_start.json'), dict(
                first, worker=_WORKER.value, generation=_GENERATION.value, pid=os.getpid(),
                process_start=started, distributed_init_sec=distributed_init_sec,
                resume=_RESUME.value, restore_sec=restored.seconds if restored else None,
                restore_bytes=restored.bytes_by_source if restored else None,
                restore_phases=restored.phases if restored else None,
                healed_bytes=restored.healed_bytes if restored else None))

    make_controller = FaultController.factory(cfg, run)

    def controller_factory(r):
        controllers.append(make_controller(r))
        return controllers[0]

    train_start = time.perf_counter()
    stop_at = _STOP_AT.value or None
    summary = train_lib.train(cfg, _WORKDIR.value, run=run, restore=restore, on_step=on_step,
                              controller_factory=controller_factory, stop_at=stop_at)
    if snapshot_hook is not None:
        snapshot_hook.close()
    state = summary.pop('state')
    end = {'worker': _WORKER.value, 'generation': _GENERATION.value,
           'params_sha256': _local_params_sha256(state.params),
           'final_step': summary['final_step'], 'finished': summary['final_step'] >= cfg.train.steps,
           'final_loss': summary['final_loss'], 'final_val_loss': summary['final_val_loss'],
           'snapshot_blocked_sec': snapshot_hook.blocked_sec if snapshot_hook else 0.0,
           'snapshots': snapshot_hook.submitted if snapshot_hook else 0}
    if end['finished']:
        from jax.experimental import multihost_utils
        params = multihost_utils.process_allgather(state.params, tiled=True)
        if jax.process_index() == 0:
            flat = {jax.tree_util.keystr(p): np.asarray(v)
                    for p, v in jax.tree_util.tree_leaves_with_path(params)}
            np.savez(os.path.join(out_dir, 'final_params.npz'), **flat)
    _write_json(os.path.join(out_dir, f'{tag}_end.json'), end)
    if provenance is not None:
        provenance.close()
    jax.distributed.shutdown()


def _local_params_sha256(params) -> str:
    """Hash of this process's parameter shards, after checking its copies of each agree.

    Replicas of one shard index must be bit-identical on every device; the
    hash then lets the launcher's caller compare processes.
    """
    import jax
    import numpy as np
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        copies = {}
        for shard in leaf.addressable_shards:
            key = tuple((s.start, s.stop) for s in shard.index)
            data = np.asarray(shard.data).tobytes()
            if copies.setdefault(key, data) != data:
                raise AssertionError(f'{jax.tree_util.keystr(path)}: local replicas differ')
        for key in sorted(copies, key=str):
            digest.update(repr((jax.tree_util.keystr(path), key)).encode())
            digest.update(copies[key])
    return digest.hexdigest()


def _parity_pusher(cfg, keepers, worker):
    """The pusher of this worker's parity group (groups of snapshot.parity_group workers)."""
    from mecefo_jax.snapshot import ParityPusher
    size = cfg.snapshot.parity_group  # snapshot.parity is 'xor': checked at resolve
    first = worker - worker % size
    group = list(range(first, min(first + size, len(keepers))))
    return ParityPusher(f'workers{first}-{group[-1]}', worker - first,
                        [tuple(keepers[w]) for w in group])


if __name__ == '__main__':
    sys.exit(app.run(main))
