"""Compile time: what a new failure topology's step costs a survivor, cold and ahead of time.

After a failure the controller compiles the train step for a mesh and layout
it has not seen. `failure_step_compile` measures it: the MeCeFO failure step
on the config's mesh with replica 3 (or the last) down, its neighbour running
two shards in neighbour mode. `run` sweeps depths, scanned and looped: under
`nn.scan` the program holds one block body whatever the depth.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

SCAN_MODES = (True, False)


def failure_step_compile(cfg, num_layers: int, *, scan_layers: bool = True) -> float:
    """Seconds to compile the failure step of `cfg` at `num_layers` (see the module docstring)."""
    import jax

    from mecefo_jax.faults.strategies import layout_for
    from mecefo_jax.model import optim
    from mecefo_jax.model.llama import build_model
    from mecefo_jax.parallel import sharding
    from mecefo_jax.parallel import state as state_lib
    from mecefo_jax.parallel.topology import TopologyCache

    model = build_model(cfg, num_layers=num_layers, scan_layers=scan_layers)
    rows = sharding.device_rows(cfg.mesh)
    replicas = len(rows)
    if replicas < 2:
        raise ValueError(f'mesh.data={cfg.mesh.data} gives {replicas} data replica on {jax.device_count()} '
                         'devices: a failure needs a survivor. Use a mesh of two or more replicas (a CPU host '
                         'simulates mesh.num_cpu_devices devices).')
    optimizer, rank = optim.make_optimizer(cfg.train), cfg.mecefo.rank
    state_layout = state_lib.layout(model, optimizer, rank)
    cache = TopologyCache(model, optimizer, state_layout, cfg)
    live = tuple(r != min(3, replicas - 1) for r in range(replicas))
    topology = cache.get([row for row, up in zip(rows, live) if up])
    layout = layout_for('mecefo', live, cfg.data.global_batch_size // replicas)
    abstract = sharding.abstract(state_layout.abstract, topology.state_shardings)
    spec = topology.batch_spec(layout, cfg.data.seq_len + 1)
    start = time.perf_counter()
    topology.compiled_step(abstract, spec, layout)
    return time.perf_counter() - start


def run(cfg, depths, out_dir: str | None = None, log=print) -> dict:
    """Compile seconds of the failure step at every depth, scanned and looped; bench_compile.json."""
    rows = []
    for scan in SCAN_MODES:
        for depth in depths:
            seconds = failure_step_compile(cfg, depth, scan_layers=scan)
            rows.append({'scan_layers': scan, 'num_layers': depth, 'compile_sec': seconds})
            log(f'compile: scan_layers={scan} layers={depth}: {seconds:.2f} s')
    for row in rows:
        base = next(r for r in rows if r['scan_layers'] == row['scan_layers'] and r['num_layers'] == min(depths))
        row['ratio_to_shallowest'] = row['compile_sec'] / base['compile_sec']
    result = {'rows': rows, 'depths': list(depths), 'mesh': dataclasses.asdict(cfg.mesh),
              'd_model': cfg.model.d_model}
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, 'bench_compile.json'), 'w') as f:
            json.dump(result, f, indent=2)
    return result
