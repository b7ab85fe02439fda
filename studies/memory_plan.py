"""Per-device memory plan of the train step, compiled ahead of time with no parameters.

Does a config fit its devices, in both roles? (`scripts/memory_plan.py` is
its command line.) It compiles `step.make_train_step` with the state given
as `jax.ShapeDtypeStruct`s carrying their shardings, so nothing is
materialised and a 7B model is planned on a laptop, and reads XLA's buffer
assignment (`memory_analysis()`) for `normal` (Program(ROLE_NORMAL, b), b =
global batch / data replicas, mesh.data = -1 resolved against `num_devices`)
and `neighbour` (Program(ROLE_NEIGHBOUR, 2b): own + one adopted shard), and
with `failure_step=True` the `lax.switch` step of a failure (one normal and
one neighbour replica, rows padded to 2b). A device's program depends on its
replica only, so two replicas are compiled (2 x mesh.model fake CPU
devices): enough for the real data-parallel all-reduce and the neighbour's
shard_map. Per device: parameters, optimizer state and projections (from the
input shardings), gradients (an estimate: one float32 copy of the
parameters), temporaries, activations (temp - gradients) and the peak
(arguments + outputs + temporaries - aliased; the state is donated).
On CPU devices the bytes estimate the GPU's, they do not measure them:
XLA:CPU may compute bfloat16 dots in float32, and its fusion and buffer
assignment differ from XLA:GPU's (docs/usage.md).
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from studies.report import markdown_table

OUTPUT_FILE = 'memory_plan.json'
REPLICAS = 2  # replicas compiled (see the module docstring)
GB = 1e9


def device_bytes(abstract_tree, shardings) -> int:
    """Bytes one device holds of a tree of arrays under their shardings."""
    total = 0
    for leaf, sh in zip(jax.tree.leaves(abstract_tree), jax.tree.leaves(shardings)):
        shape = sh.shard_shape(leaf.shape)
        total += int(np.prod(shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
    return total


def resolve(cfg, num_devices: int) -> dict[str, int]:
    """Mesh (data, model) against `num_devices` and the per-replica batch b."""
    from mecefo_jax.parallel import sharding
    data, model = sharding.mesh_shape(cfg.mesh, num_devices)
    global_batch = cfg.data.global_batch_size
    if global_batch % data:
        raise ValueError(f'data.global_batch_size={global_batch} is not divisible by the '
                         f'{data} data replicas of mesh.data={cfg.mesh.data} x '
                         f'mesh.model={model} on {num_devices} devices; change '
                         'data.global_batch_size, mesh.model or --num_devices.')
    return {'data': data, 'model': model, 'per_replica_batch': global_batch // data,
            'global_batch': global_batch}


def _role_entry(compiled, state_abs, programs, limit_bytes) -> dict[str, Any]:
    from studies.xla_costs import memory_of
    in_shardings = compiled.input_shardings[0][0]  # (args, kwargs) -> args -> state
    params = device_bytes(state_abs.params, in_shardings.params)
    optimizer = device_bytes(state_abs.opt_state, in_shardings.opt_state)
    projections = device_bytes(state_abs.projections, in_shardings.projections)
    mem = memory_of(compiled)
    temp = mem['temp_size_in_bytes']
    return {
        'programs': [p.name for p in programs],
        'parameters_bytes': params, 'optimizer_bytes': optimizer,
        'projections_bytes': projections, 'gradients_bytes': params,
        'temp_bytes': temp, 'activations_bytes': max(0, temp - params),
        'argument_bytes': mem['argument_size_in_bytes'],
        'output_bytes': mem['output_size_in_bytes'], 'alias_bytes': mem['alias_size_in_bytes'],
        'peak_bytes': mem['peak_bytes'], 'xla_peak_memory_bytes': mem['peak_memory_in_bytes'],
        'fits': mem['peak_bytes'] <= limit_bytes,
    }


def plan(cfg, *, num_devices: int = 32, limit_gb: float = 70.0, failure_step: bool = False,
         platform: str = 'cpu', log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Compile each role's train step for one replica's devices; return the plan."""
    from mecefo_jax.model.llama import build_model
    from mecefo_jax.model.optim import make_optimizer
    from mecefo_jax.neighbour.layout import ROLE_NEIGHBOUR, ROLE_NORMAL, Layout, Piece
    from mecefo_jax.parallel import sharding
    from mecefo_jax.parallel import step as step_lib
    from mecefo_jax.parallel.aot import abstract, abstract_batch
    from mecefo_jax.parallel.state import abstract_train_state, state_shardings
    from studies.step_cost import config_summary

    if log is None:
        log = lambda msg: print(msg, flush=True)  # noqa: E731
    mesh_info = resolve(cfg, num_devices)
    width, b = mesh_info['model'], mesh_info['per_replica_batch']
    devices = jax.devices(platform)
    if len(devices) < REPLICAS * width:
        raise ValueError(
            f'mesh.model={width} needs {REPLICAS * width} {platform} devices to compile '
            f'{REPLICAS} replicas; this process has {len(devices)}. Start it with '
            f'XLA_FLAGS=--xla_force_host_platform_device_count={REPLICAS * width} '
            '(scripts/memory_plan.py does).')
    model = build_model(cfg)
    optimizer = make_optimizer(cfg.train)
    rank = cfg.mecefo.rank
    seq = cfg.data.seq_len + 1
    limit = limit_gb * GB

    def compile_step(mesh, programs, rows, num_replicas):
        shardings = state_shardings(model, optimizer, mesh, rank)
        state_abs = abstract(abstract_train_state(model, optimizer, rank=rank), shardings)
        step = step_lib.make_train_step(model, optimizer, mesh, shardings, programs)
        t0 = time.perf_counter()
        compiled = step.lower(state_abs, abstract_batch(mesh, rows, seq, num_replicas)).compile()
        return compiled, state_abs, time.perf_counter() - t0

    mesh = sharding.mesh_from_rows([devices[r * width:(r + 1) * width]
                                    for r in range(REPLICAS)])
    own = lambda r: Piece(r, 0, b)  # noqa: E731  (shard r, all b examples)
    layouts = {
        'normal': Layout(replicas=(0, 1), roles=(ROLE_NORMAL,) * 2,
                         pieces=((own(0),), (own(1),))),
        # Each replica adopts one more shard: own + adopted, joined.
        'neighbour': Layout(replicas=(0, 1), roles=(ROLE_NEIGHBOUR,) * 2,
                            pieces=((own(0), own(2)), (own(1), own(3)))),
    }
    if failure_step:
        layouts['failure_step'] = Layout(replicas=(0, 1), roles=(ROLE_NORMAL, ROLE_NEIGHBOUR),
                                         pieces=((own(0),), (own(1), own(2))))
    roles = {}
    for role, layout in layouts.items():
        names = [p.name for p in layout.programs]
        log(f'memory_plan[{role}]: compiling {names} on a {REPLICAS}x{width} mesh...')
        compiled, state_abs, seconds = compile_step(mesh, layout.programs, layout.capacity,
                                                    REPLICAS)
        roles[role] = dict(_role_entry(compiled, state_abs, layout.programs, limit),
                           compile_s=seconds)
        log(f'memory_plan[{role}]: peak {roles[role]["peak_bytes"] / GB:.2f} GB '
            f'({seconds:.0f} s)')
    return {'config': config_summary(cfg, b), 'mesh': mesh_info, 'num_devices': num_devices,
            'limit_bytes': limit, 'roles': roles, 'fits': all(r['fits'] for r in roles.values()),
            'remat_policy': cfg.model.remat_policy, 'platform': platform,
            'jax_version': jax.__version__}


