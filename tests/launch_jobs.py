"""The launcher tests' job: 2 workers x 2 CPU devices, the tiny config, 4 replicas.

Shared by tests/launch_test.py (the launcher in the test's process),
tests/launcher_process_test.py (the launcher as a process, as a user runs
it) and tests/node_loss_test.py: one job shape, so their workers compile
its programs once into the session's `launcher_caches` (tests/conftest.py).
"""
import glob
import hashlib
import json
import os
import time

from configs.tiny import get_config
from mecefo_jax.config.resolve import resolve, updated
from mecefo_jax.host import processes
from mecefo_jax.launch.cluster import namespace_of
from mecefo_jax.launch.launcher import Launcher
from mecefo_jax.snapshot import shm

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS, LOCAL = 2, 2  # 4 replicas: worker 1 holds replicas 2 and 3
STEPS = 14  # the default job's length (tests/launch_test.py's crashed job needs room to rejoin)


def overrides(caches, **extra):
    """The module's job, with what a test sets in `extra`."""
    tokenizer, xla = caches
    values = {'train.steps': STEPS, 'train.eval_every': 0, 'mesh.data': 4,
              'fault.strategy': 'mecefo',  # the adoption these tests check
              'launch.local_devices': LOCAL, 'launch.compilation_cache': xla,
              'data.cache_dir': tokenizer, 'snapshot.every': 1, 'launch.compile_ahead': False}
    values.update(extra)
    return values


def config(values):
    return updated(resolve(get_config()), values)


def launch(values, workdir):
    return Launcher(config(values), workdir, WORKERS, log=lambda _: None).run()


def read(workdir, name):
    with open(os.path.join(workdir, 'launch', name)) as f:
        return json.load(f)


def worker_processes(workdir) -> list[tuple[int, int | None]]:
    """(pid, start ticks) of every worker process the job ran, from their start records."""
    records = [read(workdir, os.path.basename(p))
               for p in glob.glob(os.path.join(workdir, 'launch', 'g*_w*_start.json'))]
    return [(r['pid'], r.get('start_ticks')) for r in records]


def running(procs) -> list[int]:
    """The pids of `procs` ((pid, start ticks)) that still run as those processes: a
    suite's processes and threads wrap pid_max (32768 here) within minutes, so a bare pid
    may name another process by the time it is looked at."""
    return [pid for pid, ticks in procs if processes.same_process_alive(pid, ticks)]


def keeper_names(workdir) -> list[str]:
    import ray
    namespace = namespace_of(workdir)
    return sorted(a['name'] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a['namespace'] == namespace)


def assert_nothing_left(workdir, keeper_pids=(), *, launcher_killed=False):
    """No worker process, keeper actor or keeper segment of the job remains.

    A launcher returns only after every worker process it ran has exited. A
    SIGKILLed launcher's workers are ended by Ray (their driver died), and
    Ray reaps killed keeper actors: both within seconds.
    """
    deadline = time.monotonic() + 30
    workers = worker_processes(workdir)
    while launcher_killed and running(workers):
        assert time.monotonic() < deadline, 'workers outlived their killed launcher'
        time.sleep(0.2)
    assert not running(workers), f'workers {running(workers)} outlived the launcher'
    while keeper_names(workdir):
        assert time.monotonic() < deadline, f'left behind: keepers {keeper_names(workdir)}'
        time.sleep(0.2)
    assert not [p for p in keeper_pids if processes.alive(p) or shm.listed(p)]


def live_keeper_pids(workdir) -> list[int]:
    from mecefo_jax.snapshot.keeper_actor import find_keeper
    return [find_keeper(name, namespace_of(workdir)).pid for name in keeper_names(workdir)]


def final_provenance(workdir, values) -> dict:
    """Each step's final record (a later generation's supersedes redone work), checked
    against the reference pipeline: every step once, every sample of it computed."""
    rows = [json.loads(line) for line in open(os.path.join(workdir, 'launch', 'provenance.jsonl'))]
    final = {}
    for row in rows:
        final[row['step']] = row
    steps = int(values['train.steps'])
    assert sorted(final) == list(range(steps))
    from mecefo_jax.data import pipeline as data_lib
    cfg = config(values)
    reference = data_lib.make_pipeline(cfg.data, vocab_size=int(cfg.model.vocab_size),
                                       num_shards=4, split='train')
    shard = int(cfg.data.global_batch_size) // 4
    for step in range(steps):
        batch = next(reference)
        assert final[step]['batch_sha256'] == hashlib.sha256(batch).hexdigest(), step
        assert final[step]['covered'] == {str(s): shard for s in range(4)}, step
    return final
