"""The crash drill's readers of a job's records (the drill itself is a benchmark)."""
import json
import os

import pytest

from mecefo_jax.experiments import crash_drill, crash_drill_jobs


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
    from mecefo_jax.config_resolve import resolve
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
    from mecefo_jax.config_resolve import resolve
    monkeypatch.setattr(crash_drill_jobs, 'Launcher', Preempted)
    with pytest.raises(crash_drill_jobs.DrillStopped, match='memory job .* saved step 7'):
        crash_drill_jobs.run_job(resolve(get_config()), {}, str(tmp_path / 'memory'), 4,
                                 log=lambda _: None)
