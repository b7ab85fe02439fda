"""How far MeCeFO's gradient is from the exact one, per parameter group.

`grad_rel_error` is ||g_mecefo - g_exact|| / ||g_exact|| per parameter group
on the same two shards (`make_grad_fn` of the mecefo program against the
ndb_naive one: same tokens, same divisor): `attention` (MHA and its norm; the
neighbour contributes none, so it is 1.0 by construction), `ffn` (FFN
kernels: low-rank weight gradients plus the attention cotangent missing from
later blocks), `other` (embedding, ffn/final norms, head) and
`total_non_attention`; `grad_rel_error_by_param` gives it per parameter.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from mecefo_jax.experiments.step_modes import mode_layout

GROUPS = ('attention', 'ffn', 'other', 'total_non_attention')


def path_names(path) -> list[str]:
    """The key names along a params path, as strings."""
    return [str(getattr(k, 'key', getattr(k, 'name', k))) for k in path]


def param_group(path) -> str:
    """'attention' (MHA branch), 'ffn' (FFN kernels) or 'other' for a params path."""
    from mecefo_jax.model import is_attention_branch
    if is_attention_branch(path):
        return 'attention'
    if 'ffn' in path_names(path):
        return 'ffn'
    return 'other'  # embedding, ffn_norm, final_norm, head


def _squared(approx, exact):
    """{'/'-joined path: (||a - e||^2, ||e||^2)} in float64 on host."""
    out = {}

    def add(path, a, e):
        a64, e64 = np.asarray(a, np.float64), np.asarray(e, np.float64)
        out['/'.join(path_names(path))] = (path, float(np.sum((a64 - e64) ** 2)),
                                            float(np.sum(e64 ** 2)))
    jax.tree_util.tree_map_with_path(add, approx, exact)
    return out


def _ratio(err2: float, ref2: float) -> float:
    return float(np.sqrt(err2 / ref2)) if ref2 > 0 else float('nan')


def two_shard_gradients(model, mesh, state, tokens_nbt) -> dict[str, Any]:
    """Host gradients of the ndb_naive and mecefo programs on the same two shards.

    `step.make_grad_fn` of each mode's program (gradient sums divided by the
    token count, as the train step does): same tokens, same divisor.
    """
    from mecefo_jax import sharding
    from mecefo_jax import step as step_lib
    from mecefo_jax.layout import assemble
    batch = tokens_nbt.shape[1]
    grads = {}
    for mode in ('ndb_naive', 'mecefo'):
        layout = mode_layout(mode, batch)
        host = dict(assemble(layout, tokens_nbt), step=np.int32(0))
        device_batch = jax.device_put(host, sharding.batch_shardings(mesh))
        grad_fn = jax.jit(step_lib.make_grad_fn(model, mesh, layout.programs))
        grads[mode] = jax.device_get(grad_fn(state.params, state.projections, device_batch)[0])
    return grads


def token_grad_fn(model):
    """Jitted `(params, projections, tokens, weights, neighbour) -> gradient` of the summed
    token loss, exact or in MeCeFO's neighbour mode.

    Sums, not means: a ratio of two gradients of the same rows (the relative
    error) needs no divisor, and one jitted function serves both modes.
    """
    from mecefo_jax import step as step_lib

    def grad(params, projections, tokens, weights, neighbour):
        return jax.grad(lambda p: step_lib.token_loss_sum(
            model, p, projections, tokens, weights, neighbour=neighbour))(params)
    return jax.jit(grad, static_argnames='neighbour')


def grad_rel_error(approx, exact) -> dict[str, float]:
    """||approx - exact|| / ||exact|| per parameter group, in float64 on host."""
    err2 = dict.fromkeys(GROUPS[:3], 0.0)
    ref2 = dict.fromkeys(GROUPS[:3], 0.0)
    for path, e2, r2 in _squared(approx, exact).values():
        group = param_group(path)
        err2[group] += e2
        ref2[group] += r2
    err2['total_non_attention'] = err2['ffn'] + err2['other']
    ref2['total_non_attention'] = ref2['ffn'] + ref2['other']
    return {g: _ratio(err2[g], ref2[g]) for g in GROUPS}


def grad_rel_error_by_param(approx, exact) -> dict[str, float]:
    """||approx - exact|| / ||exact|| per parameter ('/'-joined path)."""
    return {name: _ratio(e2, r2) for name, (_, e2, r2) in _squared(approx, exact).items()}
