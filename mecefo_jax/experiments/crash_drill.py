"""The crash drill: real failures on one machine, recovered several ways, and what it cost.

`run_drill` runs, with the launcher on a simulated Ray cluster of `nodes`
nodes on this machine (`sim_cluster`), on `workers` worker actors of
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
5. `launcher_restart`: the launcher (a process of its own) killed right
   after a snapshot every keeper holds; the same command again finds the
   keepers and resumes from their memory;
6. `node_loss` (2 nodes or more): the node of the memory job's worker lost
   whole (worker, keeper and shared memory), the survivors going on from
   their keepers and the worker rejoining on another node;

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

from mecefo_jax.config_resolve import updated
from mecefo_jax.experiments import crash_drill_nodes
from mecefo_jax.experiments.report import fmt
from mecefo_jax.launch.supervisor import Launcher
from mecefo_jax.snapshot.cadence import PROBE_STEPS, SETTLE_STEPS

VICTIM = 1  # the worker the memory, disk and launcher-restart jobs lose
# Recovery components, in the order a recovery goes through them.
COMPONENTS = ('detect_sec', 'teardown_sec', 'relaunch_sec', 'distributed_init_sec',
              'restore_sec', 'compile_sec', 'refresh_sec', 'start_to_first_step_sec')


def _job(cfg, values, workdir, workers, log, node_killer=None):
    log(f'[drill] {os.path.basename(workdir)}: {workers} workers, ' +
        ', '.join(f'{k}={v}' for k, v in values.items() if k.startswith(('launch', 'snapshot'))))
    start = time.perf_counter()
    summary = Launcher(updated(cfg, values), workdir, workers, log=log,
                       node_killer=node_killer).run()
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


def _recovery(summary: dict, kind: str = 'failure') -> dict:
    """The failure's recovery row, reduced to the drill's fields.

    A drill injects one failure; any other (a relaunch that itself failed)
    is counted in `failures` and shown, not hidden.
    """
    failures = [r for r in summary['recoveries'] if r['kind'] == kind]
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
               resume=row.get('resume'), members=row.get('members'),
               healed_bytes=row.get('healed_bytes'),
               failures=len(failures), causes=[r.get('cause') for r in failures])
    return out


def compile_ahead(cfg, values, workdir, workers, log) -> dict:
    """The compile-ahead jobs of every single-worker loss, run to their end into
    `workdir`'s (empty) cache: their CPU seconds, and the survivors' cold compile."""
    from mecefo_jax.launch.compile_ahead import drive
    from mecefo_jax.launch.placement import Placement
    os.makedirs(os.path.join(workdir, 'launch'), exist_ok=True)
    job_cfg = updated(cfg, values)
    log(f'[drill] compile ahead for every single loss of {workers} workers')
    placement = Placement(workers, job_cfg.launch.local_devices, job_cfg.mesh.model)
    # Alone on the machine (nice 0): its compiles are the cold figure.
    report = drive(job_cfg, job_cfg.to_json(), workdir, placement, nice=0, log=log)
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
    from mecefo_jax.snapshot import start_keeper, stop_keeper
    from mecefo_jax.topology import Plan

    run = train_lib.build_run(cfg, workdir, checkpoint_every=0)
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
            auto = SnapshotHook(keeper, 'auto',
                                budget_pct=cfg.snapshot.overhead_budget_pct)
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
        stop_keeper,
    )

    run = train_lib.build_run(cfg, workdir, checkpoint_every=0)
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


def simulated_params(cfg, events: str, workdir: str, log=print) -> dict:
    """Final params of the same failure masked in one process (the fault controller)."""
    import jax
    import numpy as np

    from mecefo_jax.main import run as train_run
    cfg = updated(cfg, {'fault.events': events})
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


def _versus_simulated(cfg, summary: dict, row: dict, replicas, out_dir: str, job: str,
                      log) -> dict:
    """A job's final parameters against its failure simulated in one process."""
    import numpy as np
    start, rejoin = row['resume_step'], next(r['resume_step'] for r in summary['recoveries']
                                             if r['kind'] == 'rejoin')
    events = ','.join(f'{start}:{r}:{rejoin - start}' for r in replicas)
    simulated = simulated_params(cfg, events, os.path.join(out_dir, f'simulated_{job}'), log)
    real = np.load(os.path.join(out_dir, job, 'launch', 'final_params.npz'))
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


