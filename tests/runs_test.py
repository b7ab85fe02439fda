"""studies/runs.py: the `--runs` flag of the time-to-target and verdict studies, and each run's config."""
import pytest

from configs.tiny import get_config
from mecefo_jax.config.resolve import resolve
from studies.runs import Run, parse_runs, run_config, run_name


def test_runs_flag_is_checked():
    assert parse_runs('fault_free, mecefo:high, mecefo_planned:high:cap=8') == (
        Run('fault_free', ''), Run('mecefo', 'high'), Run('mecefo_planned', 'high', 8))
    assert parse_runs('mecefo:high:attn=exact:w=0.25:top=2:proj=none') == (
        Run('mecefo', 'high', projection='none', attention='exact', weight=0.25, top=2),)
    for bad, words in (('mecefo', 'needs a regime'), ('mecefo:extreme', 'needs a regime'),
                       ('fault_free:high', 'takes no regime'), ('magic:high', 'unknown'),
                       ('mecefo:high:cap=8', 'mecefo_planned plans only'),
                       ('mecefo_planned:high:cap=0', 'cap=N'),
                       ('mecefo_planned:high:8', 'cap=N'), ('mecefo:high:w=1.5', 'w=W'),
                       ('mecefo:high:attn=skip', 'attn=exact'), ('', 'empty')):
        with pytest.raises(ValueError, match=words):
            parse_runs(bad)


def test_a_capped_planned_run_gets_its_own_name_and_cap_and_no_other_run_does():
    """The cap reaches the planned run's config only; the base config's is not inherited."""
    cfg = resolve(get_config())
    capped, plain = parse_runs('mecefo_planned:high:cap=8, drop:high')
    assert run_name(*capped) == 'mecefo_planned_high_cap8'
    assert run_name(*plain) == 'drop_high'
    run_cfg = run_config(cfg, capped, seed=3, evals=2)
    assert (run_cfg.fault.strategy, run_cfg.fault.max_neighbour_rows) == ('mecefo_planned', 8)
    assert run_config(cfg, plain, seed=3, evals=2).fault.max_neighbour_rows == 0


def test_a_run_of_its_own_rank_gets_its_name_and_rank_and_no_other_run_does():
    cfg = resolve(get_config())
    ranked, capped_ranked, plain = parse_runs(
        'mecefo:high:rank=16, mecefo_planned:high:cap=8:rank=16, drop:high')
    assert (ranked.rank, capped_ranked.cap, capped_ranked.rank) == (16, 8, 16)
    assert run_name(*ranked) == 'mecefo_high_rank16'
    assert run_name(*capped_ranked) == 'mecefo_planned_high_cap8_rank16'
    assert run_config(cfg, ranked, seed=3, evals=2).mecefo.rank == 16
    assert run_config(cfg, plain, seed=3, evals=2).mecefo.rank == cfg.mecefo.rank
    for bad in ('mecefo:high:rank=0', 'mecefo:high:rank=4:rank=5', 'mecefo:high:width=4'):
        with pytest.raises(ValueError, match="'rank=R'"):
            parse_runs(bad)


def test_a_run_of_its_own_projection_rule_gets_its_name_and_rule_and_no_other_run_does():
    cfg = resolve(get_config())
    assert cfg.mecefo.projection == 'weights'
    sketched, ranked, plain = parse_runs(
        'mecefo:high:proj=gradient, mecefo:high:rank=16:proj=gradient, drop:high')
    assert (sketched.projection, ranked.rank, ranked.projection) == ('gradient', 16, 'gradient')
    assert run_name(*sketched) == 'mecefo_high_projgradient'
    assert run_name(*ranked) == 'mecefo_high_rank16_projgradient'
    assert run_config(cfg, sketched, seed=3, evals=2).mecefo.projection == 'gradient'
    assert run_config(cfg, plain, seed=3, evals=2).mecefo.projection == 'weights'
    with pytest.raises(ValueError, match="'proj=svd': the projection rule \\(mecefo.projection\\) "
                                         "is one of weights, gradient"):
        parse_runs('mecefo:high:proj=svd')
    for bad in ('mecefo:high:proj=gradient:proj=weights', 'mecefo:high:projection=gradient'):
        with pytest.raises(ValueError, match="'proj=P'"):
            parse_runs(bad)
