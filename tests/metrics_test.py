"""Tests for mecefo_jax.training.metrics: JSONL round trip, conversion, append, hosts."""

import math
import os

import jax.numpy as jnp
import numpy as np
import pytest

from mecefo_jax.training.metrics import (
    MetricsWriter,
    newest_loss_step,
    preempted_row,
    read_metrics,
    resumed_row,
    truncate_rows_after,
)


def test_round_trip_converts_numpy_and_jax(tmp_path):
    with MetricsWriter(str(tmp_path), process_index=0) as w:
        w.write(
            {
                'step': np.int64(3),
                'loss': jnp.float32(2.5),
                'lr': np.float32(0.125),
                'grad_norm': jnp.asarray(1.5, jnp.bfloat16),
                'finite': np.bool_(True),
                'tokens': jnp.asarray(4096, jnp.int32),
                'per_layer': jnp.arange(3, dtype=jnp.float32),
                'nested': {'a': np.float64(1.0), 7: 'x'},
                'name': 'run-1',
                'none': None,
            }
        )
        w.write({'step': 4, 'loss': float('nan')})
    rows = read_metrics(str(tmp_path / 'metrics.jsonl'))
    assert len(rows) == 2
    r = rows[0]
    assert r == {
        'step': 3,
        'loss': 2.5,
        'lr': 0.125,
        'grad_norm': 1.5,
        'finite': True,
        'tokens': 4096,
        'per_layer': [0.0, 1.0, 2.0],
        'nested': {'a': 1.0, '7': 'x'},
        'name': 'run-1',
        'none': None,
    }
    assert type(r['step']) is int and type(r['tokens']) is int
    assert type(r['loss']) is float and type(r['finite']) is bool
    assert math.isnan(rows[1]['loss'])
    # read_metrics also accepts the workdir.
    assert len(read_metrics(str(tmp_path))) == 2


def test_rows_visible_before_close(tmp_path):
    w = MetricsWriter(str(tmp_path), process_index=0)
    w.write({'step': 1})
    assert read_metrics(w.path) == [{'step': 1}]
    w.close()
    w.close()  # idempotent
    with pytest.raises(ValueError, match='closed'):
        w.write({'step': 2})


def test_append_on_restart_and_truncated_line(tmp_path):
    with MetricsWriter(str(tmp_path), process_index=0) as w:
        w.write({'step': 1, 'loss': 3.0})
    # Simulate a crash mid-write: a partial row with no newline.
    with open(tmp_path / 'metrics.jsonl', 'a') as f:
        f.write('{"step": 2, "lo')
    with MetricsWriter(str(tmp_path), process_index=0) as w:
        w.write({'step': 2, 'loss': 2.0})
    with pytest.warns(UserWarning, match='unparseable'):
        rows = read_metrics(str(tmp_path))
    assert rows == [{'step': 1, 'loss': 3.0}, {'step': 2, 'loss': 2.0}]


def test_non_zero_process_writes_nothing(tmp_path):
    workdir = tmp_path / 'host1'
    with MetricsWriter(str(workdir), process_index=1) as w:
        w.write({'step': 1})
    assert not workdir.exists()


def test_default_process_index_is_zero_on_single_host(tmp_path):
    with MetricsWriter(str(tmp_path)) as w:
        w.write({'step': 1})
    assert read_metrics(str(tmp_path)) == [{'step': 1}]


def test_unserialisable_value_writes_nothing(tmp_path):
    with MetricsWriter(str(tmp_path), process_index=0) as w:
        with pytest.raises(TypeError, match='row.bad'):
            w.write({'step': 1, 'bad': object()})
        w.write({'step': 2})
    assert read_metrics(str(tmp_path)) == [{'step': 2}]


def _loss_rows(path):
    return [r['step'] for r in read_metrics(path) if 'loss' in r]


def test_resume_truncates_rows_past_the_resumed_step(tmp_path):
    with MetricsWriter(str(tmp_path), process_index=0) as w:
        for step in range(1, 11):
            w.write({'step': step, 'loss': 10.0 - step})
            if step % 5 == 0:
                w.write({'step': step, 'val_loss': 1.0})
        w.write({'event': 'scheduled_failure', 'step': 8})
        w.write(preempted_row(10))
    with open(tmp_path / 'metrics.jsonl', 'a') as f:
        f.write('{"step": 11, "lo')  # cut off by a crash
    with MetricsWriter(str(tmp_path), process_index=0) as w:  # the resumed run, at step 6
        assert w.truncate_after(6) == 8  # loss 7..10, val 10, 2 events, the cut line
        assert _loss_rows(tmp_path) == [1, 2, 3, 4, 5, 6]
        w.write(resumed_row(6, 'disk'))
        for step in range(7, 11):  # the second pass over 7..10
            w.write({'step': step, 'loss': 0.5})
    rows = read_metrics(str(tmp_path))
    assert _loss_rows(tmp_path) == list(range(1, 11))  # exactly one loss row per step
    assert [r for r in rows if 'event' in r] == [{'event': 'resumed', 'step': 6, 'source': 'disk'}]
    assert [r['step'] for r in rows if 'val_loss' in r] == [5]
    assert os.listdir(tmp_path) == ['metrics.jsonl']  # no temporary file left


def test_the_newest_loss_step_passes_over_other_rows_and_a_cut_line(tmp_path):
    path = tmp_path / 'metrics.jsonl'
    assert newest_loss_step(str(path)) is None  # no file
    path.write_text('{"step": 4, "loss": 1.0}\n{"step": 5, "val_loss": 1.0}\n'
                    '{"event": "failure", "step": 9}\n{"step": 3, "loss": 1.0}\n{"step": 7, "lo')
    assert newest_loss_step(str(path)) == 4


def test_truncation_keeps_rows_without_a_step_and_ignores_a_missing_file(tmp_path):
    path = tmp_path / 'provenance.jsonl'
    assert truncate_rows_after(str(path), 3) == 0 and not path.exists()
    path.write_text('{"note": "x"}\n{"step": 2}\n{"step": 4}\n')
    assert truncate_rows_after(str(path), 3) == 1
    assert path.read_text() == '{"note": "x"}\n{"step": 2}\n'


def test_event_row_helpers():
    assert resumed_row(12, 'memory') == {'event': 'resumed', 'step': 12, 'source': 'memory'}
    assert resumed_row(12, 'disk', np.int64(14)) == {'event': 'resumed', 'step': 12,
                                                     'source': 'disk', 'dropped_through': 14}
    assert preempted_row(np.int32(7)) == {'event': 'preempted', 'step': 7}
    with pytest.raises(ValueError, match='memory'):
        resumed_row(1, 'keepers')


def test_inactive_writer_truncates_nothing(tmp_path):
    (tmp_path / 'metrics.jsonl').write_text('{"step": 9}\n')
    with MetricsWriter(str(tmp_path), process_index=1) as w:
        assert w.truncate_after(1) == 0
    assert (tmp_path / 'metrics.jsonl').read_text() == '{"step": 9}\n'
