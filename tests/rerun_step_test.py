"""What a rerun takes over from a killed launcher: the step its keepers hold, its open row.

`recovery.rerun_step`: job records as a launcher leaves them (provenance rows per
step, start records per generation) and keepers as sets of published steps, no Ray.
The case that made the rule: worker 1 was down when the launcher died, so its keeper
holds only steps from before its death, and worker 0's keeper holds the whole state of
the newer steps. `recovery.record_left`: the recovery row a launcher held open
when it was killed (the chaos smoke with 2 workers killed it 90 ms after the recovered
generation's first step, before its poll saw the step) is recorded by the rerun.
"""
import json
import os

import pytest

from mecefo_jax.launch import recovery
from mecefo_jax.launch.recovery import rerun_step


class Keepers:
    def __init__(self, held):
        self.held = held

    def steps(self, worker):
        return set(self.held.get(worker, ()))


def _records(out_dir, generations_of_steps, members):
    """provenance.jsonl: one row per step (0-indexed, as process 0 writes it); start records."""
    with open(os.path.join(out_dir, 'provenance.jsonl'), 'w') as f:
        for step, generation in generations_of_steps:
            f.write(json.dumps({'generation': generation, 'step': step}) + '\n')
        f.write('{"generation": 1, "st')  # a row cut short by the crash
    for generation, workers in members.items():
        for w in workers:
            open(os.path.join(out_dir, f'g{generation}_w{w}_start.json'), 'w').close()


def test_a_step_written_by_the_survivors_alone_is_whole_without_the_down_workers_keeper(tmp_path):
    # Generation 0 (workers 0, 1) computed steps 1-3; worker 1 died; generation 1 (worker 0
    # alone) computed steps 4-6 and the launcher died.
    _records(tmp_path, [(s, 0) for s in range(3)] + [(s, 1) for s in range(3, 6)], {0: [0, 1], 1: [0]})
    assert recovery.snapshot_writers(str(tmp_path)) == {1: [0, 1], 2: [0, 1], 3: [0, 1],
                                                               4: [0], 5: [0], 6: [0]}
    assert recovery.completed_steps_recorded(str(tmp_path)) == 6  # the cut row skipped
    keepers = Keepers({0: {5, 6}, 1: {2, 3}})
    assert rerun_step(keepers, [0, 1], str(tmp_path)) == 6
    assert keepers.steps(0) & keepers.steps(1) == set()  # the old rule: no common step, start over


def test_a_step_needs_every_writers_keeper_and_an_unrecorded_step_every_adopted_one(tmp_path):
    _records(tmp_path, [(s, 0) for s in range(4)], {0: [0, 1]})
    # Step 4 was written by both, but worker 1's keeper lacks it (its publish never came):
    # the newest step both hold is 3.
    assert rerun_step(Keepers({0: {3, 4}, 1: {2, 3}}), [0, 1], str(tmp_path)) == 3
    # Step 7 has no provenance row (cut short): it needs every adopted keeper, which hold it.
    assert rerun_step(Keepers({0: {4, 7}, 1: {3, 7}}), [0, 1], str(tmp_path)) == 7
    assert rerun_step(Keepers({0: {7}, 1: {3}}), [0, 1], str(tmp_path)) == 0
    # A writer whose keeper is gone (not adopted) leaves its steps incomplete.
    assert rerun_step(Keepers({0: {3, 4}}), [0], str(tmp_path)) == 0


def test_no_records_needs_every_adopted_keeper(tmp_path):
    assert recovery.snapshot_writers(str(tmp_path)) == {}
    assert rerun_step(Keepers({0: {2, 5}, 1: {2, 4}}), [0, 1], str(tmp_path)) == 2


def _start_record(out_dir, generation, worker, resume_step):
    record = {'worker': worker, 'first_step_done': 105.0, 'process_start': 101.0,
              'imported_at': 101.5, 'joined_at': 102.0, 'backend_up_at': 102.2,
              'train_start_at': 103.0,
              'distributed_init_sec': 0.5, 'restore_sec': 0.2, 'restore_bytes': {'memory': 10},
              'healed_bytes': 0, 'compile_sec': 1.0, 'programs_compiled': 0, 'refresh_sec': 0.0,
              'train_start_to_first_step_sec': 2.0, 'resume_step': resume_step}
    with open(os.path.join(out_dir, f'g{generation}_w{worker}_start.json'), 'w') as f:
        json.dump(record, f)


def _rows(out_dir):
    with open(os.path.join(out_dir, 'recoveries.jsonl')) as f:
        return [json.loads(line) for line in f]


def test_a_row_held_open_by_a_killed_launcher_is_recorded_by_the_rerun_once(tmp_path):
    out = str(tmp_path)
    row = {'kind': 'failure', 'failed_at': 100.0, 'completed_steps': 3, 'members': [0],
           'relaunched_at': 100.5, 'next_generation': 1, 'teardown_sec': 0.1}
    recovery.hold(out, row)
    _start_record(out, 1, 0, resume_step=3)  # the generation started; the launcher died
    (recorded,) = recovery.record_left(out)
    assert recorded['recovery_sec'] == 5.0 and recorded['redone_steps'] == 0
    # The way back in consecutive parts, from the row's and the start record's stamps.
    assert recorded['way_back_sec'] == pytest.approx({
        'detect': 0.0, 'replan': 0.5, 'process_start': 0.5, 'imports': 0.5,
        'distributed_init': 0.5, 'backend_init': 0.2, 'setup': 0.8, 'restore': 0.2,
        'program': 1.0, 'refresh': 0.0, 'first_step': 0.8})
    assert sum(recorded['badput_sec'].values()) == pytest.approx(5.0)
    assert 'unfinished' not in recorded and _rows(out) == [recorded]
    assert recovery.record_left(out) == []  # recorded once
    # A row recorded by its own launcher leaves nothing for a rerun.
    recovery.hold(out, dict(row, next_generation=2))
    _start_record(out, 2, 0, resume_step=4)
    recovery.record(out, dict(row, next_generation=2))
    assert recovery.record_left(out) == [] and len(_rows(out)) == 2


def test_a_row_whose_generation_never_started_is_recorded_as_unfinished(tmp_path):
    out = str(tmp_path)
    recovery.hold(out, {'kind': 'failure', 'failed_at': 100.0, 'completed_steps': 3,
                               'members': [0, 1], 'relaunched_at': 100.5, 'next_generation': 1,
                               'teardown_sec': 0.1})
    _start_record(out, 1, 0, resume_step=3)  # worker 1 never started
    (recorded,) = recovery.record_left(out)
    assert recorded['unfinished'].startswith('the launcher died before') and _rows(out) == [recorded]