def run_drill(cfg, config_path: str, out_dir: str, *, workers: int = 4, nodes: int = 1,
              kill_step: int, return_after: int, checkpoint_every: int, log=print) -> dict:
    """Every job on a simulated cluster of `nodes` Ray nodes, the measurements alone; the report."""
    from mecefo_jax.experiments.sim_cluster import SimulatedCluster
    _check_fresh(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    with SimulatedCluster(nodes) as cluster:
        log(f'[drill] a simulated Ray cluster of {nodes} node(s) on this machine, up in '
            f'{cluster.start_sec:.1f} s (not part of any recovery)')
        jobs = _run_jobs(cfg, out_dir, workers, cluster, nodes, kill_step=kill_step,
                         return_after=return_after, checkpoint_every=checkpoint_every, log=log)
        report = _report(cfg, config_path, out_dir, workers, nodes, jobs, kill_step=kill_step,
                         return_after=return_after, checkpoint_every=checkpoint_every, log=log)
        report['ray_start_sec'] = cluster.start_sec
    with open(os.path.join(out_dir, 'crash_drill.json'), 'w') as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(out_dir, 'crash_drill.md'), 'w') as f:
        f.write(markdown(report))
    return report


def _base_values(cfg, out_dir: str, replicas: int) -> dict:
    return {'train.steps': cfg.train.steps, 'train.eval_every': 0, 'mesh.data': replicas,
            'data.cache_dir': cfg.data.cache_dir,
            'launch.compilation_cache': os.path.join(out_dir, 'xla_cache')}


def _run_jobs(cfg, out_dir: str, workers: int, cluster, nodes: int, *, kill_step: int,
              return_after: int, checkpoint_every: int, log) -> dict:
    """The launcher jobs: {name: summary}, and the compile-ahead report as 'ahead'."""
    from mecefo_jax.launch.placement import Placement
    placement = Placement(workers, cfg.launch.local_devices, cfg.mesh.model)
    base = _base_values(cfg, out_dir, placement.replicas)
    # The survivors' programs, compiled ahead into the jobs' cache before the
    # memory job (in a long run this happens, niced, during its first steps).
    # Killed right after a snapshot every keeper holds, whatever interval auto chose.
    memory_values = dict(base, **{'launch.kill': f'{kill_step}:{VICTIM}:KILL:snapshot',
                                  'launch.return_after_steps': return_after,
                                  'launch.compile_ahead': False})
    jobs = {'ahead': compile_ahead(cfg, memory_values, os.path.join(out_dir, 'memory'), workers,
                                   log)}
    jobs['memory'] = _job(cfg, memory_values, os.path.join(out_dir, 'memory'), workers, log)
    jobs['disk'] = _job(cfg, dict(base, **{
        'launch.kill': f'{kill_step}:{VICTIM}', 'launch.recovery': 'disk',
        'snapshot.every': 0, 'train.checkpoint_every': checkpoint_every}),
        os.path.join(out_dir, 'disk'), workers, log)
    parity_workers = 4
    jobs['parity'] = _job(cfg, dict(base, **{
        'mesh.data': 1, 'mesh.model': parity_workers, 'launch.local_devices': 1,
        'snapshot.parity': 'xor', 'snapshot.parity_group': parity_workers,
        'launch.kill': f'{kill_step}:2:KILL:keeper'}),
        os.path.join(out_dir, 'parity'), parity_workers, log)
    jobs['launcher_restart'] = crash_drill_nodes.launcher_restart_job(
        cfg, base, out_dir, workers, address=cluster.address, kill_step=kill_step, log=log)
    victim = crash_drill_nodes.node_loss_victim(nodes)
    if victim is not None:
        jobs['node_loss'] = crash_drill_nodes.node_loss_job(
            _job, cfg, base, out_dir, workers, cluster=cluster, victim=victim,
            kill_step=kill_step, return_after=return_after, log=log)
        jobs['node_loss']['victim'] = victim
    return jobs


