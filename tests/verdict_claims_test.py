"""The verdict's prose held to its records: README.md's verdict section and goodput row, and docs/verdict.md's figures,
are what `studies/verdict_claims.py` builds from `docs/results/verdict.json`, which `tests/verdict_test.py` rebuilds
from the committed records; and what the prose asserts beside the figures holds in those records."""
import glob
import json
import os

import pytest

from studies import verdict_claims as vc
from studies import verdict_points as vp
from studies.runs import run_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = os.path.join(ROOT, 'docs', 'results', 'verdict_runs')


@pytest.fixture(scope='module')
def report():
    with open(os.path.join(ROOT, 'docs', 'results', 'verdict.json')) as f:
        return json.load(f)


def _flat(text: str) -> str:
    """Whitespace folded: a claim may wrap anywhere in the docs."""
    return ' '.join(text.split())


def _section(path: str, heading: str) -> str:
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    start = text.index(heading)
    end = text.find('\n## ', start + len(heading))
    return text[start:end if end > 0 else None]


def _missing(claims: list[str], text: str) -> list[str]:
    return [claim for claim in claims if _flat(claim) not in _flat(text)]


def test_the_readme_verdict_section_is_rebuilt_from_the_records(report):
    """Its map and the paragraph under it; paste what `vc.readme_claims` gives where one drifts."""
    section = _section('README.md', '## Which strategy to choose')
    assert not _missing(vc.readme_claims(report)[:2], section)


def test_the_readme_goodput_row_is_rebuilt_from_the_records(report):
    assert not _missing([vc.goodput_row(report)], _section('README.md', '## What was measured'))


def test_docs_verdict_quotes_the_records(report):
    with open(os.path.join(ROOT, 'docs', 'verdict.md')) as f:
        assert not _missing(vc.docs_claims(report), f.read())


def test_only_the_core_runs_the_capped_plan_and_the_control_ran_at_every_seed_of_a_point(report):
    """The premise of "the ablations and the other rules ran at `small`, seed 0, only": no point reports one, and
    their records are there alone."""
    others = {run_name(*r) for r in vp.ABLATIONS + vp.RULES}
    for p in report['points'].values():
        assert not others & set(p['runs'])
    where = {os.path.relpath(os.path.dirname(path), RUNS) for path in glob.glob(os.path.join(RUNS, '*', 'seed*', '*'))
             if os.path.basename(path)[:-5] in others}
    assert where == {os.path.join('small', 'seed0')}
    assert not vc.mecefo_ahead(report)


def test_the_default_point_s_moves_are_the_price_not_the_clock(report):
    """drop's step ratio is 1, so the clock cannot move its figures: between the step-clock and wall-clock records
    it moves only by the data orders, and at seed 0 (the same data order) by almost nothing."""
    a = report['points']['paper_like']['attribution']
    drop, ours = a[vc.DROP], a[vc.MECEFO]
    assert drop['step_clock'] == drop['step_clock_diluted']  # no slower step to dilute
    assert abs(drop['seed0']['wall_clock'] - drop['seed0']['step_clock_diluted']) < 0.005
    price = ours['step_clock_diluted'] - ours['step_clock']
    assert price > abs(ours['wall_clock'] - ours['step_clock_diluted'])
