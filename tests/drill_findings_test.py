"""A soak's or a drill's report lists what its own run found, and nothing else.

The soak's report once carried a fixed list of defects earlier soaks had
found: a 12-kill soak on a held-out seed reported three defects it never
met. Here both reports are driven with constructed records (no job runs): a
clean run reports none, and a run with one recovery over its bound, or one
step lost, reports exactly that.
"""
import pytest

from tests.drills import chaos_report, crash_drill_report, findings
from tests.drills.chaos_soak import KINDS

HEARTBEAT_SEC = 3.0
CHECKPOINT_EVERY = 10


def _soak(**changes) -> dict:
    """A finished soak's report, before its findings: one kill of every kind, all well."""
    kills = [{'index': i, 'kind': kind, 'generation': i, 'step': 10 * i, 'recover_sec': 3.0,
              'lost_steps': 2, 'row_kind': 'failure'} for i, kind in enumerate(KINDS)]
    report = {'command': 'python scripts/chaos_soak.py --kills 6', 'config': 'configs/tiny.py',
              'seed': 7, 'kills_asked': len(KINDS), 'nodes': 3, 'launcher_exit_code': 0,
              'launches': 2, 'steps': 148, 'wall_sec': 300.0, 'kills': kills, 'final_step': 148,
              'goodput': 0.3, 'median_step_sec': 0.2, 'max_rel_param_diff': 0.0, 'leaked': [],
              'cleanup_output': ''}
    report.update(changes)
    report['by_kind'] = chaos_report.by_kind(report['kills'])
    return report


def _soak_findings(report, problems=()):
    report['findings'] = chaos_report.soak_findings(
        report, heartbeat_timeout_sec=HEARTBEAT_SEC, checkpoint_every=CHECKPOINT_EVERY,
        problems=list(problems))
    return report['findings']


def _kill(kind: str) -> int:
    return KINDS.index(kind)


def test_a_clean_soak_reports_none():
    report = _soak()
    assert _soak_findings(report) == []
    assert not chaos_report.broken(report)
    assert chaos_report.markdown(report).endswith('## Found\n\n' + findings.table([]) + '\n')
    assert findings.table([]).splitlines()[-1] == '| none |  |  |  |'


def test_a_soak_with_one_slow_recovery_reports_exactly_that():
    report = _soak()
    report['kills'][_kill('keeper')]['recover_sec'] = 12.5
    report['kills'][_kill('hang')]['recover_sec'] = 12.5  # within 10 s + the 3 s heartbeat
    index = _kill('keeper')
    assert _soak_findings(report) == [findings.finding(findings.SLOW, f'kill {index} (keeper)', 12.5, 10.0)]
    assert not chaos_report.broken(report)  # slow, not lost: reported, and the soak passes
    assert f'| recovery over its bound | kill {index} (keeper) | 12.5 | 10 |' in chaos_report.markdown(report)


def test_a_soak_reports_the_kills_it_could_not_match_and_what_it_lost():
    report = _soak(final_step=140, leaked=['shared memory segment mcf_x_0'])
    report['kills'][0]['recover_sec'] = None
    report['kills'][1]['lost_steps'] = CHECKPOINT_EVERY + 1
    found = _soak_findings(report, problems=['step 3: not its reference batch'])
    assert [(f['what'], f['where']) for f in found] == [
        (findings.UNRECOVERED, f'kill 0 ({KINDS[0]})'),
        (findings.REDONE, f'kill 1 ({KINDS[1]})'),
        (findings.LOST, 'the job'),
        (findings.MISMATCH, 'step 3: not its reference batch'),
        (findings.LEFT, 'shared memory segment mcf_x_0')]
    assert chaos_report.broken(report)


