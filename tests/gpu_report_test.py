"""scripts/gpu_report.py: the CPU smoke end to end, and a failing or hung section's report.

The smoke's sweep runs its whole greedy path on a tiny model (every stage,
one XLA flag in a process of its own), step_best runs at
the batch the sweep found, and the profile's table comes from a CPU trace.

The smoke runs once, in a subprocess (its sections in that one process, the
flag cell in a child of its own), with grain, tensorflow_datasets,
tensorflow and matplotlib blocked in both by a `sitecustomize` on
PYTHONPATH: the report must run on a GPU image that lacks them. A section in
a child process of its own, killed at its limit, is the fake sections' test.
Its budget is generous so that a loaded machine slows it rather than failing
it; its time is the smoke's own claim (see docs/gpu.md), not a test.
"""
import json
import math
import os
import subprocess
import sys

import pytest
from fast_xla import FLAGS as FAST_XLA_FLAGS

from mecefo_jax.faults import costs
from studies import bench_costs
from studies.gpu import profile, report, runner, step, sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCKED = ('grain', 'tensorflow_datasets', 'tensorflow', 'matplotlib')
SITECUSTOMIZE = f"""
import sys
# None in sys.modules: `import x` raises ModuleNotFoundError and
# importlib.util.find_spec('x') returns None, as for a package not installed
# (libraries probing for an optional one, e.g. jax's cache for tensorflow, go on).
for name in {BLOCKED!r}:
    sys.modules[name] = None
"""
FAKE_SECTIONS = """
import threading

def boom(ctx):
    raise RuntimeError('boom from a section')

def skip(ctx):
    return {'status': 'skipped', 'reason': 'not on this machine', 'kept': 2}

def hang(ctx):
    ctx.partial({'reached': 'hold'})
    threading.Event().wait()  # held here until the report kills it

def fine(ctx):
    return {'value': 1}
"""


def _env(*dirs):
    env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
    env['XLA_FLAGS'] = FAST_XLA_FLAGS  # one CPU device; tests/fast_xla.py
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [*dirs, ROOT, env.get('PYTHONPATH')]))
    env['JAX_PLATFORMS'] = 'cpu'
    return env


@pytest.fixture(scope='module')
def smoke(tmp_path_factory):
    blocker = tmp_path_factory.mktemp('blocker')
    (blocker / 'sitecustomize.py').write_text(SITECUSTOMIZE)
    out = tmp_path_factory.mktemp('gpu_report')
    env = _env(str(blocker))
    probe = subprocess.run([sys.executable, '-c', 'import matplotlib'], env=env,
                           capture_output=True, text=True)
    assert 'ModuleNotFoundError' in probe.stderr  # the blocker is active in every child
    proc = subprocess.run([sys.executable, 'scripts/gpu_report.py', '--out', str(out), '--smoke',
                           '--budget_sec', '1500'], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / report.JSON_FILE) as f:
        return json.load(f), out, proc.stdout


@pytest.mark.subprocess  # the report and its sections
def test_smoke_runs_every_section_ok_or_skipped_where_a_cpu_cannot(smoke):
    result, _, stdout = smoke
    sections = result['sections']
    assert list(sections) == [s.name for s in report.SECTIONS]
    expected = {name: 'ok' for name in sections} | {'attention': 'skipped'}
    assert {n: s['status'] for n, s in sections.items()} == expected, stdout[-3000:]
    assert 'GPU' in sections['attention']['reason']
    assert sections['attention']['xla']['forward_backward_ms'] > 0
    assert '[step] normal: compiled' in stdout  # progress lines while it runs


@pytest.mark.subprocess  # the report and its sections
def test_smoke_step_figures_are_plausible_and_the_simulator_reads_them(smoke):
    result, out, _ = smoke
    s = result['sections']['step']
    assert list(s['modes']) == list(step.SHAPES['step']['smoke']['modes']) and not s['skipped_modes']
    for mode, v in s['modes'].items():
        assert v['step_ms'] > 0 and v['peak_bytes'] > 0 and v['flops'] > 0
        assert math.isfinite(s['ratios'][mode]['step_ms'])
    assert s['details']['mecefo_planned']['rows'] == 3 * s['batch'] // 2
    assert s['details']['mecefo_mixed']['rows'] == 3 * s['batch'] // 2
    assert s['details']['mecefo_mixed_eighth']['rows'] == s['batch'] + 1
    # Two shards exact are twice one shard's matmuls (the same optimizer, no matmul).
    assert s['ratios']['ndb_naive']['flops'] == pytest.approx(2.0, rel=0.01)
    # No remat: the compiled step's matmuls are the analytic count (6 N + attention).
    assert s['mfu']['formula'] == pytest.approx(s['mfu']['matmuls'], rel=1e-9) and s['mfu']['formula'] > 0
    for name in ('bench_step.json', 'bench_step_best.json'):
        with open(out / name) as f:
            bench = json.load(f)
        table = bench_costs.bench_table(bench, costs.PAPER_MODELS['350M'], metric='step_ms',
                                        seq_len=256, replica_seqs=16, mfu=0.4)
        assert table.ratio('mecefo') > 0 and table.ratio('ndb_naive') > 0


