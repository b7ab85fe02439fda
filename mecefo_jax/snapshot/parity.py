"""Parity of snapshots across a group of workers, so a lost one can be rebuilt.

Where no live replica holds state twice, losing a worker with its keeper would lose its
part. A group of g >= 2 members survives losing any one, for 1/(g-1) of a snapshot per
keeper (RAID-5): member m's blob is cut into g-1 chunks (`chunk_plan`) and keeper p holds
the XOR (`blob.XorCode`) of chunk c(m, p) of every member m != p. Writers push chunks
after publishing (`ParityPusher`); `rebuild_member` uses the newest step whose stripes
are complete on every survivor, and verifies the blob. Keepers need `--slots 3` here.
"""
from __future__ import annotations

import dataclasses
import logging
import zlib
from collections.abc import Sequence

import numpy as np

from mecefo_jax.snapshot import blob
from mecefo_jax.snapshot.client import BlobSnapshot, Keeper, KeeperClient, KeeperError

log = logging.getLogger(__name__)

FALLBACK = ('Fall back to restarting from the Orbax disk checkpoint (written every '
            'train.checkpoint_every steps).')


class ParityLossError(RuntimeError):
    """More members of a parity group are lost than its code can rebuild."""


class RebuildError(RuntimeError):
    """No step can be rebuilt from what the survivors hold."""


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Bytes [offset, offset + length) of `member`'s blob, parity kept at keeper `stripe`."""
    member: int
    stripe: int
    chunk_index: int
    offset: int
    length: int


