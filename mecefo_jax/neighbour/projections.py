"""Projection state for MeCeFO's low-rank FFN gradients: the V of `lowrank.lowrank_dense`.

V holds the top-r left singular vectors of each FFN kernel (Flax stores W^T), computed
exactly by SVD or by randomized subspace iteration warm-started from the held V
(`mecefo.refresh`; docs/algorithm.md, "Cheap projection refresh").
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from mecefo_jax.neighbour.contract import FFN_KERNELS, is_ffn_kernel


def resolve_rank(rank: Any, n_in: int, m_out: int, field: str = 'mecefo.rank') -> int:
    """The configured rank as an absolute r for an [n_in, m_out] kernel.

    An int >= 1 is absolute, a float in (0, 1] a fraction of min(n_in, m_out) (rounded
    half-up, at least 1); a whole float > 1 is absolute too, since ConfigDict locks
    `mecefo.rank` to float. Anything else raises naming `field`, at startup.
    """
    if n_in < 1 or m_out < 1:
        raise ValueError(f'{field}: kernel dims must be >= 1, got [{n_in}, {m_out}]')
    max_rank = min(n_in, m_out)
    valid = f'an int in [1, {max_rank}] or a float fraction in (0, 1]'
    # bool is an Integral; True silently meaning r=1 would hide a config typo.
    if isinstance(rank, bool) or not isinstance(rank, numbers.Real):
        raise ValueError(f'{field} must be {valid}; got {rank!r}')
    if isinstance(rank, numbers.Integral) or (float(rank) > 1.0 and float(rank).is_integer()):
        r = int(rank)
        if not 1 <= r <= max_rank:
            raise ValueError(f'{field} must be {valid}; got {r}')
        return r
    frac = float(rank)
    if not 0.0 < frac <= 1.0:  # also rejects NaN
        raise ValueError(f'{field} must be {valid}; got {rank!r}')
    return max(1, min(max_rank, math.floor(frac * max_rank + 0.5)))


def top_singular_vectors(kernel_nm: jax.Array, r: int) -> jax.Array:
    """Top-r left singular vectors of a Flax kernel ([n_in, m_out] -> [n_in, r]), in float32.

    One SVD per matrix of a stacked kernel: on several CPU devices (jax 0.10.2) a batched
    LAPACK SVD beside the parameter initialiser deadlocked about every other run.
    """
    kernel_nm = kernel_nm.astype(jnp.float32)
    if kernel_nm.ndim > 2:
        return jnp.stack([top_singular_vectors(k, r) for k in kernel_nm])
    u_nk, _, _ = jnp.linalg.svd(kernel_nm, full_matrices=False)
    return u_nk[:, :r]


def _orthonormal(y_kr: jax.Array) -> jax.Array:
    """Q of a thin Householder QR (orthonormal even if y is rank deficient), one per matrix.

    jax 0.10.2's CPU LAPACK kernels split a batch over XLA's thread pool and wait for it
    from a thread of that pool, so two devices refreshing at once could hang; a single
    matrix runs in the calling thread.
    """
    if y_kr.ndim > 2:
        return jnp.stack([_orthonormal(y) for y in y_kr])
    return jnp.linalg.qr(y_kr, mode='reduced')[0]


def subspace_iteration(kernel_nm: jax.Array, rank: int, init_v: jax.Array | None = None, *,
                       iterations: int, key: jax.Array | None = None,
                       split: RefreshSplit | None = None) -> jax.Array:
    """Top-r left singular subspace ([..., n, r] float32, any basis: only V V^T is used) of a
    Flax kernel by randomized subspace iteration.

    Halko, Martinsson & Tropp (2011), Algorithm 4.4: Z = orth(kernel^T Q), Q = orth(kernel Z)
    per iteration; orthonormalising after every product keeps float32 accurate where powers
    of kernel kernel^T would drown the smaller directions. V0 is `init_v` (the held V: the
    weights drift slowly, so one or two iterations track them) or a Gaussian draw from `key`.
    Products run at HIGHEST precision (TF32/bf16 passes would cap the accuracy).
    """
    kernel_nm = kernel_nm.astype(jnp.float32)
    n = kernel_nm.shape[-2]
    if init_v is None:
        if key is None:
            raise ValueError('subspace_iteration: pass init_v (the previous V) or a PRNG key '
                             'for a random start')
        init_v = jax.random.normal(key, kernel_nm.shape[:-1] + (rank,), jnp.float32)
    if init_v.shape != kernel_nm.shape[:-1] + (rank,):
        raise ValueError(f'subspace_iteration: init_v has shape {init_v.shape}, expected '
                         f'{kernel_nm.shape[:-1] + (rank,)} for a kernel {kernel_nm.shape} '
                         f'and rank {rank} (n={n})')
    if iterations < 1:
        raise ValueError(f'subspace_iteration: iterations must be >= 1; got {iterations}')
    hi = jax.lax.Precision.HIGHEST
    split = split or RefreshSplit()
    kernel_nm = split.kernel(kernel_nm)
    q_nr = _orthonormal(split.block(init_v.astype(jnp.float32)))
    for _ in range(iterations):
        z_mr = _orthonormal(split.block(split.product_m(
            jnp.einsum('...nm,...nr->...mr', kernel_nm, q_nr, precision=hi))))
        q_nr = _orthonormal(split.block(split.product_n(
            jnp.einsum('...nm,...mr->...nr', kernel_nm, z_mr, precision=hi))))
    return q_nr


def _unchanged(x: jax.Array) -> jax.Array:
    return x


@dataclasses.dataclass(frozen=True)
class RefreshSplit:
    """Where one kernel's subspace iteration runs: `kernel` places the [..., n, m] kernel before
    the products, `product_m` and `product_n` the [..., m, r] and [..., n, r] products as they
    come out, `block` each skinny block before its QR (replicated, so the QR is not split)."""
    kernel: Callable[[jax.Array], jax.Array] = _unchanged
    product_m: Callable[[jax.Array], jax.Array] = _unchanged
    product_n: Callable[[jax.Array], jax.Array] = _unchanged
    block: Callable[[jax.Array], jax.Array] = _unchanged


def compute_projections(params: Mapping[str, Any], rank: Any) -> dict[str, Any]:
    """V for every FFN kernel in the unboxed `params`, in a tree of only those paths; raises if
    there is none, since {} would make neighbour mode a silent no-op."""

    def walk(node: Mapping[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, child in node.items():
            child_path = path + (str(key),)
            if isinstance(child, Mapping):
                sub = walk(child, child_path)
                if sub:
                    out[key] = sub
            elif is_ffn_kernel(child_path):
                if getattr(child, 'ndim', 0) < 2:
                    raise ValueError(
                        f'{"/".join(child_path)}: expected an [n_in, m_out] kernel, got '
                        f'{type(child).__name__} with shape {getattr(child, "shape", None)} '
                        '(are the params still boxed?)')
                n_in, m_out = child.shape[-2], child.shape[-1]
                out[key] = top_singular_vectors(child, resolve_rank(rank, n_in, m_out))
        return out

    projections = walk(params, ())
    if not projections:
        raise ValueError(f'compute_projections: no leaf at a path ending in '
                         f'(<{"|".join(FFN_KERNELS)}>, \'kernel\') in params')
    return projections


def refresh_projections(params: Mapping[str, Any], previous: Mapping[str, Any], rank: Any, *,
                        method: str, iterations: int,
                        split_for: Callable[[tuple[str, ...], jax.Array], RefreshSplit]
                        | None = None
                        ) -> dict[str, Any]:
    """New V for every FFN kernel: exact SVD, or subspace iteration warm-started from the held
    `previous`, each kernel placed by `split_for(path, kernel)` when given."""
    if method == 'svd':
        return compute_projections(params, rank)

    def refresh(path, v_nr):
        kernel_nm = params
        for entry in path:
            kernel_nm = kernel_nm[entry.key]
        keys = tuple(str(entry.key) for entry in path)
        split = split_for(keys, kernel_nm) if split_for is not None else None
        return subspace_iteration(kernel_nm, v_nr.shape[-1], v_nr, iterations=iterations,
                                  split=split)
    return jax.tree_util.tree_map_with_path(refresh, previous)


def needs_refresh(step: int, *, tau: int, failure_onset: bool, neighbour_active: bool) -> bool:
    """Whether V must be recomputed before this step's backward: always at failure onset (the
    held V may be arbitrarily old), else every `tau` steps while a neighbour is active."""
    if step < 0:
        raise ValueError(f'step must be >= 0; got {step}')
    if failure_onset:
        return True
    return bool(neighbour_active) and step % tau == 0