@pytest.mark.subprocess  # the report and its sections
def test_smoke_sweep_keeps_only_changes_that_are_faster_and_writes_its_files(smoke):
    result, out, _ = smoke
    s = result['sections']['sweep']
    with open(out / sweep.JSON_FILE) as f:
        assert json.load(f)['cells'] == s['cells']
    cells, text = s['cells'], (out / sweep.MD_FILE).read_text()
    assert '| cells | model | stage | tokens_per_device |' in text  # one row a cell
    assert all(f'| {i} | llama_350m | {c["stage"]} |' in text for i, c in enumerate(cells))
    assert cells[0]['stage'] == 'baseline' and cells[0]['accepted']
    stages = [c['stage'] for c in cells]
    assert stages.index('batch') < stages.index('remat') < stages.index('flags')
    best = cells[0]
    for cell in cells[1:]:  # each kept change is faster per token than the cell before it
        assert set(cell) >= {'model', 'tokens_per_device', 'seq_len', 'attention', 'remat_policy',
                             'scan_layers', 'flat_optimizer', 'xla_flags', 'fits'}
        assert cell.get('error') or {'step_ms', 'tokens_per_sec', 'mfu', 'peak_mib'} <= set(cell)
        if cell['accepted']:
            assert cell['tokens_per_sec'] > best['tokens_per_sec'] * (1 + sweep.MIN_GAIN)
            best = cell
    assert s['best']['llama_350m'] == best
    flagged = [c for c in cells if c['stage'] == 'flags']
    assert flagged and flagged[0]['xla_flags'] == '='.join(sweep.SMOKE['flags'][0])
    assert 'cuDNN' in next(c for c in cells if c['stage'] == 'attention')['error']
    # The machine's drift over the sweep: its baseline cell is the step section's normal step.
    first, normal = cells[0], result['sections']['step']
    assert first['tokens_per_device'] == normal['batch'] * normal['config']['seq_len']
    assert first['overrides']['data.seq_len'] == normal['config']['seq_len']
    assert normal['modes']['normal']['step_ms'] > 0 and first['step_ms'] > 0
    assert s['gpu_defaults']['llama_350m']['config']['model.remat_policy'] in ('none', 'full')
    step_best = result['sections']['step_best']
    assert step_best['batch'] * step_best['config']['seq_len'] == best['tokens_per_device']
    assert 'sweep' in step_best['batch_source']


@pytest.mark.subprocess  # the report and its sections
def test_smoke_profile_tables_where_the_step_goes(smoke):
    result, out, _ = smoke
    p = result['sections']['profile']
    assert list(p['categories']) == list(profile.CATEGORIES)
    assert p['events'] > 0 and p['window_ms_per_step'] > 0 and p['idle_ms_per_step'] >= 0
    assert p['categories']['matmuls'] > 0 and p['categories']['optimizer'] > 0
    assert p['top_ops'] and os.path.isdir(p['trace_dir'])


@pytest.mark.subprocess  # the report and its sections
def test_smoke_other_sections_have_positive_times(smoke):
    sections = smoke[0]['sections']
    assert sections['environment']['device_count'] >= 1
    assert sections['environment']['packages']['jax']
    assert sections['step_1b']['modes']['mecefo']['step_ms'] > 0
    assert sections['step_best']['modes']['ndb_naive']['step_ms'] > 0
    snap = sections['snapshot']
    assert snap['bandwidth']['pinned_copy_gbps'] > 0 and snap['step_sec'] > 0
    assert math.isfinite(snap['every_1']['overhead_pct'])
    never = snap['every_1_latest_wins']
    assert never['published'] >= 1 and never['blocked_sec_per_snapshot'] >= 0
    interval, chosen = snap['auto']['interval'], snap['auto']['chosen']
    if 'reason' in chosen:  # an interval longer than the section times (noisy CPU timings)
        assert chosen['reason'].startswith(f'interval {interval} is longer')
    else:  # whole intervals, each snapshotted once: written or replaced by the next
        assert chosen['steps'] % interval == 0 and math.isfinite(chosen['overhead_pct'])
        assert chosen['published'] + chosen['dropped'] == chosen['steps'] // interval