ROWS = (('parameters', 'parameters_bytes'), ('optimizer state', 'optimizer_bytes'),
        ('SVD projections', 'projections_bytes'), ('gradients (est.)', 'gradients_bytes'),
        ('activations+other temp', 'activations_bytes'), ('temporaries (XLA)', 'temp_bytes'),
        ('arguments', 'argument_bytes'), ('outputs', 'output_bytes'),
        ('aliased (donated)', 'alias_bytes'), ('PEAK', 'peak_bytes'))


def format_plan(result: dict[str, Any]) -> str:
    """Per-device GB by role, as a markdown table."""
    roles, limit = result['roles'], result['limit_bytes'] / GB
    rows = [[label] + [f'{r[key] / GB:.2f}' for r in roles.values()] for label, key in ROWS]
    rows.append([f'fits in {limit:g} GB'] + [('yes' if r['fits'] else 'NO') for r in roles.values()])
    m = result['mesh']
    return (f"mesh data={m['data']} x model={m['model']} on {result['num_devices']} devices, "
            f"{m['per_replica_batch']} sequences per replica, seq_len "
            f"{result['config']['seq_len']}, remat_policy={result['remat_policy']}\n\n"
            + markdown_table(['per device, GB'] + list(roles), rows))


def main(cfg, out_dir: str | None, **kwargs) -> dict[str, Any]:
    """Entry point for scripts/memory_plan.py: plan, print, write JSON."""
    result = plan(cfg, **kwargs)
    print(format_plan(result), flush=True)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, OUTPUT_FILE)
        with open(path, 'w') as f:
            json.dump(result, f, indent=2)
        print(f'memory_plan: wrote {path}', flush=True)
    return result
