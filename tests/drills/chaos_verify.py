"""What a chaos soak's job must show once it ends: nothing lost, the right model, nothing leaked.

* Nothing lost: the job reached its last step, and every step's final record
  (a redone step's newest) is there exactly once, on the batch the reference
  pipeline gives at that step, with every live replica's shard computed
  (`check_provenance`, which names each step that is not).
* The right model: the launcher's final parameters equal an in-process run of
  the same config under the same sequence of live replica sets, read from
  the provenance (`simulate`), within `findings.REL_TOL` of each leaf's scale.
* Nothing leaked: no worker process, keeper actor, keeper segment, lock or
  cluster process is left (`leaks`).

Each kill's way back is read from the launcher's own records (`kill_rows`).
"""
from __future__ import annotations

import glob
import hashlib
import json
import os

import numpy as np

from mecefo_jax.host import processes
from mecefo_jax.snapshot import shm


def _rows(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def start_records(workdir: str) -> dict[int, list[dict]]:
    """{generation: its workers' start records}."""
    out: dict[int, list[dict]] = {}
    for path in glob.glob(os.path.join(workdir, 'launch', 'g*_w*_start.json')):
        with open(path) as f:
            record = json.load(f)
        out.setdefault(record['generation'], []).append(record)
    return out


def kill_rows(records: list[dict], workdir: str) -> list[dict]:
    """Each kill with its way back: `recover_sec` (from the kill to the first step of the
    next generation), `lost_steps` (steps done again) and the launcher's row."""
    rows = [r for r in _rows(os.path.join(workdir, 'launch', 'recoveries.jsonl'))
            if r.get('kind') in ('failure', 'launcher_restart')]
    starts = start_records(workdir)
    out = []
    for record in records:
        row = next((r for r in rows if r.get('ended_generation') == record['generation']), None)
        later = sorted(g for g in starts if g > record['generation'])
        first_step = min((s['first_step_done'] for s in starts[later[0]]), default=None) \
            if later else None
        lost = None
        if row is not None:
            lost = row.get('redone_steps')
            if lost is None and row.get('resume_step') is not None:
                lost = max(0, row.get('completed_steps', 0) - row['resume_step'])
        out.append(dict(record, recover_sec=(first_step - record['at'])
                        if first_step is not None and row is not None else None,
                        lost_steps=lost, row_kind=row.get('kind') if row else None,
                        cause=row.get('cause') if row else None))
    return out


def check_provenance(workdir: str, cfg, replicas: int) -> tuple[dict[int, dict], list[str]]:
    """Each step's final record, and what is wrong with them (module docstring): the steps
    without a record, and each step off its reference batch or with a replica's shard
    not computed."""
    from mecefo_jax.data import pipeline as data_lib
    final: dict[int, dict] = {}
    for row in _rows(os.path.join(workdir, 'launch', 'provenance.jsonl')):
        final[row['step']] = row
    steps = int(cfg.train.steps)
    missing = sorted(set(range(steps)) - set(final))
    problems = [f'steps without a record: {missing[:10]}'] if missing else []
    reference = data_lib.make_pipeline(cfg.data, vocab_size=int(cfg.model.vocab_size),
                                       num_shards=replicas, split='train')
    shard = int(cfg.data.global_batch_size) // replicas
    for step in range(steps):
        batch = next(reference)
        row = final.get(step)
        if row is None:
            continue
        if row['batch_sha256'] != hashlib.sha256(batch).hexdigest():
            problems.append(f'step {step}: not its reference batch')
        if row['covered'] != {str(r): shard for r in row['replicas']}:
            problems.append(f"step {step}: a live replica's shard not computed")
    return final, problems


def fault_events(final: dict[int, dict], replicas: int) -> str:
    """`fault.events` ('step:replica:duration,...') giving the provenance's live replica sets."""
    events = []
    for r in range(replicas):
        down_from = None
        for step in range(len(final) + 1):
            down = step < len(final) and r not in final[step]['replicas']
            if down and down_from is None:
                down_from = step
            elif not down and down_from is not None:
                events.append((down_from, r, step - down_from))
                down_from = None
    return ','.join(f'{s}:{r}:{d}' for s, r, d in sorted(events))


def simulate(cfg, events: str, sim_dir: str, replicas: int) -> dict:
    """The same config under `events`, in this process on `replicas` devices: its params."""
    import jax

    from mecefo_jax import run as run_lib
    from mecefo_jax.config.resolve import updated
    from mecefo_jax.training.run_setup import build_run
    # Only the final parameters are compared: the simulation saves no checkpoint.
    cfg = updated(cfg, {'fault.events': events, 'fault.regime': '', 'train.checkpoint_every': 0})
    run = build_run(cfg, sim_dir, replica_rows=[(d,) for d in jax.devices()[:replicas]])
    params = jax.device_get(run_lib.run(cfg, sim_dir, run=run)['state'].params)
    return {jax.tree_util.keystr(p): np.asarray(v)
            for p, v in jax.tree_util.tree_leaves_with_path(params)}


def max_rel_param_diff(workdir: str, simulated: dict) -> float:
    """max over leaves of max |launcher - simulated| / max |simulated|."""
    real = np.load(os.path.join(workdir, 'launch', 'final_params.npz'))
    worst = 0.0
    for name, leaf in simulated.items():
        scale = float(np.max(np.abs(leaf))) or 1.0
        worst = max(worst, float(np.max(np.abs(real[name] - leaf))) / scale)
    return worst


def leaks(workdir: str, namespace: str, cluster_procs: list[tuple[int, int | None]]) -> list[str]:
    """What the job left behind: processes, keeper segments, the lock, cluster processes
    (`cluster_procs`: each pid with its `workdir_lock.start_ticks`, read while it ran)."""
    left = []
    for generation in start_records(workdir).values():
        # A long soak wraps pid_max: a worker's number may be a later process's or thread's.
        left += [f"worker process {s['pid']} (g{s['generation']} w{s['worker']})"
                 for s in generation if processes.same_process_alive(s['pid'], s.get('start_ticks'))]
    left += [f'shared memory segment {n}' for n in sorted(os.listdir(shm.SHM_DIR))
             if n.startswith('mcf') and f'_{namespace}_' in n]
    if os.path.exists(os.path.join(workdir, 'run.lock')):
        left.append('the workdir lock run.lock')
    left += [f'cluster process {p}' for p, ticks in cluster_procs
             if processes.same_process_alive(p, ticks)]
    return left