@pytest.mark.subprocess  # the report and its sections
def test_smoke_markdown_has_a_table_per_section(smoke):
    _, out, _ = smoke
    text = (out / report.MD_FILE).read_text()
    for s in report.SECTIONS:
        assert f'## {s.name}: ' in text
    assert text.count('|---|') >= len(report.SECTIONS)


@pytest.mark.subprocess  # the report and its sections
def test_a_failing_section_is_failed_a_hung_one_timeout_and_the_next_still_runs(tmp_path,
                                                                                 monkeypatch):
    (tmp_path / 'fake_sections.py').write_text(FAKE_SECTIONS)
    monkeypatch.setenv('PYTHONPATH', _env(str(tmp_path))['PYTHONPATH'])
    sections = [runner.Section('boom', 'fake_sections:boom', seconds=10),
                runner.Section('skip', 'fake_sections:skip', seconds=10),
                runner.Section('hang', 'fake_sections:hang', seconds=1),
                runner.Section('fine', 'fake_sections:fine', seconds=10)]
    results = runner.run_sections(sections, {}, str(tmp_path / 'work'), budget_sec=60,
                                  echo=lambda _: None)
    assert results['boom']['status'] == 'failed'
    assert 'boom from a section' in results['boom']['error']
    assert 'RuntimeError' in results['boom']['traceback']
    skip = results['skip']
    assert (skip['status'], skip['reason'], skip['kept']) == ('skipped', 'not on this machine', 2)
    assert results['hang']['status'] == 'timeout'
    assert results['hang']['partial'] == {'reached': 'hold'}
    assert results['hang']['wall_sec'] >= results['hang']['limit_sec']
    assert results['fine']['status'] == 'ok' and results['fine']['value'] == 1
    # The smoke's way, in this process: the same statuses and figures.
    monkeypatch.syspath_prepend(str(tmp_path))
    here = runner.run_sections([s for s in sections if s.name != 'hang'], {'in_process': True},
                               str(tmp_path / 'here'), budget_sec=60, echo=lambda _: None)
    assert {n: r['status'] for n, r in here.items()} == {'boom': 'failed', 'skip': 'skipped',
                                                         'fine': 'ok'}
    assert 'boom from a section' in here['boom']['error'] and here['skip']['kept'] == 2


def test_limits_give_fixed_sections_their_seconds_and_the_rest_to_one():
    a, b = runner.Section('a', 'm:f', seconds=10), runner.Section('b', 'm:f', seconds=30)
    rest = runner.Section('rest', 'm:f', seconds=None)
    assert runner.limits_left([a, b], 100.0, min_sec=5) == 25.0  # no rest: shares of what is left
    assert runner.limits_left([b], 100.0, min_sec=5) == 100.0
    assert runner.limits_left([a, b], 4.0, min_sec=5) == 5
    assert runner.limits_left([a, rest, b], 100.0, min_sec=5) == 10  # before the rest: its own
    assert runner.limits_left([rest, b], 90.0, min_sec=5) == 60  # the rest: what b leaves
    assert runner.limits_left([rest, b], 20.0, min_sec=5) == 5
    assert runner.limits_left([a, rest, b], 20.0, min_sec=5) == 5  # short: shared, rest last
    with pytest.raises(ValueError, match='at most one'):
        runner.limits_left([rest, rest], 100.0, min_sec=5)


def test_sections_are_selected_by_name_in_report_order():
    assert [s.name for s in report.select('mfu')] == list(report.MFU_SECTIONS)
    assert [s.name for s in report.select('step,environment')] == ['environment', 'step']
    assert report.select('all') == report.SECTIONS
    with pytest.raises(ValueError, match='no section nope'):
        report.select('step,nope')


@pytest.mark.subprocess  # the report and its sections
def test_the_report_and_sweep_processes_import_no_jax():
    code = ('import sys; from studies.gpu import report, sweep; '
            'print(sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "flax")))')
    proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == '[]'
