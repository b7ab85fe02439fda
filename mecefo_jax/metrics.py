"""Training-metrics sink: one JSON object per line in <workdir>/metrics.jsonl.

This module owns the metrics file format and who writes it. Only process 0
writes (other hosts get a no-op writer) so multi-host runs produce one file.
The file is opened for append, so a resumed run keeps the rows of earlier
attempts; readers that want one row per step should keep the last row seen
for each step.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

METRICS_FILENAME = "metrics.jsonl"


def _to_jsonable(value: Any, where: str) -> Any:
    """Convert numpy/jax values to plain Python so json can encode them."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _to_jsonable(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (np.generic, np.ndarray, jax.Array)):
        # np.asarray on a jax.Array waits for the value; rows are written
        # after the step's metrics are fetched anyway.
        arr = np.asarray(value)
        # bfloat16 & co. are kind 'V' to numpy; widen them to float32 first.
        if arr.dtype.kind not in "biuf":
            if not jnp.issubdtype(arr.dtype, jnp.floating):
                raise TypeError(f"metric {where} has unsupported dtype {arr.dtype}")
            arr = arr.astype(np.float32)
        # .item()/.tolist() yield Python bool/int/float.
        return arr.item() if arr.ndim == 0 else arr.tolist()
    raise TypeError(f"metric {where} of type {type(value).__name__} is not JSON-serialisable")


class MetricsWriter:
    """Appends metric rows to <workdir>/metrics.jsonl, flushing each row.

    Flushing per row means a crash loses at most the row being written, which
    read_metrics tolerates.
    """

    def __init__(self, workdir: str, *, process_index: int | None = None):
        if process_index is None:
            process_index = jax.process_index()
        self.path = os.path.join(os.fspath(workdir), METRICS_FILENAME)
        self.active = process_index == 0
        self._file = None
        self._closed = False
        if self.active:
            os.makedirs(os.fspath(workdir), exist_ok=True)
            self._file = open(self.path, "a+", encoding="utf-8")
            # A crash mid-write can leave a partial last line; start on a
            # fresh line so the first new row is not glued onto it.
            if self._file.tell() > 0:
                self._file.seek(self._file.tell() - 1)
                if self._file.read(1) != "\n":
                    self._file.write("\n")
                    self._file.flush()

    def write(self, row: dict) -> None:
        """Append one row; numpy/jax scalars become Python numbers.

        NaN/inf are written as Python's json does (NaN, Infinity): a diverged
        loss must stay visible rather than become null.
        """
        if self._closed:
            raise ValueError(f"MetricsWriter for {self.path} is closed.")
        if not isinstance(row, dict):
            raise TypeError(f"metrics row must be a dict, got {type(row).__name__}")
        if self._file is None:
            return
        # Encode fully before writing so a bad value never leaves half a line.
        line = json.dumps(_to_jsonable(row, "row")) + "\n"
        self._file.write(line)
        self._file.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path: str) -> list[dict]:
    """Read all rows from a metrics.jsonl file (or a workdir containing one).

    Unparseable lines (a row cut off by a crash) are skipped with a warning
    rather than failing the whole read.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, METRICS_FILENAME)
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                warnings.warn(f"{path}:{lineno}: skipping unparseable metrics line ({e})")
                continue
            if isinstance(row, dict):
                rows.append(row)
            else:
                warnings.warn(f"{path}:{lineno}: skipping non-object metrics line")
    return rows
