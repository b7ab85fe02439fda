"""Replicas as rows: many logical data-parallel replicas packed onto fewer devices.

The combination rule (`combination.py`) counts rows, not devices, so which device holds a
row changes only the order of a sum. A `Packing` lays a `Layout`'s exact rows, then its
neighbour-mode rows, end to end over `devices` rows of the mesh, `capacity` rows each
(the last padded with zero weights); only devices holding neighbour-mode rows run the
neighbour program, chosen per device by `lax.switch`, and the compiled step is keyed by
the row counts per role (`signature`). So one failure at a time compiles at most two
steps whichever replica fails, and costs the rows it computes, as one device per replica
would. On one GPU (`devices=1`) this holds the paper's 32 replicas.

Shape letters as in `layout.py`, with D devices and C rows per device.
"""
import dataclasses
import math

import numpy as np

from mecefo_jax.neighbour.layout import ROLE_MIXED, ROLE_NEIGHBOUR, ROLE_NORMAL, Layout, Piece, Program, joined_rows


@dataclasses.dataclass(frozen=True)
class Packing:
    """A logical layout's rows on `devices` devices: per device, its exact pieces, then
    its neighbour-mode pieces, in `programs[program_index[d]]`."""
    devices: int
    exact: tuple[tuple[Piece, ...], ...]  # per device, computed exactly
    approximate: tuple[tuple[Piece, ...], ...]  # per device, in neighbour mode
    capacity: int  # rows per device, padding included
    programs: tuple[Program, ...]  # the distinct device programs, sorted
    program_index: tuple[int, ...]  # per device, its program in `programs`

    @property
    def replicas(self) -> tuple[int, ...]:
        """The mesh's data rows (devices), as `Layout.replicas` lists the live ones."""
        return tuple(range(self.devices))

    @property
    def is_plain(self) -> bool:
        return self.programs == (Program(ROLE_NORMAL, self.capacity),)

    @property
    def signature(self) -> tuple:
        """What the compiled step depends on: the device count and the programs."""
        return self.devices, self.programs

    def assemble(self, tokens_nbt: np.ndarray) -> dict[str, np.ndarray]:
        """The step's arrays: tokens [D*C, T], weights [D*C] (0 marks padding), programs [D]."""
        return joined_rows([e + a for e, a in zip(self.exact, self.approximate)], self.capacity,
                           self.program_index, tokens_nbt)


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


def _deal(pieces: list[Piece], devices: int, per: int, offset: int) -> list[list[Piece]]:
    """Cut `pieces`, laid end to end from example `offset` on, into runs of `per` examples:
    device d takes examples [d * per, (d + 1) * per)."""
    runs: list[list[Piece]] = [[] for _ in range(devices)]
    for piece in pieces:
        start = piece.start
        while start < piece.stop:
            device = offset // per
            take = min(piece.stop - start, (device + 1) * per - offset)
            runs[device].append(Piece(piece.shard, start, start + take))
            start, offset = start + take, offset + take
    return runs


def _program(exact_rows: int, neighbour_rows: int, capacity: int) -> Program:
    """A device's program; its padding rows (weight 0) follow its last role's rows."""
    if not neighbour_rows:
        return Program(ROLE_NORMAL, capacity)
    return Program(ROLE_MIXED, capacity, exact_rows) if exact_rows else Program(ROLE_NEIGHBOUR, capacity)


def pack(layout: Layout, devices: int) -> Packing:
    """`layout`'s rows on `devices` devices: exact rows first, then neighbour-mode rows."""
    if devices < 1:
        raise ValueError(f'pack: devices must be >= 1, got {devices}.')
    exact, approximate = _split_pieces(layout)
    num_exact = sum(p.size for p in exact)
    capacity = math.ceil((num_exact + sum(p.size for p in approximate)) / devices)
    if not capacity:
        raise ValueError('pack: the layout computes no rows.')
    exact_runs = _deal(exact, devices, capacity, 0)
    approx_runs = _deal(approximate, devices, capacity, num_exact)
    per_device = [_program(sum(p.size for p in e), sum(p.size for p in a), capacity)
                  for e, a in zip(exact_runs, approx_runs)]
    programs = tuple(sorted(set(per_device)))
    return Packing(devices, tuple(map(tuple, exact_runs)), tuple(map(tuple, approx_runs)), capacity,
                   programs, tuple(programs.index(p) for p in per_device))
