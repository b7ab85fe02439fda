"""How far the neighbour's approximate gradient is from the exact one: the measures, in float64 on host.

A MeCeFO neighbour (Hu et al., NeurIPS 2025, arXiv 2510.16415) skips the
attention backward and keeps V_r V_r^T G of each FFN kernel gradient
G = x^T G_y (Flax kernel [n_in, m_out]; V_r its top-r left singular vectors).
`grad_rel_error` is ||approx - exact|| / ||exact|| per parameter group
(`attention` is 1.0 by construction), also per parameter and per block with
the cosine (`by_layer`). `Curves` gives, from one SVD, the captured energy
E(r) = ||W V_r||^2 / ||W||^2 and the projection's error e(r) =
||(I - V_r V_r^T) G|| / ||G|| at every rank, and power laws fitted to them
carry a trained kernel to the paper's shapes. `projected` is P G under each
rule of `RULES`. The training runs that feed them: `studies/fidelity_runs.py`.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from mecefo_jax.faults.costs import ffn_kernels
from mecefo_jax.neighbour import projections as proj_lib

GROUPS = ('attention', 'ffn', 'other', 'total_non_attention')
FFN_KINDS = proj_lib.FFN_KERNELS
TARGET_ERROR = 0.6  # the paper's bound on the neighbour's relative gradient error
EXPONENT_GRID = np.linspace(-1.0, 4.0, 5001)  # the power-law exponents a fit tries
# 'weights': the paper's V V^T; 'gradient': Q Q^T, Q = orth(G Omega) (`lowrank.sketched_dense`);
# 'gradient_power1': one power iteration more (not implemented: what it would buy);
# 'best': the SVD truncation of G, which no rank-r rule beats.
RULES = ('weights', 'gradient', 'gradient_power1', 'best')


def path_names(path) -> list[str]:
    """The key names along a params path, as strings."""
    return [str(getattr(k, 'key', getattr(k, 'name', k))) for k in path]


def param_group(path) -> str:
    """'attention' (MHA branch), 'ffn' (FFN kernels) or 'other' for a params path."""
    from mecefo_jax.neighbour.contract import is_attention_branch
    if is_attention_branch(path):
        return 'attention'
    return 'ffn' if 'ffn' in path_names(path) else 'other'  # other: embedding, norms, head


def _squared(approx, exact) -> dict:
    """{'/'-joined path: (path, ||a - e||^2, ||e||^2)} in float64 on host."""
    out = {}

    def add(path, a, e):
        a64, e64 = np.asarray(a, np.float64), np.asarray(e, np.float64)
        out['/'.join(path_names(path))] = (path, float(np.sum((a64 - e64) ** 2)), float(np.sum(e64 ** 2)))
    jax.tree_util.tree_map_with_path(add, approx, exact)
    return out


def _ratio(err2: float, ref2: float) -> float:
    return float(np.sqrt(err2 / ref2)) if ref2 > 0 else float('nan')


def grad_rel_error(approx, exact) -> dict[str, float]:
    """||approx - exact|| / ||exact|| per parameter group."""
    err2, ref2 = dict.fromkeys(GROUPS[:3], 0.0), dict.fromkeys(GROUPS[:3], 0.0)
    for path, e2, r2 in _squared(approx, exact).values():
        err2[param_group(path)] += e2
        ref2[param_group(path)] += r2
    for sums in (err2, ref2):
        sums['total_non_attention'] = sums['ffn'] + sums['other']
    return {g: _ratio(err2[g], ref2[g]) for g in GROUPS}


def grad_rel_error_by_param(approx, exact) -> dict[str, float]:
    """||approx - exact|| / ||exact|| per parameter ('/'-joined path)."""
    return {name: _ratio(e2, r2) for name, (_, e2, r2) in _squared(approx, exact).items()}


def _layer_slices(path, leaf) -> list[tuple]:
    """[(block or None, group, array)]: a block leaf per block ('attention', 'ffn' or
    'ffn_norm'), any other leaf whole ('embedding' or 'top': final norm and head)."""
    names, leaf = path_names(path), np.asarray(leaf, np.float64)
    group = {'other': 'ffn_norm'}.get(param_group(path), param_group(path))
    if names[0] == 'layers':  # scanned: [L, ...]
        return [(i, group, leaf[i]) for i in range(leaf.shape[0])]
    if names[0].startswith('layers_'):
        return [(int(names[0][len('layers_'):]), group, leaf)]
    return [(None, 'embedding' if names[0] == 'embedding' else 'top', leaf)]


def by_layer(approx, exact) -> dict:
    """{'layers': [{group: {'rel_error', 'cosine'}} per block, bottom first], 'embedding': ...,
    'top': ...}: `approx` against `exact`."""
    sums: dict = {}
    for (path, a), e in zip(jax.tree_util.tree_flatten_with_path(approx)[0], jax.tree_util.tree_leaves(exact)):
        for (layer, group, a_part), (_, _, e_part) in zip(_layer_slices(path, a), _layer_slices(path, e)):
            sums[layer, group] = sums.get((layer, group), 0.0) + np.array(
                [np.sum((a_part - e_part) ** 2), np.sum(e_part ** 2), np.sum(a_part * e_part)])
    out: dict = {'layers': []}
    for (layer, group), (err2, ref2, dot) in sorted(
            sums.items(), key=lambda kv: (-1 if kv[0][0] is None else kv[0][0], kv[0][1])):
        app2 = err2 + 2 * dot - ref2  # ||a||^2 from ||a - e||^2, <a, e> and ||e||^2
        cosine = dot / np.sqrt(app2 * ref2) if app2 > 0 and ref2 > 0 else 0.0
        figures = {'rel_error': _ratio(err2, ref2), 'cosine': float(cosine)}
        if layer is None:
            out[group] = figures
            continue
        out['layers'] += [{} for _ in range(layer + 1 - len(out['layers']))]
        out['layers'][layer][group] = figures
    return out


def token_grad_fn(model):
    """Jitted `(params, projections, tokens, weights, neighbour) -> gradient` of the summed
    token loss. Sums, not means: a ratio of two gradients of the same rows needs no divisor."""
    from mecefo_jax.parallel import step as step_lib

    def grad(params, projections, tokens, weights, neighbour):
        return jax.grad(lambda p: step_lib.token_loss_sum(
            model, p, projections, tokens, weights, neighbour=neighbour))(params)
    return jax.jit(grad, static_argnames='neighbour')


def ffn_kernel_stacks(tree) -> dict[str, np.ndarray]:
    """{kind: [layers, n, m]} of a params-shaped tree (scanned or looped layers)."""
    found = {kind: [] for kind in FFN_KINDS}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        names = path_names(path)
        if len(names) >= 2 and names[-1] == 'kernel' and names[-2] in found:
            leaf = np.asarray(leaf)
            found[names[-2]].extend(leaf if leaf.ndim == 3 else [leaf])
    return {kind: np.stack(layers) for kind, layers in found.items()}


def square_sum(a, axis=None) -> np.ndarray:
    """Sum of squares in float64 whatever the input dtype (products stay in float32)."""
    return np.sum(np.square(a, dtype=np.float64), axis=axis)


@dataclasses.dataclass
class Curves:
    """Cumulative energies at ranks r = 1..k (k = min(n_in, m_out)) of a kernel, or pooled.

    Sums, not fractions (`energy[r-1]` = sum_{i<=r} sigma_i^2, `grad[r-1]` =
    sum_{i<=r} ||v_i^T G||^2), so kernels pool by adding, as `grad_rel_error`
    pools a parameter group.
    """
    n_in: int
    energy: np.ndarray
    energy_total: float
    grad: np.ndarray
    grad_total: float

    @classmethod
    def pooled(cls, curves) -> Curves:
        curves = list(curves)
        return cls(curves[0].n_in, *(sum(getattr(c, f) for c in curves)
                                     for f in ('energy', 'energy_total', 'grad', 'grad_total')))

    @property
    def k(self) -> int:
        return len(self.energy)

    def energies(self) -> np.ndarray:
        return self.energy / self.energy_total

    def errors(self) -> np.ndarray:
        return np.sqrt(np.clip(1.0 - self.grad / self.grad_total, 0.0, None))

    def energy_at(self, r: int) -> float:
        return float(self.energies()[min(r, self.k) - 1])

    def error_at(self, r: int) -> float:
        return float(self.errors()[min(r, self.k) - 1])

    def rank_for(self, target: float) -> int | None:
        """The smallest r whose error is at most `target`; None if even r = k misses it."""
        hits = np.flatnonzero(self.errors() <= target)
        return int(hits[0]) + 1 if len(hits) else None


def kernel_curves(kernel_nm, grad_nm, v_nk=None) -> Curves:
    """E and e at every rank for one kernel and its exact batch gradient; V defaults to
    all k top singular vectors as MeCeFO computes them. Products in the inputs' dtype."""
    kernel_nm, grad_nm = np.asarray(kernel_nm), np.asarray(grad_nm)
    if v_nk is None:
        v_nk = proj_lib.top_singular_vectors(kernel_nm, min(kernel_nm.shape))
    v_kn = np.asarray(v_nk, kernel_nm.dtype).T
    return Curves(kernel_nm.shape[0], np.cumsum(square_sum(v_kn @ kernel_nm, 1)), float(square_sum(kernel_nm)),
                  np.cumsum(square_sum(v_kn @ grad_nm, 1)), float(square_sum(grad_nm)))


