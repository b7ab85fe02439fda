"""Two processes x 4 CPU devices through jax.distributed, one failure and a recovery.

Each process runs tests/multihost_driver.py (run.run under failures, strategy
`mecefo`, on the global 8-replica mesh) and writes its view of the parameters;
the test checks both processes took the same decisions and ended (and passed
through the failure) with bitwise identical parameters. Replica 3 lives on
process 0 and its adopter, replica 4, on process 1, so the adoption crosses
the process boundary.

The processes get separate tokenizer caches, as hosts without a shared
data.cache_dir do, and process 1's cache already holds a different model for
the same corpus (a stale cache, or a training run whose thread schedule
differed): both processes must still tokenize with the model process 0 decides.
A second, short two-process run checks that a data.tokenizer_path holding
different bytes on different hosts is refused by every process.
"""
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from fast_xla import FLAGS as FAST_XLA_FLAGS

from configs.tiny import get_config
from mecefo_jax.config.resolve import resolve, updated

pytestmark = pytest.mark.subprocess  # spawns keepers, workers or launchers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = os.path.join(REPO, 'tests', 'multihost_driver.py')
TIMEOUT_SEC = 420
EVENTS = '2:3:3'  # replica 3 down for steps 2, 3, 4; back at 5
STEPS = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('localhost', 0))
        return s.getsockname()[1]


def _run_two_processes(out_dir, args_of_process, timeout_sec=TIMEOUT_SEC):
    """Runs the driver as processes 0 and 1; returns (exit code, log text) of each."""
    env = dict(os.environ)
    env['JAX_PLATFORMS'] = 'cpu'
    env['PYTHONPATH'] = os.pathsep.join([REPO, env.get('PYTHONPATH', '')]).rstrip(os.pathsep)
    # The driver sets its own device count (4). The suite's compile flags
    # (tests/fast_xla.py) change codegen only, the same in both processes;
    # what is compared here is the processes against each other.
    env['XLA_FLAGS'] = FAST_XLA_FLAGS
    coordinator = f'localhost:{_free_port()}'
    procs, logs = [], []
    for i in range(2):
        log = open(out_dir / f'log{i}.txt', 'w')
        logs.append(log)
        procs.append(subprocess.Popen(
            [sys.executable, DRIVER, '--coordinator', coordinator, '--num_processes', '2',
             '--process_id', str(i), '--workdir', str(out_dir / f'work{i}'),
             '--cache_dir', str(out_dir / f'cache{i}'), '--out', str(out_dir / f'params{i}.npz'),
             *args_of_process(i)],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO))
    deadline = time.monotonic() + timeout_sec
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
    return [(p.returncode, (out_dir / f'log{i}.txt').read_text()) for i, p in enumerate(procs)]


@pytest.fixture(scope='module')
def small_models():
    """Two valid tokenizers of the tiny vocab size, unlike the one a run trains.

    Trained on 40 documents each (a real run samples them all), in a second.
    """
    from mecefo_jax.data import sources as data_sources
    from mecefo_jax.data import tokenizer as tokenizer_lib
    cfg = resolve(get_config())
    documents = data_sources.load_documents(cfg.data, 'train')
    vocab_size = cfg.model.vocab_size
    return [tokenizer_lib.train_sentencepiece(documents[i:i + 40], vocab_size) for i in (0, 40)]


@pytest.fixture(scope='module')
def two_process_run(tmp_path_factory, small_models):
    from mecefo_jax.data import tokenizer as tokenizer_lib
    out_dir = tmp_path_factory.mktemp('multihost')
    # Process 1's cache already holds another model for this corpus: a stale
    # cache, or a training run whose thread schedule differed.
    cfg = updated(resolve(get_config()), {'data.cache_dir': str(out_dir / 'cache1')})
    stale_path = tokenizer_lib.cached_model_path(cfg.data, cfg.model.vocab_size)
    os.makedirs(os.path.dirname(stale_path))
    with open(stale_path, 'wb') as f:
        f.write(small_models[0])
    stale_sha256 = tokenizer_lib.Tokenizer.from_file(stale_path).model_sha256

    outcomes = _run_two_processes(out_dir, lambda i: [
        '--steps', str(STEPS), '--events', EVENTS, '--strategy', 'mecefo'])
    for i, (code, log) in enumerate(outcomes):
        assert code == 0, f'process {i} exited with {code}:\n{log[-3000:]}'
    results = []
    for i in range(2):
        with open(out_dir / f'params{i}.npz.json') as f:
            meta = json.load(f)
        with np.load(out_dir / f'params{i}.npz') as npz:
            arrays = {k: npz[k] for k in npz.files}
        results.append((meta, arrays))
    return results, out_dir, stale_sha256


def test_both_processes_see_the_global_mesh(two_process_run):
    results, _, _ = two_process_run
    for i, (meta, _) in enumerate(results):
        assert meta['process_index'] == i and meta['process_count'] == 2
        assert meta['global_devices'] == 8 and meta['local_devices'] == 4


def test_both_processes_use_process_zeros_tokenizer(two_process_run):
    (a, _), (b, _) = two_process_run[0]
    stale_sha256 = two_process_run[2]
    assert a['tokenizer_trainings'] == 1  # its cache was empty; the validation split reuses it
    assert b['tokenizer_trainings'] == 0  # it only receives process 0's model
    used = [a['tokenizer_sha256'], b['tokenizer_sha256']]
    assert len({sha for split in used for sha in split.values()}) == 1, (
        f'the processes tokenized with different models: {used}')
    assert stale_sha256 not in used[1].values(), 'process 1 kept its own cached model'


def test_both_processes_take_the_same_decisions(two_process_run):
    results, _, _ = two_process_run
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
    _, out_dir, _ = two_process_run
    assert not (out_dir / 'work1' / 'metrics.jsonl').exists()
    text = (out_dir / 'work0' / 'metrics.jsonl').read_text()
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert [r['kind'] for r in rows if r.get('event') in ('failure', 'recovery')] == [
        'failure', 'recovery']
    assert len([r for r in rows if 'loss' in r]) == STEPS


def test_tokenizer_path_must_hold_the_same_model_on_every_host(tmp_path, small_models):
    # One pair of processes tries three cases in turn; each host has its own copy.
    cases = {'same': small_models[:1] * 2, 'different': small_models,
             'missing_on_1': small_models[:1]}
    for case, models in cases.items():
        for host, model_bytes in enumerate(models):
            (tmp_path / f'host{host}').mkdir(exist_ok=True)
            (tmp_path / f'host{host}' / f'{case}.model').write_bytes(model_bytes)
    outcomes = _run_two_processes(tmp_path, lambda i: [
        '--tokenizer_paths', ','.join(str(tmp_path / f'host{i}' / f'{c}.model') for c in cases)],
        timeout_sec=180)
    for i, (code, log) in enumerate(outcomes):  # a failed agreement leaves nobody waiting
        assert code == 0, f'process {i} exited with {code}:\n{log[-3000:]}'
    same, different, missing = zip(*[
        json.loads((tmp_path / f'params{i}.npz.json').read_text())['tokenizer_paths']
        for i in range(2)])
    assert 'sha256' in same[0] and same[0] == same[1]
    for outcome in different:  # every process refuses, naming the field
        assert 'data.tokenizer_path' in outcome.get('error', ''), outcome
        assert 'processes [1] hold different bytes' in outcome['error']
    assert 'processes [1] could not read it' in missing[0].get('error', ''), missing
    assert 'data.tokenizer_path' in missing[1].get('error', ''), missing
    assert 'does not exist' in missing[1]['error']