def _drill() -> dict:
    """A drill's report, before its findings: every job back in time, nothing redone."""
    def job(**changes):
        row = {key: 0.1 for key in crash_drill_report.COMPONENTS}
        row.update(recovery_sec=3.0, lost_steps=0, failures=1, causes=['killed by SIGKILL'],
                   resume_step=15, restore_bytes=1000, healed_bytes=0, step_sec=0.2,
                   parity_rebuild_sec=None, cold_compile_sec=10.0)
        row.update(changes)
        return row
    return {
        'command': 'python scripts/crash_drill.py --config configs/tiny.py --out runs/d',
        'config': 'configs/tiny.py', 'workers': 4, 'nodes': 1, 'local_devices': 2, 'replicas': 8,
        'steps': 40, 'kill_step': 15, 'return_after_steps': 10, 'checkpoint_every': 10,
        'config_checkpoint_every': 10, 'ray_start_sec': 2.0,
        'memory': job(), 'disk': job(lost_steps=5),
        'launcher_restart': job(recovery_sec=7.0, adopted_keepers=[0, 1, 2, 3],
                                since_launcher_died_sec=8.0, ray_connect_sec=0.03),
        'parity': job(lost_steps=3, parity_rebuild_sec=0.5),
        'parity_rebuild_bitwise': True, 'parity_rebuild_mismatch': [],
        'restore_speedup_memory_vs_disk': 2.0, 'snapshot_every_setting': 'auto',
        'snapshot_every_memory_job': 10, 'expected_lost_steps_per_failure': 5.0,
        'expected_lost_steps_per_failure_disk': 5.0, 'simulated_events': '15:2:10,15:3:10',
        'max_abs_param_diff_vs_simulated': 1e-7, 'max_rel_param_diff_vs_simulated': 2.5e-6,
        'param_bitwise_equal_to_simulated': False,
        'compile_ahead': {'cpu_sec': 60.0, 'wall_sec': 30.0, 'sets': [{}, {}, {}, {}]},
        'random_kill': {'seed': 0, 'steps': 73, 'checkpoint_every': 10, 'mean_lost_steps': 5.0,
                        'max_lost_steps': 8, 'disk_mean_would_lose': 5.0,
                        'snapshot_aligned': {'lost_steps': 0, 'recovery_sec': 3.0},
                        'kills': [{'kill_step': 71, 'snapshot_every': 10, 'lost_steps': 1,
                                   'disk_would_lose': 1, 'recovery_sec': 3.2, 'resume': 'memory',
                                   'failures': 1}]},
    }


def test_a_clean_drill_reports_none():
    report = _drill()
    report['findings'] = crash_drill_report.drill_findings(report)
    assert report['findings'] == []
    assert crash_drill_report.markdown(report).endswith('## Found\n\n' + findings.table([]) + '\n')


@pytest.mark.parametrize('where, change, expected', [
    ('memory', {'recovery_sec': 10.6}, (findings.SLOW, 'memory job', 10.6, 10.0)),
    ('memory', {'lost_steps': 1}, (findings.REDONE, 'memory job', 1, 0)),  # killed after a snapshot
    ('launcher_restart', {'recovery_sec': 21.0}, (findings.SLOW, 'launcher restart job', 21.0, 20.0)),
    ('disk', {'failures': 2}, (findings.EXTRA_FAILURES, 'disk job', 2, 1)),
])
def test_a_drill_with_one_thing_off_reports_exactly_that(where, change, expected):
    report = _drill()
    report[where].update(change)
    report['findings'] = crash_drill_report.drill_findings(report)
    assert report['findings'] == [findings.finding(*expected)]
    what, job, measured, bound = expected
    assert f'| {what} | {job} | {measured:g} | {bound:g} |' in crash_drill_report.markdown(report)


def test_a_drill_reports_a_random_kill_over_its_bound_and_a_parity_rebuild_off_the_lost_copy():
    report = _drill()
    report['random_kill']['kills'][0]['recovery_sec'] = 10.63
    report['parity_rebuild_bitwise'] = False
    found = crash_drill_report.drill_findings(report)
    assert [(f['what'], f['where']) for f in found] == [
        (findings.SLOW, 'random kill at step 71'),
        (findings.MISMATCH, "parity job: the rebuilt snapshot against the lost keeper's")]


def test_a_recovery_bound_names_the_kinds_it_knows():
    assert findings.recovery_bound_sec('hang', HEARTBEAT_SEC) == 13.0
    with pytest.raises(ValueError, match="kind 'meteor'.*known kinds"):
        findings.recovery_bound_sec('meteor')
