"""The crash drill's readers of a job's records (the drill itself is a benchmark)."""
import json
import os

import pytest

from tests.drills import crash_drill, crash_drill_jobs


def write_ends(workdir, generation, ends):
    os.makedirs(os.path.join(workdir, 'launch'), exist_ok=True)
    for worker, end in enumerate(ends):
        with open(os.path.join(workdir, 'launch', f'g{generation}_w{worker}_end.json'), 'w') as f:
            json.dump(end, f)


def test_step_and_interval_come_from_the_last_generation(tmp_path):
    summary = {'recoveries': [{'next_generation': 1}, {'next_generation': 2}]}
    # The degraded generation 1 is not the job's normal step; generation 2 is.
    write_ends(tmp_path, 1, [{'median_step_sec': 9.0,
                              'snapshot_cadence': [{'step': 20, 'interval': 7}]}])
    write_ends(tmp_path, 2, [
        {'median_step_sec': 0.020, 'snapshot_cadence': [{'step': 30, 'interval': 3}]},
        {'median_step_sec': 0.030, 'snapshot_cadence': [{'step': 30, 'interval': 3}]},
        {'median_step_sec': None, 'snapshot_cadence': None}])
    assert crash_drill_jobs.step_sec(summary, str(tmp_path)) == pytest.approx(0.025)
    assert crash_drill_jobs.chosen_interval(summary, str(tmp_path), 'auto') == 3
    assert crash_drill_jobs.chosen_interval(summary, str(tmp_path), 5) == 5


def test_an_auto_job_too_short_to_choose_has_no_interval(tmp_path):
    write_ends(tmp_path, 0, [{'median_step_sec': 0.02, 'snapshot_cadence': []}])
    assert crash_drill_jobs.chosen_interval({'recoveries': []}, str(tmp_path), 'auto') is None


def test_a_drill_refuses_a_directory_a_previous_drill_left_behind(tmp_path):
    """Its jobs would resume from the old checkpoints: the simulated run once did, silently
    finishing at step 40 without training, and the drill compared against that."""
    from configs.tiny import get_config
    from mecefo_jax.config.resolve import resolve
    os.makedirs(tmp_path / 'simulated' / 'checkpoints' / '40')
    with pytest.raises(ValueError, match='is not empty'):
        crash_drill.run_drill(resolve(get_config()), 'configs/tiny.py', str(tmp_path),
                              kill_step=20, return_after=10, checkpoint_every=10)


def test_a_preempted_job_ends_the_drill(monkeypatch, tmp_path):
    """SIGTERM makes the launcher save and return; the drill must not go on to its next job."""
    class Preempted:
        def __init__(self, *args, **kwargs):
            pass

        def run(self):
            return {'preempted_at': 7, 'recoveries': []}

    from configs.tiny import get_config
    from mecefo_jax.config.resolve import resolve
    monkeypatch.setattr(crash_drill_jobs, 'Launcher', Preempted)
    with pytest.raises(crash_drill_jobs.DrillStopped, match='memory job .* saved step 7'):
        crash_drill_jobs.run_job(resolve(get_config()), {}, str(tmp_path / 'memory'), 4,
                                 log=lambda _: None)


def test_random_kill_steps_are_uniform_over_the_range_and_the_same_for_a_seed():
    from tests.drills import crash_drill_random as rnd
    steps = rnd.kill_steps(0, 2000, 44, 71)
    assert steps == rnd.kill_steps(0, 2000, 44, 71) and steps != rnd.kill_steps(1, 2000, 44, 71)
    assert min(steps) == 44 and max(steps) == 71  # both ends drawn, nothing outside
    counts = [steps.count(s) for s in range(44, 72)]
    assert max(counts) < 2 * min(counts)  # 28 values, ~71 draws each: none twice another
    # Under auto, kills come after its choice (settling and probing snapshot otherwise).
    assert rnd.first_chosen_step('auto') == 43 and rnd.first_chosen_step(4) == 1


def test_random_kills_report_each_kills_loss_and_what_disk_would_lose(monkeypatch, tmp_path):
    """Jobs faked: each recovery row as the launcher writes it; the drill's figures from them."""
    from configs.tiny import get_config
    from mecefo_jax.config.resolve import resolve
    from tests.drills import crash_drill_random as rnd
    made = []

    def fake_job(cfg, values, workdir, workers, log):
        step = int(values['launch.kill'].split(':')[0])
        made.append(values)
        os.makedirs(os.path.join(workdir, 'launch'))
        with open(os.path.join(workdir, 'launch', 'g0_w0.log'), 'w') as f:
            f.write('[worker 0] snapshot.every=auto: every 10 step(s) from step 43 (...)\n')
        done = step + 1
        return {'recoveries': [{'kind': 'failure', 'resume_step': done - done % 10,
                                'completed_steps': done, 'redone_steps': done % 10,
                                'recovery_sec': 2.0, 'resume': 'memory'}]}

    monkeypatch.setattr(rnd, 'run_job', fake_job)
    ahead = []
    monkeypatch.setattr(rnd, 'compile_ahead', lambda cfg, values, *a: ahead.append(values))
    out = rnd.random_kills(resolve(get_config()), {}, str(tmp_path), 2, checkpoint_every=10,
                           seed=3, kills=3, log=lambda _: None)
    assert out['steps'] == 43 + 30 and len(out['kills']) == 3
    assert len(ahead) == 1 and ahead[0]['train.steps'] == 73  # the jobs' programs, once
    for kill, values in zip(out['kills'], made):
        assert values['train.steps'] == 73 and values['train.checkpoint_every'] == 10
        assert 44 <= kill['kill_step'] <= 71 and kill['snapshot_every'] == 10
        assert kill['lost_steps'] == kill['disk_would_lose'] == (kill['kill_step'] + 1) % 10
    assert out['mean_lost_steps'] == pytest.approx(
        sum(k['lost_steps'] for k in out['kills']) / 3)
    assert out['max_lost_steps'] == max(k['lost_steps'] for k in out['kills'])