def _report(cfg, config_path: str, out_dir: str, workers: int, nodes: int, jobs: dict, *,
            kill_step: int, return_after: int, checkpoint_every: int, log) -> dict:
    """The drill's figures from its jobs, with the measurements only one process can make."""
    from mecefo_jax.launch.placement import Placement
    placement = Placement(workers, cfg.launch.local_devices, cfg.mesh.model)
    sim_cfg = updated(cfg, _base_values(cfg, out_dir, placement.replicas))
    memory, disk = jobs['memory'], jobs['disk']
    mem, dsk = _recovery(memory), _recovery(disk)
    versus_simulated = _versus_simulated(sim_cfg, memory, mem, placement.replicas_of(VICTIM),
                                         out_dir, 'memory', log)
    job_every = chosen_interval(memory, os.path.join(out_dir, 'memory'), cfg.snapshot.every)
    overhead = snapshot_overhead(cfg, os.path.join(out_dir, 'overhead'),
                                 every=cfg.snapshot.every, log=log)
    every = overhead['snapshot_every']
    alone = restore_comparison(cfg, os.path.join(out_dir, 'restore_alone'), log=log)
    _add_step_and_cold_compile(mem, dsk, memory, disk, jobs['ahead'], out_dir, workers)
    report = {
        'config': config_path, 'workers': workers, 'nodes': nodes,
        'local_devices': cfg.launch.local_devices,
        'replicas': placement.replicas, 'steps': cfg.train.steps, 'kill_step': kill_step,
        'return_after_steps': return_after, 'checkpoint_every': checkpoint_every,
        'memory': mem, 'disk': dsk,
        'launcher_restart': _restart_recovery(jobs['launcher_restart']),
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
        **versus_simulated, **_parity_summary(jobs['parity']),
        'compile_ahead': {'cpu_sec': jobs['ahead']['cpu_sec'],
                          'wall_sec': jobs['ahead']['wall_sec'], 'sets': jobs['ahead']['sets']},
        'job_wall_sec': {name: job['wall_sec'] for name, job in jobs.items() if 'wall_sec' in job
                         and name != 'ahead'},
    }
    if 'node_loss' in jobs:
        report['node_loss'] = _node_loss_recovery(sim_cfg, jobs['node_loss'], placement,
                                                  out_dir, log)
    return report


def _restart_recovery(summary: dict) -> dict:
    row = next(r for r in summary['recoveries'] if r['kind'] == 'launcher_restart')
    out = _recovery(summary, 'launcher_restart')
    out.update({k: row.get(k) for k in ('since_launcher_died_sec', 'adopted_keepers',
                                        'ray_connect_sec', 'ray_start_sec')})
    return out


def _node_loss_recovery(sim_cfg, summary: dict, placement, out_dir: str, log) -> dict:
    """The node-loss job's recovery, the lost node, and its parameters against its simulation."""
    out = _recovery(summary)
    failure = next(r for r in summary['recoveries'] if r['kind'] == 'failure')
    rejoin = next(r for r in summary['recoveries'] if r['kind'] == 'rejoin')
    out.update(lost_nodes=failure.get('lost_nodes'), victim=summary['victim'],
               rejoined_on=rejoin['nodes'][str(summary['victim'])],
               rejoin_healed_bytes=rejoin.get('healed_bytes'))
    out.update(_versus_simulated(sim_cfg, summary, out, placement.replicas_of(summary['victim']),
                                 out_dir, 'node_loss', log))
    return out


