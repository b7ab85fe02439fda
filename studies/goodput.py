"""Modelled time and time to target: the arithmetic of the time-to-target experiment.

It owns the *record* of a run, plain JSON so that a report can be rebuilt from stored
runs with other cost constants (`executed`, `layouts`, `events`, `refresh_steps`, `saves`,
`relaunch`), and what is computed from it: the modelled cluster time at which each step's
state exists, and when the validation loss first reaches a target. No jax runs here, and
no timing taken during a run enters it, so the same record gives the same seconds on any
machine. What a step, a live-set change, a refresh and a save cost, and why:
docs/time_to_target.md, "How it is measured". A step redone after a rollback counts when
it is redone: the state of its first execution was lost.
"""
from __future__ import annotations

import collections
import dataclasses

from mecefo_jax.faults import step_clock
from mecefo_jax.neighbour.layout import ROLE_NORMAL, Program
from studies import refresh_costs
from studies.cluster.recovery import DEFAULT_BREAKDOWN

HOUR = 3600.0


@dataclasses.dataclass(frozen=True)
class TimeCosts:
    """The stated costs of modelled time, in cluster seconds (not measurements).

    Round figures for a GPU job, the same as the cluster projection's
    (`studies/cluster/recovery.py`), so that they can be argued with in
    one place; `fault.step_time_sec` and `fault.relaunch_delay_sec` come from
    the config.
    """
    # A dead replica noticed (heartbeat or collective timeout).
    detect_sec: float = DEFAULT_BREAKDOWN['disk']['detect_sec']
    # The live state moved onto the survivors' mesh, in place: as a restore from
    # host memory.
    rebuild_sec: float = DEFAULT_BREAKDOWN['memory']['restore_sec']
    # A layout's step compiled (its first slow step included).
    compile_sec: float = DEFAULT_BREAKDOWN['disk']['compile_sec']
    # checkpoint/restart's restore from shared storage.
    restore_sec: float = DEFAULT_BREAKDOWN['disk']['restore_sec']
    # What one asynchronous save blocks training for: the device-to-host copy of a
    # replica's state (a 350M model's parameters and Adam moments, 4.2 GB, at about
    # 2 GB/s of effective PCIe bandwidth); the write to storage overlaps training.
    checkpoint_save_sec: float = 2.0
    # The projection refresh's FLOP rate and link bandwidth (studies/refresh_costs.py).
    refresh_tflops: float = refresh_costs.DEFAULT_REFRESH_TFLOPS
    link_gbps: float = refresh_costs.DEFAULT_LINK_GBPS

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            rates = field.name in ('refresh_tflops', 'link_gbps')
            if (value <= 0) if rates else (value < 0):
                raise ValueError(f'TimeCosts.{field.name}={value!r} must be {"> 0" if rates else ">= 0"}.')


class LayoutBook:
    """Distinct (live mask, device programs) pairs of a run, numbered as first seen.

    A record keeps per executed step only the number; the programs are what
    modelled time needs (the slowest one sets the step), the live mask what
    a refresh and a compile depend on.
    """

    def __init__(self, layouts: list | None = None):
        self.layouts = list(layouts or [])
        self._index = {_key(x): i for i, x in enumerate(self.layouts)}

    def index(self, live, layout) -> int:
        """The number of `layout` (a `layout.Layout`) on the replicas `live`."""
        return self.add({'live': [bool(x) for x in live],
                         'programs': [[p.role, p.rows, p.exact] for p in layout.programs]})

    def add(self, entry: dict) -> int:
        """The number of an entry (of this or another book)."""
        key = _key(entry)
        if key not in self._index:
            self._index[key] = len(self.layouts)
            self.layouts.append(entry)
        return self._index[key]


def _key(entry: dict) -> tuple:
    return tuple(entry['live']), tuple(tuple(p) for p in entry['programs'])


