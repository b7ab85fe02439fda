"""How a worker's args become its snapshot observer and its restore callback.

The launcher's choices (`WorkerArgs.resume`, its keepers, the drills' holds)
and the config's `snapshot` section meet `worker_state`'s hook and restores
here, apart from the actor (`worker`), which only passes them to training.
"""
from __future__ import annotations

import threading

from mecefo_jax.launch.progress import Progress
from mecefo_jax.launch.worker_args import WorkerArgs
from mecefo_jax.snapshot.cadence import MAX_INTERVAL


def restore_fn(args: WorkerArgs, info: dict):
    """`resume`'s restore callback; None for 'fresh' (a checkpoint, else a new run).

    In the job's own run (`args.own_run`) a tier holding nothing answers
    `START_OVER`: a job killed before its first save starts again at step 0.
    """
    from mecefo_jax.launch import worker_state
    from mecefo_jax.training.resume import START_OVER
    held = (worker_state.keeper_restore(list(args.keepers), args.worker, info,
                                        step=args.resume_step or None)
            if args.resume == 'memory' else
            worker_state.disk_restore(info) if args.resume == 'disk' else None)
    if not args.own_run:
        return held
    return lambda run, topology: (held and held(run, topology)) or START_OVER


def _held_forever(progress: Progress, kind: str, step: int, tag: str) -> None:
    """Report the hold and wait there for the launcher's signal (it never returns)."""
    progress.hold(kind, step)
    print(f'[{tag}] held ({kind}) at step {step}', flush=True)
    threading.Event().wait()


def snapshot_hook(cfg, args: WorkerArgs, progress: Progress):
    """This worker's snapshot observer, or None when snapshots are off or it has no keeper.

    Drills hold the worker at a known point (`launch.kill ...:publish` or
    `...:snapshot`): the writer thread inside the publish of a step (bytes
    copied, not published), or the training loop after the first published
    snapshot at or after a step. The launcher sees the hold in the progress
    report and signals the process there.
    """
    from mecefo_jax.launch import worker_state
    keepers = args.keepers
    if cfg.snapshot.every == 0 or not keepers or keepers[args.worker] is None:
        return None
    before_publish = on_hold = None
    if args.hold_in_publish:
        def before_publish(step: int) -> None:
            if step == args.hold_in_publish:
                _held_forever(progress, 'publish', step, args.tag)
    if args.hold_after_snapshot:
        def on_hold(step: int) -> None:
            _held_forever(progress, 'snapshot', step, args.tag)
    parity = _parity_pusher(cfg, args) if cfg.snapshot.parity else None
    return worker_state.SnapshotHook(
        keepers[args.worker], cfg.snapshot.every, parity=parity, before_publish=before_publish,
        stop_at=args.stop_at or None, hold_after=args.hold_after_snapshot or None,
        on_hold=on_hold, **cadence_options(cfg, args.observed_failures_per_hour),
        shard=cfg.snapshot.shard, generation=args.generation,
        log=lambda msg: print(f'[worker {args.worker}] {msg}', flush=True))


def cadence_options(cfg, observed_failures_per_hour: float = 0.0) -> dict:
    """What `snapshot.every=auto` weighs besides its measurements: the overhead budget, the
    failure rate (the config's `fault.regime` or `fault.mtbf_hours`, else the one the
    launcher observed in this job so far) and, as its longest interval, the disk
    checkpoint's (`train.checkpoint_every`)."""
    from mecefo_jax.faults.schedule import configured_failures_per_hour
    rate = (configured_failures_per_hour(cfg.fault, int(cfg.mesh.data))
            or observed_failures_per_hour)
    every = cfg.train.checkpoint_every
    return {'budget_pct': cfg.snapshot.overhead_budget_pct, 'failures_per_sec': rate / 3600.0,
            'max_interval': every if every > 0 else MAX_INTERVAL}


def _parity_pusher(cfg, args: WorkerArgs):
    """The pusher of this worker's parity group (groups of snapshot.parity_group workers)."""
    from mecefo_jax.launch.placement import parity_group
    from mecefo_jax.snapshot import ParityPusher
    group = parity_group(args.worker, len(args.keepers), cfg.snapshot.parity_group)
    if not group or any(args.keepers[w] is None for w in group):
        return None  # a single worker, or a member's keeper gone: no parity this generation
    return ParityPusher(f'workers{group[0]}-{group[-1]}', args.worker - group[0],
                        [args.keepers[w] for w in group], generation=args.generation)
