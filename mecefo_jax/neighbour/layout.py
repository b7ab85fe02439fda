"""Where each batch shard is computed: pieces, roles and device programs per live replica.

Failures change the layout, never the samples. Every replica runs one *program*: a role
and a number of rows, all its pieces joined into one batch (one backward, no gradient
accumulator). *normal* computes every row exactly, *neighbour* every row in neighbour
mode, *mixed* its own shard exactly and only the adopted rows in neighbour mode.
Replicas of one role share the busiest one's program, padding masked by zero weights: a
synchronous step lasts as long as its slowest device anyway, and fewer programs mean
fewer branches and compilations.

Shape letters: N shards, B examples per shard, R live replicas, C capacity
(rows per replica, the largest program), T tokens per example (seq_len + 1).
"""
import dataclasses
import functools

import numpy as np

ROLE_NORMAL = 0  # exact gradients
ROLE_NEIGHBOUR = 1  # MeCeFO approximate backward on every example it computes
ROLE_MIXED = 2  # own shard exact, adopted rows in MeCeFO's approximate backward
ROLE_NAMES = {ROLE_NORMAL: 'normal', ROLE_NEIGHBOUR: 'neighbour', ROLE_MIXED: 'mixed'}


@dataclasses.dataclass(frozen=True)
class Piece:
    """Examples [start, stop) of batch shard `shard`."""
    shard: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclasses.dataclass(frozen=True, order=True)
class Program:
    """What one device runs: `rows` examples (padding included) in `role`; a mixed
    program computes its first `exact` rows exactly and the rest in neighbour mode."""
    role: int
    rows: int
    exact: int = 0  # mixed only

    def __post_init__(self):
        if (self.role == ROLE_MIXED) != (0 < self.exact < self.rows):
            raise ValueError(f'{self}: a mixed program, and only one, has 0 < exact < rows.')

    @property
    def exact_rows(self) -> int:
        """Rows computed exactly (the first ones); the rest are in neighbour mode."""
        return {ROLE_NORMAL: self.rows, ROLE_NEIGHBOUR: 0}.get(self.role, self.exact)

    @property
    def name(self) -> str:
        if self.role == ROLE_MIXED:
            return f'{ROLE_NAMES[self.role]}x{self.exact}+{self.rows - self.exact}'
        return f'{ROLE_NAMES[self.role]}x{self.rows}'


