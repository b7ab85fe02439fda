"""The launcher on Ray surviving real crashes, run in the test's process (tests/launch_jobs.py's job).

The session's shared simulated Ray cluster of 2 nodes (a worker on each).
Each generation starts its worker processes afresh, so one job carries several
of the deaths asserted here where they do not interfere, each asserted on its
own recovery row: one job is SIGKILLed and recovered from the keepers' memory,
rejoined, then loses worker 1's keeper and rejoins again; another loses both
workers at once, then has a worker SIGSTOPped (a hang) and detected by its
silence; another is stalled with its threads still answering; a plain kill's job is
read back from the real `tensorboard` server too. The launcher run
as a process (interrupted, stopped, killed, cleaned up) is
tests/launcher_process_test.py's; node losses are tests/node_loss_test.py's;
snapshot publication under a crash, parity rebuilds and the two-lost-members
error are tests/snapshot_test.py's and tests/parity_test.py's.
"""
import glob
import json
import os

import numpy as np
import pytest
from launch_jobs import STEPS, WORKERS, assert_nothing_left, config, final_provenance, launch, overrides, read
from simulated_params import assert_params_equal_simulated
from tensorboard_server import assert_every_metric_once, serve

from mecefo_jax.config.resolve import updated
from mecefo_jax.launch import generation
from mecefo_jax.launch.launcher import Launcher
from mecefo_jax.training.metrics import read_metrics
from mecefo_jax.training.summaries import LAUNCH_RUN, TRAIN_RUN

pytestmark = [pytest.mark.subprocess, pytest.mark.ray]  # Ray's processes and workers; the TensorBoard server

# The crashed job's worker is killed while held inside its publish of
# HELD_STEP (the job cannot run on past it); once it is back, its keeper alone is
# killed after KEEPER_STEP; STEPS leave room for each rejoin 2 steps after its relaunch.
HELD_STEP = 3
KEEPER_STEP = 8


@pytest.fixture(scope='module')
def crashed(cluster, launcher_caches, tmp_path_factory):
    """Worker 1 SIGKILLed inside its publish of step 3, back 2 steps after the relaunch;
    then its keeper alone SIGKILLed after step 8, and worker 1 back 2 steps later again.

    The worker stops after copying step 3's bytes into its keeper and before
    publishing them, says so in its progress report, and the launcher kills it
    there: the kill lands at the same point in every run. The keeper's death is
    met by its worker at its next snapshot.
    """
    workdir = str(tmp_path_factory.mktemp('crashed'))
    # The whole-state snapshot (snapshot.shard=False): the survivor's own keeper holds
    # everything. The sharded default's crashes are tests/sharded_launch_test.py's.
    summary = launch(overrides(launcher_caches, **{
        'launch.kill': f'{HELD_STEP}:1:KILL:publish,{KEEPER_STEP}:1:keeper',
        'launch.return_after_steps': 2,
        'snapshot.shard': False}), workdir)
    return summary, workdir


def test_a_kill_after_a_snapshot_lands_on_the_snapshotted_step_whatever_the_interval(
        cluster, launcher_caches, tmp_path):
    """Asked for at step 4 with snapshots every 3 steps: worker 1 holds its loop after
    publishing step 6, the launcher waits until both keepers hold 6 and kills it there,
    and the survivor resumes at 6 with nothing redone. A kill at plain step 4 would
    have redone 1 step (the crash drill's memory job kills this way)."""
    workdir = str(tmp_path)
    summary = launch(overrides(launcher_caches, **{'launch.kill': '4:1:KILL:snapshot',
                                          'snapshot.every': 3, 'train.steps': 8}), workdir)
    (failure,) = summary['recoveries']
    assert failure['kind'] == 'failure' and failure['failed_workers'] == [1]
    assert failure['injected_at'] == 'held after its snapshot of step 6, which every keeper holds'
    assert failure['resume_step'] == failure['completed_steps'] == 6
    assert failure['redone_steps'] == 0
    assert read(workdir, 'g1_w0_end.json')['final_step'] == 8


PLAIN_KILL = {'launch.kill': '7:1', 'snapshot.every': 5, 'train.checkpoint_every': 2,
              'train.steps': 12, 'train.log_every': 1}


