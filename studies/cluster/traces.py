"""Seeded failure traces, cut into intervals of constant live set with each one's loads
(`faults/strategies.py`'s placement rules, in numpy so that 1,024 replicas take seconds)."""
from __future__ import annotations

import dataclasses

import numpy as np

from mecefo_jax.failure_schedule import REGIMES  # name -> (mtbf_hours, mttr_hours)

CALIBRATION_REPLICAS = 32  # the paper's cluster (4 nodes x 8 A100s)
# Part of every trace's seed: the stream whose figures docs/cluster.md quotes.
_STREAM = ord('A')


def regime_rates(regime: str, mtbf_hours: float = 0.0, mttr_hours: float = 0.0):
    """(mtbf_hours, mttr_hours) of a named regime, or the custom pair for 'custom'."""
    if regime == 'custom' and mtbf_hours > 0 and mttr_hours > 0:
        return float(mtbf_hours), float(mttr_hours)
    if regime not in REGIMES:
        raise ValueError(f'regime {regime!r}: use none, {", ".join(REGIMES)} or custom with --mtbf_hours '
                         f'and --mttr_hours > 0 (got {mtbf_hours!r} and {mttr_hours!r}).')
    return REGIMES[regime]


def sample_trace(*, num_replicas: int, mtbf_hours: float, mttr_hours: float,
                 horizon_hours: float, seed: int, rate_scaling: str = 'per_replica') -> np.ndarray:
    """Outages [k, 3] (replica, start_sec, end_sec; an end may pass the horizon): failures at
    the cluster-wide rate, one live replica each, none that would leave none live (as in
    `failure_schedule.py`). 'per_replica' keeps each replica's rate of the 32-replica
    calibration (cluster MTBF x 32 / n), 'cluster' the cluster's. The stream depends on
    (seed, n, mtbf, mttr) only: every strategy and model sees the same traces."""
    horizon, mttr = horizon_hours * 3600.0, mttr_hours * 3600.0
    mtbf = mtbf_hours * 3600.0 * (CALIBRATION_REPLICAS / num_replicas
                                  if rate_scaling == 'per_replica' else 1.0)
    rng = np.random.default_rng(
        [seed, num_replicas, _STREAM, int(round(mtbf_hours * 1e6)), int(round(mttr_hours * 1e6))])
    down_until = np.zeros(num_replicas)
    outages = []
    t = rng.exponential(mtbf)
    while t < horizon:
        live = np.flatnonzero(down_until <= t)
        if live.size > 1:
            victim = live[rng.integers(live.size)]
            down_until[victim] = t + rng.exponential(mttr)
            outages.append((victim, t, down_until[victim]))
        t += rng.exponential(mtbf)
    return np.array(outages, float).reshape(-1, 3)


def adopter_loads(live_mask) -> np.ndarray:
    """Shards adopted per replica under `strategies.adopters`: the nearest live ring
    neighbour, in index order; at a tie the less loaded, the next one first. The next one
    is never loaded yet at a tie except at the ring's wrap, where earlier choices count."""
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
    for i in np.flatnonzero((d_next == d_prev) & ((nxt == live[-1]) | (nxt == live[0]))):
        earlier = adopter[:i]
        if np.count_nonzero(earlier == nxt[i]) > np.count_nonzero(earlier == prev[i]):
            adopter[i] = prev[i]
    np.add.at(load, adopter, 1)
    return load


@dataclasses.dataclass(frozen=True)
class Intervals:
    """A trace cut where the live set changes. `adopt_shards` (1 + adopted) and `elastic_shards`
    (the orphans re-split over every live replica, in whole sequences of `shard_seqs` or
    continuous when None) are the busiest replica's; `event` marks a live-set change at the
    start (one relaunch), `onset` those in which some replica went down."""
    num_replicas: int
    horizon_sec: float
    start: np.ndarray
    end: np.ndarray
    failed: np.ndarray
    adopt_shards: np.ndarray
    elastic_shards: np.ndarray
    event: np.ndarray
    onset: np.ndarray
    shard_seqs: int | None = None

    @property
    def duration(self) -> np.ndarray:
        return self.end - self.start


def intervals(n: int, horizon: float, outages=(), *, shard_seqs: int | None = None) -> Intervals:
    """Cuts the outages (replica, start_sec, end_sec) of n replicas over [0, horizon) into
    intervals of constant live set, with their loads."""
    o, horizon = np.array(outages, float).reshape(-1, 3), float(horizon)
    if o.size and (o[:, 0].min() < 0 or o[:, 0].max() >= n or np.any(o[:, 2] <= o[:, 1])):
        raise ValueError(f'outages {outages!r}: need 0 <= replica < {n} and end > start.')
    times = np.concatenate([o[:, 1], o[:, 2]])
    deltas = np.concatenate([np.ones(len(o), int), -np.ones(len(o), int)])
    replicas = np.concatenate([o[:, 0], o[:, 0]]).astype(int)
    keep = times < horizon
    change_at, group = np.unique(times[keep], return_inverse=True)
    # Row 0: everything live from t = 0; row g + 1: after the changes at change_at[g].
    down = np.zeros((change_at.size + 1, n), np.int64)
    np.add.at(down, (group + 1, replicas[keep]), deltas[keep])
    masks = np.cumsum(down, 0) == 0
    # A replica failing again the instant it returns leaves the live set as it was: no event.
    keep_row = np.concatenate([[True], np.any(masks[1:] != masks[:-1], axis=1)])
    masks = masks[keep_row]
    start = np.concatenate([[0.0], change_at])[keep_row]
    live = masks.sum(1)
    failed = n - live
    adopt = np.array([1.0 + adopter_loads(m).max() for m in masks])
    if shard_seqs is None:
        elastic = 1.0 + failed / live
    else:
        elastic = 1.0 + -(-failed * shard_seqs // live) / shard_seqs
    return Intervals(num_replicas=n, horizon_sec=horizon, start=start,
                     end=np.append(start[1:], horizon), failed=failed,
                     adopt_shards=adopt, elastic_shards=elastic, event=np.arange(start.size) > 0,
                     onset=np.concatenate([[False], np.any(masks[:-1] & ~masks[1:], axis=1)]),
                     shard_seqs=shard_seqs)
