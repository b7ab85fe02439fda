"""One training worker of a launcher job (`python -m mecefo_jax.launch.worker`, started by launch.py).

A worker is one `jax.distributed` process holding `launch.local_devices`
devices. It heartbeats to the launcher from its first line, joins the job,
restores the state (from the keepers' in-memory snapshots, the Orbax
checkpoint, or a fresh init), and trains through `main.run` under the fault
controller, with the replicas of absent workers marked down, so the strategy
(MeCeFO by default) places their shards on live neighbours. It snapshots the
state after every `snapshot.every` steps and stops at `--stop_at` when the
launcher plans a rejoin.

It writes, under `<workdir>/launch/`: `g<G>_w<W>_start.json` once its first
step has run (how long joining, restoring, compiling and the first step
took), `g<G>_w<W>_end.json` when it finishes, and (process 0)
`provenance.jsonl` (per step: the global batch's hash and which examples of
which shard were computed) and, when the run is complete, `final_params.npz`.
"""
import hashlib
import json
import os
import statistics
import sys
import threading
import time

from absl import app, flags

from mecefo_jax.observers import Observer  # pure Python: no jax before heartbeats

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
_LAUNCHER_PID = flags.DEFINE_integer('launcher_pid', None, 'The launcher: exit when it is gone.')
_KEEPERS = flags.DEFINE_string('keepers', '[]', 'JSON list: each worker keeper [host, port] or null.')
_HOLD_AFTER_SNAPSHOT = flags.DEFINE_integer(
    'hold_after_snapshot', 0, "Crash drills (launch.kill 'STEP:WORKER:SIGNAL:snapshot'): hold "
    'the training loop once the first snapshot at or after this step is published (0: never).')
_HOLD_IN_PUBLISH = flags.DEFINE_integer(
    'hold_in_publish', 0, "Crash drills (launch.kill 'STEP:WORKER:SIGNAL:publish'): stop inside "
    "the publish of this snapshot step, say so in a file, and wait there for the launcher's signal.")
flags.mark_flags_as_required(['config_json', 'workdir', 'coordinator', 'num_processes', 'process_id',
                              'worker', 'members', 'workers', 'heartbeat'])


def _write_json(path: str, value: dict) -> None:
    tmp = f'{path}.tmp'
    with open(tmp, 'w') as f:
        json.dump(value, f, indent=2, default=str)
    os.replace(tmp, path)


