"""The crash drill's measurements in one process: the snapshot overhead and the restores alone.

`snapshot_overhead` times steps with and without in-memory snapshots,
interleaved block by block (with `snapshot.every=auto`, at the interval auto
first chooses here); `restore_comparison` times a keeper restore against an
Orbax restore of the same state, away from the jobs' scheduling noise.
"""
from __future__ import annotations

import os
import statistics
import time


def _auto_interval_here(hook, step_fn, state, host, topology, plan, run) -> tuple:
    """Run steps under `snapshot.every=auto` until it chooses: (interval, state, its choice)."""
    import numpy as np

    from mecefo_jax.training import loop as train_lib
    for _ in range(200):
        if hook.cadence.interval is not None:
            break
        step = int(host['step'])
        host['step'] = np.int32(step + 1)
        state, metrics = step_fn(state, topology.put_batch(host))
        hook.on_step(train_lib.StepDone(step, step, state, plan, None, run.train_data.get_state(),
                                        metrics, time.perf_counter()))
    else:
        raise RuntimeError('snapshot.every=auto chose no interval in 200 steps')
    hook.close()
    return hook.cadence.interval, state, hook.cadence.history[-1]


def _overhead_result(times, hook, every, choice, blocks, steps_per_block) -> dict:
    """The overhead figures from the interleaved block times and the hook's stats."""
    with_snap, without = statistics.median(times[True]), statistics.median(times[False])
    ratios = [w / o for w, o in zip(times[True], times[False])]
    quartiles = statistics.quantiles(ratios, n=4)
    stats = hook.stats
    result = {'snapshot_every': every, 'auto_choice': choice,
              'step_sec_with_snapshots': with_snap, 'step_sec_without': without,
              'overhead_pct': 100.0 * (statistics.median(ratios) - 1.0),
              'overhead_pct_quartiles': [100.0 * (quartiles[0] - 1.0),
                                         100.0 * (quartiles[2] - 1.0)],
              'ratio_of_medians_pct': 100.0 * (with_snap / without - 1.0),
              'blocks_each': blocks // 2, 'steps_per_block': steps_per_block,
              'snapshot_bytes': stats.bytes / max(stats.published, 1),
              'write_sec_per_snapshot': stats.write_sec / max(stats.published, 1),
              'wait_for_output_sec_per_snapshot': stats.materialize_sec / max(stats.published, 1),
              'blocked_sec_per_snapshot': hook.blocked_sec / max(hook.submitted, 1)}
    return result


