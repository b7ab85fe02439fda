"""Why a worker left: a crash (relaunch without it) or a program error (stop the job).

A crash is what a lost host looks like: Ray reports the worker's actor or
its node dead (a signal, a segfault, the node gone), or the worker falls
silent. A program error is a Python exception in the worker's own code
(`run` raised): the relaunched program would fail the same way, so the
launcher stops at once and shows the end of the worker's log instead of
relaunching it `launch.max_relaunches` times.
"""
from __future__ import annotations

import dataclasses
import os

CRASH, PROGRAM_ERROR = 'crash', 'program_error'
NODE_DIED = 'its node died'  # the cause of a worker whose node was lost
# What the launcher's own node kill (`launch.kill STEP:WORKER:node`) is named: it knows
# the node is gone, whichever of Ray's reports (the actor's or the node's) comes first.
NODE_LOSS_INJECTED = 'the loss of its node'
_TAIL_LINES = 20
# What a healthy process prints when JAX's distributed runtime ends it because
# another process died (the coordinator, or a peer it was waiting on).
JAX_ABORT_MARKER = 'the JAX distributed service detected fatal errors'
# What one prints when the CPU collectives' transport (gloo) fails on a message cut
# off by a peer's death: an exception its own thread cannot raise ends the process.
GLOO_ABORT_MARKER = 'Unhandled exception: N4gloo'
ABORTED_BY_JAX = "ended by JAX's runtime after a peer died"
_ABORT_TAIL_BYTES = 64 * 1024


def aborted_by_jax(log_path: str) -> bool:
    """Whether a dead worker's log ends with JAX's runtime terminating it for another
    process's death (its distributed service, or its collectives' transport).

    Such a worker is healthy: it is an echo of the death that caused it, relaunched as a
    survivor with its own keeper's snapshots, not a failure.
    """
    try:
        with open(log_path, 'rb') as f:
            f.seek(max(0, os.path.getsize(log_path) - _ABORT_TAIL_BYTES))
            tail = f.read().decode(errors='replace')
    except OSError:
        return False
    return JAX_ABORT_MARKER in tail or GLOO_ABORT_MARKER in tail


@dataclasses.dataclass(frozen=True)
class Death:
    """One dead worker of a generation."""
    worker: int
    cause: str  # 'killed by SIGKILL', 'its node died', 'no heartbeat for 3.1 s', ...
    kind: str  # CRASH | PROGRAM_ERROR
    failed_at: float  # time.time()


def log_tail(path: str, lines: int = _TAIL_LINES) -> str:
    """The last `lines` lines of a worker's log, from its last traceback if it has one."""
    try:
        with open(path, errors='replace') as f:
            text = f.read()
    except OSError as e:
        return f'(no log: {e})'
    rows = text.rstrip('\n').splitlines()
    start = max((i for i, r in enumerate(rows) if r.startswith('Traceback')), default=0)
    return '\n'.join(rows[max(start, len(rows) - lines):])


class WorkerProgramError(RuntimeError):
    """A worker failed in its own code: relaunching it would fail again."""

    def __init__(self, deaths: list, log_dir: str, generation: int, *, note: str | None = None):
        parts = []
        for d in deaths:
            path = os.path.join(log_dir, f'g{generation}_w{d.worker}.log')
            parts.append(f'Worker {d.worker} stopped with a program error ({d.cause}), not a '
                         f'crash, so it is not relaunched. The end of {path}:\n'
                         f'{log_tail(path)}')
        super().__init__('\n\n'.join(parts) + '\nFix the error and rerun the same command.'
                         + (f'\n{note}' if note else ''))
        self.workers = [d.worker for d in deaths]
