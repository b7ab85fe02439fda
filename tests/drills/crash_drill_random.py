"""The crash drill's random kills: a worker SIGKILLed at a uniformly random step.

The memory job's kill lands right after a snapshot every keeper holds, so
its way back is measured cleanly but loses nothing by construction; a
failure in production lands anywhere. `random_kills` runs `kills` jobs under
the config's snapshot cadence (`snapshot.every=auto` by default), each
SIGKILLing worker `VICTIM` at a step drawn uniformly (seeded) from those
after auto has chosen its interval, and reports what each lost
(`lost_steps`: steps redone) and how long its way back took
(`recovery_sec`), the survivors' programs compiled ahead first as for the
memory job. Beside each: what the disk tier would have lost at the
same point, the steps since its newest checkpoint (every `checkpoint_every`
steps, which these jobs also write and which caps auto's interval).
"""
from __future__ import annotations

import os
import random
import re
import statistics

from mecefo_jax.snapshot.cadence import PROBE_STEPS, SETTLE_STEPS
from tests.drills.crash_drill_jobs import VICTIM, compile_ahead, job_recovery, run_job

KILLS = 3
_CHOICE = re.compile(r'snapshot\.every=auto: every (\d+) step')


def first_chosen_step(every) -> int:
    """The first step snapshotted at auto's chosen interval (any step for a fixed one)."""
    return SETTLE_STEPS + PROBE_STEPS + 1 if every == 'auto' else 1


def kill_steps(seed: int, kills: int, first: int, last: int) -> list[int]:
    """`kills` steps drawn uniformly from [first, last], the same for the same seed."""
    rng = random.Random(seed)
    return [rng.randint(first, last) for _ in range(kills)]


def _interval_at_kill(workdir: str) -> int | None:
    """The interval auto chose in the killed generation (its worker 0's log), if it chose."""
    try:
        with open(os.path.join(workdir, 'launch', 'g0_w0.log'), errors='replace') as f:
            chosen = _CHOICE.findall(f.read())
    except FileNotFoundError:
        return None
    return int(chosen[-1]) if chosen else None


def random_kills(cfg, base: dict, out_dir: str, workers: int, *, checkpoint_every: int,
                 seed: int, kills: int = KILLS, log=print) -> dict:
    """`kills` jobs, each killed at a random step: their rows and the summary figures."""
    first = first_chosen_step(cfg.snapshot.every)
    steps = first + 3 * checkpoint_every  # three disk periods after auto has chosen
    values = dict(base, **{'train.steps': steps, 'train.checkpoint_every': checkpoint_every,
                           'launch.compile_ahead': False})
    # The survivors' programs compiled ahead into the jobs' cache first, as before the
    # snapshot-aligned kill: the way back is measured as the launcher runs it by default.
    compile_ahead(cfg, values, os.path.join(out_dir, 'random0'), workers, log)
    rows = []
    for i, step in enumerate(kill_steps(seed, kills, first + 1, steps - 2)):
        workdir = os.path.join(out_dir, f'random{i}')
        summary = run_job(cfg, dict(values, **{'launch.kill': f'{step}:{VICTIM}'}), workdir,
                          workers, log)
        row = job_recovery(summary)
        rows.append({'kill_step': step, 'lost_steps': row['lost_steps'],
                     'recovery_sec': row['recovery_sec'], 'resume': row['resume'],
                     'resume_step': row['resume_step'],
                     'completed_steps': row['completed_steps'],
                     'snapshot_every': _interval_at_kill(workdir),
                     'disk_would_lose': row['completed_steps'] % checkpoint_every,
                     'failures': row['failures']})
    lost = [r['lost_steps'] for r in rows]
    return {'kills': rows, 'seed': seed, 'steps': steps, 'checkpoint_every': checkpoint_every,
            'mean_lost_steps': statistics.mean(lost), 'max_lost_steps': max(lost),
            'mean_recovery_sec': statistics.mean(r['recovery_sec'] for r in rows),
            'disk_mean_would_lose': statistics.mean(r['disk_would_lose'] for r in rows)}
