"""The launcher on Ray surviving real crashes: 2 workers x 2 CPU devices, the tiny config.

The session's shared simulated Ray cluster of 2 nodes (a worker on each).
One job is SIGKILLed and recovered from the keepers' memory, then rejoined;
another has a worker SIGSTOPped (a hang) and detected by its silence; others
end with the launcher interrupted, stopped, killed (its rerun resumes from
the keepers it left) or cleaned up. Workers share a persistent XLA cache so
the relaunches compile little. Node losses are tests/node_loss_test.py's;
snapshot publication under a crash, parity rebuilds and the two-lost-members
error are tests/snapshot_test.py's and tests/parity_test.py's.
"""
import glob
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from simulated_params import assert_params_equal_simulated

from configs.tiny import get_config
from mecefo_jax.config_resolve import resolve, updated
from mecefo_jax.launch import generation
from mecefo_jax.launch.ray_cluster import namespace_of
from mecefo_jax.launch.supervisor import Launcher
from mecefo_jax.snapshot import shm

pytestmark = [pytest.mark.subprocess, pytest.mark.ray]  # Ray's processes, workers, launchers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS, LOCAL = 2, 2  # 4 replicas: worker 1 holds replicas 2 and 3
# The crashed job's worker is killed while held inside its publish of
# HELD_STEP (the job cannot run on past it); 14 steps leave room for the rejoin
# 2 steps after the relaunch.
STEPS = 14
HELD_STEP = 3


@pytest.fixture(scope='module')
def cluster(ray_cluster):
    assert len(ray_cluster.nodes) == WORKERS  # a worker on each node
    return ray_cluster  # the session's shared cluster (tests/conftest.py)


@pytest.fixture(scope='module')
def caches(launcher_caches):
    return launcher_caches  # shared with tests/node_loss_test.py's job of the same shape


def overrides(caches, **extra):
    """The module's job: standby workers only where a test asks for them (the SIGKILL
    job runs the default), as they cost every generation a warm-up on this machine."""
    tokenizer, xla = caches
    values = {'train.steps': STEPS, 'train.eval_every': 0, 'mesh.data': 4,
              'fault.strategy': 'mecefo',  # the adoption these tests check
              'launch.local_devices': LOCAL, 'launch.compilation_cache': xla,
              'data.cache_dir': tokenizer, 'snapshot.every': 1, 'launch.compile_ahead': False,
              'launch.standby_workers': False}
    values.update(extra)
    return values


def config(values):
    return updated(resolve(get_config()), values)


def launch(values, workdir):
    return Launcher(config(values), workdir, WORKERS, log=lambda _: None).run()


def read(workdir, name):
    with open(os.path.join(workdir, 'launch', name)) as f:
        return json.load(f)


def worker_pids(workdir) -> list[int]:
    """Every worker process the job ran (from their start records)."""
    return [read(workdir, os.path.basename(p))['pid']
            for p in glob.glob(os.path.join(workdir, 'launch', 'g*_w*_start.json'))]


def keeper_names(workdir) -> list[str]:
    import ray
    namespace = namespace_of(workdir)
    return sorted(a['name'] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a['namespace'] == namespace)


def assert_nothing_left(workdir, keeper_pids=(), *, launcher_killed=False):
    """No worker process, keeper actor or keeper segment of the job remains.

    A launcher returns only after every worker process it ran has exited. A
    SIGKILLed launcher's workers are ended by Ray (their driver died), and
    Ray reaps killed keeper actors: both within seconds.
    """
    deadline = time.monotonic() + 30
    while launcher_killed and [p for p in worker_pids(workdir) if shm.alive(p)]:
        assert time.monotonic() < deadline, 'workers outlived their killed launcher'
        time.sleep(0.2)
    assert not [p for p in worker_pids(workdir) if shm.alive(p)], 'workers outlived the launcher'
    while keeper_names(workdir):
        assert time.monotonic() < deadline, f'left behind: keepers {keeper_names(workdir)}'
        time.sleep(0.2)
    assert not [p for p in keeper_pids if shm.alive(p) or shm.listed(p)]


def live_keeper_pids(workdir) -> list[int]:
    from mecefo_jax.snapshot.keeper_actor import find_keeper
    return [find_keeper(name, namespace_of(workdir)).pid for name in keeper_names(workdir)]


