"""The gradient all-reduce in a data-parallel step, and how much of a slower device it hides.

A data-parallel step is compute, then the part of the gradients' ring
all-reduce that the backward pass did not hide:

    ring time  = 2 (n - 1) / n * B / W
    exposed    = (1 - overlap) * ring time
    phi        = exposed / (t_compute + exposed)

with n the replicas, B the gradient bytes (the config's parameter count times
the gradient dtype's bytes) and W the bus bandwidth. 2 (n - 1) / n is the
bytes each rank sends in a ring all-reduce per byte reduced, the factor by
which NCCL's tests turn an all-reduce's algorithm bandwidth into its bus
bandwidth (nccl-tests, doc/PERFORMANCE.md). Every replica waits for the same
exposed all-reduce, so a device whose compute is c times a normal one makes
the step (c t + e) / (t + e) = 1 + (c - 1)(1 - phi) times as long
(`faults/step_clock.diluted`, the one function the fault controller's clock
uses too).

The cluster is the MeCeFO paper's (Hu et al., NeurIPS 2025, arXiv
2510.16415): 32 A100 GPUs, 4 nodes of 8. The figures of `Cluster` carry
their sources; what the paper does not give is stated as an assumption. The
assumptions do not all push phi one way, so phi is an estimate, not a bound
in MeCeFO's favour: no overlap makes it as large as it can be, but float32
gradients or a higher MFU would make it larger than the stated bf16 and 40%,
and latency (about 2 (n - 1) hops per all-reduce), left out, would add to it
(`verdict_clock.phi_sensitivity` gives phi under each).

t_compute, the fault-free step's compute on one replica: the FLOP model's step
(`faults/costs.flops_per_token`, about 6 N FLOPs per token plus the attention
scores) at `Cluster.mfu` of `Cluster.peak_tflops` (`faults/costs.mfu_step_sec`);
given a bench that ran the config's own shape on a GPU, that GPU's measured
normal step instead (`bench_costs.bench_table`, scaled to the replica's tokens),
which the verdict reports only beside the cluster's own.
"""
from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The paper's cluster, each figure with its source or stated as an assumption."""
    gpus_per_node: int = 8  # the paper: 4 nodes x 8 A100 GPUs (a DGX A100 holds 8)
    # GB/s leaving a node: 8 single-port 200 Gb/s HDR InfiniBand adapters per DGX A100
    # (NVIDIA DGX A100 datasheet); NCCL runs one ring channel per adapter, so a ring
    # across nodes moves a node's whole network bandwidth.
    node_network_gbps: float = 8 * 200 / 8
    # GB/s per GPU and direction inside a node: NVLink 600 GB/s bidirectional (NVIDIA A100
    # datasheet); a ring that stays in one node runs at it.
    nvlink_gbps: float = 300.0
    # Bytes per gradient element: an assumption, bf16 gradients all-reduced (the paper
    # does not say; float32 would double B and make phi larger).
    grad_bytes: int = 2
    # Share of the ring hidden behind the backward pass: an assumption, none (bucketed
    # all-reduce as in PyTorch DDP, Li et al., VLDB 2020, hides part; 0 is the largest phi).
    overlap: float = 0.0
    # A100 dense bf16 tensor-core peak (NVIDIA A100 datasheet; faults/costs.py's figure).
    peak_tflops: float = 312.0
    # Model FLOPs utilisation: an assumption, below the 52% of peak Megatron-LM reached on
    # A100s (Narayanan et al., SC 2021); a lower MFU means longer compute and a smaller phi.
    mfu: float = 0.4

    def __post_init__(self):
        for name, ok, fix in (('gpus_per_node', self.gpus_per_node >= 1, '8'),
                              ('node_network_gbps', self.node_network_gbps > 0, '200'),
                              ('nvlink_gbps', self.nvlink_gbps > 0, '300'),
                              ('grad_bytes', self.grad_bytes >= 1, '2'),
                              ('overlap', 0.0 <= self.overlap <= 1.0, '0'),
                              ('peak_tflops', self.peak_tflops > 0, '312'),
                              ('mfu', 0.0 < self.mfu <= 1.0, '0.4')):
            if not ok:
                raise ValueError(f'Cluster.{name}={getattr(self, name)!r} is out of range; '
                                 f'e.g. Cluster({name}={fix}).')

    def bus_gbps(self, replicas: int) -> float:
        """W: a node's network where the ring crosses nodes, NVLink where it stays in one."""
        return self.node_network_gbps if replicas > self.gpus_per_node else self.nvlink_gbps


