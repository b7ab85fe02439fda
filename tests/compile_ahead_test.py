"""Compiling the survivors' programs ahead: a relaunch then compiles none, on any process.

3 workers x 1 CPU device (mesh.data=3): losing worker 1 leaves a 2-process
job, the smallest where a process other than 0 must find its programs
(JAX's own persistent cache serves only process 0 on CPU; see
mecefo_jax/parallel/program_cache.py). The compile-ahead members are Ray actors, as
the workers are, on one simulated cluster for the module.
"""
import json
import os
import threading

import pytest
from process_waits import wait_gone

from configs.tiny import get_config
from mecefo_jax.config.resolve import resolve, updated
from mecefo_jax.launch import compile_ahead
from mecefo_jax.launch.compile_ahead import survivor_sets
from mecefo_jax.launch.launcher import Launcher
from mecefo_jax.launch.placement import Placement

WORKERS = 3


def test_every_single_loss_that_leaves_a_replica_is_a_survivor_set():
    assert survivor_sets(Placement(3, 1, 1)) == [(0, [1, 2]), (1, [0, 2]), (2, [0, 1])]
    # mesh.model spanning both workers: no loss leaves a whole replica.
    assert survivor_sets(Placement(2, 2, 4)) == []


@pytest.fixture(scope='module')
def cluster(ray_cluster):
    return ray_cluster  # the session's shared cluster (tests/conftest.py)


def _config(tokenizer_cache, **extra):
    values = {'train.steps': 12, 'train.eval_every': 0, 'mesh.data': WORKERS,
              'fault.strategy': 'mecefo',  # the neighbour programs compiled ahead
              'data.global_batch_size': 12,
              'launch.local_devices': 1, 'launch.compilation_cache': 'auto',
              'launch.compile_ahead': False, 'data.cache_dir': tokenizer_cache,
              'snapshot.every': 1}
    values.update(extra)
    return updated(resolve(get_config()), values)


@pytest.mark.subprocess
@pytest.mark.ray
def test_a_relaunch_after_compile_ahead_compiles_nothing_on_every_process(cluster, tmp_path,
                                                                           tokenizer_cache):
    workdir = str(tmp_path / 'job')
    cfg = _config(tokenizer_cache, **{'launch.kill': '2:1'})
    os.makedirs(os.path.join(workdir, 'launch'))
    # The compile-ahead job for the loss of worker 1, run to its end first.
    ahead = compile_ahead.drive(cfg, workdir, Placement(WORKERS, 1, 1),
                                losses=[1], nice=0, log=lambda _: None)
    assert ahead['done'] and [s['members'] for s in ahead['sets']] == [[0, 2]]
    assert ahead['sets'][0]['ok'] and ahead['cpu_sec'] > 0

    summary = Launcher(cfg, workdir, WORKERS, log=lambda _: None).run()

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
@pytest.mark.ray
def test_a_stopped_compile_ahead_kills_its_members_and_still_counts_their_cpu_seconds(
        cluster, tmp_path, tokenizer_cache):
    workdir = str(tmp_path / 'job')
    os.makedirs(os.path.join(workdir, 'launch'))
    cfg = _config(tokenizer_cache)
    stop, running = threading.Event(), threading.Event()
    result = {}
    driver = threading.Thread(target=lambda: result.update(compile_ahead.drive(
        cfg, workdir, Placement(WORKERS, 1, 1), losses=[1], stop=stop,
        running=running, log=lambda _: None)))
    driver.start()
    assert running.wait(timeout=300), 'the job never ran'  # its members are compiling
    stop.set()
    driver.join(timeout=120)
    assert result['stopped'] and not result['done']
    (row,) = result['sets']
    assert (row['members'], row['ok']) == ([0, 2], False)
    assert row['cpu_sec'] > 0  # asked of the members before they were killed
    # ray.kill returns at once; Ray ends the processes
    wait_gone(row['pids'], 'members left running', poll=0.1)
