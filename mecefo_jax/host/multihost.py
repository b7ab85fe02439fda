"""Cross-process agreement: every process of a multi-process job takes the same decision.

A process that decides from local information (live replicas, a measured snapshot
interval, tokenizer bytes) must agree with the others first, or they compile different
programs or read different data and wait forever in a collective. Each helper returns
the same value on every process, with no collective in a single-process job.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np


def _process_count() -> int:
    import jax
    return jax.process_count()


def agreed_live_mask(local_mask) -> tuple[bool, ...]:
    """Process 0's live mask, so every host changes topology at the same step."""
    if _process_count() == 1:
        return tuple(bool(x) for x in local_mask)
    from jax.experimental import multihost_utils
    agreed = multihost_utils.broadcast_one_to_all(np.asarray(local_mask, np.int32))
    return tuple(bool(x) for x in np.asarray(agreed))


def process_zero_int(value: int) -> int:
    """Process 0's `value` on every process (a choice made from local measurements)."""
    if _process_count() == 1:
        return int(value)
    from jax.experimental import multihost_utils
    return int(np.asarray(multihost_utils.broadcast_one_to_all(np.int32(value))))


def agreed_bytes(read: Callable[[], bytes], *, every_process_reads: bool,
                 mismatch_hint: str = '') -> bytes:
    """The same bytes on every process (a tokenizer model, say): process 0 reads and broadcasts,
    or each reads and the sha256 digests must match (else a ValueError ending in
    `mismatch_hint`). A `read` error is raised once the others know, so none waits forever."""
    import jax
    from jax.experimental import multihost_utils

    local_error, data = None, b''
    if every_process_reads or jax.process_index() == 0:
        try:
            data = read()
        except Exception as error:  # re-raised below, once the others know
            local_error = error
    if every_process_reads:
        digest = np.zeros(32, np.uint8)  # all zeros: this process could not read it
        if local_error is None:
            digest = np.frombuffer(hashlib.sha256(data).digest(), np.uint8)
        digests = np.asarray(multihost_utils.process_allgather(digest))
        if local_error is not None:
            raise local_error
        unreadable = [i for i, d in enumerate(digests) if not d.any()]
        differing = [i for i, d in enumerate(digests) if (d != digests[0]).any()]
        if unreadable or differing:
            problem = (f'processes {unreadable} could not read it' if unreadable else
                       f'processes {differing} hold different bytes than process 0')
            raise ValueError(f'The processes disagree: {problem}. {mismatch_hint}'.rstrip())
        return data
    length = len(data) if local_error is None else -1
    length = int(multihost_utils.broadcast_one_to_all(np.array([length], np.int32))[0])
    if local_error is not None:
        raise local_error
    if length < 0:
        raise RuntimeError('Process 0 failed to read what every process needs (its log has '
                           'the error), so this process has nothing to use.')
    source = jax.process_index() == 0
    buffer = np.frombuffer(data, np.uint8) if source else np.zeros(length, np.uint8)
    # The broadcast is a sum with zeros from the other processes, which widens uint8.
    return np.asarray(multihost_utils.broadcast_one_to_all(buffer)).astype(np.uint8).tobytes()
