"""One run per workdir: an exclusive lock file naming the run that holds it.

Two runs in one workdir would interleave metrics and race on checkpoints. `run.lock` is
created atomically and names the holder (pid, host, start time, command line), so a
refused run says who is running. A lock whose pid is gone on this host (or a zombie, or
reused) is stale and taken over with a warning; on another host the error says how to
remove it. Only process 0 of a job takes it (`active=False` elsewhere).
"""
from __future__ import annotations

import datetime
import fcntl
import json
import logging
import os
import secrets
import socket
import sys

from mecefo_jax.host import files
from mecefo_jax.host.processes import same_process_alive, start_ticks

LOCK_FILENAME = 'run.lock'
log = logging.getLogger(__name__)


class WorkdirError(RuntimeError):
    """The workdir cannot be used now; the message says why and what to do."""


class WorkdirLockedError(WorkdirError):
    """Another run holds the workdir."""


class WorkdirUnusableError(WorkdirError):
    """The workdir is a file, or cannot be created or written."""


class WorkdirLock:
    """Holds `<workdir>/run.lock` for the life of a run (a context manager); a live holder
    raises WorkdirLockedError."""

    def __init__(self, workdir: str, *, active: bool = True):
        self.workdir = os.path.realpath(os.fspath(workdir))
        self.path = os.path.join(self.workdir, LOCK_FILENAME)
        self.active = bool(active)
        self._record = None

    def acquire(self) -> WorkdirLock:
        if not self.active or self._record is not None:
            return self
        self._make_usable()
        record = {'pid': os.getpid(), 'host': socket.gethostname(),
                  'started': datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds'),
                  'start_ticks': start_ticks(os.getpid()), 'command': ' '.join(sys.argv),
                  'token': secrets.token_hex(8)}
        for _ in range(3):  # a stale lock removed by us or by a racing run: try again
            if files.create_bytes(self.path, json.dumps(record).encode('utf-8')):
                self._record = record
                return self
            holder = self._read()
            if holder is not None and self._is_stale(holder):
                self._remove_stale(holder)
                continue
            if holder is None and not os.path.exists(self.path):
                continue  # released between our attempt and our read
            raise WorkdirLockedError(self._locked_message(holder))
        raise WorkdirLockedError(self._locked_message(self._read()))

    def release(self) -> None:
        """Remove the lock file if it is still ours. Idempotent."""
        if self._record is None:
            return
        holder = self._read()
        if holder is not None and holder.get('token') == self._record['token']:
            os.remove(self.path)
        self._record = None

    def __enter__(self) -> WorkdirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def _make_usable(self) -> None:
        """The workdir exists as a directory this process can write, or WorkdirUnusableError."""
        where = f'--workdir={self.workdir}'
        if os.path.exists(self.workdir) and not os.path.isdir(self.workdir):
            raise WorkdirUnusableError(f'{where} is a file, not a directory: pass a directory '
                                       '(it is made if missing).')
        try:
            os.makedirs(self.workdir, exist_ok=True)
        except OSError as error:
            raise WorkdirUnusableError(f'{where} cannot be made ({error.strerror}): pass a '
                                       'directory you can write.') from None
        if not os.access(self.workdir, os.W_OK | os.X_OK):
            raise WorkdirUnusableError(f'{where} is not writable: make it writable '
                                       f'(chmod u+w {self.workdir}) or pass another --workdir.')

    def _read(self) -> dict | None:
        holder = files.read_json(self.path)
        return holder if isinstance(holder, dict) and 'pid' in holder else None

    def _is_stale(self, holder: dict) -> bool:
        return (holder.get('host') == socket.gethostname()
                and not same_process_alive(int(holder['pid']), holder.get('start_ticks')))

    def _remove_stale(self, holder: dict) -> None:
        """Delete the stale lock, unless a racing run already replaced it."""
        with open(self.path + '.guard', 'a') as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            if self._read() == holder:
                os.remove(self.path)
                log.warning('Took over the stale lock %s of pid %s (started %s), which no '
                            'longer runs on this host.', self.path, holder['pid'],
                            holder.get('started'))

    def _locked_message(self, holder: dict | None) -> str:
        if holder is None:
            return (f'{self.path} exists but cannot be read, so another run may be using '
                    f'{self.workdir}. If no run is using it, delete {self.path}; otherwise '
                    'pass another --workdir.')
        same_host = holder.get('host') == socket.gethostname()
        stop = (f'wait for it to finish or stop it (kill {holder["pid"]})' if same_host else
                f'wait for it to finish, or if it is gone (its host crashed), delete {self.path}')
        return (f'Workdir {self.workdir} is in use by pid {holder["pid"]} on host '
                f'{holder.get("host")} (started {holder.get("started")}: '
                f'{holder.get("command", "?")}). To resume that run, {stop} and rerun the same '
                'command; to start a separate run, pass another --workdir.')