class TimeModel:
    """Modelled seconds of a run's record for one config (see module docstring)."""

    def __init__(self, cfg, num_replicas: int, costs: TimeCosts | None = None,
                 bench: dict | None = None, exposed: float | None = None):
        """`exposed`: phi of the all-reduce; None takes the config's `fault.allreduce_exposed`."""
        from mecefo_jax.config.resolve import updated
        from mecefo_jax.faults.costs import shape_of
        from mecefo_jax.neighbour.projections import resolve_rank
        self.costs = costs = costs or TimeCosts()
        self.step_time_sec = cfg.fault.step_time_sec
        self.relaunch_sec = cfg.fault.relaunch_delay_sec
        self.shard = cfg.data.global_batch_size // num_replicas
        self.exposed = cfg.fault.allreduce_exposed if exposed is None else exposed
        if self.exposed != cfg.fault.allreduce_exposed:
            cfg = updated(cfg, {'fault.time_model': 'wall_clock', 'fault.allreduce_exposed': self.exposed})
        m = cfg.model
        rank = resolve_rank(cfg.mecefo.rank, m.d_model, m.ffn_hidden)
        if bench is None:
            self._ratio = step_clock.layout_step_ratio(cfg, num_replicas)  # the controller's clock
            self.step_cost_source = ("analytic FLOPs of the config's shape "
                                     f'(mecefo.projection={cfg.mecefo.projection})')
        else:
            self._ratio, note = self._bench_ratio(cfg, bench, rank)
            self.step_cost_source = f'measured wall-time ratios, {note}'
        if self.exposed:
            self.step_cost_source += f', all-reduce exposed share {self.exposed:.3f}'
        if cfg.mecefo.projection != 'weights':  # the controller refreshes nothing
            self.refresh = {'refresh_sec': 0.0, 'refresh_split_sec': 0.0, 'refresh_source':
                            f'none: mecefo.projection={cfg.mecefo.projection} reads no '
                            'projections'}
        else:
            self.refresh = refresh_costs.refresh_charge(
                shape_of(m), method=cfg.mecefo.refresh, rank=rank,
                iterations=cfg.mecefo.refresh_iters, tflops=costs.refresh_tflops,
                link_gbps=costs.link_gbps,
                split_min_elements=cfg.mecefo.refresh_split_min_elements)

    def _bench_ratio(self, cfg, bench: dict, rank):
        """(fn(programs) -> the step's ratio under the bench's measured costs, diluted; the
        bench table's note)."""
        from mecefo_jax.faults.costs import role_cost, shape_of
        from studies.bench_costs import bench_table
        table = bench_table(bench, shape_of(cfg.model), metric='step_ms', seq_len=cfg.data.seq_len,
                            replica_seqs=self.shard, mfu=1.0, rank=rank,
                            recompute_ffn=cfg.mecefo.remat_ffn)
        cost = role_cost(table, self.shard)
        ratio = step_clock.slowest_program_ratio(cost, cost(ROLE_NORMAL, self.shard), self.exposed)
        return ratio, table.note

    def programs_ratio(self, programs) -> float:
        """A step of `programs` (`layout.Program`s) in fault-free steps: its slowest program, diluted."""
        return self._ratio(programs)

    def step_ratio(self, layout: dict) -> float:
        """A `LayoutBook` entry's step in fault-free steps."""
        return self.programs_ratio([Program(*p) for p in layout['programs']])

    def refresh_sec(self, live: int) -> float:
        return self.refresh['refresh_sec'] + self.refresh['refresh_split_sec'] / live

    def precompiled(self, replicas: int) -> dict:
        """The layout (a `LayoutBook` entry) every run compiles before training starts: the full
        mesh's normal step."""
        return {'live': [True] * replicas, 'programs': [[ROLE_NORMAL, self.shard, 0]]}

    def change_sec(self, relaunch: bool, new_layout: bool) -> float:
        """One live-set change: a relaunch (checkpoint/restart) or in place."""
        c = self.costs
        if relaunch:
            return c.detect_sec + self.relaunch_sec + c.restore_sec + c.compile_sec
        return c.detect_sec + c.rebuild_sec + (c.compile_sec if new_layout else 0.0)

    def timeline(self, record: dict) -> tuple[dict[int, float], dict[str, float]]:
        """({steps done: modelled seconds after the last execution of that step},
        {seconds per part: compute, changes, refresh, checkpoints; steps executed, redone})."""
        events = {e['clock']: e for e in record['events']}
        refresh = collections.Counter(record['refresh_steps'])
        saves = collections.Counter(record['saves'])
        step_secs = [self.step_ratio(x) * self.step_time_sec for x in record['layouts']]
        keys = [_key(x) for x in record['layouts']]
        parts = dict.fromkeys(('compute_sec', 'change_sec', 'refresh_sec', 'checkpoint_sec'), 0.0)
        seen = {_key(self.precompiled(len(record['layouts'][0]['live'])))}
        done, t, compute = {}, 0.0, 0.0

        def charge(part: str, seconds: float) -> None:
            nonlocal t
            parts[part] += seconds
            t += seconds
        last = None
        for clock, step, index in record['executed']:  # a loop over every step: kept lean
            if clock in events:  # the live set changed before this step
                charge('change_sec', self.change_sec(record['relaunch'], keys[index] not in seen))
            if index != last:
                seen.add(keys[index])
                last = index
            if saves.get(step):  # checkpoint/restart saved the state entering this step
                saves[step] -= 1
                charge('checkpoint_sec', self.costs.checkpoint_save_sec)
            if refresh.get(step):  # the projections were refreshed before this step
                refresh[step] -= 1
                charge('refresh_sec', self.refresh_sec(sum(record['layouts'][index]['live'])))
            compute += step_secs[index]
            t += step_secs[index]
            done[step + 1] = t
        parts['compute_sec'] = compute
        parts['executed_steps'] = len(record['executed'])
        parts['redone_steps'] = len(record['executed']) - len(done)
        return done, parts


def time_to_target(curve, times: dict[int, float], target: float) -> float | None:
    """Modelled seconds at which the validation loss first reaches `target`, or None.

    `curve` is [(steps done, val loss)] in step order, `times` the timeline.
    Linear in modelled time between the two evaluations that bracket the
    first crossing; the first evaluation itself when it already crosses.
    """
    previous = None
    for step, loss in curve:
        if loss <= target:
            t = times[step]
            if previous is None:
                return t
            step0, loss0 = previous
            t0 = times[step0]
            return t0 + (loss0 - target) / (loss0 - loss) * (t - t0)
        previous = (step, loss)
    return None
