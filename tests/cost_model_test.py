"""Unit tests of studies.role_timer: which programs a layout runs, and their cost."""

import jax
import pytest

from configs import tiny
from mecefo_jax.config_resolve import resolve
from mecefo_jax.faults.strategies import layout_for
from mecefo_jax.model import optim
from mecefo_jax.model.llama import build_model
from mecefo_jax.neighbour.layout import ROLE_NEIGHBOUR, ROLE_NORMAL, Program
from studies.role_timer import RoleTimer, layout_keys

N, B = 8, 2


def down(*replicas):
    return tuple(r not in replicas for r in range(N))


def test_layout_keys_are_the_programs_the_devices_run():
    assert layout_keys(layout_for('mecefo', down(), B)) == {Program(ROLE_NORMAL, B)}
    assert layout_keys(layout_for('mecefo', down(3), B)) == {
        Program(ROLE_NORMAL, B), Program(ROLE_NEIGHBOUR, 2 * B)}
    # Elastic: one larger normal program (2 + ceil(2/7) = 3 rows) for everyone.
    assert layout_keys(layout_for('elastic', down(3), B)) == {Program(ROLE_NORMAL, B + 1)}
    # Naive neighbour-do-both: one program, every device padded to two shards.
    assert layout_keys(layout_for('ndb_naive', down(3), B)) == {Program(ROLE_NORMAL, 2 * B)}


class _Known(RoleTimer):
    """A RoleTimer whose programs have known costs (no compiling, no timing)."""

    def __init__(self, seconds):
        self._cache = dict(seconds)

    def measure(self, programs):
        raise AssertionError(f'unexpected measurement of {programs}')


def test_a_step_lasts_as_long_as_its_slowest_device():
    timer = _Known({Program(ROLE_NORMAL, B): 1.0, Program(ROLE_NEIGHBOUR, 2 * B): 1.5,
                    Program(ROLE_NORMAL, 2 * B): 2.0, Program(ROLE_NORMAL, B + 1): 1.25})
    assert timer.step_seconds(layout_for('mecefo', down(), B)) == 1.0
    assert timer.step_seconds(layout_for('mecefo', down(3), B)) == 1.5
    assert timer.step_seconds(layout_for('ndb_naive', down(3), B)) == 2.0
    assert timer.step_seconds(layout_for('elastic', down(3), B)) == 1.25
    assert timer.table() == {'normalx2': 1.0, 'normalx3': 1.25, 'normalx4': 2.0,
                             'neighbourx4': 1.5}


def test_measure_times_every_program_alone_on_one_device():
    cfg = resolve(tiny.get_config())
    model = build_model(cfg, num_layers=1)
    timer = RoleTimer(model, optim.make_optimizer(cfg.train), seq_len=16,
                      vocab_size=int(cfg.model.vocab_size), rank=8, warmup=1, iters=3,
                      device=jax.devices()[0])
    programs = {Program(ROLE_NORMAL, B), Program(ROLE_NEIGHBOUR, 2 * B)}
    timer.measure(programs)
    assert set(timer.table()) == {'normalx2', 'neighbourx4'}
    assert all(t > 0 for t in timer.table().values())
    # A program first met later is measured then (together with the known ones).
    assert timer.seconds(Program(ROLE_NORMAL, 2 * B)) > 0
    assert set(timer.table()) == {'normalx2', 'neighbourx4', 'normalx4'}


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
