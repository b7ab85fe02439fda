"""Per-device memory plan of the train step, compiled ahead of time with no parameters.

Does a config fit its devices, in both roles? (`scripts/memory_plan.py`.) It
compiles `step.make_train_step` with the state given as `ShapeDtypeStruct`s
carrying their shardings, so nothing is materialised and a 7B model is
planned on a laptop, and reads XLA's buffer assignment for `normal` (b rows,
b = global batch / data replicas, mesh.data = -1 resolved against
`num_devices`) and `neighbour` (2b: own + one adopted shard), and with
`failure_step=True` the `lax.switch` step of a failure (one normal and one
neighbour replica). A device's program depends on its replica only, so two
replicas are compiled (2 x mesh.model fake CPU devices): enough for the real
all-reduce and the neighbour's shard_map. Per device: parameters, optimizer
state and projections (from the input shardings), gradients (an estimate:
one float32 copy of the parameters), temporaries, activations (temp -
gradients) and the peak (arguments + outputs + temporaries - aliased; the
state is donated). On CPU devices the bytes estimate the GPU's: XLA:CPU may
compute bfloat16 dots in float32, and its fusion and buffer assignment
differ from XLA:GPU's (docs/usage.md).
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

import jax
import numpy as np

from studies.report import markdown_table

OUTPUT_FILE = 'memory_plan.json'
REPLICAS = 2  # replicas compiled (see the module docstring)
GB = 1e9
ROWS = (('parameters', 'parameters_bytes'), ('optimizer state', 'optimizer_bytes'),
        ('SVD projections', 'projections_bytes'), ('gradients (est.)', 'gradients_bytes'),
        ('activations+other temp', 'activations_bytes'), ('temporaries (XLA)', 'temp_bytes'),
        ('arguments', 'argument_bytes'), ('outputs', 'output_bytes'),
        ('aliased (donated)', 'alias_bytes'), ('PEAK', 'peak_bytes'))


def device_bytes(abstract_tree, shardings) -> int:
    """Bytes one device holds of a tree of arrays under their shardings."""
    return sum(int(np.prod(sh.shard_shape(leaf.shape), dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
               for leaf, sh in zip(jax.tree.leaves(abstract_tree), jax.tree.leaves(shardings)))


def resolve(cfg, num_devices: int) -> dict[str, int]:
    """Mesh (data, model) against `num_devices` and the per-replica batch b."""
    from mecefo_jax.parallel import sharding
    data, model = sharding.mesh_shape(cfg.mesh, num_devices)
    global_batch = cfg.data.global_batch_size
    if global_batch % data:
        raise ValueError(f'data.global_batch_size={global_batch} is not divisible by the {data} data replicas '
                         f'of mesh.data={cfg.mesh.data} x mesh.model={model} on {num_devices} devices; change '
                         'data.global_batch_size, mesh.model or --num_devices.')
    return {'data': data, 'model': model, 'per_replica_batch': global_batch // data, 'global_batch': global_batch}


def _role_entry(compiled, state_abs, programs, limit_bytes) -> dict[str, Any]:
    from studies.xla_costs import memory_of
    in_shardings = compiled.input_shardings[0][0]  # (args, kwargs) -> args -> state
    params = device_bytes(state_abs.params, in_shardings.params)
    mem = memory_of(compiled)
    temp = mem['temp_size_in_bytes']
    return {'programs': [p.name for p in programs], 'parameters_bytes': params,
            'optimizer_bytes': device_bytes(state_abs.opt_state, in_shardings.opt_state),
            'projections_bytes': device_bytes(state_abs.projections, in_shardings.projections),
            'gradients_bytes': params, 'temp_bytes': temp, 'activations_bytes': max(0, temp - params),
            'argument_bytes': mem['argument_size_in_bytes'], 'output_bytes': mem['output_size_in_bytes'],
            'alias_bytes': mem['alias_size_in_bytes'], 'peak_bytes': mem['peak_bytes'],
            'xla_peak_memory_bytes': mem['peak_memory_in_bytes'], 'fits': mem['peak_bytes'] <= limit_bytes}


def _layouts(b: int, failure_step: bool) -> dict:
    """Each role's two-replica layout; a neighbour adopts one more shard (own + adopted, joined)."""
    from mecefo_jax.neighbour.layout import ROLE_NEIGHBOUR, ROLE_NORMAL, Layout, Piece
    own = lambda r: Piece(r, 0, b)  # noqa: E731  (shard r, all b examples)
    layouts = {'normal': Layout(replicas=(0, 1), roles=(ROLE_NORMAL,) * 2, pieces=((own(0),), (own(1),))),
               'neighbour': Layout(replicas=(0, 1), roles=(ROLE_NEIGHBOUR,) * 2,
                                   pieces=((own(0), own(2)), (own(1), own(3))))}
    if failure_step:
        layouts['failure_step'] = Layout(replicas=(0, 1), roles=(ROLE_NORMAL, ROLE_NEIGHBOUR),
                                         pieces=((own(0),), (own(1), own(2))))
    return layouts


