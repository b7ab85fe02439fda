"""Erasure codes over byte blocks, behind one small interface.

A stripe is one data block per member (shorter ones count as zero-padded) plus
`parity_blocks` parity blocks. `XorCode` is RAID-5's single parity; a k-of-m code
(e.g. Reed-Solomon) implements the same methods. `accumulate` lets keepers build parity
from contributions arriving one member at a time (any linear code can). No jax here.
"""
from __future__ import annotations

import abc
from collections.abc import Sequence

import numpy as np


class TooManyLostError(ValueError):
    """More blocks of a stripe are missing than the code can rebuild."""


def as_bytes(block) -> np.ndarray:
    """A flat uint8 view of any buffer."""
    if isinstance(block, np.ndarray):
        return block.reshape(-1).view(np.uint8)
    return np.frombuffer(block, dtype=np.uint8)


def xor_into(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[:len(src)] ^= src, eight bytes at a time where possible."""
    n = len(src)
    if n > len(dst):
        raise ValueError(f'Block of {n} bytes does not fit a parity buffer of {len(dst)}.')
    wide = n // 8 * 8
    if wide:
        np.bitwise_xor(dst[:wide].view(np.uint64), src[:wide].view(np.uint64),
                       out=dst[:wide].view(np.uint64))
    if n > wide:
        np.bitwise_xor(dst[wide:n], src[wide:n], out=dst[wide:n])


class ErasureCode(abc.ABC):
    """Parity over the blocks of one stripe."""

    name: str
    parity_blocks: int  # how many lost blocks per stripe it can rebuild

    @abc.abstractmethod
    def encode(self, blocks: Sequence) -> list[np.ndarray]:
        """The stripe's parity blocks, each as long as the longest block."""

    @abc.abstractmethod
    def accumulate(self, parity: list[np.ndarray], block, position: int) -> None:
        """Fold data block `position` into `parity` in place (buffers long enough)."""

    @abc.abstractmethod
    def decode(self, blocks: Sequence, parity: Sequence, lengths: Sequence[int]) -> list[np.ndarray]:
        """All data blocks, the missing ones (None) rebuilt to `lengths`."""


class XorCode(ErasureCode):
    name = 'xor'
    parity_blocks = 1

    def encode(self, blocks):
        blocks = [as_bytes(b) for b in blocks]
        parity = [np.zeros(max((len(b) for b in blocks), default=0), np.uint8)]
        for i, b in enumerate(blocks):
            self.accumulate(parity, b, i)
        return parity

    def accumulate(self, parity, block, position):
        xor_into(parity[0], as_bytes(block))

    def decode(self, blocks, parity, lengths):
        missing = [i for i, b in enumerate(blocks) if b is None]
        if not missing:
            return [as_bytes(b) for b in blocks]
        if len(missing) > self.parity_blocks or parity[0] is None:
            raise TooManyLostError(f"XOR parity rebuilds one block per stripe; blocks {missing} "
                                   f"are missing{' and so is the parity' if parity[0] is None else ''}.")
        (lost,) = missing
        out = as_bytes(parity[0]).copy()
        for i, b in enumerate(blocks):
            if i != lost:
                xor_into(out, as_bytes(b))
        if lengths[lost] > len(out):
            raise TooManyLostError(f'Block {lost} has {lengths[lost]} bytes but the parity only {len(out)}.')
        rebuilt = [as_bytes(b) if b is not None else None for b in blocks]
        rebuilt[lost] = out[:lengths[lost]]
        return rebuilt


CODES: dict[str, ErasureCode] = {XorCode.name: XorCode()}


def get_code(name: str) -> ErasureCode:
    try:
        return CODES[name]
    except KeyError:
        raise ValueError(f'Unknown erasure code {name!r}; known: {sorted(CODES)}.') from None