@pytest.fixture(scope='module')
def plain_kill(cluster, launcher_caches, tmp_path_factory):
    """Worker 1 SIGKILLed wherever the step the launcher sees as done finds it (7 to 9), with
    snapshots every 5 steps and Orbax checkpoints every 2: (summary, workdir, overrides).
    Its recovery is asserted below, its TensorBoard log read back from the real server
    in the test after."""
    workdir = str(tmp_path_factory.mktemp('plain_kill'))
    values = overrides(launcher_caches, **PLAIN_KILL)
    return launch(values, workdir), workdir, values


def test_a_plain_kill_resumes_from_the_newer_tier_and_counts_what_it_redoes(plain_kill):
    """The survivor resumes from whichever tier holds the newer step (the disk's 6 or 8
    over the keepers' 5, unless the kill lands past step 10).

    redone_steps must equal what worker 0, which survives and writes metrics.jsonl (a
    loss row per completed step), had recorded past the resumed step, as its resume's
    cut reports it. Worker 1 may die a step or two past the step the launcher saw,
    after joining the collectives of a step the survivor then finishes: the launcher's
    routine reports could miss it, and redone_steps fell one short (again under load,
    where the survivor's report of that step came after the launcher's last ask): the
    launcher now reads the newest loss row once the generation's processes are gone."""
    summary, workdir, values = plain_kill
    (failure,) = summary['recoveries']
    assert failure['kind'] == 'failure' and failure['failed_workers'] == [1]
    held = failure['newest_held_by_worker']['0']
    assert failure['resume_step'] == max(held, failure['newest_checkpoint'])
    assert failure['resume'] == ('disk' if failure['newest_checkpoint'] > held else 'memory')
    (resumed,) = [r for r in read_metrics(workdir) if r.get('event') == 'resumed']
    assert (resumed['step'], resumed['source']) == (failure['resume_step'], failure['resume'])
    assert failure['completed_steps'] == resumed.get('dropped_through', resumed['step'])
    assert failure['redone_steps'] == failure['completed_steps'] - failure['resume_step']
    final = final_provenance(workdir, values)  # every step once, on the right batch
    assert final[failure['resume_step']]['replicas'] == [0, 1]  # worker 1's are down


def test_the_plain_kills_tensorboard_log_shows_each_step_once_and_the_recovery(plain_kill):
    """Read back from the real `tensorboard` server: the `train` run holds every
    metrics.jsonl step once, with the values of the generation that finished it (the
    relaunch redid the steps past the tier it resumed from); the launcher's `launch` run
    holds the failure's series at the step it hit."""
    summary, workdir, _ = plain_kill
    (failure,) = summary['recoveries']
    assert failure['redone_steps'] >= 1
    with serve(workdir, wait_for_run=f'tensorboard/{LAUNCH_RUN}') as server:
        train = server.scalars(f'tensorboard/{TRAIN_RUN}')
        recovery = server.scalars(f'tensorboard/{LAUNCH_RUN}')
    assert_every_metric_once(workdir, train)
    steps = PLAIN_KILL['train.steps']
    assert [s for s, _ in sorted(train['train/loss'])] == list(range(1, steps + 1))
    assert dict(train['fault/replicas'])[steps] == 2  # worker 1's two replicas stay down
    assert 'cost/snapshot_block_sec' in train
    at = failure['completed_steps']
    for key in ('recovery_sec', 'detect_sec', 'restore_sec', 'compile_sec', 'redone_steps', 'resume_step'):
        ((step, value),) = recovery[f'launch/failure/{key}']
        assert step == at and np.float32(value) == np.float32(failure[key]), key
    assert recovery['launch/failure/failed_workers'] == [(at, 1.0)]
    assert recovery['launch/live_workers'] == [(at, 1.0)]  # the survivor, relaunched


def test_a_kill_after_a_snapshot_needs_snapshots(cluster, launcher_caches, tmp_path):
    with pytest.raises(ValueError, match='needs snapshots'):
        launch(overrides(launcher_caches, **{'launch.kill': '4:1:KILL:snapshot', 'snapshot.every': 0}),
               str(tmp_path))


