"""How each strategy places the global batch on the live replicas.

Every strategy is a pure function of the live mask: `layout_for` recomputes the whole
assignment at each change, so chained failures (an adopter failing, adjacent replicas
failing) need no special cases. The global batch and its order never change, only where
shards are computed; each replica joins its own shard and what it adopts into one batch.
`REGISTRY` holds one `StrategySpec` per strategy (docs/failures.md tabulates them);
what treats strategies differently reads its fields, never the names, so a new strategy
is one new entry. `drop_adopters` is a control: it drops exactly the rows `mecefo`
approximates, so `mecefo` against it is the value of an approximated row over a dropped
one; controls stay out of the default `STRATEGIES`.
"""
import dataclasses
import enum

from mecefo_jax.faults.planner import Planner, ring_distance
from mecefo_jax.neighbour.layout import ROLE_NEIGHBOUR, ROLE_NORMAL, Layout, Piece


class Orphans(enum.Enum):
    """Where the shard of a failed replica goes."""
    NEAREST_NEIGHBOUR = 'the nearest live ring neighbour (`adopters`)'
    PLANNER = 'split as the planner chooses (`faults/planner.py`); it sets the roles too'
    SPLIT_EVENLY = 'split evenly over every live replica'
    NOWHERE = 'nowhere: its samples are skipped'
    NOWHERE_NOR_ADOPTERS = 'nowhere, and the replica that would adopt it skips its own shard'


@dataclasses.dataclass(frozen=True)
class StrategySpec:
    """What sets one strategy apart from the others (module docstring)."""
    name: str
    orphans: Orphans  # where failed shards go
    neighbour_mode: bool  # adopters run MeCeFO's neighbour program, else the exact one
    restores_at_failure: bool = False  # each failure restores the last checkpoint
    control: bool = False  # a control for an experiment, not a strategy to train with

    def __post_init__(self):
        # The planner sets neighbour mode itself; under NOWHERE no replica adopts.
        required = {Orphans.PLANNER: True, Orphans.NOWHERE: False,
                    Orphans.NOWHERE_NOR_ADOPTERS: False}.get(self.orphans)
        if required is not None and self.neighbour_mode != required:
            raise ValueError(f'strategy {self.name!r}: Orphans.{self.orphans.name} needs '
                             f'neighbour_mode={required}.')


# In the order every report lists them; `mecefo` is the paper's rule.
REGISTRY = (
    StrategySpec('mecefo', Orphans.NEAREST_NEIGHBOUR, neighbour_mode=True),
    StrategySpec('mecefo_planned', Orphans.PLANNER, neighbour_mode=True),
    StrategySpec('ndb_naive', Orphans.NEAREST_NEIGHBOUR, neighbour_mode=False),
    StrategySpec('elastic', Orphans.SPLIT_EVENLY, neighbour_mode=False),
    StrategySpec('drop', Orphans.NOWHERE, neighbour_mode=False),
    StrategySpec('checkpoint_restart', Orphans.SPLIT_EVENLY, neighbour_mode=False,
                 restores_at_failure=True),
    StrategySpec('drop_adopters', Orphans.NOWHERE_NOR_ADOPTERS, neighbour_mode=False,
                 control=True),
)
SPECS = {spec.name: spec for spec in REGISTRY}  # the config's STRATEGIES + CONTROLS, each once


def strategy_spec(name: str) -> StrategySpec:
    """The registry's entry for `name` (a config's is checked; a study's may not be)."""
    if name not in SPECS:
        raise ValueError(f'strategy {name!r} is unknown; use one of {", ".join(SPECS)}.')
    return SPECS[name]


def ring_order(replica: int, live_mask) -> list[int]:
    """Live replicas by ring distance from `replica` (at a tie, the next one first)."""
    n = len(live_mask)
    order = []
    for distance in range(1, n):
        for candidate in ((replica + distance) % n, (replica - distance) % n):
            if live_mask[candidate] and candidate not in order:
                order.append(candidate)
    return order


def adopters(live_mask) -> dict[int, int]:
    """Failed replica -> the nearest live replica on the ring, which adopts its shard; between
    equally near ones the less loaded, so adjacent failures spread over both sides."""
    load = {r: 0 for r, up in enumerate(live_mask) if up}
    chosen = {}
    for failed in (r for r, up in enumerate(live_mask) if not up):
        order = ring_order(failed, live_mask)
        if not order:
            raise AllReplicasDownError('every replica is down')
        n = len(live_mask)
        nearest = min(ring_distance(failed, c, n) for c in order)
        ties = [c for c in order if ring_distance(failed, c, n) == nearest]
        chosen[failed] = min(ties, key=lambda c: (load[c], ties.index(c)))
        load[chosen[failed]] += 1
    return chosen


class AllReplicasDownError(RuntimeError):
    """No live replica is left to compute on."""


def _split_evenly(pieces: list[Piece], parts: int) -> list[list[Piece]]:
    """Cut a run of pieces into `parts` consecutive groups whose sizes differ by <= 1: group j
    gets examples [j*total//parts, (j+1)*total//parts), two pieces where it spans shards."""
    total = sum(p.size for p in pieces)
    bounds = [j * total // parts for j in range(parts + 1)]
    groups: list[list[Piece]] = [[] for _ in range(parts)]
    offset = 0
    for piece in pieces:
        for j in range(parts):
            lo, hi = max(bounds[j], offset), min(bounds[j + 1], offset + piece.size)
            if hi > lo:
                start = piece.start + lo - offset
                groups[j].append(Piece(piece.shard, start, start + hi - lo))
        offset += piece.size
    return groups


def layout_for(strategy: str, live_mask, shard_batch: int, *,
               planner: Planner | None = None) -> Layout:
    """The layout `strategy` uses when only the replicas in `live_mask` are up; `planner`
    (`Orphans.PLANNER` only) carries the costs and memory bound, else the default costs."""
    spec = strategy_spec(strategy)
    live = [r for r, up in enumerate(live_mask) if up]
    if not live:
        raise AllReplicasDownError('every replica is down')
    if spec.orphans is Orphans.PLANNER:
        planner = planner or Planner(shard_batch)
        if planner.shard != shard_batch:
            raise ValueError(f'the planner plans shards of {planner.shard} rows, not '
                             f'{shard_batch}.')
        return planner.layout(live_mask)
    failed = [r for r, up in enumerate(live_mask) if not up]
    extra: dict[int, list[Piece]] = {r: [] for r in live}
    if spec.orphans is Orphans.NOWHERE_NOR_ADOPTERS:
        idle = set(adopters(live_mask).values())
        pieces = tuple(() if r in idle else (Piece(r, 0, shard_batch),) for r in live)
        return Layout(replicas=tuple(live), roles=(ROLE_NORMAL,) * len(live), pieces=pieces)
    if spec.orphans is Orphans.NEAREST_NEIGHBOUR:
        for shard, adopter in adopters(live_mask).items():
            extra[adopter].append(Piece(shard, 0, shard_batch))
    elif spec.orphans is Orphans.SPLIT_EVENLY and failed:
        orphans = [Piece(shard, 0, shard_batch) for shard in failed]
        for r, group in zip(live, _split_evenly(orphans, len(live))):
            extra[r].extend(group)
    # Orphans.NOWHERE: failed shards are simply not assigned.

    roles = tuple(ROLE_NEIGHBOUR if extra[r] and spec.neighbour_mode else ROLE_NORMAL
                  for r in live)
    pieces = tuple((Piece(r, 0, shard_batch),) + tuple(extra[r]) for r in live)
    return Layout(replicas=tuple(live), roles=roles, pieces=pieces)
