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

from studies.step_modes import mode_layout

GROUPS = ('attention', 'ffn', 'other', 'total_non_attention')


def path_names(path) -> list[str]:
    """The key names along a params path, as strings."""
    return [str(getattr(k, 'key', getattr(k, 'name', k))) for k in path]


def param_group(path) -> str:
    """'attention' (MHA branch), 'ffn' (FFN kernels) or 'other' for a params path."""
    from mecefo_jax.neighbour.attention_skip import is_attention_branch
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
    from mecefo_jax.neighbour.layout import assemble
    from mecefo_jax.parallel import sharding
    from mecefo_jax.parallel import step as step_lib
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
    from mecefo_jax.parallel import step as step_lib

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


LAYER_GROUPS = ('attention', 'ffn', 'ffn_norm')  # per block; the rest: 'embedding', 'top'


def _layer_slices(path, leaf):
    """[(layer or None, group, array)]: a stacked block leaf split per layer."""
    names = path_names(path)
    leaf = np.asarray(leaf, np.float64)
    if names[0] == 'layers':  # scanned: [L, ...]
        group = param_group(path) if param_group(path) != 'other' else 'ffn_norm'
        return [(i, group, leaf[i]) for i in range(leaf.shape[0])]
    if names[0].startswith('layers_'):
        group = param_group(path) if param_group(path) != 'other' else 'ffn_norm'
        return [(int(names[0][len('layers_'):]), group, leaf)]
    return [(None, 'embedding' if names[0] == 'embedding' else 'top', leaf)]  # head, final_norm


def by_layer(approx, exact) -> dict:
    """Relative error and cosine of `approx` against `exact`, per block and group.

    {'layers': [{group: {'rel_error', 'cosine'}} per block, bottom first],
     'embedding': {...}, 'top': {...} (final norm and head)}; float64 on host.
    """
    sums: dict = {}
    flat_a = jax.tree_util.tree_flatten_with_path(approx)[0]
    flat_e = jax.tree_util.tree_leaves(exact)
    for (path, a), e in zip(flat_a, flat_e):
        for (layer, group, a_part), (_, _, e_part) in zip(_layer_slices(path, a),
                                                           _layer_slices(path, e)):
            acc = sums.setdefault((layer, group), [0.0, 0.0, 0.0])
            acc[0] += float(np.sum((a_part - e_part) ** 2))
            acc[1] += float(np.sum(e_part ** 2))
            acc[2] += float(np.sum(a_part * e_part))

    def figures(err2, ref2, dot, app2):
        cosine = dot / np.sqrt(app2 * ref2) if app2 > 0 and ref2 > 0 else 0.0
        return {'rel_error': _ratio(err2, ref2), 'cosine': float(cosine)}
    out = {'layers': []}
    for (layer, group), (err2, ref2, dot) in sorted(sums.items(), key=lambda kv: (
            -1 if kv[0][0] is None else kv[0][0], kv[0][1])):
        app2 = err2 + 2 * dot - ref2  # ||a||^2 from ||a - e||^2, <a, e> and ||e||^2
        if layer is None:
            out[group] = figures(err2, ref2, dot, app2)
            continue
        while len(out['layers']) <= layer:
            out['layers'].append({})
        out['layers'][layer][group] = figures(err2, ref2, dot, app2)
    return out