@pytest.fixture(scope='module')
def crashed(cluster, caches, tmp_path_factory):
    """Worker 1 SIGKILLed inside its publish of step 3, back 2 steps after the relaunch.

    The worker stops after copying step 3's bytes into its keeper and before
    publishing them, says so in its progress report, and the launcher kills it
    there: the kill lands at the same point in every run.
    """
    workdir = str(tmp_path_factory.mktemp('crashed'))
    summary = launch(overrides(caches, **{'launch.kill': f'{HELD_STEP}:1:KILL:publish',
                                          'launch.return_after_steps': 2,
                                          'launch.standby_workers': True}), workdir)
    return summary, workdir


def test_a_kill_after_a_snapshot_lands_on_the_snapshotted_step_whatever_the_interval(
        cluster, caches, tmp_path):
    """Asked for at step 4 with snapshots every 3 steps: worker 1 holds its loop after
    publishing step 6, the launcher waits until both keepers hold 6 and kills it there,
    and the survivor resumes at 6 with nothing redone. A kill at plain step 4 would
    have redone 1 step (the crash drill's memory job kills this way)."""
    workdir = str(tmp_path)
    summary = launch(overrides(caches, **{'launch.kill': '4:1:KILL:snapshot',
                                          'snapshot.every': 3, 'train.steps': 8}), workdir)
    (failure,) = summary['recoveries']
    assert failure['kind'] == 'failure' and failure['failed_workers'] == [1]
    assert failure['injected_at'] == 'held after its snapshot of step 6, which every keeper holds'
    assert failure['resume_step'] == failure['completed_steps'] == 6
    assert failure['redone_steps'] == 0
    assert read(workdir, 'g1_w0_end.json')['final_step'] == 8


def test_a_kill_after_a_snapshot_needs_snapshots(cluster, caches, tmp_path):
    with pytest.raises(ValueError, match='needs snapshots'):
        launch(overrides(caches, **{'launch.kill': '4:1:KILL:snapshot', 'snapshot.every': 0}),
               str(tmp_path))


def test_the_job_survives_a_sigkill_from_the_keepers_memory_and_rejoins(crashed):
    summary, workdir = crashed
    failure, rejoin = summary['recoveries']
    assert failure['kind'] == 'failure' and failure['failed_workers'] == [1]
    assert failure['cause'] == 'killed by SIGKILL'
    assert failure['members'] == [0] and failure['resume'] == 'memory'
    # The dead worker's keeper never got step 3; the survivor's own keeper has
    # every step the job completed (snapshot.every=1), and the survivors need
    # only their own shards: they resume where the job was, nothing redone.
    assert failure['newest_held_by_worker']['1'] == HELD_STEP - 1
    assert failure['redone_steps'] == 0
    assert failure['resume_step'] == failure['completed_steps'] >= HELD_STEP
    assert failure['restore_bytes'] > 0 and failure['restore_sec'] > 0
    for kind in ('infrastructure_recovery_from_disruption', 'program_startup',
                 'accelerator_initialization', 'unproductive_checkpoint_restore',
                 'training_prep', 'first_step'):
        assert kind in failure['badput_sec']
    assert rejoin['kind'] == 'rejoin' and rejoin['members'] == [0, 1]
    assert rejoin['resume_step'] == failure['resume_step'] + 2
    # The returning worker's keeper holds only its pre-crash snapshots: it heals from its peer.
    assert rejoin['healed_bytes'] > 0 and rejoin['redone_steps'] == 0
    assert failure['healed_bytes'] == 0  # the survivor had everything in its own keeper
    ends = [read(workdir, f'g2_w{w}_end.json') for w in range(WORKERS)]
    assert all(e['finished'] and e['final_step'] == STEPS for e in ends)
    # Surviving and returning workers hold bitwise-identical replicas.
    assert ends[0]['params_sha256'] == ends[1]['params_sha256']
    # Each worker ran on its own node; the job's keepers went with it.
    assert len(set(summary['nodes'].values())) == WORKERS
    assert_nothing_left(workdir)


