"""Two processes x 4 CPU devices through jax.distributed, one failure and a recovery.

Each process runs tests/multihost_driver.py (FaultController.train under
`mecefo` on the global 8-replica mesh) and writes its view of the parameters;
the test checks both processes took the same decisions and ended (and passed
through the failure) with bitwise identical parameters. Replica 3 lives on
process 0 and its adopter, replica 4, on process 1, so the adoption crosses
the process boundary.
"""
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from configs.tiny import get_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = os.path.join(REPO, 'tests', 'multihost_driver.py')
TIMEOUT_SEC = 420
EVENTS = '2:3:3'  # replica 3 down for steps 2, 3, 4; back at 5
STEPS = 8


@pytest.fixture(scope='session')
def cache_dir(tmp_path_factory):
    # Same path as controller_test.py's fixture: the tokenizer trains once per session.
    path = tmp_path_factory.getbasetemp() / 'fault_tests_tokenizer_cache'
    path.mkdir(exist_ok=True)
    return str(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('localhost', 0))
        return s.getsockname()[1]


@pytest.fixture(scope='module')
def two_process_run(cache_dir, tmp_path_factory):
    # Train the tokenizer here first, so the two processes only read the cache
    # instead of racing to write it.
    from mecefo_jax import data as data_lib
    cfg = get_config()
    cfg.data.cache_dir = cache_dir
    data_lib.make_pipeline(cfg.data, vocab_size=int(cfg.model.vocab_size), num_shards=8,
                           split='train')

    out_dir = tmp_path_factory.mktemp('multihost')
    env = dict(os.environ)
    env['JAX_PLATFORMS'] = 'cpu'
    env['PYTHONPATH'] = os.pathsep.join([REPO, env.get('PYTHONPATH', '')]).rstrip(os.pathsep)
    # The driver sets its own device count (4). Optimisation level 0 halves
    # XLA's CPU compile time and changes codegen only, the same in both
    # processes; what is compared here is the processes against each other.
    env['XLA_FLAGS'] = '--xla_backend_optimization_level=0'
    coordinator = f'localhost:{_free_port()}'
    procs, logs = [], []
    for i in range(2):
        log = open(out_dir / f'log{i}.txt', 'w')
        logs.append(log)
        procs.append(subprocess.Popen(
            [sys.executable, DRIVER, '--coordinator', coordinator, '--num_processes', '2',
             '--process_id', str(i), '--workdir', str(out_dir / f'work{i}'),
             '--cache_dir', cache_dir, '--out', str(out_dir / f'params{i}.npz'),
             '--steps', str(STEPS), '--events', EVENTS, '--strategy', 'mecefo'],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO))
    deadline = time.monotonic() + TIMEOUT_SEC
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:  # only the two processes started here
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()

    def tail(i):
        return (out_dir / f'log{i}.txt').read_text()[-3000:]
    for i, p in enumerate(procs):
        assert p.returncode == 0, f'process {i} exited with {p.returncode}:\n{tail(i)}'
    results = []
    for i in range(2):
        with open(out_dir / f'params{i}.npz.json') as f:
            meta = json.load(f)
        with np.load(out_dir / f'params{i}.npz') as npz:
            arrays = {k: npz[k] for k in npz.files}
        results.append((meta, arrays))
    return results, out_dir


def test_both_processes_see_the_global_mesh(two_process_run):
    results, _ = two_process_run
    for i, (meta, _) in enumerate(results):
        assert meta['process_index'] == i and meta['process_count'] == 2
        assert meta['global_devices'] == 8 and meta['local_devices'] == 4


def test_both_processes_take_the_same_decisions(two_process_run):
    results, _ = two_process_run
    expected = [{'kind': 'failure', 'step': 2, 'replicas': [3], 'live': 7},
                {'kind': 'recovery', 'step': 5, 'replicas': [3], 'live': 8}]
    for meta, _ in results:
        assert meta['events'] == expected
        assert meta['during_live'] == 7 and len(meta['during_devices']) == 7
        assert len(meta['final_devices']) == 8  # back on the full mesh
        assert np.isfinite(meta['final_loss']) and np.isfinite(meta['final_val_loss'])
    (a, _), (b, _) = results
    assert a['during_devices'] == b['during_devices']
    assert a['final_loss'] == b['final_loss'] and a['final_val_loss'] == b['final_val_loss']


def test_both_processes_end_with_identical_parameters(two_process_run):
    (_, a), (_, b) = two_process_run[0]
    assert set(a) == set(b)
    assert any(k.startswith('final') for k in a) and any(k.startswith('during') for k in a)
    for key in sorted(a):
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        assert a[key].tobytes() == b[key].tobytes(), f'{key} differs between processes'
        assert np.isfinite(a[key]).all(), key


def test_only_process_zero_writes_metrics(two_process_run):
    _, out_dir = two_process_run
    assert not (out_dir / 'work1' / 'metrics.jsonl').exists()
    text = (out_dir / 'work0' / 'metrics.jsonl').read_text()
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert [r['kind'] for r in rows if r.get('event') in ('failure', 'recovery')] == [
        'failure', 'recovery']
    assert len([r for r in rows if 'loss' in r]) == STEPS