def test_the_job_survives_a_sigkill_from_the_keepers_memory_and_rejoins(crashed):
    summary, workdir = crashed
    failure, rejoin = summary['recoveries'][:2]
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
    # The way back's parts follow each other: they add up to the recovery, none negative.
    parts = failure['way_back_sec']
    assert min(parts.values()) >= 0, parts
    assert sum(parts.values()) == pytest.approx(failure['recovery_sec'], abs=1e-6)
    assert sum(failure['badput_sec'].values()) == pytest.approx(failure['recovery_sec'], abs=1e-6)
    assert rejoin['kind'] == 'rejoin' and rejoin['members'] == [0, 1]
    assert rejoin['resume_step'] == failure['resume_step'] + 2
    # The returning worker's keeper holds only its pre-crash snapshots: it heals from its peer.
    assert rejoin['healed_bytes'] > 0 and rejoin['redone_steps'] == 0
    assert failure['healed_bytes'] == 0  # the survivor had everything in its own keeper
    # The rejoined generation ran on until worker 1's keeper was killed (the next test's).
    assert summary['recoveries'][2]['completed_steps'] >= KEEPER_STEP
    ends = [read(workdir, f'g4_w{w}_end.json') for w in range(WORKERS)]
    assert all(e['finished'] and e['final_step'] == STEPS for e in ends)
    # Surviving and returning workers hold bitwise-identical replicas.
    assert ends[0]['params_sha256'] == ends[1]['params_sha256']
    # Each worker ran on its own node; the job's keepers went with it.
    assert len(set(summary['nodes'].values())) == WORKERS
    assert_nothing_left(workdir)


def _down_starts(workdir) -> list[int]:
    """The steps from which worker 1's replicas were down (for 2 steps), one per failure."""
    recoveries = json.load(open(os.path.join(workdir, 'launch', 'summary.json')))['recoveries']
    return [r['resume_step'] for r in recoveries if r['kind'] == 'failure']


def test_every_sample_of_every_step_is_computed_exactly_once(crashed, launcher_caches):
    _, workdir = crashed
    final = final_provenance(workdir, overrides(launcher_caches))
    starts = _down_starts(workdir)
    assert len(starts) == 2
    down = {step for start in starts for step in range(start, start + 2)}
    for step in range(STEPS):  # worker 1's replicas were absent and their shards were adopted
        assert final[step]['replicas'] == ([0, 1] if step in down else [0, 1, 2, 3]), step


def test_final_parameters_equal_the_same_failure_simulated_in_one_process(crashed, launcher_caches,
                                                                          tmp_path):
    _, workdir = crashed
    # Worker 1's replicas, down for 2 steps after each failure.
    events = ','.join(f'{start}:{r}:2' for start in _down_starts(workdir) for r in (2, 3))
    cfg = updated(config(overrides(launcher_caches)), {'fault.events': events})
    assert_params_equal_simulated(workdir, cfg, tmp_path, replicas=4)


