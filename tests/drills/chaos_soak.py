"""A chaos soak: one launcher job, many random deaths of every component, nothing lost.

Every other failure test kills one thing at a moment it chose. Real clusters
fail at any moment, several things at once, and a soak finds in one run the
races that single tests find one per run (torchft's authors ran 1,200 to
2,000 synthetic failures in one training run before trusting it). `Soak`
runs one job of the launcher (`python -m mecefo_jax.launch`, a process of
its own) on a simulated Ray cluster this process owns, and from outside it
kills, `kills` times, at a random step of a running generation (a seeded
uniform gap after the job has recovered from the previous kill), one of
`KINDS`:

  worker    SIGKILL of a live worker process;
  keeper    SIGKILL of a keeper actor (its worker meets the loss at its next snapshot);
  launcher  SIGKILL of the launcher, rerun at once with the same command, as a user would;
  node      the loss of a simulated node that hosts workers (a new node joins);
  hang      SIGSTOP of a live worker (the launcher detects its silence);
  double    SIGKILL of two live workers 50 ms apart (two deaths in one settle window).

Each kill is recorded with its kind, the newest completed step and the time;
`chaos_verify` then checks what the job left (`python scripts/chaos_soak.py`).
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import random
import signal
import subprocess
import sys
import time

from mecefo_jax.host import processes

KINDS = ('worker', 'keeper', 'launcher', 'node', 'hang', 'double')
WORKERS, LOCAL_DEVICES = 4, 2
GAP_STEPS = (2, 10)  # a kill lands this many steps (uniform) into a running generation
RETURN_STEPS = 4  # a failed worker rejoins this many steps later
SPARE_STEPS = 40  # the job's steps beyond the most its kills can take
POLL_SEC = 0.05


def job_values(kills: int, tokenizer_cache: str = '', xla_cache: str = '', *,
               spare_steps: int = SPARE_STEPS, max_gap: int = GAP_STEPS[1],
               workers: int = WORKERS) -> dict:
    """The soak job's overrides of configs/tiny.py: long enough for `kills` kills.

    A kill lands at most `max_gap` steps (and a rejoin, and a step of polling) past
    the start of the generation after the previous kill's, so every kill lands before
    the last `spare_steps`. A smoke asks for less (`scripts/chaos_soak.py --spare_steps
    --max_gap --workers`): the same kinds in the same order, kills sooner into each
    generation, fewer steps after them to run and to simulate, and fewer worker processes
    to start at each relaunch (with 2, every kind still has a target; a double kill then
    leaves no survivor)."""
    if workers < 2:
        raise ValueError(f'workers={workers}: a double kill needs 2 workers; ask for at least 2')
    if not GAP_STEPS[0] <= max_gap <= GAP_STEPS[1]:
        raise ValueError(f'max_gap={max_gap}: a kill lands {GAP_STEPS[0]} to {GAP_STEPS[1]} steps '
                         f'into a generation; ask for a max_gap in that range')
    steps = kills * (max_gap + RETURN_STEPS + 4) + spare_steps
    values = {'train.steps': steps, 'train.eval_every': 0, 'train.checkpoint_every': 10,
              'mesh.data': workers * LOCAL_DEVICES, 'launch.local_devices': LOCAL_DEVICES,
              'launch.return_after_steps': RETURN_STEPS, 'launch.heartbeat_timeout_sec': 3.0,
              'launch.max_relaunches': 10 * kills + 10,
              # Replicas summed in one order: the simulation's model is the same, bit for bit.
              'train.ordered_reduction': True}
    if tokenizer_cache:
        values['data.cache_dir'] = tokenizer_cache
    if xla_cache:
        values['launch.compilation_cache'] = xla_cache
    return values


@dataclasses.dataclass
class Progress:
    """What the job's provenance shows: its newest generation and step, and when."""
    generation: int = -1
    step: int = -1
    first_step_of_generation: int = -1

    @classmethod
    def read(cls, workdir: str) -> Progress:
        path = os.path.join(workdir, 'launch', 'provenance.jsonl')
        out = cls()
        try:
            with open(path) as f:
                lines = f.readlines()
        except FileNotFoundError:
            return out
        for line in lines:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a row being written
                continue
            if row['generation'] > out.generation:
                out.generation, out.first_step_of_generation = row['generation'], row['step']
            if row['generation'] == out.generation:
                out.step = max(out.step, row['step'])
        return out


