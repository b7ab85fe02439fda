"""32 replicas of one sequence: replicas as rows on 8 devices against one device per replica.

Run by tests/replicas_as_rows_test.py in a process of its own (32 fake CPU devices must be
set before jax starts). Prints one JSON line: the largest differences and the programs
each job compiled.
"""
import json
import os
import sys
import tempfile

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '')
                           + ' --xla_force_host_platform_device_count=32')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from replicas_as_rows_test import _cfg, _grads, _run  # noqa: E402

from mecefo_jax.faults.strategies import layout_for  # noqa: E402
from mecefo_jax.model.llama import build_model, init_params  # noqa: E402
from mecefo_jax.neighbour.projections import compute_projections  # noqa: E402
from mecefo_jax.neighbour.row_packing import pack  # noqa: E402

EVENTS = '3:7:5,11:20:4'  # one failure at a time, two different replicas


def main():
    changes = dict(data__global_batch_size=32, mesh__num_cpu_devices=32, fault__strategy='mecefo',
                   fault__events=EVENTS)
    from flax import linen as nn
    model = build_model(_cfg(**changes))
    params = nn.unbox(init_params(model, jax.random.key(2)))
    projections = jax.jit(compute_projections, static_argnums=1)(params, 8)
    tokens = np.random.default_rng(1).integers(0, 256, (32, 1, 33), dtype=np.int32)
    layout = layout_for('mecefo', tuple(r != 7 for r in range(32)), 1)
    ref, _ = _grads(model, params, projections, tokens, layout, 31)
    rows, _ = _grads(model, params, projections, tokens, pack(layout, 8), 8)
    rel = max(float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(b))), 1e-12)
              for a, b in zip(jax.tree.leaves(rows), jax.tree.leaves(ref)))
    with tempfile.TemporaryDirectory() as tmp:
        ref_losses, ref_params, ref_compiled, _ = _run(_cfg(**changes), 32, os.path.join(tmp, 'a'))
        losses, params_rows, compiled, _ = _run(_cfg(**changes, mesh__replicas=32), 8,
                                                os.path.join(tmp, 'b'))
    print(json.dumps({
        'grad_max_rel_err': rel,
        'loss_max_abs_err': float(np.max(np.abs(losses - ref_losses))),
        'param_max_abs_err': max(float(np.max(np.abs(a - b)))
                                 for a, b in zip(jax.tree.leaves(params_rows), jax.tree.leaves(ref_params))),
        'compiled_rows': compiled, 'compiled_devices': ref_compiled}))


if __name__ == '__main__':
    main()