@dataclasses.dataclass(frozen=True)
class Layout:
    """Batch pieces per live replica: `replicas[i]`, the data-axis index of the mesh's i-th row,
    computes `pieces[i]` joined in order, in `roles[i]` (a mixed one its first piece exactly)."""
    replicas: tuple[int, ...]
    roles: tuple[int, ...]
    pieces: tuple[tuple[Piece, ...], ...]

    def __post_init__(self):
        if not (len(self.replicas) == len(self.roles) == len(self.pieces)):
            raise ValueError('Layout needs one role and one piece list per live replica.')
        for role, pieces in zip(self.roles, self.pieces):
            if role not in ROLE_NAMES:
                raise ValueError(f'unknown role {role}')
            for piece in pieces:
                if piece.size <= 0:
                    raise ValueError(f'{piece} is empty.')
            if role == ROLE_MIXED and len(pieces) < 2:
                raise ValueError('A mixed replica computes its first piece exactly and '
                                 f'adopts more; it has {pieces}.')
        if len({p[0].size for p, r in zip(self.pieces, self.roles) if r == ROLE_MIXED}) > 1:
            raise ValueError('Mixed replicas share one program: their first pieces (computed '
                             'exactly) must be of one size.')

    def rows(self, i: int) -> int:
        """Real examples of live row i."""
        return sum(piece.size for piece in self.pieces[i])

    def neighbour_rows(self, i: int) -> int:
        """Real examples of live row i computed in neighbour mode."""
        return {ROLE_NORMAL: 0, ROLE_NEIGHBOUR: self.rows(i)}.get(
            self.roles[i], self.rows(i) - self.pieces[i][0].size)

    def neighbour_mode_rows(self) -> int:
        """Examples computed in neighbour mode, over every live replica."""
        return sum(self.neighbour_rows(i) for i in range(len(self.replicas)))

    @property
    def uses_neighbour_mode(self) -> bool:
        """Some replica approximates (the projections V must be fresh)."""
        return any(role != ROLE_NORMAL for role in self.roles)

    @functools.cached_property  # the layout is frozen; its programs are read every step
    def programs(self) -> tuple[Program, ...]:
        """The distinct device programs, sorted: per role, its busiest replica's rows."""
        busiest: dict[int, int] = {}
        exact: dict[int, int] = {}
        for i, role in enumerate(self.roles):
            busiest[role] = max(busiest.get(role, 1), self.rows(i))
            if role == ROLE_MIXED:
                exact[role] = self.pieces[i][0].size
        return tuple(sorted(Program(role, rows, exact.get(role, 0))
                            for role, rows in busiest.items()))

    def program_index(self) -> tuple[int, ...]:
        """Per live row, the index of its program in `programs`."""
        by_role = {p.role: k for k, p in enumerate(self.programs)}
        return tuple(by_role[role] for role in self.roles)

    @property
    def capacity(self) -> int:
        """Rows per replica in the assembled batch: the largest program."""
        return max(p.rows for p in self.programs)

    @property
    def is_plain(self) -> bool:
        """One normal program everywhere: plain data parallelism, no branching."""
        return len(self.programs) == 1 and self.programs[0].role == ROLE_NORMAL

    @property
    def signature(self) -> tuple:
        """What the compiled step depends on: (live replicas, programs)."""
        return len(self.replicas), self.programs

    def shards_covered(self) -> dict[int, int]:
        """Examples computed per shard, to check nothing is lost or repeated."""
        covered: dict[int, int] = {}
        for pieces in self.pieces:
            for piece in pieces:
                covered[piece.shard] = covered.get(piece.shard, 0) + piece.size
        return covered

    def examples(self) -> int:
        return sum(self.rows(i) for i in range(len(self.replicas)))

    def assemble(self, tokens_nbt: np.ndarray) -> dict[str, np.ndarray]:
        """The step's arrays for this layout (`assemble`); a `row_packing.Packing` answers alike."""
        return assemble(self, tokens_nbt)


def full_layout(num_replicas: int, shard_batch: int) -> Layout:
    """Fault-free data parallelism: replica i computes shard i exactly."""
    return Layout(replicas=tuple(range(num_replicas)),
                  roles=(ROLE_NORMAL,) * num_replicas,
                  pieces=tuple((Piece(i, 0, shard_batch),) for i in range(num_replicas)))


def assemble(layout: Layout, tokens_nbt: np.ndarray) -> dict[str, np.ndarray]:
    """The step's arrays: int32 tokens [R*C, T], float32 example weights [R*C] (0 marks padding)
    and int32 program indices [R]; split over 'data', replica r owns rows [r*C, (r+1)*C)."""
    return joined_rows(layout.pieces, layout.capacity, layout.program_index(), tokens_nbt)


def joined_rows(pieces_per_row, capacity: int, program_index, tokens_nbt: np.ndarray) -> dict:
    """`assemble`'s arrays: each row's pieces joined in order, padded to `capacity`."""
    rows, seq = len(pieces_per_row), tokens_nbt.shape[-1]
    tokens = np.zeros((rows, capacity, seq), np.int32)
    weights = np.zeros((rows, capacity), np.float32)
    for r, pieces in enumerate(pieces_per_row):
        row = 0
        for piece in pieces:
            tokens[r, row:row + piece.size] = tokens_nbt[piece.shard, piece.start:piece.stop]
            weights[r, row:row + piece.size] = 1.0
            row += piece.size
    return {'tokens': tokens.reshape(rows * capacity, seq), 'weights': weights.reshape(rows * capacity),
            'programs': np.asarray(program_index, np.int32)}
