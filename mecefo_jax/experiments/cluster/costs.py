"""The simulator's cost tables: the library's `faults/costs.py`, re-exported.

The pure cost functions moved into the library because the placement planner
needs them at run time, and the library never imports `experiments`.
"""
from mecefo_jax.faults.costs import (PAPER_MODELS, PEAK_FLOPS_A100_BF16, CostTable,  # noqa: F401
                                     ModelShape, analytic_table, bench_table,
                                     block_flops_per_token, flops_per_token, interpolate,
                                     load_json, mfu_step_sec, paper_implied_mfu,
                                     program_seconds, role_cost, roles_table,
                                     svd_refresh_flops)
