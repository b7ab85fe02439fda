"""Tests for mecefo_jax.metrics: JSONL round trip, conversion, append, hosts."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from mecefo_jax.metrics import MetricsWriter, read_metrics


def test_round_trip_converts_numpy_and_jax(tmp_path):
    with MetricsWriter(str(tmp_path), process_index=0) as w:
        w.write(
            {
                "step": np.int64(3),
                "loss": jnp.float32(2.5),
                "lr": np.float32(0.125),
                "grad_norm": jnp.asarray(1.5, jnp.bfloat16),
                "finite": np.bool_(True),
                "tokens": jnp.asarray(4096, jnp.int32),
                "per_layer": jnp.arange(3, dtype=jnp.float32),
                "nested": {"a": np.float64(1.0), 7: "x"},
                "name": "run-1",
                "none": None,
            }
        )
        w.write({"step": 4, "loss": float("nan")})
    rows = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert len(rows) == 2
    r = rows[0]
    assert r == {
        "step": 3,
        "loss": 2.5,
        "lr": 0.125,
        "grad_norm": 1.5,
        "finite": True,
        "tokens": 4096,
        "per_layer": [0.0, 1.0, 2.0],
        "nested": {"a": 1.0, "7": "x"},
        "name": "run-1",
        "none": None,
    }
    assert type(r["step"]) is int and type(r["tokens"]) is int
    assert type(r["loss"]) is float and type(r["finite"]) is bool
    assert math.isnan(rows[1]["loss"])
    # read_metrics also accepts the workdir.
    assert len(read_metrics(str(tmp_path))) == 2


def test_rows_visible_before_close(tmp_path):
    w = MetricsWriter(str(tmp_path), process_index=0)
    w.write({"step": 1})
    assert read_metrics(w.path) == [{"step": 1}]
    w.close()
    w.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        w.write({"step": 2})


def test_append_on_restart_and_truncated_line(tmp_path):
    with MetricsWriter(str(tmp_path), process_index=0) as w:
        w.write({"step": 1, "loss": 3.0})
    # Simulate a crash mid-write: a partial row with no newline.
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "lo')
    with MetricsWriter(str(tmp_path), process_index=0) as w:
        w.write({"step": 2, "loss": 2.0})
    with pytest.warns(UserWarning, match="unparseable"):
        rows = read_metrics(str(tmp_path))
    assert rows == [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.0}]


def test_non_zero_process_writes_nothing(tmp_path):
    workdir = tmp_path / "host1"
    with MetricsWriter(str(workdir), process_index=1) as w:
        w.write({"step": 1})
    assert not workdir.exists()


def test_default_process_index_is_zero_on_single_host(tmp_path):
    with MetricsWriter(str(tmp_path)) as w:
        w.write({"step": 1})
    assert read_metrics(str(tmp_path)) == [{"step": 1}]


def test_unserialisable_value_writes_nothing(tmp_path):
    with MetricsWriter(str(tmp_path), process_index=0) as w:
        with pytest.raises(TypeError, match="row.bad"):
            w.write({"step": 1, "bad": object()})
        w.write({"step": 2})
    assert read_metrics(str(tmp_path)) == [{"step": 2}]
