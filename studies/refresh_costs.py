"""What one projection refresh costs a replica, for the cluster simulator.

MeCeFO recomputes the FFN projections V at each neighbour onset and every
`tau` steps while a neighbour is active (Hu et al., NeurIPS 2025, arXiv
2510.16415). The library's default refresh (`mecefo.refresh=subspace`) is
randomized subspace iteration (Halko, Martinsson & Tropp, 2011) and its
products are split over the live data-parallel replicas (`refresh.make_refresh_fn`:
the kernels are identical on every replica), so a refresh costs a replica

* 1/live of the products ``4 n m r`` per kernel and iteration,
* the thin QRs of the skinny blocks, replicated, and
* one all-gather of the long-axis [., r] block and one all-reduce of the
  short-axis one per kernel and iteration.

A kernel under `mecefo.refresh_split_min_elements` is not split: every
replica pays its products and no collective.

The exact SVD (`mecefo.refresh=svd`) is not split: every replica pays all of it.
Pure numpy: no jax import.
"""
from __future__ import annotations

import dataclasses

from mecefo_jax.config.defaults import DEFAULT_SPLIT_MIN_ELEMENTS
from mecefo_jax.faults.costs import ffn_kernels, thin_qr_flops

# Effective TFLOP/s of the refresh's products and QRs on a GPU: an assumption, not a
# measurement, kept low on purpose (float32 at HIGHEST precision, skinny r-wide
# products and LAPACK-style QRs run far below dense bf16 peak).
DEFAULT_REFRESH_TFLOPS = 1.0
# Per-GPU bandwidth between data-parallel replicas on different nodes: one 200 Gb/s
# HDR InfiniBand port per A100 in a DGX A100 (NVIDIA's DGX A100 datasheet), 25 GB/s.
DEFAULT_LINK_GBPS = 25.0
BYTES_F32 = 4


def svd_refresh_flops(shape) -> float:
    """FLOPs of one projection refresh: a thin SVD of each of the 3 FFN kernels
    per block, as `projections.top_singular_vectors` computes (U, S and V of
    an m x n kernel, m >= n: ``6mn^2 + 20n^3``, Golub & Van Loan's R-SVD
    count), on every replica (the SVD is not split)."""
    m, n = max(shape.d_model, shape.ffn_hidden), min(shape.d_model, shape.ffn_hidden)
    return 3.0 * shape.num_layers * (6.0 * m * n * n + 20.0 * n ** 3)


def subspace_flops(n: int, m: int, r: int, iterations: int) -> float:
    """One [n, m] kernel, unsplit: two products per iteration plus the thin QRs,
    the start's QR included."""
    return thin_qr_flops(n, r) + iterations * (4.0 * n * m * r + thin_qr_flops(m, r) + thin_qr_flops(n, r))


@dataclasses.dataclass(frozen=True)
class SubspaceRefreshParts:
    """One subspace refresh of every FFN kernel, in the three parts it is charged in."""
    product_flops: float  # all replicas together: each pays 1/live
    whole_flops: float  # every replica: the QRs, and the products of unsplit kernels
    collective_bytes: float  # every replica (ring all-gather/all-reduce upper bound)


def subspace_refresh_parts(shape, rank: int, iterations: int,
                           split_min_elements: int = DEFAULT_SPLIT_MIN_ELEMENTS
                           ) -> SubspaceRefreshParts:
    """The refresh's parts. A kernel of at least `split_min_elements` is split:
    collective bytes per replica, per kernel and iteration, are an all-gather of
    the long-axis [max(n, m), r] block (``k r`` words received) and a ring
    all-reduce of the short-axis one (``2 k r`` words), at their
    (live - 1) / live <= 1 upper bound. A smaller one is computed whole."""
    products = whole = words = 0.0
    for n, m in ffn_kernels(shape):
        kernel_products = iterations * 4.0 * n * m * rank
        whole += thin_qr_flops(n, rank) + iterations * (thin_qr_flops(m, rank) + thin_qr_flops(n, rank))
        if n * m < split_min_elements:
            whole += kernel_products
            continue
        products += kernel_products
        words += iterations * rank * (max(n, m) + 2 * min(n, m))
    layers = shape.num_layers
    return SubspaceRefreshParts(layers * products, layers * whole, layers * words * BYTES_F32)


def refresh_charge(shape, *, method: str, rank: int, iterations: int, tflops: float,
                   link_gbps: float,
                   split_min_elements: int = DEFAULT_SPLIT_MIN_ELEMENTS) -> dict:
    """CostTable fields {refresh_sec, refresh_split_sec, refresh_source} for one model:
    `refresh_sec` is paid whole by every replica, `refresh_split_sec` divided by the
    live replicas."""
    rate = tflops * 1e12
    if method == 'svd':
        flops = svd_refresh_flops(shape)
        return {'refresh_sec': flops / rate, 'refresh_split_sec': 0.0,
                'refresh_source': f'thin-SVD FLOPs of the FFN kernels ({flops / 1e12:.3f} '
                                  f'TFLOP, on every replica) at an assumed {tflops:g} TFLOP/s'}
    parts = subspace_refresh_parts(shape, rank, iterations, split_min_elements)
    return {'refresh_sec': parts.whole_flops / rate + parts.collective_bytes / (link_gbps * 1e9),
            'refresh_split_sec': parts.product_flops / rate,
            'refresh_source': (
                f'{iterations}-iteration subspace refresh split over the live replicas: '
                f'{parts.product_flops / 1e12:.3f} TFLOP of products / live + '
                f'{parts.whole_flops / 1e12:.4f} TFLOP of QRs and unsplit products at an '
                f'assumed {tflops:g} TFLOP/s, '
                f'+ {parts.collective_bytes / 1e6:.0f} MB of collectives at {link_gbps:g} GB/s')}
