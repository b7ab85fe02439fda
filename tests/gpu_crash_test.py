"""The GPU crash script's smoke: `bash scripts/gpu_crash.sh --smoke` on the CPU, as a lease runs it.

One worker of configs/tiny.py on the session's shared Ray cluster, SIGKILLed
once with its keeper alive and once with its keeper killed too: the report
must show each kill restored from the tier it planned, its way back in parts
that add up to the recovery, and the crashed run bit for bit the uninterrupted
one (a CPU run is deterministic). tests/drills/gpu_crash.py says what it runs.
"""
import json
import os
import subprocess
import tarfile

import pytest

from tests.drills import gpu_crash
from tests.drills.findings import MISMATCH, UNRECOVERED

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.subprocess, pytest.mark.ray]
SMOKE_STEPS = 14  # scripts/gpu_crash.py --smoke


@pytest.fixture(scope='module')
def smoke(cluster, launcher_caches, tmp_path_factory):
    out = str(tmp_path_factory.mktemp('gpu_crash'))
    tokenizer, xla = launcher_caches
    proc = subprocess.run(
        ['bash', 'scripts/gpu_crash.sh', '--smoke', out, f'--address={cluster.address}',
         f'--config.data.cache_dir={tokenizer}', f'--config.launch.compilation_cache={xla}'],
        cwd=REPO, capture_output=True, text=True, timeout=400,
        env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(os.path.join(out, 'crash.json')) as f:
        return json.load(f), out


def test_each_kill_comes_back_from_its_tier_with_its_way_back_in_parts(smoke):
    report, _ = smoke
    memory, disk = report['kills']
    assert [memory['planned_tier'], disk['planned_tier']] == ['memory', 'disk']
    assert memory['resume'] == 'memory' and memory['redone_steps'] <= 1
    # From disk: the newest checkpoint committed when the worker died, and nothing older. How far
    # back that is depends on how long Orbax's async commit trails the steps (on a loaded CPU, past
    # a checkpoint period: the report names that a finding, as it would on a GPU).
    assert disk['resume'] == 'disk' and disk['resume_step'] == disk['newest_checkpoint'] > 0
    assert disk['redone_steps'] == disk['completed_steps'] - disk['resume_step']
    for kill in report['kills']:
        parts = kill['way_back_sec']
        assert set(parts) == set(gpu_crash.PARTS)
        assert min(parts.values()) >= 0, parts
        assert sum(parts.values()) == pytest.approx(kill['recovery_sec'], abs=1e-6)
        assert kill['restore_bytes'] > 0 and kill['restore_gb_per_sec'] > 0
        assert kill['programs_compiled'] + kill['programs_cached'] > 0
    assert report['by_tier']['memory']['max_redone_steps'] == memory['redone_steps']


def test_the_crashed_run_ends_bit_for_bit_the_uninterrupted_one(smoke):
    report, _ = smoke
    check = report['check']
    assert check['param_bitwise_equal'], check
    assert check['max_abs_loss_diff_after_first_kill'] == 0.0
    assert check['loss_steps_compared'] >= SMOKE_STEPS - report['kills'][0]['kill_step']
    assert 'seed_noise_max_abs_loss_diff' not in check  # no third job where nothing differs
    # A slow recovery on a loaded machine is a finding worth reporting, not a failure here.
    assert not [f for f in report['findings'] if f['what'] in (MISMATCH, UNRECOVERED,
                                                                   gpu_crash.OFF_REFERENCE)]


def test_the_report_and_the_records_come_back(smoke):
    report, out = smoke
    with open(os.path.join(out, 'crash.md')) as f:
        text = f.read()
    assert '## Each kill, its way back in parts' in text and 'backend_init (s)' in text
    assert report['command'].startswith('python scripts/gpu_crash.py --smoke')
    with tarfile.open(os.path.join(out, 'records.tar.gz')) as tar:
        names = tar.getnames()
    assert any(n.endswith('crashed/launch/recoveries.jsonl') for n in names)
    assert not any(n.endswith('.npz') for n in names)


def test_kill_plans_spread_over_each_half_and_refuse_too_few_steps():
    plan = gpu_crash.kill_plan(seed=3, kills=3, steps=40, checkpoint_every=10)
    assert plan == gpu_crash.kill_plan(seed=3, kills=3, steps=40, checkpoint_every=10)
    memory = [s for s, tier in plan if tier == 'memory']
    disk = [s for s, tier in plan if tier == 'disk']
    assert len(memory) == len(disk) == 3
    assert 2 <= memory[0] < memory[1] < memory[2] < 20 <= disk[0] < disk[1] < disk[2] <= 38
    assert gpu_crash.launch_kill([(4, 'memory'), (9, 'disk')]) == '4:0,9:0:KILL:keeper'
    with pytest.raises(ValueError, match='raise --steps or lower --kills'):
        gpu_crash.kill_plan(seed=0, kills=4, steps=12, checkpoint_every=3)