def main(argv):
    """Runs the worker; an exception ends the process at once, with exit code 1.

    A normal interpreter exit runs `jax.distributed`'s shutdown, which waits
    in a barrier for peers that may never reach it (they wait for this
    process in a collective): minutes in which the launcher sees a live,
    beating worker. Ending at once makes the error visible by its exit code.
    """
    try:
        _run(argv)
    except Exception:  # SystemExit (EXIT_PREEMPTED) leaves normally
        import traceback
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def _run(argv):
    del argv
    started = time.time()
    # Heartbeats first: the launcher must hear from us while jax imports.
    from mecefo_jax.launch.heartbeat import HeartbeatSender
    host, port = _HEARTBEAT.value.rsplit(':', 1)
    heartbeat = HeartbeatSender((host, int(port)), _WORKER.value, _GENERATION.value,
                                launcher_pid=_LAUNCHER_PID.value)
    from mecefo_jax.settings import load_json
    cfg = load_json(_CONFIG_JSON.value)
    from mecefo_jax.sharding import simulate_cpu_devices
    simulate_cpu_devices(cfg.launch.local_devices)
    import jax
    from absl import logging
    logging.set_verbosity(logging.WARNING)
    # Shared by every worker, generation and compile-ahead job: a program
    # compiled once loads on every process after a relaunch.
    from mecefo_jax import program_cache
    program_cache.configure(cfg.launch.compilation_cache, _WORKDIR.value,
                            program_cache.program_context(cfg))

    members = [int(w) for w in _MEMBERS.value.split(',')]
    keepers = json.loads(_KEEPERS.value)
    out_dir = os.path.join(_WORKDIR.value, 'launch')
    tag = f'g{_GENERATION.value}_w{_WORKER.value}'
    t0 = time.perf_counter()
    from mecefo_jax.launch.coordinator import join
    join(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    distributed_init_sec = time.perf_counter() - t0

    from mecefo_jax import train as train_lib
    from mecefo_jax.launch import placement as placement_lib
    from mecefo_jax.launch import worker_state as worker_state

    placement = placement_lib.Placement(_WORKERS.value, cfg.launch.local_devices, cfg.mesh.model)
    placement.check_mesh(cfg.mesh)
    rows = placement_lib.replica_rows(placement, members, jax.devices())
    # Orbax checkpoints every train.checkpoint_every steps in either mode: the
    # disk tier under the keepers' memory tier (REFT and Orbax's emergency
    # checkpointing keep both), so losing the launcher or a host loses at most
    # the steps since the last save.
    run = train_lib.build_run(cfg, _WORKDIR.value, replica_rows=rows)

    info: dict = {}
    restore = _restore_fn(keepers, info)
    snapshot_hook = _snapshot_hook(cfg, keepers, _WORKER.value,
                                   before_publish=_hold_in_publish(out_dir, tag),
                                   on_hold=_hold_after_snapshot(out_dir, tag))

    provenance = (os.path.join(out_dir, 'provenance.jsonl')
                  if jax.process_index() == 0 else None)
    start_record = dict(worker=_WORKER.value, generation=_GENERATION.value, pid=os.getpid(),
                        process_start=started, distributed_init_sec=distributed_init_sec,
                        resume=_RESUME.value)
    step_log = _StepLog(heartbeat, provenance, os.path.join(out_dir, f'{tag}_start.json'),
                        start_record, info)
    observers = [step_log] + ([snapshot_hook] if snapshot_hook is not None else [])
    summary, preempted = _train(cfg, run, restore, observers)
    if snapshot_hook is not None:
        snapshot_hook.close()  # the keeper holds the last snapshot before the launcher stops it
    if preempted is None:
        _write_end(cfg, summary, snapshot_hook, out_dir, tag,
                   median_step_sec=step_log.median_step_sec())
    else:
        _write_json(os.path.join(out_dir, f'{tag}_end.json'),
                    {'worker': _WORKER.value, 'generation': _GENERATION.value,
                     'final_step': preempted, 'finished': False, 'preempted': True})
    if step_log.provenance is not None:
        step_log.provenance.close()
    # Every process reaches the end before any leaves: a process that shuts
    # down while a peer still talks to the coordination service can make that
    # peer abort (SIGABRT) at a planned stop.
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(f'end of generation {_GENERATION.value}')
    jax.distributed.shutdown()
    if preempted is not None:
        from mecefo_jax.preemption import EXIT_PREEMPTED
        sys.exit(EXIT_PREEMPTED)


def _restore_fn(keepers, info: dict):
    """`--resume`'s restore callback; None for 'fresh'.

    'fresh' restores the newest intact disk checkpoint if the workdir has one
    (a rerun after the launcher itself was lost), else starts a new run.
    """
    from mecefo_jax.launch import worker_state
    if _RESUME.value == 'memory':
        return worker_state.keeper_restore(keepers, _WORKER.value, info,
                                           step=_RESUME_STEP.value or None)
    if _RESUME.value == 'disk':
        return worker_state.disk_restore(info)
    return None


def _train(cfg, run, restore, observers):
    """(summary, None), or (None, the saved step) when the launcher asked the job to stop."""
    from mecefo_jax.main import run as train_run
    from mecefo_jax.preemption import Preempted, PreemptionGuard
    with PreemptionGuard() as preemption:  # the launcher forwards SIGTERM; JAX syncs the step
        try:
            return train_run(cfg, _WORKDIR.value, run=run, restore=restore, observers=observers,
                             stop_at=_STOP_AT.value or None, elastic=True,
                             preemption=preemption), None
        except Preempted as stopped:
            return None, stopped.step


def _write_end(cfg, summary: dict, snapshot_hook, out_dir: str, tag: str, *,
               median_step_sec: float | None) -> None:
    """The end record (and, for a complete run, the final parameters from process 0)."""
    import jax
    import numpy as np

    from mecefo_jax import program_cache
    state = summary.pop('state')
    end = {'worker': _WORKER.value, 'generation': _GENERATION.value,
           'params_sha256': _local_params_sha256(state.params),
           'final_step': summary['final_step'], 'finished': summary['final_step'] >= cfg.train.steps,
           'final_loss': summary['final_loss'], 'final_val_loss': summary['final_val_loss'],
           'snapshot_blocked_sec': snapshot_hook.blocked_sec if snapshot_hook else 0.0,
           'snapshots': snapshot_hook.submitted if snapshot_hook else 0,
           'programs_compiled': program_cache.stats.misses,
           'programs_cached': program_cache.stats.hits,
           'median_step_sec': median_step_sec,
           'snapshot_cadence': (snapshot_hook.cadence.history
                                if snapshot_hook and snapshot_hook.cadence else None)}
    if end['finished']:
        from jax.experimental import multihost_utils
        params = multihost_utils.process_allgather(state.params, tiled=True)
        if jax.process_index() == 0:
            flat = {jax.tree_util.keystr(p): np.asarray(v)
                    for p, v in jax.tree_util.tree_leaves_with_path(params)}
            np.savez(os.path.join(out_dir, 'final_params.npz'), **flat)
    _write_json(os.path.join(out_dir, f'{tag}_end.json'), end)


class _StepLog(Observer):
    """The worker's observer: heartbeat and provenance per step, the start record once.

    The start record times the way back: everything up to the end of the
    first step, with the compile and refresh seconds of the events (a
    relaunch's failure) reported before it.
    """

    def __init__(self, heartbeat, provenance_path, start_path: str, record: dict, info: dict):
        self.heartbeat, self.provenance_path = heartbeat, provenance_path
        self.provenance = None  # opened at the first step, once the resumed step is known
        self.start_path, self.record, self.info = start_path, record, info
        self.events = []
        self.train_start = time.perf_counter()
        self.first_done = False
        self.dispatched: list[float] = []  # each step's dispatch time (perf_counter)

    def median_step_sec(self, settle: int = 2) -> float | None:
        """This generation's median step, dispatch to dispatch, past its first `settle` steps.

        The loop dispatches a step once the previous one's outputs can be
        read, so the interval is a step's wall time, snapshot blocking included.
        """
        times = self.dispatched[settle:]
        gaps = [b - a for a, b in zip(times, times[1:])]
        return statistics.median(gaps) if gaps else None

    def on_event(self, event) -> None:
        self.events.append(event)

    def on_step(self, done) -> None:
        import jax
        import numpy as np

        from mecefo_jax import program_cache
        from mecefo_jax.metrics import truncate_rows_after
        self.heartbeat.dispatched_step(done.step + 1, done.loss)
        self.dispatched.append(done.dispatched)
        if self.provenance is None and self.provenance_path is not None:
            # Steps past the resumed one were recorded by a run that did not
            # keep them: this run records them again, once.
            if os.path.exists(self.provenance_path):
                truncate_rows_after(self.provenance_path, done.step - 1)
            self.provenance = open(self.provenance_path, 'a')
        if self.provenance is not None:
            self.provenance.write(json.dumps({
                'generation': self.record['generation'], 'step': done.step,
                'batch_sha256': hashlib.sha256(np.ascontiguousarray(done.tokens_nbt)).hexdigest(),
                'covered': {str(k): v for k, v in sorted(done.layout.shards_covered().items())},
                'replicas': list(done.layout.replicas)}) + '\n')
            self.provenance.flush()
        if self.first_done:
            return
        self.first_done = True
        jax.block_until_ready(done.loss)
        events = [e for e in self.events if e.step == done.step]
        restored = self.info.get('restore')
        _write_json(self.start_path, dict(
            resume_step=done.step, first_step_done=time.time(),
            compile_sec=done.compile_sec + sum(e.compile_sec for e in events),
            programs_compiled=program_cache.stats.misses,
            programs_cached=program_cache.stats.hits,
            programs_load_sec=program_cache.stats.load_sec,
            programs_found_untraced=program_cache.stats.untraced_hits,
            refresh_sec=sum(e.refresh_sec for e in events),
            train_start_to_first_step_sec=time.perf_counter() - self.train_start,
            **self.record, restore_sec=restored.seconds if restored else None,
            restore_bytes=restored.bytes_by_source if restored else None,
            restore_phases=restored.phases if restored else None,
            healed_bytes=restored.healed_bytes if restored else None))


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


def _hold_in_publish(out_dir: str, tag: str):
    """The writer's `before_publish` for `--hold_in_publish`: None unless a drill asks for it.

    The snapshot writer thread stops after copying the step's bytes and
    before publishing them, writes a marker file, and never goes on: the
    launcher, which polls for that file, kills the process there.
    """
    hold = _HOLD_IN_PUBLISH.value
    if not hold:
        return None

    def before_publish(step: int) -> None:
        if step == hold:
            from mecefo_jax.launch.kills import held_in_publish_marker
            marker = held_in_publish_marker(out_dir, _GENERATION.value, _WORKER.value)
            _write_json(marker, {'worker': _WORKER.value, 'step': step, 'pid': os.getpid()})
            print(f'[{tag}] holding inside the publish of step {step}', flush=True)
            threading.Event().wait()  # until the launcher's signal
    return before_publish


def _hold_after_snapshot(out_dir: str, tag: str):
    """SnapshotHook's `on_hold` for `--hold_after_snapshot`: write the marker, wait for the signal."""
    def on_hold(step: int) -> None:
        from mecefo_jax.launch.kills import held_after_snapshot_marker
        marker = held_after_snapshot_marker(out_dir, _GENERATION.value, _WORKER.value)
        _write_json(marker, {'worker': _WORKER.value, 'step': step, 'pid': os.getpid()})
        print(f'[{tag}] holding after the published snapshot of step {step}', flush=True)
        threading.Event().wait()  # until the launcher's signal
    return on_hold


def _snapshot_hook(cfg, keepers, worker, *, before_publish=None, on_hold=None):
    """This worker's snapshot observer, or None when snapshots are off or it has no keeper."""
    from mecefo_jax.launch import worker_state
    if cfg.snapshot.every == 0 or not keepers or keepers[worker] is None:
        return None
    parity = _parity_pusher(cfg, keepers, worker) if cfg.snapshot.parity else None
    return worker_state.SnapshotHook(
        keepers[worker], cfg.snapshot.every, parity=parity, before_publish=before_publish,
        stop_at=_STOP_AT.value or None,
        hold_after=_HOLD_AFTER_SNAPSHOT.value or None, on_hold=on_hold,
        budget_pct=cfg.snapshot.overhead_budget_pct,
        log=lambda msg: print(f'[worker {worker}] {msg}', flush=True))


def _parity_pusher(cfg, keepers, worker):
    """The pusher of this worker's parity group (groups of snapshot.parity_group workers)."""
    from mecefo_jax.snapshot import ParityPusher
    size = cfg.snapshot.parity_group  # snapshot.parity is 'xor': checked at resolve
    first = worker - worker % size
    group = list(range(first, min(first + size, len(keepers))))
    return ParityPusher(f'workers{first}-{group[-1]}', worker - first,
                        [tuple(keepers[w]) for w in group], generation=_GENERATION.value)


if __name__ == '__main__':
    sys.exit(app.run(main))
