"""The launcher run as a process, as a user or a scheduler runs it (tests/launch_jobs.py's job).

On the session's shared simulated Ray cluster, or (the killed launcher's
rerun) on the default local cluster the launcher starts. Ctrl-C and SIGTERM
save a step and leave nothing behind; a worker the stop cannot reach ends
after the stop timeout; a killed launcher's rerun resumes from the keepers
it left, after mistaken reruns are refused without touching them; one killed
before its first save is rerun from step 0; and one killed inside the
generation that recovered from a worker's death leaves that recovery's row,
and `--cleanup` removes what it left, the rerun resuming from disk.
(SIGTERM and Ctrl-C share a job: the rerun after SIGTERM is the one Ctrl-C stops.)
"""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from launch_jobs import (
    REPO,
    WORKERS,
    assert_nothing_left,
    config,
    final_provenance,
    keeper_names,
    live_keeper_pids,
    overrides,
    read,
    running,
    worker_processes,
)
from process_waits import wait_gone
from simulated_params import assert_params_equal_simulated

from mecefo_jax.host import processes
from mecefo_jax.snapshot import shm

pytestmark = [pytest.mark.subprocess, pytest.mark.ray]  # Ray's processes, workers, launchers


def start_launcher(launcher_caches, workdir, *, address=None, **extra):
    """The launcher as a process (as a user or a scheduler runs it)."""
    values = overrides(launcher_caches, **extra)
    args = [sys.executable, '-m', 'mecefo_jax.launch', f'--nprocs={WORKERS}',
            f'--workdir={workdir}', '--config=' + os.path.join(REPO, 'configs', 'tiny.py')]
    args += [f'--address={address}'] if address else []
    args += [f'--config.{k}={v}' for k, v in values.items()]
    launcher = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    return launcher, args


