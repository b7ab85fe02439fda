"""The crash drill's launcher jobs, and what their records say about each recovery.

`run_jobs` runs the drill's jobs (`crash_drill` lists them) with the
launcher, each in a directory of its own, after compiling ahead the
survivors' programs of every single-worker loss (`compile_ahead`). The rest
reads what the jobs left: a job's recovery row reduced to the drill's fields
(`job_recovery`, and the launcher-restart, parity and node-loss variants),
its median normal step and chosen snapshot interval from its last
generation's end records, the cold compiles, and its final parameters
against the same failure simulated in one process (`versus_simulated`).
"""
from __future__ import annotations

import glob
import json
import os
import statistics
import time

from mecefo_jax.config.resolve import updated
from mecefo_jax.launch.launcher import Launcher
from tests.drills import crash_drill_nodes

VICTIM = 1  # the worker the memory, disk and launcher-restart jobs lose
# Recovery components, in the order a recovery goes through them.
COMPONENTS = ('detect_sec', 'teardown_sec', 'relaunch_sec', 'distributed_init_sec',
              'restore_sec', 'compile_sec', 'refresh_sec', 'start_to_first_step_sec')


def replicas_of(placement, worker: int) -> tuple[int, ...]:
    """Replicas with at least one device on `worker` (its failure takes them down)."""
    return tuple(r for r in range(placement.replicas) if worker in placement.workers_of(r))


def run_job(cfg, values, workdir, workers, log, node_killer=None):
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


def base_values(cfg, out_dir: str, replicas: int) -> dict:
    """What every job of the drill sets: MeCeFO adopts the lost shards (whatever the
    config's default strategy), so its figures are those of the adoption it documents."""
    return {'train.steps': cfg.train.steps, 'train.eval_every': 0, 'mesh.data': replicas,
            'fault.strategy': 'mecefo',
            'data.cache_dir': cfg.data.cache_dir,
            'launch.compilation_cache': os.path.join(out_dir, 'xla_cache')}


def run_jobs(cfg, out_dir: str, workers: int, cluster, nodes: int, *, kill_step: int,
             return_after: int, checkpoint_every: int, log) -> dict:
    """The launcher jobs: {name: summary}, and the compile-ahead report as 'ahead'."""
    from mecefo_jax.launch.placement import Placement
    placement = Placement(workers, cfg.launch.local_devices, cfg.mesh.model)
    base = base_values(cfg, out_dir, placement.replicas)
    # The survivors' programs, compiled ahead into the jobs' cache before the
    # memory job (in a long run this happens, niced, during its first steps).
    # Killed right after a snapshot every keeper holds, whatever interval auto chose.
    memory_values = dict(base, **{'launch.kill': f'{kill_step}:{VICTIM}:KILL:snapshot',
                                  'launch.return_after_steps': return_after,
                                  'launch.compile_ahead': False})
    jobs = {'ahead': compile_ahead(cfg, memory_values, os.path.join(out_dir, 'memory'), workers,
                                   log)}
    jobs['memory'] = run_job(cfg, memory_values, os.path.join(out_dir, 'memory'), workers, log)
    jobs['disk'] = run_job(cfg, dict(base, **{
        'launch.kill': f'{kill_step}:{VICTIM}', 'launch.recovery': 'disk',
        'snapshot.every': 0, 'train.checkpoint_every': checkpoint_every}),
        os.path.join(out_dir, 'disk'), workers, log)
    parity_workers = 4
    jobs['parity'] = run_job(cfg, dict(base, **{
        'mesh.data': 1, 'mesh.model': parity_workers, 'launch.local_devices': 1,
        'snapshot.parity': 'xor', 'snapshot.parity_group': parity_workers,
        'launch.kill': f'{kill_step}:2:KILL:keeper'}),
        os.path.join(out_dir, 'parity'), parity_workers, log)
    jobs['launcher_restart'] = crash_drill_nodes.launcher_restart_job(
        cfg, base, out_dir, workers, address=cluster.address, kill_step=kill_step, log=log)
    victim = crash_drill_nodes.node_loss_victim(nodes)
    if victim is not None:
        jobs['node_loss'] = crash_drill_nodes.node_loss_job(
            run_job, cfg, base, out_dir, workers, cluster=cluster, victim=victim,
            kill_step=kill_step, return_after=return_after, log=log)
        jobs['node_loss']['victim'] = victim
    return jobs


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
    report = drive(job_cfg, workdir, placement, nice=0, log=log)
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


def job_recovery(summary: dict, kind: str = 'failure') -> dict:
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


def restart_recovery(summary: dict) -> dict:
    row = next(r for r in summary['recoveries'] if r['kind'] == 'launcher_restart')
    out = job_recovery(summary, 'launcher_restart')
    out.update({k: row.get(k) for k in ('since_launcher_died_sec', 'adopted_keepers',
                                        'ray_connect_sec', 'ray_start_sec')})
    return out


def parity_summary(parity: dict) -> dict:
    """The parity job's recovery, and whether its rebuilt snapshot was the lost one bit for bit."""
    bitwise = [v for r in parity['recoveries'] for v in
               (r.get('parity_rebuild_bitwise') or {}).values()]
    return {'parity_rebuild_bitwise': bool(bitwise) and all(bitwise),
            # Where a rebuild and the killed keeper's own copy part, if they do.
            'parity_rebuild_mismatch': [r['parity_rebuild_mismatch'] for r in parity['recoveries']
                                        if r.get('parity_rebuild_mismatch')],
            'parity': job_recovery(parity)}


def node_loss_recovery(sim_cfg, summary: dict, placement, out_dir: str, log) -> dict:
    """The node-loss job's recovery, the lost node, and its parameters against its simulation."""
    out = job_recovery(summary)
    failure = next(r for r in summary['recoveries'] if r['kind'] == 'failure')
    rejoin = next(r for r in summary['recoveries'] if r['kind'] == 'rejoin')
    out.update(lost_nodes=failure.get('lost_nodes'), victim=summary['victim'],
               rejoined_on=rejoin['nodes'][str(summary['victim'])],
               rejoin_healed_bytes=rejoin.get('healed_bytes'))
    out.update(versus_simulated(sim_cfg, summary, out, replicas_of(placement, summary['victim']),
                                out_dir, 'node_loss', log))
    return out


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


def add_step_and_cold_compile(mem, dsk, memory, disk, ahead, out_dir, workers) -> None:
    """Each path's median normal step, and a cold compile of the program it loaded."""
    mem['step_sec'] = step_sec(memory, os.path.join(out_dir, 'memory'))
    dsk['step_sec'] = step_sec(disk, os.path.join(out_dir, 'disk'))
    mem['cold_compile_sec_by_process'] = ahead['cold_compile_sec_by_process']
    mem['cold_compile_sec'] = max(ahead['cold_compile_sec_by_process'].values(), default=None)
    dsk['cold_compile_sec'] = _cold_full_compile(os.path.join(out_dir, 'memory'),
                                                 range(workers))


def simulated_params(cfg, events: str, workdir: str, log=print) -> dict:
    """Final params of the same failure masked in one process (the fault controller)."""
    import jax
    import numpy as np

    from mecefo_jax.run import run as train_run
    cfg = updated(cfg, {'fault.events': events})
    log(f'[drill] simulated: fault.events={events}')
    params = train_run(cfg, workdir)['state'].params
    return {jax.tree_util.keystr(p): np.asarray(v)
            for p, v in jax.tree_util.tree_leaves_with_path(jax.device_get(params))}


def versus_simulated(cfg, summary: dict, row: dict, replicas, out_dir: str, job: str,
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