def gradient_error(grad_nm, v_nr) -> float:
    """||(I - V V^T) G||_F / ||G||_F: the relative error of the low-rank kernel gradient V V^T G."""
    g, v = np.asarray(grad_nm, np.float64), np.asarray(v_nr, np.float64)
    return float(np.linalg.norm(g - v @ (v.T @ g)) / np.linalg.norm(g))


def power_law_fraction(exponent, k: int) -> np.ndarray:
    """sum_{i<=r} i^-a / sum_{i<=k} i^-a at r = 1..k (one row per exponent a)."""
    a = np.asarray(exponent, np.float64)[..., None]
    cumulative = np.cumsum(np.arange(1, k + 1, dtype=np.float64) ** -a, axis=-1)
    return cumulative / cumulative[..., -1:]


def fit_exponent(fraction) -> dict:
    """The power law whose cumulative fraction fits `fraction` (r = 1..k) best, and its RMS.

    Least squares on the cumulative curve, the quantity the extrapolation
    reads, not on log sigma_i, which would weigh the tail's noise as much as the top.
    """
    fraction = np.asarray(fraction, np.float64)
    sse = np.sum((power_law_fraction(EXPONENT_GRID, len(fraction)) - fraction) ** 2, axis=1)
    best = int(np.argmin(sse))
    return {'exponent': float(EXPONENT_GRID[best]), 'rms': float(np.sqrt(sse[best] / len(fraction)))}


