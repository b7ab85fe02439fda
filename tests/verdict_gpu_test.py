"""scripts/verdict_gpu.sh --smoke: the GPU lease's path on CPU, resumed per (seed, run)."""
import json
import os
import subprocess

import pytest

from studies import corpus_export, verdict_60m

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POINT = 'paper_like_60m'


def _smoke(out, work):
    env = dict(os.environ, WORK=str(work))
    proc = subprocess.run(['bash', 'scripts/verdict_gpu.sh', '--smoke', str(out)], cwd=REPO,
                          env=env, text=True, capture_output=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _records(out) -> dict:
    seed = out / 'verdict_runs' / POINT / 'seed0'
    return {p.name: p.read_bytes() for p in sorted(seed.glob('*.json'))}


@pytest.mark.subprocess
def test_smoke_leaves_records_and_a_second_call_trains_nothing(tmp_path):
    out = tmp_path / 'out'
    first = _smoke(out, tmp_path / 'work1')
    records = _records(out)
    assert set(records) == {'fault_free.json', 'drop_high.json'}, first[-2000:]
    assert json.loads(records['drop_high.json'])['how'].startswith('trained'), 'drop met no failure'
    assert (out / 'report' / 'verdict.json').exists()
    assert not list((out / 'verdict_runs').rglob('*.ckpt*')), 'checkpoints belong in WORK'
    # A new machine: an empty WORK, the records only in OUT.
    second = _smoke(out, tmp_path / 'work2')
    assert ': start (' not in second, second[-2000:]
    assert _records(out) == records


def test_the_corpus_reads_back_as_its_documents_and_fails_clearly_when_missing(tmp_path,
                                                                                  monkeypatch):
    documents = [f'Paragraph {i} of a short document.' for i in range(3)]
    documents.insert(1, '\n\n'.join(f'Paragraph {i}: ' + 'x' * 600 for i in range(4)))  # full
    summary = corpus_export.export(documents, str(tmp_path), vocab_size=28, val_fraction=0.3)
    assert corpus_export.is_full(documents[1]) and not corpus_export.is_full(documents[0])
    assert summary['files'] == 3  # a short one ends each file: [short], [full, short], [short]
    assert corpus_export.read_summary(str(tmp_path))['sha256'] == summary['sha256']
    (tmp_path / corpus_export.CORPUS_DIR / '000000.txt').write_text('changed\n')
    with pytest.raises(ValueError, match='export it again'):
        corpus_export.read_summary(str(tmp_path))
    monkeypatch.setenv('VERDICT_ASSETS', str(tmp_path / 'none'))
    with pytest.raises(FileNotFoundError, match=r'verdict_corpus\.json is missing.*corpus_export'):
        verdict_60m.overrides()


def test_the_horizon_reads_the_corpus_at_most_once():
    tokens_per_step = verdict_60m.REPLICAS * (verdict_60m.SEQ_LEN + 1)
    steps = verdict_60m.one_pass_steps(4_000_000, verdict_60m.SEQ_LEN, limit_factor=1.5)
    assert steps * 1.5 * tokens_per_step <= 4_000_000 < (steps + 1) * 1.5 * tokens_per_step
