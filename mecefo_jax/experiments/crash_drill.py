"""The crash drill: real failures on one machine, recovered three ways, and what it cost.

`run_drill` runs, with the launcher, on `workers` worker processes of
`launch.local_devices` CPU devices each:

1. `memory`: one worker SIGKILLed mid-run; the survivors carry on from the
   keepers' in-memory snapshots under MeCeFO and the worker rejoins later;
2. `disk`: the same failure recovered the old way, every worker restarting
   from the Orbax checkpoint of every `checkpoint_every` steps;
3. `simulated`: the same failure masked inside one healthy process (the
   fault controller), whose final parameters (1) must match;
4. `parity`: a `mesh.data=1` job (the model spread over the workers) whose
   worker AND keeper are killed; the lost snapshot is rebuilt from the XOR
   parity of the others, checked bit for bit against what the keeper held;

and measures the snapshot overhead per step in one process: steps with and
without snapshots, interleaved block by block. It writes `crash_drill.json`
and `crash_drill.md`.
"""
from __future__ import annotations

import glob
import json
import os
import statistics
import time

from mecefo_jax.experiments.report import fmt
from mecefo_jax.launch.supervisor import Launcher
from mecefo_jax.snapshot.cadence import PROBE_STEPS, SETTLE_STEPS

# Recovery components, in the order a recovery goes through them.
COMPONENTS = ('detect_sec', 'teardown_sec', 'relaunch_sec', 'distributed_init_sec',
              'restore_sec', 'compile_sec', 'refresh_sec', 'start_to_first_step_sec')


def _job(cfg, values, workdir, workers, log):
    log(f'[drill] {os.path.basename(workdir)}: {workers} workers, ' +
        ', '.join(f'{k}={v}' for k, v in values.items() if k.startswith(('launch', 'snapshot'))))
    start = time.perf_counter()
    summary = Launcher(cfg.updated(values), workdir, workers, log=log).run()
    if summary['preempted_at'] is not None:  # SIGTERM or Ctrl-C: the user stopped the drill
        raise DrillStopped(f'the drill was stopped during its {os.path.basename(workdir)} job '
                           f"(every worker saved step {summary['preempted_at']}); its figures "
                           'are incomplete, so none are written.')
    summary['wall_sec'] = time.perf_counter() - start
    return summary


class DrillStopped(RuntimeError):
    """A job of the drill was preempted (SIGTERM, Ctrl-C): the drill ends there."""


def _check_fresh(out_dir: str) -> None:
    """A drill's jobs resume from whatever their directories hold: start from an empty one."""
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        raise ValueError(f'--out {out_dir} is not empty: its jobs would resume from the '
                         'checkpoints and snapshots a previous drill left there. Choose a new '
                         'directory or remove this one.')


def _recovery(summary: dict) -> dict:
    """The failure's recovery row, reduced to the drill's fields.

    A drill injects one failure; any other (a relaunch that itself failed)
    is counted in `failures` and shown, not hidden.
    """
    failures = [r for r in summary['recoveries'] if r['kind'] == 'failure']
    recovered = [r for r in failures if r.get('resume_step') is not None]
    if not recovered:
        raise RuntimeError(f'the job never recovered from its failures: {failures}')
    row = recovered[-1]
    out = {k: row.get(k) for k in COMPONENTS}
    out.update(recovery_sec=row.get('recovery_sec'), lost_steps=row.get('redone_steps'),
               resume_step=row.get('resume_step'), completed_steps=row.get('completed_steps'),
               restore_bytes=row.get('restore_bytes'), badput_sec=row.get('badput_sec'),
               parity_rebuild_sec=row.get('parity_rebuild_sec'),
               compile_sec_by_worker=row.get('compile_sec_by_worker'),
               programs_compiled_by_worker=row.get('programs_compiled_by_worker'),
               failures=len(failures), causes=[r.get('cause') for r in failures])
    return out