def final_provenance(workdir, values) -> dict:
    """Each step's final record (a later generation's supersedes redone work), checked
    against the reference pipeline: every step once, every sample of it computed."""
    rows = [json.loads(line) for line in open(os.path.join(workdir, 'launch', 'provenance.jsonl'))]
    final = {}
    for row in rows:
        final[row['step']] = row
    steps = int(values['train.steps'])
    assert sorted(final) == list(range(steps))
    from mecefo_jax.data import pipeline as data_lib
    cfg = config(values)
    reference = data_lib.make_pipeline(cfg.data, vocab_size=int(cfg.model.vocab_size),
                                       num_shards=4, split='train')
    shard = int(cfg.data.global_batch_size) // 4
    for step in range(steps):
        batch = next(reference)
        assert final[step]['batch_sha256'] == hashlib.sha256(batch).hexdigest(), step
        assert final[step]['covered'] == {str(s): shard for s in range(4)}, step
    return final


def test_every_sample_of_every_step_is_computed_exactly_once(crashed, caches):
    _, workdir = crashed
    final = final_provenance(workdir, overrides(caches))
    failure = json.load(open(os.path.join(workdir, 'launch', 'summary.json')))['recoveries'][0]
    down = range(failure['resume_step'], failure['resume_step'] + 2)
    for step in down:  # worker 1's replicas were absent and their shards were adopted
        assert final[step]['replicas'] == [0, 1], step


def test_final_parameters_equal_the_same_failure_simulated_in_one_process(crashed, caches,
                                                                          tmp_path):
    summary, workdir = crashed
    start = summary['recoveries'][0]['resume_step']
    # Worker 1's replicas, down for 2 steps.
    cfg = updated(config(overrides(caches)), {'fault.events': f'{start}:2:2,{start}:3:2'})
    assert_params_equal_simulated(workdir, cfg, tmp_path, replicas=4)


def test_only_a_warm_standby_is_taken_and_a_cold_one_is_killed(cluster):
    """A standby still importing (here one that never warms: `Worker(False)`) is killed,
    not taken: its lowest-priority warm-up thread can hold the GIL for seconds on a
    loaded machine. A warm one on the asked-for node is taken."""
    import ray

    from mecefo_jax.launch import actors
    from mecefo_jax.launch.standby import Standbys
    from mecefo_jax.launch.worker import Worker
    standbys, node = Standbys(), cluster.head
    standbys.fill({0: node, 1: node}, env={}, gpus={})
    cold = ray.remote(Worker).options(**actors.options(env={}, node_id=node, concurrency=4)).remote(False)
    cold_pid = ray.get(cold.info.remote())['pid']
    standbys._ready[1] = (node, cold)
    warm = standbys._ready[0][1]
    deadline = time.monotonic() + 120
    while not ray.get(warm.is_warm.remote()):  # hold until the warm-up is done
        assert time.monotonic() < deadline, 'the standby never warmed'
        time.sleep(0.2)
    assert standbys.take(0, node) is warm
    assert standbys.take(1, node) is None
    deadline = time.monotonic() + 30
    while shm.alive(cold_pid):  # killed
        assert time.monotonic() < deadline, 'the cold standby was left running'
        time.sleep(0.2)
    ray.kill(warm)


def test_a_hung_worker_is_detected_by_its_silence(cluster, caches, tmp_path):
    timeout = 3.0
    summary = launch(overrides(caches, **{'launch.kill': '2:1:STOP', 'train.steps': 4,
                                          'launch.heartbeat_timeout_sec': timeout}),
                     str(tmp_path))
    (failure,) = summary['recoveries']
    assert failure['cause'].startswith('no heartbeat')
    # The launcher asks every PROGRESS_SEC and looks every 0.05 s; silence counts
    # from the last answer, which may precede the SIGSTOP by one request.
    assert timeout - generation.PROGRESS_SEC - 0.05 <= failure['detect_sec'] < timeout + 0.5
    assert summary['final_members'] == [0]
    assert read(str(tmp_path), 'g1_w0_end.json')['finished']


def start_launcher(caches, workdir, *, address=None, **extra):
    """The launcher as a process (as a user or a scheduler runs it)."""
    values = overrides(caches, **extra)
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


def loss_steps(workdir):
    rows = [json.loads(line) for line in open(os.path.join(workdir, 'metrics.jsonl'))]
    return [r['step'] for r in rows if 'loss' in r], rows


