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
7. `random` (`random_kills` jobs): worker 1 SIGKILLed at a uniformly random
   step under the default cadence, what it lost and how long the way back
   took, beside the snapshot-aligned kill of (1) (`crash_drill_random`).

It writes `crash_drill.json` and `crash_drill.md` (its tables, and what the
run found against its bounds). What a snapshot costs a step is measured
apart, by `python -m studies.snapshot_bench` and the GPU report's snapshot
section, not here.

This module runs the drill and gathers its figures; its parts live beside
it: `crash_drill_jobs` (the launcher jobs and what their records say),
`crash_drill_nodes` (the node-loss and launcher-restart jobs) and
`crash_drill_report` (the tables and the findings).
"""
from __future__ import annotations

import json
import os

from mecefo_jax.config.resolve import updated
from tests.drills import crash_drill_jobs as jobs_lib
from tests.drills.crash_drill_random import KILLS, random_kills
from tests.drills.crash_drill_report import drill_findings, markdown


def run_drill(cfg, config_path: str, out_dir: str, *, workers: int = 4, nodes: int = 1,
              kill_step: int, return_after: int, checkpoint_every: int,
              random_kills: int = KILLS, seed: int = 0, command: str = '', log=print) -> dict:
    """Every job on a simulated cluster of `nodes` Ray nodes; the report, with what it found."""
    from tests.drills.sim_cluster import SimulatedCluster
    _check_fresh(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    with SimulatedCluster(nodes) as cluster:
        log(f'[drill] a simulated Ray cluster of {nodes} node(s) on this machine, up in '
            f'{cluster.start_sec:.1f} s (not part of any recovery)')
        jobs = jobs_lib.run_jobs(cfg, out_dir, workers, cluster, nodes, kill_step=kill_step,
                                 return_after=return_after, checkpoint_every=checkpoint_every,
                                 log=log)
        report = _report(cfg, config_path, out_dir, workers, nodes, jobs, kill_step=kill_step,
                         return_after=return_after, checkpoint_every=checkpoint_every,
                         command=command, log=log)
        report['ray_start_sec'] = cluster.start_sec
        if random_kills > 0:
            report['random_kill'] = random_kill_report(cfg, out_dir, workers, report['memory'],
                                                       checkpoint_every=checkpoint_every,
                                                       kills=random_kills, seed=seed, log=log)
    report['findings'] = drill_findings(report)
    with open(os.path.join(out_dir, 'crash_drill.json'), 'w') as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(out_dir, 'crash_drill.md'), 'w') as f:
        f.write(markdown(report))
    return report


def random_kill_report(cfg, out_dir: str, workers: int, memory: dict, *, checkpoint_every: int,
                       kills: int, seed: int, log) -> dict:
    """The random kills' figures beside the snapshot-aligned kill's (the memory job)."""
    from mecefo_jax.launch.placement import Placement
    placement = Placement(workers, cfg.launch.local_devices, cfg.mesh.model)
    result = random_kills(cfg, jobs_lib.base_values(cfg, out_dir, placement.replicas), out_dir,
                          workers, checkpoint_every=checkpoint_every, seed=seed, kills=kills,
                          log=log)
    result['snapshot_aligned'] = {'lost_steps': memory['lost_steps'],
                                  'recovery_sec': memory['recovery_sec']}
    return result


def _check_fresh(out_dir: str) -> None:
    """A drill's jobs resume from whatever their directories hold: start from an empty one."""
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        raise ValueError(f'--out {out_dir} is not empty: its jobs would resume from the '
                         'checkpoints and snapshots a previous drill left there. Choose a new '
                         'directory or remove this one.')


def _report(cfg, config_path: str, out_dir: str, workers: int, nodes: int, jobs: dict, *,
            kill_step: int, return_after: int, checkpoint_every: int, command: str, log) -> dict:
    """The drill's figures from its jobs, and its parameters against the simulated failure."""
    from mecefo_jax.launch.placement import Placement
    placement = Placement(workers, cfg.launch.local_devices, cfg.mesh.model)
    sim_cfg = updated(cfg, jobs_lib.base_values(cfg, out_dir, placement.replicas))
    memory, disk = jobs['memory'], jobs['disk']
    mem, dsk = jobs_lib.job_recovery(memory), jobs_lib.job_recovery(disk)
    versus_simulated = jobs_lib.versus_simulated(
        sim_cfg, memory, mem, jobs_lib.replicas_of(placement, jobs_lib.VICTIM), out_dir, 'memory', log)
    job_every = jobs_lib.chosen_interval(memory, os.path.join(out_dir, 'memory'),
                                         cfg.snapshot.every)
    jobs_lib.add_step_and_cold_compile(mem, dsk, memory, disk, jobs['ahead'], out_dir, workers)
    report = {
        'command': command, 'config': config_path, 'workers': workers, 'nodes': nodes,
        'local_devices': cfg.launch.local_devices,
        'replicas': placement.replicas, 'steps': cfg.train.steps, 'kill_step': kill_step,
        'return_after_steps': return_after, 'checkpoint_every': checkpoint_every,
        # The jobs' own Orbax period, which caps auto's interval (the disk and
        # random-kill jobs set `checkpoint_every` instead).
        'config_checkpoint_every': int(cfg.train.checkpoint_every),
        'memory': mem, 'disk': dsk,
        'launcher_restart': jobs_lib.restart_recovery(jobs['launcher_restart']),
        'restore_speedup_memory_vs_disk': (dsk['restore_sec'] / mem['restore_sec']
                                           if mem['restore_sec'] else None),
        'snapshot_every_setting': cfg.snapshot.every,
        'snapshot_every_memory_job': job_every,
        # A kill at a random step redoes half a save interval on average; the
        # memory job's kill lands right after a snapshot (scripts/crash_drill.py).
        'expected_lost_steps_per_failure': job_every / 2 if job_every else None,
        'expected_lost_steps_per_failure_disk': checkpoint_every / 2,
        **versus_simulated, **jobs_lib.parity_summary(jobs['parity']),
        'compile_ahead': {'cpu_sec': jobs['ahead']['cpu_sec'],
                          'wall_sec': jobs['ahead']['wall_sec'], 'sets': jobs['ahead']['sets']},
        'job_wall_sec': {name: job['wall_sec'] for name, job in jobs.items() if 'wall_sec' in job
                         and name != 'ahead'},
    }
    if 'node_loss' in jobs:
        report['node_loss'] = jobs_lib.node_loss_recovery(sim_cfg, jobs['node_loss'],
                                                          placement, out_dir, log)
    return report