def wait_until(condition, launcher, what, limit=300):
    """Hold the test until `condition()` holds (a state of the job, not a time)."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline and launcher.poll() is None, f'{what} never happened'
        time.sleep(0.1)


def wait_for(path_glob, launcher, limit=300):
    wait_until(lambda: glob.glob(path_glob), launcher, f'{path_glob} appearing', limit)


def wait_for_workers_to_end(workdir, limit=30):
    """Hold the test until a killed launcher's workers are gone (Ray ends a dead driver's actors)."""
    workers = worker_processes(workdir)
    wait_gone(workers, 'workers outlived their launcher', limit, poll=0.2, running=running)


def loss_steps(workdir):
    rows = [json.loads(line) for line in open(os.path.join(workdir, 'metrics.jsonl'))]
    return [r['step'] for r in rows if 'loss' in r], rows


def rerun(args, steps):
    args = [a for a in args if not a.startswith(('--config.train.steps=', '--config.launch.kill='))]
    done = subprocess.run(args + [f'--config.train.steps={steps}'], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_sigterm_saves_one_step_the_rerun_resumes_there_and_ctrl_c_leaves_nothing(cluster, launcher_caches,
                                                                                  tmp_path):
    """SIGTERM: every worker stops at the step JAX's preemption sync picks, saves it to
    disk and ends; the keepers stay until then; the launcher exits with EXIT_PREEMPTED,
    leaving nothing. The rerun of the same command resumes from that step (one loss row
    per step); held once every keeper holds a snapshot (shared memory to leave behind),
    it gets Ctrl-C: it saves a step too, and leaves no worker, keeper or shared memory.
    (One job for both signals: each stop is the one a fresh job would meet.)"""
    from mecefo_jax.training.preemption import EXIT_PREEMPTED
    workdir = str(tmp_path)
    launcher, args = start_launcher(launcher_caches, workdir, address=cluster.address, **{
        'train.steps': 2000, 'train.log_every': 1, 'train.checkpoint_every': 1000})
    wait_for(os.path.join(workdir, 'launch', 'g0_w*_start.json'), launcher)
    launcher.send_signal(signal.SIGTERM)
    output = launcher.communicate(timeout=300)[0]
    assert launcher.returncode == EXIT_PREEMPTED, output
    ends = [read(workdir, f'g0_w{w}_end.json') for w in range(WORKERS)]
    saved = ends[0]['final_step']
    assert all(e['preempted'] and e['final_step'] == saved for e in ends)
    assert f'preempted: saved step {saved}' in output
    assert_nothing_left(workdir)

    rerun_launcher = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True)
    wait_until(lambda: len(keeper_names(workdir)) == WORKERS, rerun_launcher, "the rerun's keepers")
    keepers = live_keeper_pids(workdir)
    # Every keeper's first snapshot (after the rerun's first step) gives it shared memory.
    wait_until(lambda: all(shm.listed(p) for p in keepers), rerun_launcher, 'a snapshot in every keeper')
    rerun_launcher.send_signal(signal.SIGINT)
    output = rerun_launcher.communicate(timeout=120)[0]
    assert rerun_launcher.returncode == EXIT_PREEMPTED, output
    assert_nothing_left(workdir, keepers)
    (saved_again,) = set(map(int, re.findall(r'preempted: saved step (\d+)', output)))
    steps, rows = loss_steps(workdir)
    assert {'event': 'resumed', 'step': saved, 'source': 'disk'} in rows
    # One row per step, up to the step Ctrl-C saved.
    assert steps == sorted(set(steps)) and steps[-1] == saved_again > saved


def test_a_stop_that_a_worker_cannot_reach_ends_after_the_stop_timeout(cluster, launcher_caches, tmp_path):
    """Worker 1 is SIGSTOPped before the launcher gets SIGTERM, so it never reaches the
    preemption sync and worker 0 waits there for it. The launcher kills them after
    launch.stop_timeout_sec and exits preempted, naming the workers that saved
    nothing. (The heartbeat and stall timeouts are long: only the stop timeout can
    end this job.)"""
    from mecefo_jax.training.preemption import EXIT_PREEMPTED
    workdir = str(tmp_path)
    launcher, _ = start_launcher(launcher_caches, workdir, address=cluster.address, **{
        'train.steps': 2000, 'launch.stop_timeout_sec': 3.0,
        'launch.heartbeat_timeout_sec': 1000, 'launch.stall_timeout_sec': 1000})
    wait_for(os.path.join(workdir, 'launch', 'g0_w1_start.json'), launcher)
    os.kill(read(workdir, 'g0_w1_start.json')['pid'], signal.SIGSTOP)
    launcher.send_signal(signal.SIGTERM)
    output = launcher.communicate(timeout=120)[0]
    assert launcher.returncode == EXIT_PREEMPTED, output
    assert 'did not stop within launch.stop_timeout_sec=3 s' in output
    assert 'workers [0, 1] did not save within launch.stop_timeout_sec' in output
    assert_nothing_left(workdir)


def assert_mistaken_reruns_are_refused_and_leave_the_job(args, workdir, host):
    """--nprocs=1 (the job has keepers for worker 1) and model.d_model=64 (its snapshots
    hold d_model=32): each refused with its fix, the cluster and the record kept. (The
    keepers are the local cluster's, which this process is not connected to: the rerun
    that follows resuming from them, nothing redone, shows they were kept.)"""
    from mecefo_jax.launch import cluster as ray_cluster
    with open(os.path.join(workdir, 'config.json')) as f:
        record = f.read()
    base = [a for a in args if not a.startswith(('--nprocs', '--config.launch.kill'))]
    for extra, says in (
            (['--nprocs=1', '--config.mesh.data=-1'], 'rerun with the --nprocs it ran with (--nprocs=2)'),
            ([f'--nprocs={WORKERS}', '--config.model.d_model=64'], '--config.model.d_model=32')):
        done = subprocess.run(base + extra, cwd=REPO, capture_output=True, text=True, timeout=600)
        assert done.returncode == 1 and says in done.stdout + done.stderr, done.stdout + done.stderr
        assert ray_cluster.local_cluster(workdir) == host
        with open(os.path.join(workdir, 'config.json')) as f:
            assert f.read() == record


def test_a_killed_launchers_rerun_resumes_from_its_keepers_with_nothing_lost(launcher_caches, tmp_path):
    """On the default local cluster: the launcher kills itself once every keeper holds
    the snapshot worker 0 was held after (step 6). Its workers go with it; its keepers
    and the local cluster stay. Two mistaken reruns (fewer --nprocs; a config that does
    not fit the snapshots) are refused, naming the fix, and leave the cluster, the keepers
    and the workdir's config.json as they found them. The same command again finds them and
    resumes there, redoing nothing (each step's samples computed once, the final
    parameters those of the run uninterrupted in one process), then removes them all at
    the end."""
    from mecefo_jax.launch import cluster as ray_cluster
    workdir = str(tmp_path)
    launcher, args = start_launcher(launcher_caches, workdir, **{
        'train.steps': 10, 'train.log_every': 1, 'snapshot.every': 3,
        'launch.kill': '5:launcher:KILL:snapshot'})
    output = launcher.communicate(timeout=600)[0]
    assert launcher.returncode == -signal.SIGKILL, output
    host = ray_cluster.local_cluster(workdir)
    assert host is not None, 'the local cluster died with the launcher'
    assert read(workdir, 'launcher_killed.json')['where'].startswith(
        'held after its snapshot of step 6')
    wait_for_workers_to_end(workdir)
    assert_mistaken_reruns_are_refused_and_leave_the_job(args, workdir, host)
    done = rerun(args, 10)
    summary = read(workdir, 'summary.json')
    (restart,) = summary['recoveries']
    assert restart['kind'] == 'launcher_restart' and restart['adopted_keepers'] == [0, 1]
    assert restart['resume_step'] == restart['completed_steps'] == 6
    assert restart['redone_steps'] == 0
    assert not summary['ray']['started_local_cluster'], done.stdout  # it joined the one left
    steps, rows = loss_steps(workdir)
    assert {'event': 'resumed', 'step': 6, 'source': 'memory'} in rows
    assert steps == list(range(1, 11))  # one loss row per step
    assert ray_cluster.local_cluster(workdir) is None and not processes.alive(host['pid'])
    values = overrides(launcher_caches, **{'train.steps': 10, 'snapshot.every': 3})
    final = final_provenance(workdir, values)
    assert all(row['replicas'] == [0, 1, 2, 3] for row in final.values())  # none was down
    (tmp_path / 'simulated').mkdir()
    assert_params_equal_simulated(workdir, config(values), tmp_path / 'simulated', replicas=4)


def test_a_launcher_killed_before_its_first_save_is_rerun_from_step_0(cluster, launcher_caches, tmp_path):
    """Nothing saved (no snapshots, no checkpoint) when the launcher kills itself at step 2:
    the same command again starts the job over at step 0, its own run by the config record,
    rather than refusing a fresh start over it; the recovery row says all it redid."""
    workdir = str(tmp_path)
    launcher, args = start_launcher(launcher_caches, workdir, address=cluster.address, **{
        'train.steps': 4, 'train.log_every': 1, 'train.checkpoint_every': 0, 'snapshot.every': 0,
        'launch.kill': '2:launcher:KILL'})
    output = launcher.communicate(timeout=600)[0]
    assert launcher.returncode == -signal.SIGKILL, output
    wait_for_workers_to_end(workdir)  # Ray ends a dead driver's actors, a step or so later
    killed_at = loss_steps(workdir)[0][-1]
    assert killed_at >= 2 and not os.path.exists(os.path.join(workdir, 'checkpoints', str(killed_at)))
    rerun(args, 4)
    steps, rows = loss_steps(workdir)
    assert {'event': 'resumed', 'step': 0, 'source': 'start_over', 'dropped_through': killed_at} in rows
    assert steps == [1, 2, 3, 4]  # one loss row per step
    (restart,) = read(workdir, 'summary.json')['recoveries']
    assert (restart['kind'], restart['resume'], restart['resume_step']) == ('launcher_restart', 'fresh', 0)
    assert restart['redone_steps'] == restart['completed_steps'] >= 2


def test_a_killed_launcher_leaves_its_recovery_row_and_after_cleanup_the_rerun_resumes_from_disk(
        cluster, launcher_caches, tmp_path):
    """Worker 1 is killed at step 3 and the launcher kills itself at step 11, inside the
    generation that recovered: the recovery's row was written once that generation's
    members had started, not when it ended (the launcher never saw it end). Memory mode
    writes the disk tier too: with the keepers removed (--cleanup), the rerun of the same
    command resumes from the newest Orbax checkpoint."""
    workdir = str(tmp_path)
    launcher, args = start_launcher(launcher_caches, workdir, address=cluster.address, **{
        'train.steps': 2000, 'train.log_every': 1, 'train.checkpoint_every': 3,
        'launch.kill': '3:1:KILL,11:launcher:KILL'})
    output = launcher.communicate(timeout=600)[0]
    assert launcher.returncode == -signal.SIGKILL, output
    with open(os.path.join(workdir, 'launch', 'recoveries.jsonl')) as f:
        (row,) = [json.loads(line) for line in f]
    assert (row['kind'], row['ended_generation'], row['next_generation']) == ('failure', 0, 1)
    assert row['failed_workers'] == [1] and row['recovery_sec'] > 0 and row['resume_step'] >= 1
    keepers = live_keeper_pids(workdir)
    assert len(keepers) == WORKERS  # left for a rerun
    base = [a for a in args if not a.startswith('--config')]
    cleaned = subprocess.run(base + ['--cleanup'], cwd=REPO, capture_output=True, text=True,
                             timeout=120)
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert json.loads(cleaned.stdout)['keepers'] == ['keeper0', 'keeper1']
    assert_nothing_left(workdir, keepers, launcher_killed=True)
    newest = max(int(d) for d in os.listdir(os.path.join(workdir, 'checkpoints')) if d.isdigit())
    rerun(args, newest + 2)
    steps, rows = loss_steps(workdir)
    resumed = [r for r in rows if r.get('event') == 'resumed']
    # The newest step, or the one before it if the kill cut its save short (step 9's save
    # began after step 6's had finished: Orbax saves one step at a time).
    assert resumed and resumed[-1]['source'] == 'disk' and 6 <= resumed[-1]['step'] <= newest
    assert steps == list(range(1, newest + 3))  # one loss row per step after the resume
