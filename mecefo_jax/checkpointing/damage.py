"""Damaged checkpoint steps: recognise them, move them aside, resume from an older one.

A crash mid-copy, a bad disk or a careless `rm` can leave the newest step unreadable while
older ones are intact: a restore falls back to the newest intact step and names the one it
gave up on. Damage is what Orbax and TensorStore raise on unreadable files
(`looks_damaged`); a config mismatch is caught earlier, from the metadata, and moves
nothing. Array chunks carry no checksum, so only damage Orbax reports is recognised. A
damaged step is renamed `<step>.damaged-<n>`, neither listed nor pruned; every process
calls `restore_newest_intact`, they agree on each step, and only process 0 renames.
"""
from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from mecefo_jax.host.disk_space import exception_chain

log = logging.getLogger(__name__)

# TensorStore's codes for bytes on disk that are missing or bad. Not INVALID_ARGUMENT or
# PERMISSION_DENIED: a bad request or the environment, which moving the step would not help.
_STORAGE_CODES = re.compile(r'\b(NOT_FOUND|DATA_LOSS|OUT_OF_RANGE|FAILED_PRECONDITION):')
_DAMAGED_SUFFIX = '.damaged-'


class CheckpointDamagedError(RuntimeError):
    """A checkpoint step's files are missing or unreadable (not a config mismatch)."""

    def __init__(self, directory: str, step: int, cause: BaseException):
        self.directory, self.step = directory, int(step)
        culprit = next((e for e in exception_chain(cause) if _is_damage(e)), cause)
        self.reason = f'{type(culprit).__name__}: {_first_line(culprit)}'
        super().__init__(f'Checkpoint step {step} in {directory!r} is damaged ({self.reason}).')


class NoIntactCheckpointError(RuntimeError):
    """Every checkpoint step was damaged; the run must not silently start over."""


def _first_line(exc: BaseException, limit: int = 300) -> str:
    """The gist of an Orbax/TensorStore message, without its multi-kB spec dump."""
    text = str(exc).split(' [tensorstore_spec', 1)[0].strip().splitlines()
    line = text[0] if text else ''
    return line[:limit] + (' ...' if len(line) > limit else '')


def looks_damaged(exc: BaseException) -> bool:
    """Whether `exc` (or an exception it wraps) reports unreadable checkpoint files."""
    return any(_is_damage(e) for e in exception_chain(exc))


def _is_damage(e: BaseException) -> bool:
    if isinstance(e, (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError)):
        return True
    return isinstance(e, ValueError) and bool(_STORAGE_CODES.search(str(e)))


def move_aside(directory: str, step: int) -> str:
    """Rename `<directory>/<step>` to the first free `<step>.damaged-<n>`; return it."""
    source = os.path.join(directory, str(step))
    n = 1
    while os.path.exists(f'{source}{_DAMAGED_SUFFIX}{n}'):
        n += 1
    target = f'{source}{_DAMAGED_SUFFIX}{n}'
    os.rename(source, target)
    return target


def _any_process(flag: bool) -> bool:
    """True on every process when `flag` is True on any (no collective when alone)."""
    if jax.process_count() == 1:
        return flag
    flags = multihost_utils.process_allgather(np.asarray(int(flag), np.int32))
    return bool(np.asarray(flags).any())


def restore_newest_intact(checkpointer, abstract_state: Any) -> tuple[Any, dict, int]:
    """(state, data_state, step) of the newest step that restores; each damaged one on the way is
    moved aside with a warning. A `CheckpointMismatchError` propagates at once, moving nothing;
    `NoIntactCheckpointError` lists every step tried when none is left (none at all: not found)."""
    tried = []
    while True:
        steps = checkpointer.all_steps()
        if not steps and tried:
            raise NoIntactCheckpointError(_none_left_message(checkpointer.directory, tried))
        step = steps[-1] if steps else None
        damage = None
        try:
            state, data_state = checkpointer.restore(abstract_state, step=step)
        except CheckpointDamagedError as e:
            damage = e
        if not _any_process(damage is not None):
            return state, data_state, step
        reason = damage.reason if damage else 'another process could not read its part'
        moved = f'{os.path.join(checkpointer.directory, str(step))}{_DAMAGED_SUFFIX}?'
        if jax.process_index() == 0:
            moved = move_aside(checkpointer.directory, step)
        log.warning('Checkpoint step %d in %s is damaged (%s); moved it aside to %s and '
                    'trying the next older step.', step, checkpointer.directory, reason, moved)
        tried.append((step, moved, reason))
        _barrier(f'checkpoint_damage_{step}')
        checkpointer.reload()


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def _none_left_message(directory: str, tried: list) -> str:
    lines = [f'  step {step}: {reason} -> moved to {moved}' for step, moved, reason in tried]
    return (f'No intact checkpoint is left in {directory!r}; every step failed to restore:\n'
            + '\n'.join(lines) + '\nNothing was deleted. Fix: restore the directory from a '
            'backup, or rename a step back (e.g. mv 20.damaged-1 20) if its damage is '
            'repairable; to start over on purpose, use a new --workdir.')
