"""Where each batch shard is computed: slots and roles per live replica.

The data pipeline always yields the global batch as `num_shards` shards in a
fixed order. A `Layout` says which live replica computes which examples and in
which role; `assemble` turns a global batch into the per-replica slot arrays
the step consumes. Failures change the layout, never the samples.

Shape letters: N shards, B examples per shard, R live replicas, S slots per
replica, P examples per slot, T tokens per example (seq_len + 1).
"""
import dataclasses

import numpy as np

ROLE_NORMAL = 0  # exact gradients
ROLE_NEIGHBOUR = 1  # MeCeFO approximate backward on every slot it computes


@dataclasses.dataclass(frozen=True)
class Piece:
    """Examples [start, stop) of batch shard `shard`."""
    shard: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclasses.dataclass(frozen=True)
class Layout:
    """Static assignment of batch pieces to the live replicas of a mesh.

    `replicas[i]` is the original data-axis index of the i-th live replica (the
    i-th row of the current mesh); `slots[i]` lists the pieces it computes, at
    most `slot_batch` examples each; `roles[i]` is its role for all of them.
    """
    replicas: tuple[int, ...]
    roles: tuple[int, ...]
    slots: tuple[tuple[Piece, ...], ...]
    slot_batch: int

    def __post_init__(self):
        if not (len(self.replicas) == len(self.roles) == len(self.slots)):
            raise ValueError('Layout needs one role and one slot list per live replica.')
        for pieces in self.slots:
            for piece in pieces:
                if not 0 < piece.size <= self.slot_batch:
                    raise ValueError(f'{piece} does not fit a slot of {self.slot_batch}.')

    @property
    def num_slots(self) -> int:
        """Slots per replica: the busiest replica's count (others are padded)."""
        return max(1, max(len(pieces) for pieces in self.slots))

    @property
    def signature(self) -> tuple[int, int, int]:
        """What the compiled step depends on: (replicas, slots, slot batch)."""
        return len(self.replicas), self.num_slots, self.slot_batch

    def shards_covered(self) -> dict[int, int]:
        """Examples computed per shard, to check nothing is lost or repeated."""
        covered: dict[int, int] = {}
        for pieces in self.slots:
            for piece in pieces:
                covered[piece.shard] = covered.get(piece.shard, 0) + piece.size
        return covered


def full_layout(num_replicas: int, shard_batch: int) -> Layout:
    """Fault-free data parallelism: replica i computes shard i exactly."""
    return Layout(replicas=tuple(range(num_replicas)),
                  roles=(ROLE_NORMAL,) * num_replicas,
                  slots=tuple((Piece(i, 0, shard_batch),) for i in range(num_replicas)),
                  slot_batch=shard_batch)


def assemble(layout: Layout, tokens_nbt: np.ndarray) -> dict[str, np.ndarray]:
    """Gather a global batch into slot arrays for the step.

    Returns int32 tokens [R*S, P, T], float32 example weights [R*S, P] (0 marks
    padding) and int32 roles [R]; the leading axes are split over 'data'.
    """
    num_replicas, num_slots, slot_batch = layout.signature
    seq = tokens_nbt.shape[-1]
    tokens = np.zeros((num_replicas, num_slots, slot_batch, seq), np.int32)
    weights = np.zeros((num_replicas, num_slots, slot_batch), np.float32)
    for r, pieces in enumerate(layout.slots):
        for s, piece in enumerate(pieces):
            tokens[r, s, :piece.size] = tokens_nbt[piece.shard, piece.start:piece.stop]
            weights[r, s, :piece.size] = 1.0
    return {'tokens': tokens.reshape(num_replicas * num_slots, slot_batch, seq),
            'weights': weights.reshape(num_replicas * num_slots, slot_batch),
            'roles': np.asarray(layout.roles, np.int32)}