def rerun(args, steps):
    args = [a for a in args if not a.startswith(('--config.train.steps=', '--config.launch.kill='))]
    done = subprocess.run(args + [f'--config.train.steps={steps}'], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_ctrl_c_saves_a_step_and_leaves_no_worker_keeper_or_shared_memory(cluster, caches,
                                                                          tmp_path):
    workdir = str(tmp_path)
    launcher, _ = start_launcher(caches, workdir, address=cluster.address, **{'train.steps': 2000})
    wait_for(os.path.join(workdir, 'launch', 'g0_w*_start.json'), launcher)
    keepers = live_keeper_pids(workdir)
    assert len(keepers) == WORKERS
    # Every keeper's first snapshot (after step 1) gives it shared memory to leave behind.
    wait_until(lambda: all(shm.listed(p) for p in keepers), launcher, 'a snapshot in every keeper')
    launcher.send_signal(signal.SIGINT)
    from mecefo_jax.preemption import EXIT_PREEMPTED
    assert launcher.wait(timeout=120) == EXIT_PREEMPTED
    assert_nothing_left(workdir, keepers)


def test_a_job_that_completes_no_step_is_restarted(cluster, caches, tmp_path):
    """Worker 0 stopped, its silence not yet past a long heartbeat timeout: the
    other worker blocks in a collective while its own threads keep answering.
    Only the stalled step count shows the job is stuck. (16 steps: the stop
    lands mid-run, not in the end-of-run phase after the last step.)"""
    # Long enough that a loaded 2-core machine's compile of a later step in the
    # relaunched generation is not taken for a stall.
    stall = 8.0
    summary = launch(overrides(caches, **{'launch.kill': '2:0:STOP', 'train.steps': 16,
                                          'launch.heartbeat_timeout_sec': 1000,
                                          'launch.stall_timeout_sec': stall}), str(tmp_path))
    (stuck,) = summary['recoveries']
    assert stuck['cause'].startswith('no step completed') and stuck['failed_workers'] == []
    assert stall <= stuck['detect_sec'] < stall + 1.0  # asked every 0.2 s, looked at every 0.05 s
    assert stuck['members'] == [0, 1] and stuck['resume'] == 'memory'
    # The stop may catch worker 0 mid-publish: its keeper then holds one step
    # fewer than worker 1's, and the common step is one back. snapshot.every=1
    # and one write in flight bound the loss to that step (the SIGKILL test,
    # whose dead keeper is not consulted, loses none).
    assert stuck['redone_steps'] <= 1
    assert read(str(tmp_path), 'g1_w0_end.json')['finished']


def test_sigterm_to_the_launcher_saves_one_step_and_the_rerun_resumes_there(cluster, caches,
                                                                             tmp_path):
    """Every worker stops at the step JAX's preemption sync picks, saves it to disk
    and ends; the keepers stay until then; the launcher exits with EXIT_PREEMPTED."""
    from mecefo_jax.preemption import EXIT_PREEMPTED
    workdir = str(tmp_path)
    launcher, args = start_launcher(caches, workdir, address=cluster.address, **{
        'train.steps': 2000, 'train.log_every': 1, 'train.checkpoint_every': 1000})
    wait_for(os.path.join(workdir, 'launch', 'g0_w*_start.json'), launcher)
    launcher.send_signal(signal.SIGTERM)
    output = launcher.communicate(timeout=300)[0]
    assert launcher.returncode == EXIT_PREEMPTED, output
    ends = [read(workdir, f'g0_w{w}_end.json') for w in range(WORKERS)]
    saved = ends[0]['final_step']
    assert all(e['preempted'] and e['final_step'] == saved for e in ends)
    assert f'preempted: saved step {saved}' in output
    rerun(args, saved + 2)
    steps, rows = loss_steps(workdir)
    assert {'event': 'resumed', 'step': saved, 'source': 'disk'} in rows
    assert steps == sorted(set(steps)) and steps[-1] == saved + 2  # one row per step


def test_a_stop_that_a_worker_cannot_reach_ends_after_the_stop_timeout(cluster, caches, tmp_path):
    """Worker 1 is SIGSTOPped before the launcher gets SIGTERM, so it never reaches the
    preemption sync and worker 0 waits there for it. The launcher kills them after
    launch.stop_timeout_sec and exits preempted, naming the workers that saved
    nothing. (The heartbeat and stall timeouts are long: only the stop timeout can
    end this job.)"""
    from mecefo_jax.preemption import EXIT_PREEMPTED
    workdir = str(tmp_path)
    launcher, _ = start_launcher(caches, workdir, address=cluster.address, **{
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
    from mecefo_jax.launch import ray_cluster
    with open(os.path.join(workdir, 'launch', 'config.json')) as f:
        record = f.read()
    base = [a for a in args if not a.startswith(('--nprocs', '--config.launch.kill'))]
    for extra, says in (
            (['--nprocs=1', '--config.mesh.data=-1'], 'rerun with the --nprocs it ran with (--nprocs=2)'),
            ([f'--nprocs={WORKERS}', '--config.model.d_model=64'], '--config.model.d_model=32')):
        done = subprocess.run(base + extra, cwd=REPO, capture_output=True, text=True, timeout=600)
        assert done.returncode == 1 and says in done.stdout + done.stderr, done.stdout + done.stderr
        assert ray_cluster.local_cluster(workdir) == host
        with open(os.path.join(workdir, 'launch', 'config.json')) as f:
            assert f.read() == record


def test_a_killed_launchers_rerun_resumes_from_its_keepers_with_nothing_lost(caches, tmp_path):
    """On the default local cluster: the launcher kills itself once every keeper holds
    the snapshot worker 0 was held after (step 6). Its workers go with it; its keepers
    and the local cluster stay. Two mistaken reruns (fewer --nprocs; a config that does
    not fit the snapshots) are refused, naming the fix, and leave the cluster, the keepers
    and launch/config.json as they found them. The same command again finds them and
    resumes there, redoing nothing (each step's samples computed once, the final
    parameters those of the run uninterrupted in one process), then removes them all at
    the end."""
    from mecefo_jax.launch import ray_cluster
    workdir = str(tmp_path)
    launcher, args = start_launcher(caches, workdir, **{
        'train.steps': 10, 'train.log_every': 1, 'snapshot.every': 3,
        'launch.kill': '5:launcher:KILL:snapshot'})
    output = launcher.communicate(timeout=600)[0]
    assert launcher.returncode == -signal.SIGKILL, output
    host = ray_cluster.local_cluster(workdir)
    assert host is not None, 'the local cluster died with the launcher'
    assert read(workdir, 'launcher_killed.json')['where'].startswith(
        'held after its snapshot of step 6')
    workers_before = worker_pids(workdir)
    deadline = time.monotonic() + 30  # Ray ends a dead driver's actors
    while [p for p in workers_before if shm.alive(p)]:
        assert time.monotonic() < deadline, 'workers outlived their launcher'
        time.sleep(0.2)
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
    assert ray_cluster.local_cluster(workdir) is None and not shm.alive(host['pid'])
    values = overrides(caches, **{'train.steps': 10, 'snapshot.every': 3})
    final = final_provenance(workdir, values)
    assert all(row['replicas'] == [0, 1, 2, 3] for row in final.values())  # none was down
    (tmp_path / 'simulated').mkdir()
    assert_params_equal_simulated(workdir, config(values), tmp_path / 'simulated', replicas=4)


def test_cleanup_removes_what_a_killed_launcher_left_and_the_rerun_resumes_from_disk(
        cluster, caches, tmp_path):
    """Memory mode writes the disk tier too: with the keepers removed (--cleanup), the
    rerun of the same command resumes from the newest Orbax checkpoint."""
    workdir = str(tmp_path)
    launcher, args = start_launcher(caches, workdir, address=cluster.address, **{
        'train.steps': 2000, 'train.log_every': 1, 'train.checkpoint_every': 3})
    wait_for(os.path.join(workdir, 'checkpoints', '6'), launcher)
    launcher.kill()
    launcher.wait(timeout=60)
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
    # The newest step, or the one before it if the kill cut its save short.
    assert resumed and resumed[-1]['source'] == 'disk' and 6 <= resumed[-1]['step'] <= newest
    assert steps == list(range(1, newest + 3))  # one loss row per step after the resume


def test_a_program_error_stops_the_job_at_once_with_the_workers_error(cluster, caches, tmp_path):
    """Every worker raises the same FileNotFoundError (a data path that does not
    exist): a relaunch would fail again, so the launcher stops after one
    generation and shows the traceback's end from the worker's log."""
    from mecefo_jax.launch.exits import WorkerProgramError
    missing = str(tmp_path / 'no_such_corpus.txt')
    with pytest.raises(WorkerProgramError, match='matches no files') as raised:
        launch(overrides(caches, **{'data.source': 'text', 'data.text_files': missing}),
               str(tmp_path))
    assert 'program error (FileNotFoundError' in str(raised.value)
    summary = read(str(tmp_path), 'summary.json')
    assert summary['generations'] == 1 and summary['program_error']['workers']
    (row,) = summary['recoveries']
    assert row['kind'] == 'program_error' and 'matches no files' in row['error']
    assert not os.path.exists(os.path.join(tmp_path, 'launch', 'g1_w0.log'))


def test_a_dead_keeper_is_a_crash_of_its_worker_and_the_job_goes_on_from_the_peers(
        cluster, caches, tmp_path):
    """Worker 1's keeper alone is SIGKILLed after step 3. Its worker meets the loss at its
    next snapshot and ends as a crash ('its keeper died'), not a program error: once that
    stopped the job and removed every other keeper. Worker 0 goes on from its own keeper
    under MeCeFO; worker 1 comes back 2 steps later with a new keeper and heals from its
    peer's."""
    workdir = str(tmp_path)
    summary = launch(overrides(caches, **{'launch.kill': '3:1:keeper', 'train.steps': 10,
                                          'launch.return_after_steps': 2}), workdir)
    failure, rejoin = summary['recoveries']
    assert failure['kind'] == 'failure' and failure['failed_workers'] == [1]
    assert failure['deaths'] == {'1': 'its keeper died'}
    assert failure['members'] == [0] and failure['resume'] == 'memory'
    assert failure['redone_steps'] == 0
    assert rejoin['kind'] == 'rejoin' and rejoin['members'] == [0, 1]
    assert rejoin['healed_bytes'] > 0 and rejoin['redone_steps'] == 0
    ends = [read(workdir, f'g2_w{w}_end.json') for w in range(WORKERS)]
    assert all(e['finished'] and e['final_step'] == 10 for e in ends)
    assert ends[0]['params_sha256'] == ends[1]['params_sha256']
    assert summary['program_error'] is None


def test_two_workers_killed_at_once_are_both_recorded_and_neither_survives(cluster, caches,
                                                                            tmp_path):
    """Both workers held inside their publish of HELD_STEP and SIGKILLed together."""
    summary = launch(overrides(caches, **{
        'launch.kill': f'{HELD_STEP}:0:KILL:publish,{HELD_STEP}:1:KILL:publish',
        'train.steps': 6}), str(tmp_path))
    (failure,) = summary['recoveries']
    assert failure['failed_workers'] == [0, 1]
    assert failure['deaths'] == {'0': 'killed by SIGKILL', '1': 'killed by SIGKILL'}
    # No survivor: both come back, from the step both keepers hold.
    assert failure['members'] == [0, 1] and failure['resume'] == 'memory'
    assert failure['resume_step'] == HELD_STEP - 1
    assert all(read(str(tmp_path), f'g1_w{w}_end.json')['finished'] for w in range(WORKERS))


def test_a_generation_that_completes_no_step_within_the_start_timeout_has_failed(
        cluster, caches, tmp_path):
    """Worker 1 SIGSTOPped at its first progress report, while it is still starting;
    its silence is not yet past a long heartbeat timeout, and worker 0 waits for it
    in jax.distributed. No step ever completes: launch.start_timeout_sec ends it
    (max_relaunches=0 stops the job there, so the test waits for one timeout only)."""
    start_timeout = 3.0
    logs = []
    cfg = config(overrides(caches, **{'launch.kill': '0:1:STOP',
                                      'launch.heartbeat_timeout_sec': 1000,
                                      'launch.start_timeout_sec': start_timeout,
                                      'launch.max_relaunches': 0}))
    with pytest.raises(RuntimeError, match='Gave up after 0 relaunches'):
        Launcher(cfg, str(tmp_path), WORKERS, log=logs.append).run()
    hung = [line for line in logs if 'no step completed' in line]
    assert hung and 'launch.start_timeout_sec' in hung[0], logs
    assert not glob.glob(os.path.join(tmp_path, 'launch', 'g0_w*_start.json'))
    (row,) = read(str(tmp_path), 'summary.json')['recoveries']
    assert row['kind'] == 'gave_up' and row['cause'].startswith('no step completed')