def test_a_job_that_completes_no_step_is_restarted(cluster, launcher_caches, tmp_path):
    """Worker 0 stopped, its silence not yet past a long heartbeat timeout: the
    other worker blocks in a collective while its own threads keep answering.
    Only the stalled step count shows the job is stuck. (16 steps: the stop
    lands mid-run, not in the end-of-run phase after the last step.)"""
    # Long enough that a loaded 2-core machine's compile of a later step in the
    # relaunched generation is not taken for a stall.
    stall = 8.0
    summary = launch(overrides(launcher_caches, **{'launch.kill': '2:0:STOP', 'train.steps': 16,
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


def test_a_program_error_stops_the_job_at_once_with_the_workers_error(cluster, launcher_caches, tmp_path):
    """Every worker raises the same FileNotFoundError (a data path that does not
    exist): a relaunch would fail again, so the launcher stops after one
    generation and shows the traceback's end from the worker's log."""
    from mecefo_jax.launch.generation import WorkerProgramError
    missing = str(tmp_path / 'no_such_corpus.txt')
    with pytest.raises(WorkerProgramError, match='matches no files') as raised:
        launch(overrides(launcher_caches, **{'data.source': 'text', 'data.text_files': missing}),
               str(tmp_path))
    assert 'program error (FileNotFoundError' in str(raised.value)
    summary = read(str(tmp_path), 'summary.json')
    assert summary['generations'] == 1 and summary['program_error']['workers']
    (row,) = summary['recoveries']
    assert row['kind'] == 'program_error' and 'matches no files' in row['error']
    assert not os.path.exists(os.path.join(tmp_path, 'launch', 'g1_w0.log'))


def test_a_dead_keeper_is_a_crash_of_its_worker_and_the_job_goes_on_from_the_peers(crashed):
    """Worker 1's keeper alone is SIGKILLed after step 8 (the crashed job's second death,
    with both workers back). Its worker meets the loss at its next snapshot and ends as a
    crash ('its keeper died'), not a program error: once that stopped the job and removed
    every other keeper. Worker 0 goes on from its own keeper under MeCeFO; worker 1 comes
    back 2 steps later with a new keeper and heals from its peer's."""
    summary, workdir = crashed
    failure, rejoin = summary['recoveries'][2:]
    assert failure['kind'] == 'failure' and failure['failed_workers'] == [1]
    assert failure['deaths'] == {'1': 'its keeper died'}
    assert failure['members'] == [0] and failure['resume'] == 'memory'
    assert failure['redone_steps'] == 0
    assert rejoin['kind'] == 'rejoin' and rejoin['members'] == [0, 1]
    assert rejoin['healed_bytes'] > 0 and rejoin['redone_steps'] == 0
    ends = [read(workdir, f'g4_w{w}_end.json') for w in range(WORKERS)]
    assert all(e['finished'] and e['final_step'] == STEPS for e in ends)
    assert ends[0]['params_sha256'] == ends[1]['params_sha256']
    assert summary['program_error'] is None


# The two-deaths job: both workers are SIGKILLed inside their publish of HELD_STEP; once
# both are back, worker 1 is SIGSTOPped after HUNG_STEP (a hang) and never returns.
HUNG_STEP = 5
HEARTBEAT_TIMEOUT = 3.0


@pytest.fixture(scope='module')
def two_deaths(cluster, launcher_caches, tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp('two_deaths'))
    summary = launch(overrides(launcher_caches, **{
        'launch.kill': f'{HELD_STEP}:0:KILL:publish,{HELD_STEP}:1:KILL:publish,{HUNG_STEP}:1:STOP',
        'train.steps': 8, 'launch.heartbeat_timeout_sec': HEARTBEAT_TIMEOUT}), workdir)
    # Two injected failures, so three generations; any other failure is named here.
    assert summary['generations'] == 3, [(r['kind'], r.get('cause'), r.get('failed_workers'))
                                         for r in summary['recoveries']]
    return summary, workdir


def test_two_workers_killed_at_once_are_both_recorded_and_neither_survives(two_deaths):
    """Both workers held inside their publish of HELD_STEP and SIGKILLed together."""
    summary, workdir = two_deaths
    failure = summary['recoveries'][0]
    assert failure['failed_workers'] == [0, 1]
    assert failure['deaths'] == {'0': 'killed by SIGKILL', '1': 'killed by SIGKILL'}
    # No survivor: both come back, from the step both keepers hold, and train on together
    # (the next death lands in that generation, past HUNG_STEP).
    assert failure['members'] == [0, 1] and failure['resume'] == 'memory'
    assert failure['resume_step'] == HELD_STEP - 1
    assert all(os.path.exists(os.path.join(workdir, 'launch', f'g1_w{w}_start.json'))
               for w in range(WORKERS))
    assert summary['recoveries'][1]['completed_steps'] >= HUNG_STEP


def test_a_hung_worker_is_detected_by_its_silence(two_deaths):
    summary, workdir = two_deaths
    (failure,) = summary['recoveries'][1:]
    assert failure['cause'].startswith('no heartbeat') and failure['failed_workers'] == [1]
    # The launcher asks every PROGRESS_SEC and looks every 0.05 s; silence counts
    # from the last answer, which may precede the SIGSTOP by one request.
    assert HEARTBEAT_TIMEOUT - generation.PROGRESS_SEC - 0.05 <= failure['detect_sec'] < HEARTBEAT_TIMEOUT + 0.5
    assert summary['final_members'] == [0]
    assert read(workdir, 'g2_w0_end.json')['finished']


def test_a_generation_that_completes_no_step_within_the_start_timeout_has_failed(
        cluster, launcher_caches, tmp_path):
    """Worker 1 SIGSTOPped at its first progress report, while it is still starting;
    its silence is not yet past a long heartbeat timeout, and worker 0 waits for it
    in jax.distributed. No step ever completes: launch.start_timeout_sec ends it
    (max_relaunches=0 stops the job there, so the test waits for one timeout only).
    On a loaded host the actors may not even answer within the timeout: that start
    timed out the same way (tests/watchdog_test.py holds that path alone)."""
    start_timeout = 3.0
    logs = []
    cfg = config(overrides(launcher_caches, **{'launch.kill': '0:1:STOP',
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

