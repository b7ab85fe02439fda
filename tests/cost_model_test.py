"""Which device programs a layout runs, and what the analytic cost model charges a neighbour."""

import pytest

from mecefo_jax.faults.strategies import layout_for
from mecefo_jax.neighbour.layout import ROLE_NEIGHBOUR, ROLE_NORMAL, Program

N, B = 8, 2


def down(*replicas):
    return tuple(r not in replicas for r in range(N))


def programs(strategy, live):
    return set(layout_for(strategy, live, B).programs)


def test_a_layouts_programs_are_the_ones_its_devices_run():
    assert programs('mecefo', down()) == {Program(ROLE_NORMAL, B)}
    assert programs('mecefo', down(3)) == {Program(ROLE_NORMAL, B), Program(ROLE_NEIGHBOUR, 2 * B)}
    # Elastic: one larger normal program (2 + ceil(2/7) = 3 rows) for everyone.
    assert programs('elastic', down(3)) == {Program(ROLE_NORMAL, B + 1)}
    # Naive neighbour-do-both: one program, every device padded to two shards.
    assert programs('ndb_naive', down(3)) == {Program(ROLE_NORMAL, 2 * B)}


def test_the_neighbours_attention_backward_costs_twice_its_forward_per_block():
    """mecefo.skip_attention off (share 1) or in the top K blocks (share K / L): each such
    block adds the attention branch's backward, twice its forward (projections + scores)."""
    from mecefo_jax.faults import costs
    shape = costs.PAPER_MODELS['350M']
    kw = dict(mode='neighbour', seq_len=256, rank=128, batch_tokens=4096.0, recompute_ffn=False)
    skipped = costs.flops_per_token(shape, **kw)
    half = costs.flops_per_token(shape, attention_backward=0.5, **kw)
    d, scores = shape.d_model, 4 * 256 * shape.d_model
    per_block = 2.0 * (2 * 4 * d * d + scores)
    assert half - skipped == pytest.approx(0.5 * shape.num_layers * per_block)
