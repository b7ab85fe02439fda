"""Compiled train steps per run: one replica per device row against replicas as rows.

    python -m studies.compile_count --point paper_like --seeds 0,1,2,3

Replays a point's failure schedule through each strategy's layouts, without
training, and counts the distinct programs a run would compile: with one
replica per data row, one per (live rows, layout signature), since every new
set of live replicas is a new mesh; with replicas as rows (`mesh.replicas`),
one per packing signature, since roles are data and only row counts key a program.
"""
from __future__ import annotations

import json

from absl import app, flags

from configs import small
from mecefo_jax import failure_schedule as schedule_lib
from mecefo_jax.config.resolve import resolve, updated
from mecefo_jax.faults.planner import config_planner
from mecefo_jax.faults.strategies import Orphans, layout_for, strategy_spec
from mecefo_jax.neighbour.row_packing import pack
from studies.verdict_points import POINTS, point_config

STRATEGIES = ('mecefo', 'mecefo_planned', 'drop', 'elastic', 'ndb_naive')


def programs_per_run(cfg, strategy: str, devices: int) -> dict[str, int]:
    """{'device_per_replica': n, 'replicas_as_rows': n} for `strategy` over `cfg`'s schedule."""
    replicas = cfg.mesh.replicas or cfg.mesh.data
    shard = cfg.data.global_batch_size // replicas
    events = schedule_lib.events_from_config(cfg.fault, num_replicas=replicas, total_steps=cfg.train.steps)
    schedule = schedule_lib.FailureSchedule(events, replicas)
    planner = config_planner(cfg, shard) if strategy_spec(strategy).orphans is Orphans.PLANNER else None
    per_device, as_rows = set(), set()
    for step in range(cfg.train.steps):
        live = schedule.live_mask(step)
        layout = layout_for(strategy, live, shard, planner=planner)
        per_device.add((live, layout.signature))
        as_rows.add(pack(layout, devices).signature)
    return {'device_per_replica': len(per_device), 'replicas_as_rows': len(as_rows)}


def point_counts(point_name: str, seeds, devices: int = 8) -> dict:
    point = POINTS[point_name]
    base = resolve(point_config(small.get_config(), point))
    replicas = base.mesh.replicas or base.mesh.num_cpu_devices
    out = {}
    for strategy in STRATEGIES:
        counts = [programs_per_run(updated(base, {'fault.seed': seed, 'fault.regime': 'high',
                                                  'fault.strategy': strategy, 'mesh.data': replicas}),
                                   strategy, devices) for seed in seeds]
        out[strategy] = {k: max(c[k] for c in counts) for k in counts[0]}
    return {'point': point_name, 'seeds': list(seeds), 'devices_as_rows': devices, 'max_per_run': out}


FLAGS = flags.FLAGS
flags.DEFINE_string('point', 'paper_like', 'A verdict point (studies/verdict_points.py).')
flags.DEFINE_string('seeds', '0,1,2,3', 'Failure seeds, comma-separated.')
flags.DEFINE_integer('devices', 8, 'Devices that hold the replicas as rows.')


def main(argv):
    del argv
    seeds = [int(s) for s in FLAGS.seeds.split(',') if s]
    print(json.dumps(point_counts(FLAGS.point, seeds, FLAGS.devices), indent=1))


if __name__ == '__main__':
    app.run(main)