def compile_ahead(cfg, values, workdir, workers, log) -> dict:
    """The compile-ahead driver over every single-worker loss, run to its end into
    `workdir`'s (empty) cache: its CPU seconds, and the survivors' cold compile."""
    import subprocess
    import sys

    from mecefo_jax.launch.compile_ahead import REPORT, worker_env
    os.makedirs(os.path.join(workdir, 'launch'), exist_ok=True)
    config_json = os.path.join(workdir, 'launch', 'ahead_config.json')
    with open(config_json, 'w') as f:
        f.write(cfg.updated(values).to_json())
    log(f'[drill] compile ahead for every single loss of {workers} workers')
    subprocess.run([sys.executable, '-m', 'mecefo_jax.launch.compile_ahead_job',
                    f'--config_json={config_json}', f'--workdir={workdir}', f'--workers={workers}',
                    '--nice=0'],  # alone on the machine: its compiles are the cold figure
                   check=True, env=worker_env())
    with open(os.path.join(workdir, 'launch', REPORT)) as f:
        report = json.load(f)
    report['cold_compile_sec_by_process'] = cold_compiles(workdir, report['sets'])
    return report


def cold_compiles(workdir: str, sets) -> dict:
    """Per process id: the survivors' train step compiled on a cache miss (lowering included).

    Sets after the first usually find the same programs: process p's devices
    and the lowered step do not depend on which worker was lost. So the cold
    figure is the first miss of each process, whichever set it came from.
    """
    cold = {}
    for row in sets:
        for process_id, w in enumerate(row['members']):
            name = f"compile_ahead_lost{row['lost_worker']}_w{w}.json"
            try:
                with open(os.path.join(workdir, 'launch', name)) as f:
                    member = json.load(f)
            except FileNotFoundError:
                continue
            if ['train_step', 'miss'] in [p[:2] for p in member['programs']]:
                cold.setdefault(str(process_id), member['train_step_sec'])
    return cold


def _cold_full_compile(workdir: str, members) -> float | None:
    """The full topology's first compile in a job's generation 0 (an empty cache)."""
    times = []
    for w in members:
        try:
            with open(os.path.join(workdir, 'launch', f'g0_w{w}_start.json')) as f:
                times.append(json.load(f)['compile_sec'])
        except FileNotFoundError:
            pass
    return max(times, default=None)


def _last_ends(summary: dict, workdir: str) -> list[dict]:
    """The end records of the job's last generation (full size again after any rejoin)."""
    last = max(r['next_generation'] for r in summary['recoveries']) if summary['recoveries'] else 0
    ends = []
    for path in sorted(glob.glob(os.path.join(workdir, 'launch', f'g{last}_w*_end.json'))):
        with open(path) as f:
            ends.append(json.load(f))
    return ends


def step_sec(summary: dict, workdir: str) -> float | None:
    """The job's median normal step: its last generation's, the median over its workers."""
    steps = [e['median_step_sec'] for e in _last_ends(summary, workdir)
             if e.get('median_step_sec')]
    return statistics.median(steps) if steps else None


def chosen_interval(summary: dict, workdir: str, setting) -> int | None:
    """The snapshot interval the job used at full size: `snapshot.every`, or auto's last
    choice; None when its last generation was too short for auto to choose one."""
    if isinstance(setting, int):
        return setting
    for end in _last_ends(summary, workdir):
        if end.get('snapshot_cadence'):
            return int(end['snapshot_cadence'][-1]['interval'])
    return None


