"""Deaths that once cost a run or a healthy worker, survived (tests/launch_jobs.py's job).

One job carries both deaths, each asserted on its own recovery rows. The
coordinator's host (worker 0) SIGKILLed: the workers JAX's runtime ends after
it are echoes, relaunched as survivors; only worker 0 is failed. Then, with
worker 0 back, every worker and keeper lost at once: nothing is left in memory,
and the launcher says so and restarts from the disk tier.
"""
import pytest
from launch_jobs import WORKERS, config, overrides, read

from mecefo_jax.launch.launcher import Launcher

pytestmark = [pytest.mark.subprocess, pytest.mark.ray]  # Ray's processes and workers

# Worker 1 alone runs 2 steps past the first death (at most a step or two past 4): it
# cannot reach ALL_LOST_STEP before worker 0 is back.
COORDINATOR_STEP, ALL_LOST_STEP, STEPS = 4, 10, 14


@pytest.fixture(scope='module')
def deaths(cluster, launcher_caches, tmp_path_factory):
    """Worker 0 SIGKILLed at step 4, back 2 steps later; both workers SIGKILLed with their
    keepers at step 10; Orbax checkpoints every 2 steps. (The launcher's log, kept.)"""
    workdir = str(tmp_path_factory.mktemp('deaths'))
    logs = []
    kills = f'{COORDINATOR_STEP}:0:KILL,{ALL_LOST_STEP}:0:KILL:keeper,{ALL_LOST_STEP}:1:KILL:keeper'
    cfg = config(overrides(launcher_caches, **{'launch.kill': kills, 'train.steps': STEPS,
                                               'launch.return_after_steps': 2,
                                               'train.checkpoint_every': 2}))
    summary = Launcher(cfg, workdir, WORKERS, log=logs.append).run()
    return summary, workdir, logs


def test_the_coordinators_death_fails_worker_0_alone_and_the_rest_go_on(deaths):
    """Worker 0 hosts jax.distributed's coordinator. SIGKILLed at step 4, it takes the
    service with it and JAX may end worker 1 too; worker 1 is relaunched as the survivor
    (its keeper holds its state) and worker 0 rejoins 2 steps later."""
    summary, workdir, _ = deaths
    failure, rejoin = summary['recoveries'][:2]
    assert failure['failed_workers'] == [0] and failure['deaths'] == {'0': 'killed by SIGKILL'}
    assert failure['members'] == [1] and failure['resume'] == 'memory'
    # If worker 1 died in the settle window, it is the kill's echo, not a failure.
    assert set(failure.get('echo_errors', {})) <= {'1'}
    assert rejoin['kind'] == 'rejoin' and rejoin['members'] == [0, 1]
    # Both trained on together until the next death, then to the end.
    assert summary['recoveries'][2]['completed_steps'] >= ALL_LOST_STEP
    ends = [read(workdir, f'g3_w{w}_end.json') for w in range(WORKERS)]
    assert all(e['finished'] and e['final_step'] == STEPS for e in ends)
    assert ends[0]['params_sha256'] == ends[1]['params_sha256']


def test_with_every_worker_and_keeper_lost_the_job_falls_back_to_disk_and_says_so(deaths):
    """Both workers SIGKILLed with their keepers at step 10: no copy is left in memory.
    The launcher says so and restarts every worker from the newest Orbax checkpoint
    (every 2 steps; the save of step 4 starts only once step 2's is complete, so step 2
    at least is on disk by then)."""
    summary, workdir, logs = deaths
    (failure,) = summary['recoveries'][2:]
    assert failure['failed_workers'] == [0, 1] and failure['resume'] == 'disk'
    assert failure['members'] == [0, 1]
    assert failure['fallback'].startswith("no copy of the job's state is left in memory")
    assert any('no copy of the job' in line for line in logs), logs
    assert 2 <= failure['resume_step'] <= failure['completed_steps']
    assert failure['resume_step'] % 2 == 0  # a checkpoint's step
    assert all(read(workdir, f'g3_w{w}_end.json')['finished'] for w in range(WORKERS))
    assert summary['program_error'] is None
