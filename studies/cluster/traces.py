"""Failure traces for the cluster simulator, and what each live set costs.

This module owns (1) sampling seeded failure traces in continuous time, the
paper's regimes read per cluster (failures arrive at 1/MTBF for the whole
cluster, each taking one replica; docs/cluster.md) and (2) cutting a trace
into intervals of constant live set, with the load each live set puts on the
busiest replica. Traces start with every replica live;
a failure that would leave nothing live is dropped, as in
`faults/schedule.py`. The loads reproduce `faults/strategies.py` exactly
(the tests check it against `adopters` and `layout_for` on random masks),
vectorised so that a 1,024-replica trace with thousands of changes takes a
fraction of a second: `mecefo` / `ndb_naive` give each failed shard to its
nearest live ring neighbour (busiest: 1 + its adopted shards); `elastic` /
`checkpoint_restart` re-split the orphaned sequences over every live replica
(busiest: ceil(f s / (n - f)) extra sequences of a shard of s, or f / (n - f)
shards for continuous batches). `mecefo_planned` is not here: `cluster.sim`
asks the planner itself. Pure numpy: no jax import.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from mecefo_jax.faults.schedule import REGIMES  # name -> (mtbf_hours, mttr_hours)

CALIBRATION_REPLICAS = 32  # the paper's cluster (4 nodes x 8 A100s)
# Part of every trace's seed: the stream that earlier runs, whose figures docs/cluster.md
# quotes, drew for this (per-cluster) reading of the regimes.
_STREAM = ord('A')


@dataclasses.dataclass(frozen=True)
class Trace:
    """Outages (replica, start_sec, end_sec) of `num_replicas` replicas over [0, horizon_sec)."""
    num_replicas: int
    horizon_sec: float
    outages: np.ndarray  # float64 [k, 3]: replica, start, end (end may pass the horizon)


def regime_rates(regime: str, mtbf_hours: float = 0.0, mttr_hours: float = 0.0):
    """(mtbf_hours, mttr_hours) of a named regime, or the custom pair for 'custom'."""
    if regime == 'custom':
        if not (mtbf_hours > 0 and mttr_hours > 0):
            raise ValueError(f'regime custom needs --mtbf_hours and --mttr_hours > 0, got '
                             f'{mtbf_hours!r} and {mttr_hours!r}.')
        return float(mtbf_hours), float(mttr_hours)
    if regime not in REGIMES:
        raise ValueError(f'regime {regime!r} is unknown; use none, {", ".join(REGIMES)} or '
                         f'custom (with --mtbf_hours and --mttr_hours).')
    return REGIMES[regime]


def sample_trace(*, num_replicas: int, mtbf_hours: float, mttr_hours: float,
                 horizon_hours: float, seed: int, rate_scaling: str = 'per_replica') -> Trace:
    """A seeded trace: failures at the cluster-wide rate, whatever is live, one replica each.

    `rate_scaling='per_replica'` keeps each replica's rate at the 32-replica
    calibration (the cluster MTBF scales by 32 / num_replicas); 'cluster'
    keeps the cluster's. The stream depends on (seed, num_replicas, mtbf,
    mttr) only, so every strategy and model is evaluated on the same traces.
    """
    if not (mtbf_hours > 0 and mttr_hours > 0 and horizon_hours > 0):
        raise ValueError(f'mtbf_hours, mttr_hours and horizon_hours must be > 0, got '
                         f'{mtbf_hours!r}, {mttr_hours!r}, {horizon_hours!r}.')
    if rate_scaling not in ('per_replica', 'cluster'):
        raise ValueError(f"--rate_scaling={rate_scaling!r}: use 'per_replica' or 'cluster'.")
    if num_replicas < 1:
        raise ValueError(f'--replicas={num_replicas} must be >= 1.')
    horizon = horizon_hours * 3600.0
    mtbf, mttr = mtbf_hours * 3600.0, mttr_hours * 3600.0
    if rate_scaling == 'per_replica':
        mtbf *= CALIBRATION_REPLICAS / num_replicas
    rng = np.random.default_rng(
        [seed, num_replicas, _STREAM, int(round(mtbf_hours * 1e6)), int(round(mttr_hours * 1e6))])
    down_until = np.zeros(num_replicas)
    outages = []
    t = rng.exponential(mtbf)
    while t < horizon:
        live = np.flatnonzero(down_until <= t)
        if live.size > 1:  # else it would leave no replica live: dropped, as in schedule.py
            victim = live[rng.integers(live.size)]
            down_until[victim] = t + rng.exponential(mttr)
            outages.append((victim, t, down_until[victim]))
        t += rng.exponential(mtbf)
    return Trace(num_replicas, horizon, np.array(outages, float).reshape(-1, 3))


def trace_from_outages(num_replicas: int, horizon_sec: float, outages) -> Trace:
    """A hand-written trace: (replica, start_sec, end_sec) triples."""
    arr = np.array(outages, float).reshape(-1, 3)
    if arr.size and (arr[:, 0].min() < 0 or arr[:, 0].max() >= num_replicas
                     or np.any(arr[:, 2] <= arr[:, 1])):
        raise ValueError(f'outages {outages!r}: need 0 <= replica < {num_replicas} '
                         f'and end > start.')
    return Trace(num_replicas, float(horizon_sec), arr)


# ------------------------------------------------------------- per live set


def adopter_loads(live_mask) -> np.ndarray:
    """Shards adopted per replica under `strategies.adopters` (0 for failed ones).

    Nearest live ring neighbour of each failed replica, processed in index
    order; at a tie the less loaded, the next one first. The next one is
    never loaded yet at a tie, except for the two gaps that touch the ring's
    wrap (a tie whose next live replica is the last or first live one), which
    are resolved in order by counting the earlier choices.
    """
    mask = np.asarray(live_mask, bool)
    n = mask.size
    live, failed = np.flatnonzero(mask), np.flatnonzero(~mask)
    load = np.zeros(n, np.int64)
    if failed.size == 0:
        return load
    if live.size == 0:
        raise ValueError('every replica is down: nothing can adopt a shard.')
    if live.size == 1:
        load[live[0]] = failed.size
        return load
    pos = np.searchsorted(live, failed)
    nxt, prev = live[pos % live.size], live[pos - 1]
    d_next, d_prev = (nxt - failed) % n, (failed - prev) % n
    adopter = np.where(d_prev < d_next, prev, nxt)
    tie = d_next == d_prev
    for i in np.flatnonzero(tie & ((nxt == live[-1]) | (nxt == live[0]))):
        earlier = adopter[:i]
        if np.count_nonzero(earlier == nxt[i]) > np.count_nonzero(earlier == prev[i]):
            adopter[i] = prev[i]
    np.add.at(load, adopter, 1)
    return load


@dataclasses.dataclass(frozen=True)
class Intervals:
    """A trace cut where the live set changes; one entry per interval.

    `*_shards` are the shards the busiest replica computes under each
    strategy (1.0 when nothing is down); `event` marks a live-set change at
    the interval's start (a failure, a return or both: one relaunch), and
    `onset` those changes in which some replica went down.
    """
    num_replicas: int
    horizon_sec: float
    start: np.ndarray
    end: np.ndarray
    failed: np.ndarray
    adopt_shards: np.ndarray  # mecefo / ndb_naive: 1 + adopted shards
    elastic_shards: np.ndarray  # elastic / checkpoint_restart
    event: np.ndarray
    onset: np.ndarray
    shard_seqs: int | None = None  # sequences per shard; None: continuous batches

    @property
    def duration(self) -> np.ndarray:
        return self.end - self.start


def live_set_shards(mask: np.ndarray, *, shard_seqs: int | None) -> tuple[float, float]:
    """(adopt, elastic) shards on the busiest replica for one live set.

    The reference for `batch_shards`, which does many live sets at once.
    """
    n, f = mask.size, int(np.count_nonzero(~mask))
    if f == 0:
        return 1.0, 1.0
    adopt = 1.0 + float(adopter_loads(mask).max())
    if shard_seqs is None:  # continuous batches
        elastic = 1.0 + f / (n - f)
    else:
        elastic = 1.0 + -(-f * shard_seqs // (n - f)) / shard_seqs
    return adopt, elastic


_CHUNK_ELEMENTS = 1 << 18  # live sets x replicas handled per vectorised chunk


def batch_shards(masks: np.ndarray, *, shard_seqs: int | None) -> np.ndarray:
    """`live_set_shards` of every row of `masks` [K, n]: float [K, 2].

    The same rules, vectorised over rows: previous / next live replica of
    every position from running max / min over the ring laid out three
    times. Rows the vectorised rules do not cover exactly (a tie at the
    ring's wrap) go through the one-row function.
    """
    masks = np.asarray(masks, bool)
    rows, n = masks.shape
    out = np.empty((rows, 2))
    step = max(1, _CHUNK_ELEMENTS // max(n, 1))
    for a in range(0, rows, step):
        out[a:a + step] = _batch_chunk(masks[a:a + step], shard_seqs)
    return out


def _batch_chunk(masks, shard_seqs):
    rows, n = masks.shape
    live_count = masks.sum(1)
    failed_count = n - live_count
    if np.any(live_count == 0):
        raise ValueError('every replica is down in some live set: nothing can adopt a shard.')
    out = np.ones((rows, 2))
    # Ring laid out three times; position p of the middle copy is n + p.
    # prev_at[r, q]: last live <= q; next_at[r, q]: first live >= q.
    idx3 = np.arange(3 * n)
    tiled = np.tile(masks, 3)
    prev_at = np.maximum.accumulate(np.where(tiled, idx3, -1), axis=1)
    next_at = np.minimum.accumulate(np.where(tiled, idx3, 4 * n)[:, ::-1], axis=1)[:, ::-1]
    # Work on the failed positions only: (row, position) pairs.
    fr, fp = np.nonzero(~masks)
    mid = n + fp
    nxt_t, prv_t = next_at[fr, mid + 1], prev_at[fr, mid - 1]

    # mecefo / ndb_naive: nearest live, tie -> the next one (see adopter_loads).
    d_next, d_prev = nxt_t - mid, mid - prv_t
    nxt, prv = nxt_t % n, prv_t % n
    adopter = np.where(d_prev < d_next, prv, nxt)
    first_live, last_live = next_at[:, n] % n, prev_at[:, 2 * n - 1] % n
    special = (d_next == d_prev) & (nxt != prv) & (
        (nxt == last_live[fr]) | (nxt == first_live[fr]))
    loads = np.bincount(fr * n + adopter, minlength=rows * n).reshape(rows, n)
    out[:, 0] = 1.0 + loads.max(1)
    for r in np.unique(fr[special]):
        out[r, 0] = 1.0 + adopter_loads(masks[r]).max()

    # elastic / checkpoint_restart: the orphaned examples over every live replica.
    if shard_seqs is None:
        out[:, 1] = 1.0 + failed_count / live_count
    else:
        out[:, 1] = 1.0 + -(-failed_count * shard_seqs // live_count) / shard_seqs

    out[failed_count == 0] = 1.0
    return out


def no_failures(num_replicas: int, horizon_sec: float) -> Intervals:
    """The intervals of a failure-free run: one, everything live."""
    return intervals(trace_from_outages(num_replicas, horizon_sec, []))


def intervals(trace: Trace, *, shard_seqs: int | None = None) -> Intervals:
    """Cuts `trace` into intervals of constant live set, with their loads."""
    n, horizon = trace.num_replicas, trace.horizon_sec
    o = trace.outages
    times = np.concatenate([o[:, 1], o[:, 2]])
    deltas = np.concatenate([np.ones(len(o), int), -np.ones(len(o), int)])
    replicas = np.concatenate([o[:, 0], o[:, 0]]).astype(int)
    keep = times < horizon
    times, deltas, replicas = times[keep], deltas[keep], replicas[keep]
    change_at, group = np.unique(times, return_inverse=True)
    # Row 0: everything live from t = 0; row g + 1: after the changes at change_at[g].
    down = np.zeros((change_at.size + 1, n), np.int64)
    np.add.at(down, (group + 1, replicas), deltas)
    masks = np.cumsum(down, 0) == 0
    # Drop changes that leave the live set as it was (a replica failing again
    # the instant it returns): they are no event.
    keep_row = np.concatenate([[True], np.any(masks[1:] != masks[:-1], axis=1)])
    masks = masks[keep_row]
    start = np.concatenate([[0.0], change_at])[keep_row]
    onset = np.concatenate([[False], np.any(masks[:-1] & ~masks[1:], axis=1)])
    event = np.ones(start.size, bool)
    event[0] = False
    shards = batch_shards(masks, shard_seqs=shard_seqs)
    return Intervals(num_replicas=n, horizon_sec=horizon, start=start,
                     end=np.append(start[1:], horizon), failed=n - masks.sum(1),
                     adopt_shards=shards[:, 0], elastic_shards=shards[:, 1], event=event, onset=onset,
                     shard_seqs=shard_seqs)
