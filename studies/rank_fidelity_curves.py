"""The rank-r projection's curves: captured energy and gradient error at every rank.

For a Flax kernel K = W^T ([n_in, m_out]) and its exact batch gradient
G = x^T G_y, MeCeFO's neighbour (Hu et al., NeurIPS 2025, arXiv 2510.16415;
`lowrank.lowrank_dense`) keeps V_r V_r^T G, V_r the top-r left singular
vectors of K. This module owns the two curves over r that one SVD gives,
E(r) = ||W V_r||_F^2 / ||W||_F^2 and e(r) = ||(I - V_r V_r^T) G||_F / ||G||_F,
their pooling over kernels, the rank a target error needs, and the power
laws fitted to a trained kernel's curves (and the curves those laws give at
another shape), which `rank_fidelity` carries to the paper's shapes.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from mecefo_jax.neighbour import projections as proj_lib

FFN_KINDS = proj_lib.FFN_KERNEL_NAMES
TARGET_ERROR = 0.6  # the paper's bound on the neighbour's relative gradient error
EXPONENT_GRID = np.linspace(-1.0, 4.0, 5001)  # the power-law exponents a fit tries


def square_sum(a, axis=None) -> np.ndarray:
    """Sum of squares in float64 whatever the input dtype (products stay in float32)."""
    return np.sum(np.square(a, dtype=np.float64), axis=axis)


@dataclasses.dataclass
class Curves:
    """Cumulative energies at ranks r = 1..k (k = min(n_in, m_out)) of a kernel, or pooled.

    `energy[r-1]` = sum_{i<=r} sigma_i^2 of W and `grad[r-1]` = sum_{i<=r}
    ||v_i^T G||^2 are sums, not fractions, so kernels pool by adding: the
    pooled error is that of the concatenated gradients, as `grad_error`
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
        return cls(curves[0].n_in, sum(c.energy for c in curves),
                   sum(c.energy_total for c in curves), sum(c.grad for c in curves),
                   sum(c.grad_total for c in curves))

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
    """E and e at every rank for one Flax kernel and its exact batch gradient.

    V defaults to all k top singular vectors as MeCeFO computes them
    (`projections.top_singular_vectors`). Products run in the inputs' dtype
    (float32 at the paper's shapes), sums in float64.
    """
    kernel_nm, grad_nm = np.asarray(kernel_nm), np.asarray(grad_nm)
    if v_nk is None:
        v_nk = proj_lib.top_singular_vectors(kernel_nm, min(kernel_nm.shape))
    v_kn = np.asarray(v_nk, kernel_nm.dtype).T
    return Curves(kernel_nm.shape[0], np.cumsum(square_sum(v_kn @ kernel_nm, 1)),
                  float(square_sum(kernel_nm)), np.cumsum(square_sum(v_kn @ grad_nm, 1)),
                  float(square_sum(grad_nm)))


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
    """The power law whose cumulative fraction fits `fraction` (r = 1..k) best.

    Least squares over every rank on the cumulative curve, the quantity the
    extrapolation reads, rather than on log sigma_i, which would weigh the
    tail's noise as much as the top. Returns the exponent and the RMS residual.
    """
    fraction = np.asarray(fraction, np.float64)
    sse = np.sum((power_law_fraction(EXPONENT_GRID, len(fraction)) - fraction) ** 2, axis=1)
    best = int(np.argmin(sse))
    return {'exponent': float(EXPONENT_GRID[best]), 'rms': float(np.sqrt(sse[best] / len(fraction)))}


def fit_curves(curves: Curves) -> dict:
    """Power laws for a trained kernel: sigma_i^2 ~ i^-a (`spectrum`), p_i ~ i^-g within
    W's row space (`profile`), and the gradient share `outside` it (0 when n_in = k)."""
    inside = curves.grad[-1] / curves.grad_total
    return {'spectrum': fit_exponent(curves.energies()),
            'profile': fit_exponent(curves.grad / curves.grad[-1]),
            'outside': float(max(0.0, 1.0 - inside)), 'k': curves.k, 'n_in': curves.n_in}


def fitted_curves(n: int, m: int, fit: dict) -> Curves:
    """The expected curves of an [n, m] kernel under a `fit_curves` fit (no sampling).

    The exponents carry over unchanged (a power law has no scale of its own);
    the share outside W's row space carries over where the shape has one.
    """
    k = min(n, m)
    outside = fit['outside'] if n > k else 0.0
    return Curves(n, power_law_fraction(fit['spectrum']['exponent'], k), 1.0,
                  (1.0 - outside) * power_law_fraction(fit['profile']['exponent'], k), 1.0)


def summary(curves: Curves, ranks: dict[str, int], *, target: float = TARGET_ERROR,
            curve: bool = False) -> dict:
    """Energy and error at named ranks, the rank `target` needs, the floor at r = k."""
    out = {'n_in': curves.n_in, 'k': curves.k, 'ranks': dict(ranks),
           'energy': {label: curves.energy_at(r) for label, r in ranks.items()},
           'error': {label: curves.error_at(r) for label, r in ranks.items()},
           'rank_for_target': curves.rank_for(target), 'error_floor': curves.error_at(curves.k)}
    if curve:
        out['curve'] = {'energy': [round(float(v), 6) for v in curves.energies()],
                        'error': [round(float(v), 6) for v in curves.errors()]}
    return out