def param_count(model_cfg) -> int:
    """Parameters of the config's LLaMA (`model/llama.py`): embedding and untied head,
    per block the attention kernels (grouped KV heads), three FFN kernels and two
    norms, and the final norm."""
    d, f, v = model_cfg.d_model, model_cfg.ffn_hidden, model_cfg.vocab_size
    heads, kv, head_dim = model_cfg.num_heads, model_cfg.num_kv_heads, d // model_cfg.num_heads
    attention = d * head_dim * (2 * heads + 2 * kv)
    block = attention + 3 * d * f + 2 * d
    return 2 * v * d + model_cfg.num_layers * block + d


def ring_sec(grad_bytes: float, replicas: int, bus_gbps: float) -> float:
    """A ring all-reduce of `grad_bytes` over `replicas` at bus bandwidth `bus_gbps`."""
    if replicas < 2:
        return 0.0
    return 2.0 * (replicas - 1) / replicas * grad_bytes / (bus_gbps * 1e9)


def exposed_share(compute_sec: float, exposed_sec: float) -> float:
    """phi: the exposed all-reduce's share of a fault-free step."""
    total = compute_sec + exposed_sec
    if not total > 0 or not math.isfinite(total):
        raise ValueError(f'a step of compute {compute_sec!r} s and exposed all-reduce '
                         f'{exposed_sec!r} s has no share to take.')
    return exposed_sec / total


def compute_sec(cfg, replicas: int, cluster: Cluster, bench: dict | None = None) -> tuple[float, str]:
    """(seconds, source) of one replica's fault-free compute (module docstring)."""
    from mecefo_jax.faults import costs
    from studies import bench_costs
    shape = costs.shape_of(cfg.model)
    seqs = cfg.data.global_batch_size // replicas
    kw = dict(seq_len=cfg.data.seq_len, replica_seqs=seqs, mfu=cluster.mfu,
              peak_flops=cluster.peak_tflops * 1e12, recompute_ffn=cfg.mecefo.remat_ffn)
    if bench is not None:
        table = bench_costs.bench_table(bench, shape, metric='step_ms', **kw)
        return table.step_sec, table.step_sec_source
    return (costs.mfu_step_sec(shape, **kw),
            f'analytic FLOPs at MFU {cluster.mfu:g} of {cluster.peak_tflops:g} TFLOP/s')


def step_allreduce(cfg, replicas: int, cluster: Cluster | None = None,
                   bench: dict | None = None) -> dict:
    """The all-reduce in one fault-free step of `cfg` over `replicas`: {phi, model_params,
    grad_bytes, bus_gbps, ring_sec, exposed_sec, compute_sec, compute_source, cluster}."""
    cluster = cluster or Cluster()
    params = param_count(cfg.model)
    grad_bytes = params * cluster.grad_bytes
    ring = ring_sec(grad_bytes, replicas, cluster.bus_gbps(replicas))
    exposed = (1.0 - cluster.overlap) * ring
    compute, source = compute_sec(cfg, replicas, cluster, bench)
    return {'phi': exposed_share(compute, exposed), 'model_params': params,
            'grad_bytes': grad_bytes, 'bus_gbps': cluster.bus_gbps(replicas), 'ring_sec': ring,
            'exposed_sec': exposed, 'compute_sec': compute, 'compute_source': source,
            'cluster': dataclasses.asdict(cluster)}