class Soak:
    """One soak job (module docstring): `run()` returns the kill records."""

    def __init__(self, config_path: str, workdir: str, out_dir: str, *, kills: int, seed: int,
                 nodes: int = 3, values: dict | None = None, max_gap: int = GAP_STEPS[1],
                 workers: int = WORKERS, log=print):
        self.max_gap, self.workers = max_gap, workers
        self.config_path, self.workdir, self.out_dir = config_path, workdir, out_dir
        self.kills, self.seed, self.nodes, self.log = kills, seed, nodes, log
        self.values = values or job_values(kills, max_gap=max_gap, workers=workers)
        self.rng = random.Random(seed)
        self.records: list[dict] = []
        self.launcher: subprocess.Popen | None = None
        self.launches = 0
        self.cluster = None
        self.start = 0.0
        self.exit_code: int | None = None  # the last launcher's
        self.keepers_after_job: list[str] = []  # named actors the finished job left
        self.cleanup_output = ''
        self._failed_generation = -1  # the generation the last kill ended

    # ----------------------------------------------------------------- the job

    def _command(self) -> list[str]:
        return ([sys.executable, '-m', 'mecefo_jax.launch', f'--config={self.config_path}',
                 f'--nprocs={self.workers}', f'--workdir={self.workdir}',
                 f'--address={self.cluster.address}']
                + [f'--config.{k}={v}' for k, v in self.values.items()])

    def _launch(self) -> None:
        log_path = os.path.join(self.out_dir, f'launcher{self.launches}.log')
        self.launches += 1
        with open(log_path, 'w') as out:
            self.launcher = subprocess.Popen(self._command(), stdout=out, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL)

    def _kinds(self) -> list[str]:
        """Every kind as often as the others (to one), in a seeded random order."""
        kinds = [KINDS[i % len(KINDS)] for i in range(self.kills)]
        self.rng.shuffle(kinds)
        return kinds

    def run(self) -> list[dict]:
        from tests.drills.sim_cluster import SimulatedCluster
        os.makedirs(self.out_dir, exist_ok=True)
        self.cluster = SimulatedCluster(self.nodes)
        self.start = time.time()
        try:
            self._launch()
            for index, kind in enumerate(self._kinds()):
                if not self._wait_running(need=2 if kind == 'double' else 1):
                    self.log(f'[soak] the job ended before kill {index}')
                    break
                self.records.append(self._kill(index, kind))
            self._finish()
        finally:
            if self.launcher is not None and self.launcher.poll() is None:
                self.launcher.kill()
        return self.records

    def _finish(self) -> None:
        """Let the job run to its last step, then `--cleanup` what it left (nothing, if all
        went well)."""
        import ray

        from mecefo_jax.launch.cluster import namespace_of
        self.exit_code = self.launcher.wait()
        namespace = namespace_of(self.workdir)
        self.keepers_after_job = sorted(
            a['name'] for a in ray.util.list_named_actors(all_namespaces=True)
            if a['namespace'] == namespace)
        done = subprocess.run([sys.executable, '-m', 'mecefo_jax.launch',
                               f'--workdir={self.workdir}', f'--address={self.cluster.address}',
                               '--cleanup'], capture_output=True, text=True, check=False)
        self.cleanup_output = done.stdout.strip()[-2000:]

    def _wait_running(self, need: int = 1, limit_sec: float = 600.0) -> bool:
        """Wait until a generation newer than the last kill's has done a random number of
        steps; False if the job ended first."""
        last = self._failed_generation
        gap = self.rng.randint(GAP_STEPS[0], self.max_gap)
        deadline = time.monotonic() + limit_sec
        while time.monotonic() < deadline:
            if self.launcher.poll() is not None:
                return False
            p = Progress.read(self.workdir)
            # Two deaths need two live workers: wait for a generation that has them.
            enough = need <= 1 or len(self._live_workers(p.generation)) >= need
            if p.generation > last and p.step - p.first_step_of_generation >= gap and enough:
                return True
            time.sleep(POLL_SEC)
        raise TimeoutError(f'the job made no progress for {limit_sec:.0f} s after kill '
                           f'{len(self.records) - 1}: see {self.out_dir}/launcher*.log')

    # ------------------------------------------------------------------ kills

    def _live_workers(self, generation: int) -> dict[int, int]:
        """{worker: pid} of the generation's workers still alive (from their start records)."""
        out = {}
        for path in glob.glob(os.path.join(self.workdir, 'launch', f'g{generation}_w*_start.json')):
            with open(path) as f:
                record = json.load(f)
            # Not a reused pid: the soak must never signal a process that is not the worker.
            if processes.same_process_alive(record['pid'], record.get('start_ticks')):
                out[record['worker']] = record['pid']
        return out

    def _kill(self, index: int, kind: str) -> dict:
        p = Progress.read(self.workdir)
        record = {'index': index, 'kind': kind, 'generation': p.generation, 'step': p.step,
                  'time_sec': time.time() - self.start, 'at': time.time()}
        workers = self._live_workers(p.generation)
        targets = sorted(workers)
        self._failed_generation = p.generation
        if kind in ('worker', 'hang') and targets:
            w = self.rng.choice(targets)
            os.kill(workers[w], signal.SIGSTOP if kind == 'hang' else signal.SIGKILL)
            record['workers'] = [w]
        elif kind == 'double' and len(targets) >= 2:
            pair = self.rng.sample(targets, 2)
            os.kill(workers[pair[0]], signal.SIGKILL)
            time.sleep(0.05)
            os.kill(workers[pair[1]], signal.SIGKILL)
            record['workers'] = sorted(pair)
        elif kind == 'keeper' and targets:
            record['keeper'] = self._kill_keeper(self.rng.choice(targets))
        elif kind == 'node' and targets:
            record['node'], record['workers'] = self._lose_node(workers)
        elif kind == 'launcher':
            self.launcher.kill()
            self.launcher.wait()
            self._launch()  # rerun at once, as a user would
        else:
            record['skipped'] = f'no live worker to {kind} in generation {p.generation}'
            self._failed_generation = p.generation - 1  # nothing failed: go on in this one
        self.log(f'[soak] kill {index}: {kind} at step {p.step} (generation {p.generation})'
                 + ''.join(f', {k} {record[k]}' for k in ('workers', 'keeper', 'node')
                           if k in record))
        return record

    def _kill_keeper(self, worker: int) -> int:
        """SIGKILL the keeper of a live worker (whose next snapshot then fails)."""
        from mecefo_jax.launch.cluster import namespace_of
        from mecefo_jax.snapshot.keeper_actor import find_keeper
        handle = find_keeper(f'keeper{worker}', namespace_of(self.workdir))
        os.kill(handle.pid, signal.SIGKILL)
        return worker

    def _lose_node(self, workers: dict[int, int]) -> tuple[str, list[int]]:
        """Lose the node of a random live worker (not the head: it is the cluster; a worker
        there is then killed alone); the node's id and the workers that were on it."""
        raylets = {node.all_processes['raylet'][0].process.pid: node_id
                   for node_id, node in self.cluster.nodes.items()}
        node_of = {w: raylets.get(_parent(pid)) for w, pid in workers.items()}
        # A worker off the head first: the head cannot be lost (it is the cluster).
        off_head = sorted(w for w, n in node_of.items() if n not in (None, self.cluster.head))
        w = self.rng.choice(off_head or sorted(workers))
        node = node_of[w]
        if node is None or node == self.cluster.head:
            os.kill(workers[w], signal.SIGKILL)
            return 'head (its worker killed)', [w]
        self.cluster.lose(node, replace=True)
        return node[:12], sorted(v for v, n in node_of.items() if n == node)

    def shutdown(self) -> None:
        if self.cluster is not None:
            self.cluster.shutdown()


def _parent(pid: int) -> int | None:
    """The parent pid of `pid` (a Ray worker's is its node's raylet)."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return int(f.read().rsplit(')', 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
