"""Injected failures (`launch.kill`): which signal goes into which worker, and when.

Crash drills and tests inject real failures at known points: a signal once
a worker has completed a step, inside its snapshot publish of a step, or
right after its first snapshot at or after a step, once every keeper holds it.
"""
from __future__ import annotations

import dataclasses
import os
import signal


@dataclasses.dataclass(frozen=True)
class Kill:
    """One injected failure: `signal` into `worker` at `step`.

    `keeper`: its keeper is killed with it (its memory is lost).
    `in_publish`: the worker is held inside its snapshot publish of step
    `step` (bytes copied, not yet published) and the signal lands there, at a
    known point rather than wherever a heartbeat happens to find it.
    `after_snapshot`: the worker holds its training loop once its first
    snapshot at or after `step` is published; the signal lands when every
    keeper of the job holds that step. Whatever interval `snapshot.every=auto`
    chose, the failure then costs no redone step by construction: a drill
    measures the way back, and the expected loss (interval / 2) separately.
    """
    step: int
    worker: int
    signal: int = signal.SIGKILL
    keeper: bool = False
    in_publish: bool = False
    after_snapshot: bool = False


_KILL_FORMAT = ("'STEP:WORKER[:SIGNAL[:keeper|publish|snapshot]]', e.g. '12:1', '8:0:STOP', "
                "'9:2:KILL:keeper'")


def parse_kills(text: str, workers: int) -> list[Kill]:
    """`launch.kill`: comma-separated items in `_KILL_FORMAT`."""
    kills = []
    for item in filter(None, (t.strip() for t in str(text).split(','))):
        parts = item.split(':')
        try:
            step, worker = int(parts[0]), int(parts[1])
            sig = signal.SIGKILL
            if len(parts) > 2 and parts[2]:
                name = parts[2].upper()
                sig = getattr(signal, name if name.startswith('SIG') else f'SIG{name}')
            where = parts[3] if len(parts) > 3 else ''
            if len(parts) > 4 or where not in ('', 'keeper', 'publish', 'snapshot'):
                raise ValueError
        except (ValueError, IndexError, AttributeError):
            raise ValueError(f'launch.kill: cannot read {item!r}; use {_KILL_FORMAT}.') from None
        if not 0 <= worker < workers or step < 0:
            raise ValueError(f'launch.kill: {item!r} names worker {worker} of {workers} workers '
                             f'(0..{workers - 1}) at step {step} (>= 0).')
        kills.append(Kill(step, worker, sig, where == 'keeper', where == 'publish',
                          where == 'snapshot'))
    return kills


def held_in_publish_marker(out_dir: str, generation: int, worker: int) -> str:
    """The file a worker held inside a publish writes (`Kill.in_publish`)."""
    return os.path.join(out_dir, f'g{generation}_w{worker}_held_in_publish.json')


def held_after_snapshot_marker(out_dir: str, generation: int, worker: int) -> str:
    """The file a worker held after a published snapshot writes (`Kill.after_snapshot`)."""
    return os.path.join(out_dir, f'g{generation}_w{worker}_held_after_snapshot.json')
