"""Preemption: a SIGTERM (or a first Ctrl-C) ends the run after a saved step, never mid-step.

The loop finishes the step in flight, saves, writes a `preempted` row and raises
`Preempted`; the entry point exits with `EXIT_PREEMPTED` and a rerun resumes there. Every
process must stop at the same step, or one would wait forever in a collective: there JAX's
preemption sync point picks it (its coordination service owns SIGTERM); in one process a
Python handler sets a flag. A second Ctrl-C aborts at once.
"""
from __future__ import annotations

import os
import signal
import threading

# The exit status of a run stopped by preemption after saving (EX_TEMPFAIL:
# "try again later"); distinct from a crash (1) and from SIGTERM's 143.
EXIT_PREEMPTED = 75


class Preempted(Exception):
    """The run saved step `step` and stopped because it was asked to (SIGTERM, Ctrl-C)."""

    def __init__(self, step: int, where: str):
        super().__init__(f'preempted: saved step {step} ({where}); rerun the same command '
                         f'to resume from step {step}.')
        self.step, self.where = step, where


def _multi_process() -> bool:
    import jax
    return jax.process_count() > 1


class PreemptionGuard:
    """Context manager: catches SIGTERM and a first SIGINT; `requested(step)` says when to stop."""

    def __init__(self):
        self._flag = threading.Event()
        self._previous: dict = {}
        self._multi = False

    def __enter__(self) -> PreemptionGuard:
        self._multi = _multi_process()
        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be installed from the main thread
        self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_signal)
        if not self._multi:  # multi-process: JAX's coordination service handles SIGTERM
            self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _on_signal(self, signum, frame) -> None:
        if signum == signal.SIGINT and self._flag.is_set():
            raise KeyboardInterrupt  # a second Ctrl-C: stop now, without saving
        self.request(signal.Signals(signum).name)

    def request(self, why: str) -> None:
        """Stop at the next step every process agrees on (a signal, or a launcher's call);
        multi-process, the others learn of it through JAX's SIGTERM notifier."""
        self._flag.set()
        if self._multi:
            os.kill(os.getpid(), signal.SIGTERM)
        print(f'\n{why}: finishing the current step and saving '
              '(Ctrl-C again to abort without saving)', flush=True)

    def requested(self, step: int) -> bool:
        """Whether to stop before `step`, the same on every process (which must all ask at every
        step from the same start step)."""
        if self._multi:  # a local flag alone would stop this process only
            from jax.experimental import multihost_utils
            return multihost_utils.reached_preemption_sync_point(step)
        return self._flag.is_set()
