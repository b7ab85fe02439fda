"""The neighbour's approximate backward (MeCeFO, Hu et al., NeurIPS 2025), in one place.

A live replica that adopts a failed one's rows computes them, and may compute
its own, in *neighbour mode*: the forward is exact, the attention branch is
skipped in backward, and the FFN weight gradients are low-rank.

| module | what it owns |
|---|---|
| `attention_skip` | the attention branch as identity in backward, and which parameters lie on it |
| `lowrank` | `custom_vjp` FFN layers whose weight gradient is `G_y (x^T V) V^T` (or a sketch) |
| `projections` | the top-`r` right singular subspaces `V`, and when they are refreshed |
| `layout` | which replica computes which rows, in which role (normal, neighbour, mixed) |
| `combination` | how per-row gradient sums become one update: attention over exact rows only |

The step (`mecefo_jax.parallel.step`) runs each replica's role with
`lax.switch`; the fault strategies (`mecefo_jax.faults.strategies`) choose the
layout.
"""