def fit_curves(curves: Curves) -> dict:
    """sigma_i^2 ~ i^-a (`spectrum`), p_i ~ i^-g inside W's row space (`profile`), and the
    gradient share `outside` it (0 when n_in = k)."""
    return {'spectrum': fit_exponent(curves.energies()), 'profile': fit_exponent(curves.grad / curves.grad[-1]),
            'outside': float(max(0.0, 1.0 - curves.grad[-1] / curves.grad_total)),
            'k': curves.k, 'n_in': curves.n_in}


def fitted_curves(n: int, m: int, fit: dict) -> Curves:
    """The expected curves of an [n, m] kernel under a `fit_curves` fit: the exponents carry
    over (a power law has no scale), the share outside where the shape has one."""
    k = min(n, m)
    outside = fit['outside'] if n > k else 0.0
    return Curves(n, power_law_fraction(fit['spectrum']['exponent'], k), 1.0,
                  (1.0 - outside) * power_law_fraction(fit['profile']['exponent'], k), 1.0)


def summary(curves: Curves, ranks: dict[str, int], *, curve: bool = False) -> dict:
    """Energy and error at named ranks, the rank `TARGET_ERROR` needs, the floor at r = k."""
    out = {'n_in': curves.n_in, 'k': curves.k, 'ranks': dict(ranks),
           'energy': {label: curves.energy_at(r) for label, r in ranks.items()},
           'error': {label: curves.error_at(r) for label, r in ranks.items()},
           'rank_for_target': curves.rank_for(TARGET_ERROR), 'error_floor': curves.error_at(curves.k)}
    if curve:
        out['curve'] = {'energy': [round(float(v), 6) for v in curves.energies()],
                        'error': [round(float(v), 6) for v in curves.errors()]}
    return out


