"""Compiling the survivors' programs ahead: a relaunch then compiles none, on any process.

3 workers x 1 CPU device (mesh.data=3): losing worker 1 leaves a 2-process
job, the smallest where a process other than 0 must find its programs
(JAX's own persistent cache serves only process 0 on CPU; see
mecefo_jax/program_cache.py).
"""
import json
import os
import subprocess
import sys
import time

import pytest

from configs.tiny import get_config
from mecefo_jax.launch.compile_ahead import survivor_sets
from mecefo_jax.launch.placement import Placement
from mecefo_jax.launch.supervisor import Launcher
from mecefo_jax.settings import resolve

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS = 3


def test_every_single_loss_that_leaves_a_replica_is_a_survivor_set():
    assert survivor_sets(Placement(3, 1, 1)) == [(0, [1, 2]), (1, [0, 2]), (2, [0, 1])]
    # mesh.model spanning both workers: no loss leaves a whole replica.
    assert survivor_sets(Placement(2, 2, 4)) == []


@pytest.mark.subprocess
def test_a_relaunch_after_compile_ahead_compiles_nothing_on_every_process(tmp_path):
    workdir = str(tmp_path / 'job')
    values = {'train.steps': 12, 'train.eval_every': 0, 'mesh.data': WORKERS,
              'data.global_batch_size': 12,
              'launch.local_devices': 1, 'launch.compilation_cache': 'auto',
              'launch.compile_ahead': False, 'launch.kill': '2:1',
              'data.cache_dir': str(tmp_path / 'tokenizer'), 'snapshot.every': 1}
    args = ['--config=' + os.path.join(REPO, 'configs', 'tiny.py')] + [
        f'--config.{k}={v}' for k, v in values.items()]
    os.makedirs(os.path.join(workdir, 'launch'))
    # The compile-ahead job for the loss of worker 1, run to its end first.
    driver = subprocess.run(
        [sys.executable, '-m', 'mecefo_jax.launch.compile_ahead_job', *args,
         f'--workdir={workdir}', f'--workers={WORKERS}', '--losses=1', '--nice=0'],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert driver.returncode == 0, driver.stderr[-3000:]
    with open(os.path.join(workdir, 'launch', 'compile_ahead.json')) as f:
        ahead = json.load(f)
    assert ahead['done'] and [s['members'] for s in ahead['sets']] == [[0, 2]]
    assert ahead['sets'][0]['ok'] and ahead['cpu_sec'] > 0

    cfg = get_config()
    for key, value in values.items():
        section, field = key.split('.')
        cfg[section][field] = value
    summary = Launcher(resolve(cfg), workdir, WORKERS, log=lambda _: None).run()

    failure = next(r for r in summary['recoveries'] if r['kind'] == 'failure')
    assert failure['members'] == [0, 2]
    assert failure['programs_compiled_by_worker'] == {'0': 0, '2': 0}
    for worker in (0, 2):
        with open(os.path.join(workdir, 'launch', f'g1_w{worker}_start.json')) as f:
            start = json.load(f)
        # The train step and the projection refresh (MeCeFO: a neighbour is active).
        assert start['programs_cached'] >= 2, start
        with open(os.path.join(workdir, 'launch', f'g1_w{worker}_end.json')) as f:
            end = json.load(f)
        # ... and the final evaluation's step.
        assert end['finished'] and end['programs_compiled'] == 0, end
        assert end['programs_cached'] == start['programs_cached'] + 1, end


@pytest.mark.subprocess
def test_a_stopped_driver_reaps_its_job_and_still_records_its_cpu_seconds(tmp_path):
    workdir = str(tmp_path / 'job')
    launch_dir = os.path.join(workdir, 'launch')
    os.makedirs(launch_dir)
    args = ['--config=' + os.path.join(REPO, 'configs', 'tiny.py'), '--config.mesh.data=3',
            '--config.launch.local_devices=1', '--config.data.global_batch_size=12',
            f"--config.data.cache_dir={tmp_path / 'tokenizer'}"]
    driver = subprocess.Popen(
        [sys.executable, '-m', 'mecefo_jax.launch.compile_ahead_job', *args,
         f'--workdir={workdir}', f'--workers={WORKERS}', '--losses=1'], cwd=REPO)
    # Held until both members of its job have run on a CPU (a clock tick of user time).
    members = []
    while len(members) < 2 or not all(_user_ticks(m) > 0 for m in members):
        assert driver.poll() is None, 'the driver ended before its job ran'
        time.sleep(0.05)
        members = _children(driver.pid)
    driver.terminate()
    assert driver.wait(timeout=60) == 0
    assert not [m for m in members if os.path.exists(f'/proc/{m}')], 'members left running'
    with open(os.path.join(launch_dir, 'compile_ahead.json')) as f:
        report = json.load(f)
    assert report['stopped'] and not report['done']
    assert [(s['members'], s['ok']) for s in report['sets']] == [([0, 2], False)]
    assert report['sets'][0]['cpu_sec'] > 0  # the killed members were reaped and counted


def _children(pid: int) -> list[int]:
    try:
        with open(f'/proc/{pid}/task/{pid}/children') as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def _user_ticks(pid: int) -> int:
    try:
        with open(f'/proc/{pid}/stat') as f:
            return int(f.read().rsplit(')', 1)[1].split()[11])  # utime
    except OSError:
        return 0