def _auto_interval_here(hook, step_fn, state, host, topology, plan, run) -> tuple:
    """Run steps under `snapshot.every=auto` until it chooses: (interval, state, its choice)."""
    import numpy as np

    from mecefo_jax import train as train_lib
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

    from mecefo_jax import resume
    from mecefo_jax import train as train_lib
    from mecefo_jax.launch.worker_state import SnapshotHook
    from mecefo_jax.layout import assemble, full_layout
    from mecefo_jax.snapshot import start_keeper

    run = train_lib.build_run(cfg, workdir, checkpoint_every=0)
    topology = run.topologies.get(run.full_rows)
    layout = full_layout(run.num_shards, run.shard_batch)
    plan = train_lib.Plan(topology, layout, run.present)
    state = resume.init_or_restore(run)
    keeper = start_keeper(f'mecefodrill{os.getpid()}', slots=cfg.snapshot.slots)
    host = dict(assemble(layout, next(run.train_data)), step=np.int32(0))
    step_fn, _ = topology.compiled_step(state, topology.put_batch(host), layout)
    choice, hook = None, None
    try:
        if every == 'auto':
            auto = SnapshotHook(keeper.address, 'auto',
                                budget_pct=cfg.snapshot.overhead_budget_pct)
            every, state, choice = _auto_interval_here(auto, step_fn, state, host, topology,
                                                       plan, run)
        # Whole intervals per block; with a long interval, fewer blocks (at
        # least 10 of each kind).
        if steps_per_block % every:
            steps_per_block = every * -(-steps_per_block // every)
            blocks = max(20, min(blocks, 2 * -(-100 // steps_per_block)))
        hook = SnapshotHook(keeper.address, every)
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
        keeper.stop()


def restore_comparison(cfg, workdir: str, *, repeats: int = 10, log=print) -> dict:
    """The two restores alone: one process, the same state, interleaved, medians.

    In the jobs above every relaunched worker restores while the others start
    up on the same two cores, so tens of milliseconds of scheduling noise sit
    on restores of about that size. Here only the mechanisms differ: read and
    place from a keeper's shared memory, or an Orbax restore from local disk.
    """
    import jax

    from mecefo_jax import checkpoint as ckpt_lib
    from mecefo_jax import resume
    from mecefo_jax import train as train_lib
    from mecefo_jax.snapshot import (
        KeeperClient,
        SnapshotWriter,
        host_shards,
        open_sources,
        restore,
        start_keeper,
    )

    run = train_lib.build_run(cfg, workdir, checkpoint_every=0)
    topology = run.topologies.get(run.full_rows)
    state = resume.init_or_restore(run)
    abstract = ckpt_lib.abstract_like(run.abstract_state, topology.state_shardings)
    keeper = start_keeper(f'mecefodrillrestore{os.getpid()}', slots=2)
    checkpointer = ckpt_lib.Checkpointer(os.path.join(workdir, 'orbax'), save_every=1)
    try:
        with KeeperClient(keeper.address) as client:
            SnapshotWriter(client).write(1, host_shards(state), {'step': 1})
        checkpointer.maybe_save(1, state, {'step': 1}, force=True)
        checkpointer.wait()
        times = {'memory': [], 'disk': []}
        for _ in range(repeats):
            start = time.perf_counter()
            snaps = open_sources(keeper.address)
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
        keeper.stop()
    memory, disk = statistics.median(times['memory']), statistics.median(times['disk'])
    result = {'memory_restore_sec': memory, 'disk_restore_sec': disk, 'speedup': disk / memory,
              'repeats': repeats, 'bytes': sum(x.nbytes for x in jax.tree.leaves(state)),
              'times_sec': times}
    log(f"[drill] restore alone: keeper {memory * 1e3:.1f} ms, Orbax {disk * 1e3:.1f} ms "
        f"({result['speedup']:.1f}x)")
    return result


def simulated_params(cfg, events: str, workdir: str, log=print) -> dict:
    """Final params of the same failure masked in one process (the fault controller)."""
    import jax
    import numpy as np

    from mecefo_jax.main import run as train_run
    cfg = cfg.updated({'fault.events': events})
    log(f'[drill] simulated: fault.events={events}')
    params = train_run(cfg, workdir)['state'].params
    return {jax.tree_util.keystr(p): np.asarray(v)
            for p, v in jax.tree_util.tree_leaves_with_path(jax.device_get(params))}


def _add_step_and_cold_compile(mem, dsk, memory, disk, ahead, out_dir, workers) -> None:
    """Each path's median normal step, and a cold compile of the program it loaded."""
    mem['step_sec'] = step_sec(memory, os.path.join(out_dir, 'memory'))
    dsk['step_sec'] = step_sec(disk, os.path.join(out_dir, 'disk'))
    mem['cold_compile_sec_by_process'] = ahead['cold_compile_sec_by_process']
    mem['cold_compile_sec'] = max(ahead['cold_compile_sec_by_process'].values(), default=None)
    dsk['cold_compile_sec'] = _cold_full_compile(os.path.join(out_dir, 'memory'),
                                                 range(workers))


def _versus_simulated(cfg, memory: dict, mem: dict, replicas, out_dir: str, log) -> dict:
    """The memory job's final parameters against its failure simulated in one process."""
    import numpy as np
    start, rejoin = mem['resume_step'], next(r['resume_step'] for r in memory['recoveries']
                                             if r['kind'] == 'rejoin')
    events = ','.join(f'{start}:{r}:{rejoin - start}' for r in replicas)
    simulated = simulated_params(cfg, events, os.path.join(out_dir, 'simulated'), log)
    real = np.load(os.path.join(out_dir, 'memory', 'launch', 'final_params.npz'))
    diffs = {k: float(np.max(np.abs(real[k] - v))) for k, v in simulated.items()}
    return {'max_abs_param_diff_vs_simulated': max(diffs.values()),
            'max_rel_param_diff_vs_simulated': max(
                diffs[k] / max(float(np.max(np.abs(v))), 1e-30) for k, v in simulated.items()),
            'param_bitwise_equal_to_simulated': all(d == 0.0 for d in diffs.values()),
            'simulated_events': events}


def _parity_summary(parity: dict) -> dict:
    """The parity job's recovery, and whether its rebuilt snapshot was the lost one bit for bit."""
    bitwise = [v for r in parity['recoveries'] for v in
               (r.get('parity_rebuild_bitwise') or {}).values()]
    return {'parity_rebuild_bitwise': bool(bitwise) and all(bitwise),
            # Where a rebuild and the killed keeper's own copy part, if they do.
            'parity_rebuild_mismatch': [r['parity_rebuild_mismatch'] for r in parity['recoveries']
                                        if r.get('parity_rebuild_mismatch')],
            'parity': _recovery(parity)}


def run_drill(cfg, config_path: str, out_dir: str, *, workers: int = 4, kill_step: int,
              return_after: int, checkpoint_every: int, log=print) -> dict:
    from mecefo_jax.launch.placement import Placement
    _check_fresh(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    local = cfg.launch.local_devices
    placement = Placement(workers, local, cfg.mesh.model)
    victim = 1
    base = {'train.steps': cfg.train.steps, 'train.eval_every': 0,
            'mesh.data': placement.replicas, 'data.cache_dir': cfg.data.cache_dir,
            'launch.compilation_cache': os.path.join(out_dir, 'xla_cache')}
    # The survivors' programs, compiled ahead into the jobs' cache before the
    # memory job (in a long run this happens, niced, during its first steps).
    # Killed right after a snapshot every keeper holds, whatever interval auto chose.
    memory_values = dict(base, **{'launch.kill': f'{kill_step}:{victim}:KILL:snapshot',
                                  'launch.return_after_steps': return_after,
                                  'launch.compile_ahead': False})
    ahead = compile_ahead(cfg, memory_values, os.path.join(out_dir, 'memory'), workers, log)
    memory = _job(cfg, memory_values, os.path.join(out_dir, 'memory'), workers, log)
    disk = _job(cfg, dict(base, **{
        'launch.kill': f'{kill_step}:{victim}', 'launch.recovery': 'disk',
        'snapshot.every': 0, 'train.checkpoint_every': checkpoint_every}),
        os.path.join(out_dir, 'disk'), workers, log)
    parity_workers = 4
    parity = _job(cfg, dict(base, **{
        'mesh.data': 1, 'mesh.model': parity_workers, 'launch.local_devices': 1,
        'snapshot.parity': 'xor', 'snapshot.parity_group': parity_workers,
        'launch.kill': f'{kill_step}:2:KILL:keeper'}),
        os.path.join(out_dir, 'parity'), parity_workers, log)

    mem = _recovery(memory)
    versus_simulated = _versus_simulated(cfg.updated(base), memory, mem,
                                         placement.replicas_of(victim), out_dir, log)
    job_every = chosen_interval(memory, os.path.join(out_dir, 'memory'), cfg.snapshot.every)
    overhead = snapshot_overhead(cfg, os.path.join(out_dir, 'overhead'),
                                 every=cfg.snapshot.every, log=log)
    every = overhead['snapshot_every']
    alone = restore_comparison(cfg, os.path.join(out_dir, 'restore_alone'), log=log)
    dsk = _recovery(disk)
    _add_step_and_cold_compile(mem, dsk, memory, disk, ahead, out_dir, workers)
    report = {
        'config': config_path, 'workers': workers, 'local_devices': local,
        'replicas': placement.replicas, 'steps': cfg.train.steps, 'kill_step': kill_step,
        'return_after_steps': return_after, 'checkpoint_every': checkpoint_every,
        'memory': mem, 'disk': dsk,
        'restore_speedup_memory_vs_disk': (dsk['restore_sec'] / mem['restore_sec']
                                           if mem['restore_sec'] else None),
        'restore_alone': alone,
        'snapshot_overhead_pct': overhead['overhead_pct'], 'snapshot_overhead': overhead,
        'snapshot_every': every, 'snapshot_every_setting': cfg.snapshot.every,
        'snapshot_every_memory_job': job_every,
        # A kill at a random step redoes half a save interval on average; the
        # memory job's kill lands right after a snapshot (scripts/crash_drill.py).
        'expected_lost_steps_per_failure': every / 2,
        'expected_lost_steps_per_failure_disk': checkpoint_every / 2,
        **versus_simulated, **_parity_summary(parity),
        'compile_ahead': {'cpu_sec': ahead['cpu_sec'], 'wall_sec': ahead['wall_sec'],
                          'sets': ahead['sets']},
        'job_wall_sec': {'memory': memory['wall_sec'], 'disk': disk['wall_sec'],
                         'parity': parity['wall_sec']},
    }
    with open(os.path.join(out_dir, 'crash_drill.json'), 'w') as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(out_dir, 'crash_drill.md'), 'w') as f:
        f.write(markdown(report))
    return report


def _rounded(by_worker: dict | None) -> dict | None:
    return None if by_worker is None else {w: round(v, 2) for w, v in by_worker.items()}


def markdown(r: dict) -> str:
    mem, dsk = r['memory'], r['disk']
    lines = [f"Crash drill: `{r['config']}`, {r['workers']} workers x {r['local_devices']} CPU "
             f"devices ({r['replicas']} replicas), {r['steps']} steps; worker 1 SIGKILLed right "
             f"after its first snapshot at or after step {r['kill_step']} (memory) or at step "
             f"{r['kill_step']} (disk), back {r['return_after_steps']} steps later (memory); "
             f"Orbax every {r['checkpoint_every']} steps (disk).", '',
             '| component (s) | memory (keepers) | disk (Orbax) |', '|---|---|---|']
    for key in COMPONENTS + ('recovery_sec',):
        lines.append(f'| {key} | {fmt(mem.get(key))} | {fmt(dsk.get(key))} |')
    lines.append(f"| cold compile of the same program | {fmt(mem.get('cold_compile_sec'))} | "
                 f"{fmt(dsk.get('cold_compile_sec'))} |")
    lines.append(f"| lost (redone) steps | {mem['lost_steps']} | {dsk['lost_steps']} |")
    lines.append(f"| failures (causes) | {mem.get('failures')} ({', '.join(mem.get('causes') or [])}) "
                 f"| {dsk.get('failures')} ({', '.join(dsk.get('causes') or [])}) |")
    lines.append(f"| normal step (median, s) | {fmt(mem.get('step_sec'))} | "
                 f"{fmt(dsk.get('step_sec'))} |")
    lines.append(f"| restored bytes | {mem['restore_bytes']} | {dsk['restore_bytes']} |")
    o = r['snapshot_overhead']
    speedup = r['restore_speedup_memory_vs_disk']
    a = r['restore_alone']
    lines += ['', f"Restore from keepers is {fmt(speedup, '.1f')}x faster than from disk in "
              "the jobs (slowest worker each).",
              f"The restores alone (one process, the same {a['bytes'] / 2**20:.1f} MiB state, "
              f"{a['repeats']} interleaved repeats, medians): keeper "
              f"{a['memory_restore_sec'] * 1e3:.1f} ms, Orbax {a['disk_restore_sec'] * 1e3:.1f} ms, "
              f"{a['speedup']:.1f}x.",
              f"Snapshot interval: `snapshot.every={r['snapshot_every_setting']}` chose "
              + (f"{r['snapshot_every_memory_job']} step(s) in the memory job (at its full size)"
                 if r['snapshot_every_memory_job'] is not None else
                 f'none in the memory job (its last generation ended before the '
                 f'{SETTLE_STEPS + PROBE_STEPS} steps it measures)')
              + f" and {r['snapshot_every']} in the overhead measurement below: a failure redoes the "
              f"steps since the last snapshot, {r['expected_lost_steps_per_failure']:g} on "
              "average at the latter (disk: "
              f"{r.get('expected_lost_steps_per_failure_disk', r['checkpoint_every'] / 2):g} "
              f"at Orbax every {r['checkpoint_every']}); the memory job's kill lands right "
              "after a snapshot every keeper holds, so its lost steps measure only what a "
              "surviving copy failed to give back.",
              f"Snapshot overhead: {r['snapshot_overhead_pct']:+.2f}% of step time, the median "
              f"over {o['blocks_each']} pairs of interleaved blocks of {o['steps_per_block']} "
              f"steps with and without snapshots (quartiles "
              f"{o['overhead_pct_quartiles'][0]:+.2f}% to {o['overhead_pct_quartiles'][1]:+.2f}%; "
              f"medians {o['step_sec_with_snapshots'] * 1e3:.1f} vs "
              f"{o['step_sec_without'] * 1e3:.1f} ms/step; {o['snapshot_bytes'] / 2**20:.1f} MiB "
              f"per snapshot, published {o['write_sec_per_snapshot'] * 1e3:.1f} ms after submit "
              f"in the background, of which "
              f"{o['wait_for_output_sec_per_snapshot'] * 1e3:.1f} ms waiting for the step's "
              f"output and the rest copying and checksumming).",
              f"Final parameters vs the same failure simulated in one process "
              f"(`{r['simulated_events']}`): max |diff| {r['max_abs_param_diff_vs_simulated']:.3g} "
              f"({r['max_rel_param_diff_vs_simulated']:.3g} of the leaf's scale; bitwise: "
              f"{r['param_bitwise_equal_to_simulated']}).",
              f"Compiled ahead for every single-worker loss ({len(r['compile_ahead']['sets'])} "
              f"survivor sets, before the memory job): {r['compile_ahead']['cpu_sec']:.1f} CPU s, "
              f"{r['compile_ahead']['wall_sec']:.1f} s wall; the relaunch's compile_sec per "
              f"worker {_rounded(mem.get('compile_sec_by_worker'))}, programs compiled per worker "
              f"{mem.get('programs_compiled_by_worker')} (cold, by process id: "
              f"{_rounded(mem.get('cold_compile_sec_by_process'))}).",
              f"Parity (`mesh.data=1`, worker 2 and its keeper killed): rebuilt in "
              f"{fmt(r['parity']['parity_rebuild_sec'], '.3f')} s, bitwise: "
              f"{r['parity_rebuild_bitwise']}; resumed at step {r['parity']['resume_step']}, "
              f"{r['parity']['lost_steps']} step(s) redone."]
    return '\n'.join(lines) + '\n'
