"""Deaths that once cost a run or a healthy worker, survived (tests/launch_jobs.py's job).

Every worker and keeper lost at once: nothing is left in memory, and the
launcher says so and restarts from the disk tier. The coordinator's host
(worker 0) SIGKILLed: the workers JAX's runtime ends after it are echoes,
relaunched as survivors; only worker 0 is failed.
"""
import pytest
from launch_jobs import WORKERS, config, overrides, read

from mecefo_jax.launch.supervisor import Launcher

pytestmark = [pytest.mark.subprocess, pytest.mark.ray]  # Ray's processes and workers


def test_with_every_worker_and_keeper_lost_the_job_falls_back_to_disk_and_says_so(
        cluster, launcher_caches, tmp_path):
    """Both workers SIGKILLed with their keepers at step 6: no copy is left in memory.
    The launcher says so and restarts every worker from the newest Orbax checkpoint
    (every 2 steps; the save of step 4 starts only once step 2's is complete, so step 2
    at least is on disk by then)."""
    logs = []
    cfg = config(overrides(launcher_caches, **{'launch.kill': '6:0:KILL:keeper,6:1:KILL:keeper',
                                      'train.steps': 10, 'train.checkpoint_every': 2}))
    summary = Launcher(cfg, str(tmp_path), WORKERS, log=logs.append).run()
    (failure,) = summary['recoveries']
    assert failure['failed_workers'] == [0, 1] and failure['resume'] == 'disk'
    assert failure['members'] == [0, 1]
    assert failure['fallback'].startswith("no copy of the job's state is left in memory")
    assert any('no copy of the job' in line for line in logs), logs
    assert 2 <= failure['resume_step'] <= failure['completed_steps']
    assert failure['resume_step'] % 2 == 0  # a checkpoint's step
    assert all(read(str(tmp_path), f'g1_w{w}_end.json')['finished'] for w in range(WORKERS))
    assert summary['program_error'] is None



def test_the_coordinators_death_fails_worker_0_alone_and_the_rest_go_on(cluster, launcher_caches,
                                                                        tmp_path):
    """Worker 0 hosts jax.distributed's coordinator. SIGKILLed at step 4, it takes the
    service with it and JAX may end worker 1 too; worker 1 is relaunched as the survivor
    (its keeper holds its state) and worker 0 rejoins 2 steps later."""
    summary = Launcher(config(overrides(launcher_caches, **{
        'launch.kill': '4:0:KILL', 'train.steps': 10, 'launch.return_after_steps': 2})),
        str(tmp_path), WORKERS, log=lambda _: None).run()
    failure, rejoin = summary['recoveries']
    assert failure['failed_workers'] == [0] and failure['deaths'] == {'0': 'killed by SIGKILL'}
    assert failure['members'] == [1] and failure['resume'] == 'memory'
    # If worker 1 died in the settle window, it is the kill's echo, not a failure.
    assert set(failure.get('echo_errors', {})) <= {'1'}
    assert rejoin['kind'] == 'rejoin' and rejoin['members'] == [0, 1]
    ends = [read(str(tmp_path), f'g2_w{w}_end.json') for w in range(WORKERS)]
    assert all(e['finished'] and e['final_step'] == 10 for e in ends)
    assert ends[0]['params_sha256'] == ends[1]['params_sha256']
