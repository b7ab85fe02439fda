"""Training-metrics sink: one JSON object per line in <workdir>/metrics.jsonl.

Only process 0 writes, so a multi-host run has one file. A resumed run appends, after
dropping the rows past the resumed step (`MetricsWriter.truncate_after`), so a step has
at most one row of each kind and every reader can take the rows as they are. With
`tensorboard`, every row also goes to TensorBoard (`summaries.py`), cut back alike.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mecefo_jax.host import files
from mecefo_jax.training.summaries import TRAIN_RUN, Summaries, row_scalars, run_dir

METRICS_FILENAME = 'metrics.jsonl'
RESUME_SOURCES = ('memory', 'disk', 'start_over')  # start_over: step 0, nothing was saved


def resumed_row(step: int, source: str, dropped_through: int | None = None) -> dict:
    """The row written on every resume: from which step and tier; `dropped_through`, the newest
    loss row it cut (with `train.log_every=1`, minus `step`: the steps redone)."""
    if source not in RESUME_SOURCES:
        raise ValueError(f'resume source must be one of {RESUME_SOURCES}, got {source!r}.')
    row = {'event': 'resumed', 'step': int(step), 'source': source}
    if dropped_through is not None:
        row['dropped_through'] = int(dropped_through)
    return row


def preempted_row(step: int) -> dict:
    """The row written once a preemption save of `step` has completed."""
    return {'event': 'preempted', 'step': int(step)}


def _lines(path) -> list[str] | None:
    """A JSON-lines file's lines; None where it does not exist."""
    try:
        with open(os.fspath(path), encoding='utf-8') as f:
            return f.readlines()
    except FileNotFoundError:
        return None


def _parsed(lines):
    """(line, value) for each line that parses: one cut off by a crash does not."""
    for line in lines:
        try:
            yield line, json.loads(line)
        except json.JSONDecodeError:
            continue


def newest_loss_step(path: str) -> int | None:
    """The newest step with a loss row in a metrics file (cut-off lines passed over); None for none."""
    steps = [row['step'] for _, row in _parsed(_lines(path) or [])
             if isinstance(row, dict) and 'loss' in row and isinstance(row.get('step'), int)]
    return max(steps, default=None)


def truncate_rows_after(path: str, step: int) -> int:
    """Drop the rows of a JSON-lines file whose "step" is past `step` (and a cut-off last line),
    replacing it atomically; return how many. metrics.jsonl rows name the steps done (pass the
    resumed step), provenance.jsonl rows the 0-based step run (pass it minus one).
    """
    lines = _lines(path)
    if lines is None:
        return 0
    kept = []
    for line, row in _parsed(lines):  # a row cut off by a crash belongs to no finished step
        if not (isinstance(row, dict) and isinstance(row.get('step'), (int, float))
                and row['step'] > step):
            kept.append(line if line.endswith('\n') else line + '\n')
    dropped = sum(1 for line in lines if line.strip()) - len(kept)
    files.write_text(os.fspath(path), ''.join(kept))
    return dropped


def _to_jsonable(value: Any, where: str) -> Any:
    """Convert numpy/jax values to plain Python so json can encode them."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _to_jsonable(v, f'{where}.{k}') for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_jsonable(v, f'{where}[{i}]') for i, v in enumerate(value)]
    if isinstance(value, (np.generic, np.ndarray, jax.Array)):
        arr = np.asarray(value)  # waits for a jax.Array: its step's metrics were fetched anyway
        # bfloat16 & co. are kind 'V' to numpy; widen them to float32 first.
        if arr.dtype.kind not in 'biuf':
            if not jnp.issubdtype(arr.dtype, jnp.floating):
                raise TypeError(f'metric {where} has unsupported dtype {arr.dtype}')
            arr = arr.astype(np.float32)
        return arr.item() if arr.ndim == 0 else arr.tolist()
    raise TypeError(f'metric {where} of type {type(value).__name__} is not JSON-serialisable')


class MetricsWriter:
    """Appends metric rows to <workdir>/metrics.jsonl, flushed one by one: a crash loses at most
    the row being written, which read_metrics tolerates."""

    def __init__(self, workdir: str, *, process_index: int | None = None, tensorboard: bool = False):
        if process_index is None:
            process_index = jax.process_index()
        self.path = os.path.join(os.fspath(workdir), METRICS_FILENAME)
        self.active = process_index == 0
        self._file = None
        self._closed = False
        self.summaries = (Summaries(run_dir(workdir, TRAIN_RUN))
                          if self.active and tensorboard else None)
        if self.active:
            os.makedirs(os.fspath(workdir), exist_ok=True)
            self._open()

    def _open(self) -> None:
        self._file = open(self.path, 'a+', encoding='utf-8')
        # Start a fresh line after a partial last line left by a crash.
        if self._file.tell() > 0:
            self._file.seek(self._file.tell() - 1)
            if self._file.read(1) != '\n':
                self._file.write('\n')
                self._file.flush()

    def truncate_after(self, step: int) -> int:
        """On a resume at `step`: drop the rows past it; return how many. The file is replaced
        and reopened here: other writers of it must reopen it too."""
        if self._closed:
            raise ValueError(f'MetricsWriter for {self.path} is closed.')
        if self._file is None:
            return 0
        if self.summaries is not None:
            self.summaries.purge_from(step + 1)
        self._file.close()
        try:
            return truncate_rows_after(self.path, step)
        finally:
            self._open()

    def rolled_back(self, step: int) -> None:
        """Training went back to `step` in this process (a simulated restart): TensorBoard hides
        the steps past it, which are redone (metrics.jsonl keeps both rows of each)."""
        if self.summaries is not None:
            self.summaries.purge_from(step + 1)

    def scalars(self, step: int, values: dict) -> None:
        """Figures for TensorBoard alone (what a checkpoint or a snapshot cost the loop)."""
        if self.summaries is not None:
            self.summaries.write(step, row_scalars(values))

    def write(self, row: dict) -> None:
        """Append one row; NaN/inf are written as json does (NaN, Infinity): a diverged loss must
        stay visible rather than become null."""
        if self._closed:
            raise ValueError(f'MetricsWriter for {self.path} is closed.')
        if not isinstance(row, dict):
            raise TypeError(f'metrics row must be a dict, got {type(row).__name__}')
        if self._file is None:
            return
        # Encode fully before writing so a bad value never leaves half a line.
        plain = _to_jsonable(row, 'row')
        line = json.dumps(plain) + '\n'
        self._file.write(line)
        self._file.flush()
        if self.summaries is not None and isinstance(row.get('step'), (int, float)):
            self.summaries.write(row['step'], row_scalars(plain))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.summaries is not None:
            self.summaries.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path: str) -> list[dict]:
    """All rows of a metrics.jsonl file (or a workdir holding one); a row cut off by a crash is
    skipped with a warning."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, METRICS_FILENAME)
    rows = []
    with open(path, encoding='utf-8') as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                warnings.warn(f'{path}:{lineno}: skipping unparseable metrics line ({e})', stacklevel=2)
                continue
            if isinstance(row, dict):
                rows.append(row)
            else:
                warnings.warn(f'{path}:{lineno}: skipping non-object metrics line', stacklevel=2)
    return rows