def _rounded(by_worker: dict | None) -> dict | None:
    return None if by_worker is None else {w: round(v, 2) for w, v in by_worker.items()}


def _table(r: dict) -> list[str]:
    """The recovery table: one column per job that recovered (node loss only on 2+ nodes)."""
    columns = [('memory (keepers)', r['memory']), ('disk (Orbax)', r['disk']),
               ('launcher restart (keepers)', r['launcher_restart'])]
    if r.get('node_loss'):
        columns.append(('node loss (keepers)', r['node_loss']))

    def row(label, cells) -> str:
        return f"| {label} | {' | '.join(cells)} |"

    lines = [row('component (s)', [name for name, _ in columns]),
             row('---', ['---'] * len(columns))]
    for key in COMPONENTS + ('recovery_sec',):
        lines.append(row(key, [fmt(c.get(key)) for _, c in columns]))
    lines.append(row('cold compile of the same program',
                     [fmt(c.get('cold_compile_sec')) for _, c in columns]))
    lines.append(row('lost (redone) steps', [str(c.get('lost_steps')) for _, c in columns]))
    lines.append(row('failures (causes)', [f"{c.get('failures')} ({', '.join(c.get('causes') or [])})"
                                           for _, c in columns]))
    lines.append(row('normal step (median, s)', [fmt(c.get('step_sec')) for _, c in columns]))
    lines.append(row('restored bytes (healed from peers)',
                     [f"{c.get('restore_bytes')} ({c.get('healed_bytes') or 0})" for _, c in columns]))
    return lines


def markdown(r: dict) -> str:
    lines = [f"Crash drill: `{r['config']}`, {r['workers']} workers x {r['local_devices']} CPU "
             f"devices ({r['replicas']} replicas) on {r.get('nodes', 1)} simulated Ray node(s), "
             f"{r['steps']} steps; worker 1 SIGKILLed right after its first snapshot at or after "
             f"step {r['kill_step']} (memory) or at step {r['kill_step']} (disk), back "
             f"{r['return_after_steps']} steps later (memory); Orbax every "
             f"{r['checkpoint_every']} steps (disk); the launcher killed the same way (launcher "
             'restart)' + (f", and worker {r['node_loss']['victim']}'s node lost (node loss)"
                           if r.get('node_loss') else '') +
             f". Ray's start-up, {fmt(r.get('ray_start_sec'))} s, is in no recovery.", '']
    lines += _table(r)
    o = r['snapshot_overhead']
    speedup = r['restore_speedup_memory_vs_disk']
    a = r['restore_alone']
    mem = r['memory']
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
    lines += _restart_and_node_loss_lines(r)
    return '\n'.join(lines) + '\n'


def _restart_and_node_loss_lines(r: dict) -> list[str]:
    rs = r['launcher_restart']
    lines = [f"Launcher restart: the rerun found the keepers of workers {rs['adopted_keepers']} "
             f"and resumed at step {rs['resume_step']}, {rs['lost_steps']} step(s) redone; "
             f"{fmt(rs.get('since_launcher_died_sec'))} s from the launcher's death to the rerun's "
             f"first step, of which {fmt(rs.get('recovery_sec'))} s from the rerun's start "
             f"(joining Ray took {fmt(rs.get('ray_connect_sec'), '.3f')} s more)."]
    nl = r.get('node_loss')
    if nl:
        lines.append(
            f"Node loss: worker {nl['victim']}'s node lost, detected in {fmt(nl['detect_sec'])} s; "
            f"resumed at step {nl['resume_step']}, {nl['lost_steps']} step(s) redone; the worker "
            f"rejoined on node {str(nl['rejoined_on'])[:12]} and healed {nl['rejoin_healed_bytes']} bytes from "
            f"its peers; final "
            f"parameters vs the same failure simulated in one process: "
            f"{nl['max_rel_param_diff_vs_simulated']:.3g} of the leaf's scale.")
    return lines