def snapshot_overhead(cfg, workdir: str, *, every='auto', blocks: int = 40,
                      steps_per_block: int = 5, log=print) -> dict:
    """Step time with and without in-memory snapshots every `every` steps, interleaved.

    With `every='auto'` the interval is the one `snapshot.every=auto` chooses
    here first (its step and snapshot timings are this process's, not a job's).
    Blocks alternate, each a whole number of intervals. Steps are dispatched
    ahead and synchronised every `train.log_every` steps, as training reads
    its metrics (XLA:CPU's in-process collectives hung, a rendezvous timeout,
    with 200 steps of 8 fake devices in flight on 2 cores). In a block with
    snapshots, each interval snapshots its first step, so the background
    write has the rest of the interval to finish, as in a run; the block
    still ends by waiting for the last write, so nothing it started is
    charged to the next block (with `every=1` that wait is an upper bound:
    in a run the last write would overlap the next step).
    The overhead is the median over adjacent pairs of blocks of their time
    ratio, robust to the drift of a shared machine; quartiles show the noise.
    """
    import jax
    import numpy as np

    from mecefo_jax.launch.worker_snapshots import cadence_options
    from mecefo_jax.launch.worker_state import SnapshotHook
    from mecefo_jax.neighbour.layout import assemble, full_layout
    from mecefo_jax.snapshot import start_keeper, stop_keeper
    from mecefo_jax.training import loop as train_lib
    from mecefo_jax.training import resume, run_setup
    from mecefo_jax.training.controller import Plan

    run = run_setup.build_run(cfg, workdir, checkpoint_every=0)
    topology = run.topologies.get(run.full_rows)
    layout = full_layout(run.num_shards, run.shard_batch)
    plan = Plan(topology, layout, run.present)
    state = resume.init_or_restore(run)
    keeper = start_keeper(f'drill{os.getpid()}', slots=cfg.snapshot.slots, detached=False)
    host = dict(assemble(layout, next(run.train_data)), step=np.int32(0))
    step_fn, _ = topology.compiled_step(state, topology.put_batch(host), layout)
    choice, hook = None, None
    try:
        if every == 'auto':
            auto = SnapshotHook(keeper, 'auto', **cadence_options(cfg))  # as a worker's
            every, state, choice = _auto_interval_here(auto, step_fn, state, host, topology,
                                                       plan, run)
        # Whole intervals per block, and `blocks` of them whatever the interval:
        # with fewer for a long one (10 pairs of 1 s blocks on tiny, every ~100
        # steps), the median moved by a point from drill to drill on 2 shared cores.
        if steps_per_block % every:
            steps_per_block = every * -(-steps_per_block // every)
        hook = SnapshotHook(keeper, every)
        times = {True: [], False: []}
        for block in range(blocks + 2):  # two warm-up blocks
            with_snapshots = bool(block % 2)
            start = time.perf_counter()
            for i in range(steps_per_block):
                step = int(host['step'])
                host['step'] = np.int32(step + 1)
                state, metrics = step_fn(state, topology.put_batch(host))
                if (i + 1) % cfg.train.log_every == 0:
                    jax.device_get(metrics['loss'])  # as training reads its metrics
                if with_snapshots:  # labelled so that the hook's `every` falls on the first step
                    label = step + every - 1
                    hook.on_step(train_lib.StepDone(
                        label, label, state, plan, None, run.train_data.get_state(), metrics,
                        time.perf_counter()))
            jax.block_until_ready(state)
            if with_snapshots:
                hook._snapshotter.wait()
            if block >= 2:
                times[with_snapshots].append((time.perf_counter() - start) / steps_per_block)
        result = _overhead_result(times, hook, every, choice, blocks, steps_per_block)
        log(f"[drill] snapshot overhead every {every} step(s): {result['overhead_pct']:+.2f}% "
            f"({result['step_sec_with_snapshots'] * 1e3:.1f} vs "
            f"{result['step_sec_without'] * 1e3:.1f} ms/step)")
        return result
    finally:
        if hook is not None:
            hook.close()
        stop_keeper(keeper)


def restore_comparison(cfg, workdir: str, *, repeats: int = 10, log=print) -> dict:
    """The two restores alone: one process, the same state, interleaved, medians.

    In the drill's jobs every relaunched worker restores while the others start
    up on the same two cores, so tens of milliseconds of scheduling noise sit
    on restores of about that size. Here only the mechanisms differ: read and
    place from a keeper's shared memory, or an Orbax restore from local disk.
    """
    import jax

    from mecefo_jax.checkpointing import checkpoint as ckpt_lib
    from mecefo_jax.snapshot import (
        KeeperClient,
        SnapshotWriter,
        host_shards,
        open_sources,
        restore,
        start_keeper,
        stop_keeper,
    )
    from mecefo_jax.training import resume, run_setup

    run = run_setup.build_run(cfg, workdir, checkpoint_every=0)
    topology = run.topologies.get(run.full_rows)
    state = resume.init_or_restore(run)
    abstract = ckpt_lib.abstract_like(run.abstract_state, topology.state_shardings)
    keeper = start_keeper(f'drillrestore{os.getpid()}', slots=2, detached=False)
    checkpointer = ckpt_lib.Checkpointer(os.path.join(workdir, 'orbax'), save_every=1)
    try:
        with KeeperClient(keeper) as client:
            SnapshotWriter(client).write(1, host_shards(state), {'step': 1})
        checkpointer.maybe_save(1, state, {'step': 1}, force=True)
        checkpointer.wait()
        times = {'memory': [], 'disk': []}
        for _ in range(repeats):
            start = time.perf_counter()
            snaps = open_sources(keeper)
            try:
                jax.block_until_ready(restore(abstract, snaps, step=1)[0])
            finally:
                for snap in snaps:
                    snap.close()
            times['memory'].append(time.perf_counter() - start)
            start = time.perf_counter()
            jax.block_until_ready(checkpointer.restore(abstract, step=1)[0])
            times['disk'].append(time.perf_counter() - start)
    finally:
        checkpointer.close()
        stop_keeper(keeper)
    memory, disk = statistics.median(times['memory']), statistics.median(times['disk'])
    result = {'memory_restore_sec': memory, 'disk_restore_sec': disk, 'speedup': disk / memory,
              'repeats': repeats, 'bytes': sum(x.nbytes for x in jax.tree.leaves(state)),
              'times_sec': times}
    log(f"[drill] restore alone: keeper {memory * 1e3:.1f} ms, Orbax {disk * 1e3:.1f} ms "
        f"({result['speedup']:.1f}x)")
    return result