def plan(cfg, *, num_devices: int = 32, limit_gb: float = 70.0, failure_step: bool = False,
         platform: str = 'cpu', log=None) -> dict[str, Any]:
    """Compile each role's train step for two replicas' devices; return the plan."""
    from mecefo_jax.model.llama import build_model
    from mecefo_jax.model.optim import make_optimizer
    from mecefo_jax.parallel import sharding
    from mecefo_jax.parallel import step as step_lib
    from mecefo_jax.parallel.sharding import abstract, abstract_batch
    from mecefo_jax.parallel.state import trace_layout
    from studies.step_cost import config_summary
    log = log or (lambda msg: print(msg, flush=True))
    mesh_info = resolve(cfg, num_devices)
    width, b = mesh_info['model'], mesh_info['per_replica_batch']
    devices = jax.devices(platform)
    if len(devices) < REPLICAS * width:
        raise ValueError(f'mesh.model={width} needs {REPLICAS * width} {platform} devices to compile {REPLICAS} '
                         f'replicas; this process has {len(devices)}. Start it with XLA_FLAGS='
                         f'--xla_force_host_platform_device_count={REPLICAS * width} (scripts/memory_plan.py does).')
    model, optimizer, rank = build_model(cfg), make_optimizer(cfg.train), cfg.mecefo.rank
    mesh = sharding.mesh_from_rows([devices[r * width:(r + 1) * width] for r in range(REPLICAS)])
    state_layout = trace_layout(model, optimizer, rank)
    shardings = state_layout.shardings(mesh)
    state_abs = abstract(state_layout.abstract, shardings)
    roles = {}
    for role, layout in _layouts(b, failure_step).items():
        log(f'memory_plan[{role}]: compiling {[p.name for p in layout.programs]} on a {REPLICAS}x{width} mesh...')
        step = step_lib.make_train_step(model, optimizer, mesh, shardings, layout.programs, ordered_reduction=False)
        start = time.perf_counter()
        compiled = step.lower(state_abs, abstract_batch(mesh, layout.capacity, cfg.data.seq_len + 1,
                                                        REPLICAS)).compile()
        roles[role] = dict(_role_entry(compiled, state_abs, layout.programs, limit_gb * GB),
                           compile_s=time.perf_counter() - start)
        log(f"memory_plan[{role}]: peak {roles[role]['peak_bytes'] / GB:.2f} GB")
    return {'config': config_summary(cfg, b), 'mesh': mesh_info, 'num_devices': num_devices,
            'limit_bytes': limit_gb * GB, 'roles': roles, 'fits': all(r['fits'] for r in roles.values()),
            'remat_policy': cfg.model.remat_policy, 'platform': platform, 'jax_version': jax.__version__}


def format_plan(result: dict[str, Any]) -> str:
    """Per-device GB by role, as a markdown table."""
    roles, limit = result['roles'], result['limit_bytes'] / GB
    rows = [[label] + [f'{r[key] / GB:.2f}' for r in roles.values()] for label, key in ROWS]
    rows.append([f'fits in {limit:g} GB'] + [('yes' if r['fits'] else 'NO') for r in roles.values()])
    return markdown_table(['per device, GB'] + list(roles), rows)


def main(cfg, out_dir: str | None, **kwargs) -> dict[str, Any]:
    """Entry point for scripts/memory_plan.py: plan, print, write JSON."""
    result = plan(cfg, **kwargs)
    print(format_plan(result), flush=True)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, OUTPUT_FILE), 'w') as f:
            json.dump(result, f, indent=2)
    return result