def kernel_shapes(shape) -> dict[str, tuple[int, int]]:
    """{kind: [n_in, m_out]} of a `ModelShape`'s FFN kernels."""
    return dict(zip(FFN_KINDS, ffn_kernels(shape)))


def random_init_standin(n: int, m: int, *, tokens: int, seed: int) -> Curves:
    """Stand-in (a): the initialisation N(0, 1/n_in) at [n, m], with inputs and output
    gradients independent standard Gaussians (nothing aligns them with W yet)."""
    rng = np.random.default_rng(seed)
    kernel = rng.standard_normal((n, m), dtype=np.float32) * np.float32(n ** -0.5)
    x = rng.standard_normal((tokens, n), dtype=np.float32)
    return kernel_curves(kernel, x.T @ rng.standard_normal((tokens, m), dtype=np.float32))


def fitted_standin(n: int, m: int, fit: dict, *, tokens: int, seed: int) -> Curves:
    """Stand-in (c): a batch generated at [n, m] under the fitted laws, measured.

    W is taken in its own singular basis (both figures are invariant under
    orthogonal changes of basis), so V is the first r coordinates. Inputs
    x = z * s carry the fitted profile along W's directions and the share
    outside spread evenly; G_y is Gaussian, independent of x.
    """
    expected = fitted_curves(n, m, fit)
    k = expected.k
    outside = np.full(n - k, (1.0 - expected.grad[-1]) / max(n - k, 1))
    scale = np.sqrt(np.concatenate([np.diff(expected.grad, prepend=0.0), outside])).astype(np.float32)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, n), dtype=np.float32) * scale
    grad = x.T @ rng.standard_normal((tokens, m), dtype=np.float32)
    return Curves(n, expected.energy, 1.0, np.cumsum(square_sum(grad[:k], 1)), float(square_sum(grad)))


def projected(rule: str, kernel_nm, g_nm, r: int):
    """P G for one kernel and its exact gradient under `rule` of `RULES` (float64)."""
    from mecefo_jax.neighbour.lowrank import sketch_matrix
    if rule == 'weights':
        v = np.linalg.svd(kernel_nm, full_matrices=False)[0][:, :r]
        return v @ (v.T @ g_nm)
    if rule == 'best':
        u, s, vt = np.linalg.svd(g_nm, full_matrices=False)
        return (u[:, :r] * s[:r]) @ vt[:r]
    q = np.linalg.qr(g_nm @ np.asarray(sketch_matrix(*g_nm.shape, r), np.float64))[0]
    if rule == 'gradient_power1':
        q = np.linalg.qr(g_nm @ (g_nm.T @ q))[0]
    return q @ (q.T @ g_nm)


def projection_errors(params, exact, r: int) -> dict:
    """{kind: {rule: ||G - P G|| / ||G||}} of the projection alone at rank r, pooled over layers."""
    kernels, grads = ffn_kernel_stacks(params), ffn_kernel_stacks(exact)
    out = {}
    for kind in FFN_KINDS:
        pairs = [(np.asarray(k, np.float64), np.asarray(g, np.float64)) for k, g in zip(kernels[kind], grads[kind])]
        total = sum(np.sum(g * g) for _, g in pairs)
        out[kind] = {rule: float(np.sqrt(sum(np.sum((g - projected(rule, k, g, r)) ** 2) for k, g in pairs) / total))
                     for rule in RULES}
    return out
