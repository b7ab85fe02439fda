"""Disk space for checkpoints: warn before the first save, explain a failed one.

An async Orbax save that runs out of space fails in a background thread and surfaces only
at the next save or wait, as a bare "No space left on device", leaving its
`<step>.orbax-checkpoint-tmp-*` directory behind: hence the look before the first save.
"""
from __future__ import annotations

import errno
import glob
import logging
import os
import shutil
from typing import Any

log = logging.getLogger(__name__)

# One step on disk is about the state's size: float weights and moments barely
# compress. The factor leaves room for OCDBT indices and metadata and for the
# blocks a filesystem keeps in reserve. Orbax deletes the oldest kept step only
# after the new one has committed, so the new step must fit next to all kept ones.
SAVE_HEADROOM = 1.5
_TMP_GLOB = '*.orbax-checkpoint-tmp*'


class CheckpointSaveError(OSError):
    """A checkpoint save failed on the filesystem; the previous step is the resume point."""


def state_nbytes(state: Any) -> int:
    """Bytes of every array in `state` (global sizes, not this process's shards)."""
    import jax
    import numpy as np
    total = 0
    for leaf in jax.tree.leaves(state):
        dtype = getattr(leaf, 'dtype', None)
        if dtype is None:
            leaf = np.asarray(leaf)
            dtype = leaf.dtype
        if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):  # stored as key data
            leaf = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(leaf.shape, dtype))
            dtype = leaf.dtype
        total += int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return total


def bytes_needed(state: Any) -> int:
    """Free bytes one more checkpoint step of `state` should find."""
    return int(state_nbytes(state) * SAVE_HEADROOM)


def free_bytes(directory: str) -> int:
    """Free bytes on the filesystem that holds (or will hold) `directory`."""
    path = os.path.abspath(directory)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return shutil.disk_usage(path).free


def _mib(n: int) -> str:
    return f'{n / 2**20:.1f} MiB'


def warn_if_short(directory: str, state: Any) -> bool:
    """Warn when `directory` has less room than a save of `state` needs; True if short."""
    if '://' in directory:  # object stores have no free-space figure to read
        return False
    needed, free = bytes_needed(state), free_bytes(directory)
    if free >= needed:
        return False
    log.warning('Checkpoints in %s may not fit: a save needs about %s (state %s x %.1f '
                'headroom) but only %s is free. Free space there, lower '
                'train.keep_checkpoints, or use another --workdir.', directory, _mib(needed),
                _mib(state_nbytes(state)), SAVE_HEADROOM, _mib(free))
    return True


def remove_tmp_dirs(directory: str) -> list[str]:
    """Delete the uncommitted step directories a failed save left; return them."""
    removed = sorted(glob.glob(os.path.join(directory, _TMP_GLOB)))
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def exception_chain(exc: BaseException):
    """`exc`, then the exceptions it was raised from or during, each once."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def explain_failed_save(directory: str, exc: BaseException, needed: int | None,
                        resume_step: int | None, *, clean: bool = True) -> BaseException:
    """The error to raise for a failed save: `exc` itself unless the filesystem failed (an
    OSError in its chain, or TensorStore's "No space left on device"); then, with the unfinished
    temporary directory removed (`clean`), bytes needed and free, and the resume step."""
    os_error = next((e for e in exception_chain(exc) if isinstance(e, OSError)), None)
    no_space = (os_error is not None and os_error.errno == errno.ENOSPC) \
        or 'No space left on device' in str(exc)
    if os_error is None and not no_space:
        return exc
    removed = remove_tmp_dirs(directory) if clean and '://' not in directory else []
    free = free_bytes(directory) if '://' not in directory else None
    what = 'ran out of disk space' if no_space else f'failed ({type(exc).__name__}: {exc})'
    need = _mib(needed) if needed is not None else 'unknown'
    have = _mib(free) if free is not None else 'unknown'
    resume = (f'step {resume_step} stays the resume point' if resume_step is not None
              else 'no earlier step exists to resume from')
    code = errno.ENOSPC if no_space else os_error.errno
    message = (f'Checkpoint save in {directory} {what}: needs about {need}, {have} free; '
               f'{resume}; removed {len(removed)} unfinished temporary director'
               f'{"y" if len(removed) == 1 else "ies"}. Fix: free space there, lower '
               'train.keep_checkpoints, or rerun with another --workdir.')
    return CheckpointSaveError(code, message) if code else CheckpointSaveError(message)
