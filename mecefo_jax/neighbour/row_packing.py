"""Replicas as rows: many logical data-parallel replicas packed onto fewer devices.

MeCeFO's combination rule (`combination.py`) counts rows, not devices, so a step needs
only two sets of rows, exact and neighbour-mode; which device holds a row changes only
the order of a sum. A `Packing` spreads a logical `Layout` over `devices` rows of the
mesh as evenly as it can: each device computes `exact_rows` rows exactly, then
`neighbour_rows` in neighbour mode, padded with zero weights. Roles are then data: who
failed only decides which rows are gathered where (`assemble`), and the compiled step
is keyed by the two counts (`signature`), so one failure at a time compiles at most two
steps whichever replica fails. On one GPU (`devices=1`) this holds the paper's 32 replicas.

Shape letters as in `layout.py`: N shards, B examples per shard, D devices,
C rows per device, T tokens per example.
"""
import dataclasses
import math

import numpy as np

from mecefo_jax.neighbour.layout import ROLE_MIXED, ROLE_NEIGHBOUR, ROLE_NORMAL, Layout, Piece, Program


@dataclasses.dataclass(frozen=True)
class Packing:
    """A logical layout's rows on `devices` devices: per device, exact pieces then neighbour ones."""
    devices: int
    exact: tuple[tuple[Piece, ...], ...]  # per device, computed exactly
    approximate: tuple[tuple[Piece, ...], ...]  # per device, in neighbour mode
    exact_rows: int  # rows per device computed exactly (padding included)
    neighbour_rows: int  # rows per device in neighbour mode (padding included)

    @property
    def program(self) -> Program:
        """The one program every device runs: its first `exact_rows` rows exact."""
        rows = self.exact_rows + self.neighbour_rows
        if self.neighbour_rows == 0:
            return Program(ROLE_NORMAL, rows)
        if self.exact_rows == 0:
            return Program(ROLE_NEIGHBOUR, rows)
        return Program(ROLE_MIXED, rows, self.exact_rows)

    @property
    def programs(self) -> tuple[Program, ...]:
        return (self.program,)

    @property
    def replicas(self) -> tuple[int, ...]:
        """The mesh's data rows (devices), as `Layout.replicas` lists the live ones."""
        return tuple(range(self.devices))

    @property
    def capacity(self) -> int:
        return self.exact_rows + self.neighbour_rows

    @property
    def is_plain(self) -> bool:
        return self.program.role == ROLE_NORMAL

    @property
    def signature(self) -> tuple:
        """What the compiled step depends on: the device count and the two row counts."""
        return self.devices, self.programs

    def assemble(self, tokens_nbt: np.ndarray) -> dict[str, np.ndarray]:
        """The step's arrays: tokens [D*C, T], weights [D*C] (0 marks padding), programs [D]."""
        seq, capacity = tokens_nbt.shape[-1], self.capacity
        tokens = np.zeros((self.devices, capacity, seq), np.int32)
        weights = np.zeros((self.devices, capacity), np.float32)
        for d in range(self.devices):
            for pieces, row in ((self.exact[d], 0), (self.approximate[d], self.exact_rows)):
                for piece in pieces:
                    tokens[d, row:row + piece.size] = tokens_nbt[piece.shard, piece.start:piece.stop]
                    weights[d, row:row + piece.size] = 1.0
                    row += piece.size
        return {'tokens': tokens.reshape(self.devices * capacity, seq),
                'weights': weights.reshape(self.devices * capacity),
                'programs': np.zeros(self.devices, np.int32)}


def _split_pieces(layout: Layout) -> tuple[list[Piece], list[Piece]]:
    """(pieces computed exactly, pieces in neighbour mode), in replica order."""
    exact, approximate = [], []
    for role, pieces in zip(layout.roles, layout.pieces):
        if role == ROLE_NORMAL:
            exact += pieces
        elif role == ROLE_NEIGHBOUR:
            approximate += pieces
        else:  # mixed: its own (first) piece exact, the adopted ones approximated
            exact.append(pieces[0])
            approximate += pieces[1:]
    return exact, approximate


def _deal(pieces: list[Piece], devices: int) -> tuple[tuple[tuple[Piece, ...], ...], int]:
    """Cut `pieces` into `devices` runs of consecutive examples, as equal as can be.

    Returns the runs and the rows per device (the longest run): device d takes
    examples [d * per, (d + 1) * per) of the pieces laid end to end.
    """
    total = sum(p.size for p in pieces)
    per = math.ceil(total / devices) if total else 0
    runs: list[list[Piece]] = [[] for _ in range(devices)]
    offset = 0  # examples dealt so far
    for piece in pieces:
        start = piece.start
        while start < piece.stop:
            device = offset // per
            take = min(piece.stop - start, (device + 1) * per - offset)
            runs[device].append(Piece(piece.shard, start, start + take))
            start, offset = start + take, offset + take
    return tuple(tuple(r) for r in runs), per


def pack(layout: Layout, devices: int) -> Packing:
    """`layout`'s rows on `devices` devices: exact rows spread evenly, then neighbour rows."""
    if devices < 1:
        raise ValueError(f'pack: devices must be >= 1, got {devices}.')
    exact, approximate = _split_pieces(layout)
    if not exact and not approximate:
        raise ValueError('pack: the layout computes no rows.')
    exact_runs, exact_rows = _deal(exact, devices)
    approx_runs, neighbour_rows = _deal(approximate, devices)
    return Packing(devices, exact_runs, approx_runs, exact_rows, neighbour_rows)
