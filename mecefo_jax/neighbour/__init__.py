"""The neighbour's approximate backward (MeCeFO, Hu et al., NeurIPS 2025), in one place.

*Neighbour mode*: the forward exact, the attention branch skipped in backward, the FFN
weight gradients low-rank.

| module | what it owns |
|---|---|
| `contract` | the parameter names the neighbour's rules read off a model, checked |
| `lowrank` | the backward rules: the attention branch skipped; FFN weight gradients `G_y (x^T V) V^T` (or a sketch) |
| `projections` | the top-`r` right singular subspaces `V`, and when they are refreshed |
| `layout`, `row_packing` | which replica (or device row) computes which rows, in which role |
| `combination` | how per-row gradient sums become one update: attention over exact rows only |
"""
