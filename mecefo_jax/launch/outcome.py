"""How a generation ended (`Outcome`), and the rules that decide it from what the launcher saw.

The launcher's watch (`supervisor`) polls a generation and asks these rules
each time: whether it hangs (`hung`), whether its deaths so far settle how
it ended (`decided`, then `failed`), and, after a forwarded stop, what its
workers saved (`preempted`). Apart from the loop so the rules read, and are
tested, alone.
"""
from __future__ import annotations

import dataclasses
import time

from mecefo_jax.launch import generation
from mecefo_jax.launch.exits import ABORTED_BY_JAX, CRASH
from mecefo_jax.launch.generation import Generation
from mecefo_jax.launch.job_state import JobState

# A worker's exception may only be its peer's death seen first (a collective
# that fails when a node goes): wait this long for a crash before calling it
# a program error. Node losses are reported within a few seconds (ray_host).
_ERROR_GRACE_SEC = 5.0
_SETTLE_SEC = 0.5  # after a first crash, for the others of the same event


@dataclasses.dataclass
class Outcome:
    kind: str  # 'finished' | 'stopped' | 'preempted' | 'failed' (a crash) | 'error' (a program error)
    failed: list = dataclasses.field(default_factory=list)
    cause: str = ''
    failed_at: float = 0.0  # time.time() the failure happened (kill sent / last report)
    detected_at: float = 0.0
    completed_steps: int = 0  # the most steps any worker had completed
    unsaved: list = dataclasses.field(default_factory=list)  # a stop: workers that never saved
    deaths: list = dataclasses.field(default_factory=list)  # exits.Death of every dead worker
    # A crash's echoes: workers whose code raised because a peer died under them
    # (a collective that failed); they survive, their errors are recorded.
    echoes: dict = dataclasses.field(default_factory=dict)


def hung(job: JobState, gen: Generation, progress: int, stalled: float, now: float) -> Outcome | None:
    """A generation that completes no step: within the start timeout, or for the stall timeout.

    After its last step a generation saves and ends, which no step marks:
    `launch.stop_timeout_sec` bounds that phase instead of the stall timeout
    (a slow final save is not a stuck collective).
    """
    running = len(gen.ends) < len(gen.members)
    if progress >= (gen.stop_at or int(job.cfg.train.steps)):
        limit = job.cfg.launch.stop_timeout_sec
        if stalled > limit and running:
            job.log(f'[launch] no end {stalled:.0f} s after the last step '
                    '(launch.stop_timeout_sec): the generation hangs')
            return Outcome('failed', [], f'no end within {limit:.1f} s of the last step',
                           now - stalled, now, progress)
        return None
    if progress <= 0 and now - gen.started > job.cfg.launch.start_timeout_sec and running:
        return start_timed_out(job, gen, now)
    if progress > 0 and stalled > job.cfg.launch.stall_timeout_sec and running:
        job.log(f'[launch] no step completed for {stalled:.0f} s: the job is stuck')
        return Outcome('failed', [], f'no step completed for {stalled:.1f} s',
                       now - stalled, now, progress)
    return None


def start_timed_out(job: JobState, gen: Generation, now: float) -> Outcome:
    """A generation that completed no step within `launch.start_timeout_sec` of its start
    (its actors too slow to answer count: the start takes them in)."""
    job.log(f'[launch] no step completed {now - gen.started:.0f} s after the start '
            '(launch.start_timeout_sec): the generation hangs')
    return Outcome('failed', [], f'no step completed within '
                   f'{job.cfg.launch.start_timeout_sec:.1f} s of the start', gen.started, now, 0)


def decided(job: JobState, gen: Generation, deaths: list, now: float) -> bool:
    """Whether the deaths so far settle how the generation ended.

    A crash settles it (after a moment for others of the same event). A
    program error alone waits `_ERROR_GRACE_SEC` for a crash it may only
    be the echo of, unless every worker has already ended; so do crashes
    that are all echoes (JAX ending a worker after a peer died): the death
    they echo may be a node's, which Ray reports a second or two later
    than the survivors' aborts (a chaos soak's node loss found it decided
    on the echoes alone, and took the lost node's workers for survivors).
    """
    if not deaths:
        return False
    ended = {d.worker for d in deaths} | set(gen.ends)
    waiting = len(ended) < len(gen.members) and (
        now - min(d.failed_at for d in deaths) <= _ERROR_GRACE_SEC)
    crashes = [d for d in deaths if d.kind == CRASH]
    if crashes and not (waiting and all(d.cause == ABORTED_BY_JAX for d in crashes)):
        if not gen.settled:
            gen.settled = True
            time.sleep(_SETTLE_SEC)
            deaths += generation.exits(gen, now, job.injector.injected, job.injector.out_dir)
        return True
    return not crashes and not waiting


def failed(job: JobState, gen: Generation, deaths: list, now: float) -> Outcome:
    """Every death at once, detected at `now`. With a crash, the workers that raised are
    its echo, not failed."""
    crashed = [d for d in deaths if d.kind == CRASH]
    # Workers JAX ended because a peer died are that death's echo: relaunched as
    # survivors (unless every crash is such an abort: then the cause is unknown).
    aborted = [d for d in crashed if d.cause == ABORTED_BY_JAX]
    if len(aborted) < len(crashed):
        crashed = [d for d in crashed if d.cause != ABORTED_BY_JAX]
    else:
        aborted = []
    injected = job.injector.kill_time
    job.injector.kill_time = None
    failed_at = injected if injected is not None and crashed else min(
        d.failed_at for d in (crashed or deaths))
    lost = crashed or deaths
    cause = (lost[0].cause if len(lost) == 1 else
             '; '.join(f'worker {d.worker}: {d.cause}' for d in lost))
    workers = sorted({d.worker for d in lost})
    kind = 'failed' if crashed else 'error'
    job.log(f'[launch] worker(s) {workers} '
            f"{'failed' if crashed else 'stopped with a program error'} ({cause}); "
            f'generation {gen.number} at step {gen.completed()}')
    echoes = {str(d.worker): d.cause for d in deaths
              if crashed and (d.kind != CRASH or d in aborted)}
    return Outcome(kind, workers, cause, failed_at, now, gen.completed(), deaths=lost,
                   echoes=echoes)


def preempted(job: JobState, gen: Generation, waited: float) -> Outcome | None:
    """Once every worker has ended after a forwarded stop: the step they saved.

    A worker that cannot reach the save (stopped, or stuck starting up)
    would keep the launcher waiting forever: after `launch.stop_timeout_sec`
    the generation is killed, and the rerun resumes from the newest checkpoint.
    """
    deaths = generation.exits(gen, time.time(), {})
    running = [w for w in gen.members
               if w not in gen.ends and w not in {d.worker for d in deaths}]
    if running and waited <= job.cfg.launch.stop_timeout_sec:
        return None
    if running:
        job.log(f'[launch] workers {running} did not stop within launch.stop_timeout_sec='
                f'{job.cfg.launch.stop_timeout_sec:g} s of the stop: killing them')
        generation.stop(gen)
    unsaved = sorted(w for w in gen.members if not gen.ends.get(w, {}).get('preempted'))
    saved = min((e.get('final_step', 0) for e in gen.ends.values()), default=0)
    job.log(f'[launch] preempted: workers {unsaved} saved nothing; the rerun resumes from '
            'the newest checkpoint' if unsaved else
            f'[launch] preempted: every worker stopped; resume step {saved}')
    now = time.time()
    return Outcome('preempted', failed_at=now, detected_at=now, completed_steps=saved,
                   unsaved=unsaved)