def chunk_plan(member: int, nbytes: int, members: int) -> list[Chunk]:
    """How member's blob of `nbytes` is cut over the other members' stripes."""
    if members < 2:
        raise ValueError(f'A parity group needs at least 2 members, got {members}.')
    if not 0 <= member < members:
        raise ValueError(f'Member {member} is not in a group of {members}.')
    size = -(-nbytes // (members - 1))
    chunks = []
    for j, stripe in enumerate(p for p in range(members) if p != member):
        start = min(j * size, nbytes)
        chunks.append(Chunk(member, stripe, j, start, min(start + size, nbytes) - start))
    return chunks


class ParityPusher:
    """Sends one member's chunks to its group's keepers after each publish; `keepers[p]` is
    member p's keeper (the own one is never contacted)."""

    def __init__(self, group: str, member: int, keepers: Sequence[Keeper], *,
                 code: blob.XorCode | None = None, timeout: float = 120.0,
                 generation: int = 0):
        self.group, self.member, self.members = str(group), int(member), len(keepers)
        # A relaunched job's stripes replace those its rolled-back predecessor left.
        self.generation = int(generation)
        self.code = code or blob.XorCode()
        if self.code.parity_blocks != 1:
            raise ValueError(f'The RAID-5 placement holds one parity block per stripe; '
                             f'code {self.code.name!r} has {self.code.parity_blocks}.')
        chunk_plan(self.member, 0, self.members)  # validates member and group size
        self._clients = {p: KeeperClient(k, timeout=timeout)
                         for p, k in enumerate(keepers) if p != self.member}

    def push(self, step: int, raw, checksum: int) -> int:
        """Send step's chunks of `raw` (the published blob); returns bytes sent."""
        raw = memoryview(raw)
        sent = 0
        for c in chunk_plan(self.member, len(raw), self.members):
            data = raw[c.offset:c.offset + c.length]
            self._clients[c.stripe].parity_put(
                data, group=self.group, step=int(step), stripe=c.stripe, members=self.members,
                member=self.member, chunk_index=c.chunk_index, offset=c.offset, length=c.length,
                chunk_crc=zlib.crc32(data), blob_nbytes=len(raw), blob_checksum=int(checksum),
                code=self.code.name, generation=self.generation)
            sent += c.length
        return sent

    def close(self) -> None:
        for c in self._clients.values():
            c.close()


@dataclasses.dataclass
class Rebuilt:
    """A lost member's snapshot blob, rebuilt and verified."""
    member: int
    step: int
    raw: bytearray
    checksum: int

    def snapshot(self) -> BlobSnapshot:
        return BlobSnapshot(self.raw, source=f'parity:member{self.member}', expect_checksum=self.checksum)


def rebuild_member(group: str, keepers: Sequence[Keeper | None], lost: int | Sequence[int] = (), *,
                   code: blob.XorCode | None = None, timeout: float = 120.0) -> Rebuilt:
    """Rebuild the one lost member's newest recoverable snapshot.

    `keepers[m]` is member m's keeper, None where it is known to be gone;
    `lost` names members lost even if their keeper answers (e.g. a keeper
    that restarted empty). A keeper that does not answer counts as lost.
    """
    code = code or blob.XorCode()
    members = len(keepers)
    if members < 2:
        raise ValueError(f'A parity group needs at least 2 members, got {members}.')
    lost = {lost} if isinstance(lost, int) else set(lost)
    lost |= {m for m, k in enumerate(keepers) if k is None}
    clients = {m: KeeperClient(k, timeout=timeout) for m, k in enumerate(keepers) if m not in lost}
    try:
        for m, c in list(clients.items()):
            try:
                c.hello()
            except KeeperError:
                lost.add(m)
                clients.pop(m).close()
        if len(lost) > code.parity_blocks:
            raise ParityLossError(
                f'Parity group {group!r} lost members {sorted(lost)} of {members}; {code.name} parity '
                f'rebuilds at most {code.parity_blocks} member per group. {FALLBACK}')
        if not lost:
            raise ValueError(f'No member of parity group {group!r} is lost; nothing to rebuild.')
        (gone,) = lost
        return _rebuild(group, gone, members, clients, code)
    finally:
        for c in clients.values():
            c.close()


def _rebuild(group, gone, members, clients, code) -> Rebuilt:
    published = {m: {r.step: r for r in c.snapshots()} for m, c in clients.items()}
    stripes = {p: {s['step']: s for s in c.parity_list(group) if s['complete']} for p, c in clients.items()}
    steps = set.intersection(*(set(s) for s in stripes.values()))
    problems = []
    for step in sorted(steps, reverse=True):
        try:
            return _rebuild_step(group, gone, members, step, clients, published, stripes, code)
        except (RebuildError, blob.SnapshotCorruptError, KeeperError) as e:
            log.warning('Rebuilding member %d at step %d failed: %s', gone, step, e)
            problems.append(f'step {step}: {e}')
    held = {m: sorted(p) for m, p in published.items()}
    complete = {p: sorted(s) for p, s in stripes.items()}
    raise RebuildError(
        f"Cannot rebuild member {gone} of parity group {group!r}: no step has complete parity on "
        f"every survivor and the survivors' snapshots of it. Survivors hold snapshots {held} and "
        f"complete parity {complete}. " + (' '.join(problems) + ' ' if problems else '') + FALLBACK)


def _rebuild_step(group, gone, members, step, clients, published, stripes, code) -> Rebuilt:
    contributions = {p: {int(m): c for m, c in stripes[p][step]['contributions'].items()} for p in clients}
    sizes = {(c[gone]['blob_nbytes'], c[gone]['blob_checksum']) for c in contributions.values()}
    if len(sizes) != 1:
        raise RebuildError(f"stripes disagree on member {gone}'s blob (size, checksum): {sorted(sizes)}")
    ((nbytes, checksum),) = sizes
    for p, contrib in contributions.items():
        for m, c in contrib.items():
            if m == gone:
                continue
            record = published[m].get(step)
            if record is None:
                raise RebuildError(f'survivor {m} no longer holds its snapshot')
            if record.checksum != c['blob_checksum']:
                raise RebuildError(f"survivor {m}'s snapshot is not the one it contributed to stripe {p}")
    raw = bytearray(nbytes)
    for p in sorted(clients):
        _, parity = clients[p].parity_get(group, step)
        blocks, lengths = [], []
        for m in range(members):
            c = contributions[p].get(m)
            if m == p:  # no member contributes to its own stripe: a zero block
                blocks.append(np.zeros(0, np.uint8))
                lengths.append(0)
            elif m == gone:
                blocks.append(None)
                lengths.append(c['length'])
            else:
                data = clients[m].read(step, [(c['offset'], c['length'])])
                if zlib.crc32(data) != c['chunk_crc']:
                    raise RebuildError(f"survivor {m}'s chunk for stripe {p} fails its crc")
                blocks.append(data)
                lengths.append(c['length'])
        chunk = code.decode(blocks, [parity], lengths)[gone]
        mine = contributions[p][gone]
        if zlib.crc32(chunk) != mine['chunk_crc']:
            raise RebuildError(f"rebuilt chunk {mine['chunk_index']} (stripe {p}) fails its recorded crc")
        memoryview(raw)[mine['offset']:mine['offset'] + mine['length']] = chunk
    rebuilt = Rebuilt(member=gone, step=step, raw=raw, checksum=checksum)
    rebuilt.snapshot().verify()  # preamble and header against `checksum`, then every shard's checksum
    return rebuilt
