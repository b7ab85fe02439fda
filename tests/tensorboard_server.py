"""The real `tensorboard` server on the loopback, asked over HTTP what a user's browser would be shown.

Shared by tests/tensorboard_test.py (a run of the main job) and
tests/launch_test.py (a launcher job with a kill).
"""
import contextlib
import gzip
import json
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import numpy as np

from mecefo_jax.training.metrics import read_metrics

START_TIMEOUT_SEC = 120  # the server's start on a loaded 2-core machine
RELOAD_SEC = 1  # how often the server reads the logdir again


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, port: int):
        self.base = f'http://127.0.0.1:{port}'

    def get(self, path: str, **query):
        url = f'{self.base}{path}' + (f'?{urllib.parse.urlencode(query)}' if query else '')
        with urllib.request.urlopen(url, timeout=60) as response:
            body = response.read()
            if response.headers.get('Content-Encoding') == 'gzip':
                body = gzip.decompress(body)
        return json.loads(body)

    def scalars(self, run: str) -> dict[str, list[tuple[int, float]]]:
        """{tag: [(step, value), ...]} of a run, as the scalars dashboard reads them, once two reads
        a reload apart agree (the server loads the files in the background, one after another)."""
        previous = None
        for _ in range(60):
            current = self._read(run)
            if current == previous:
                return current
            previous = current
            time.sleep(RELOAD_SEC + 0.5)
        raise AssertionError(f'the scalars of {run!r} never settled')

    def _read(self, run: str) -> dict:
        tags = self.get('/data/plugin/scalars/tags').get(run, {})
        return {tag: [(step, value) for _, step, value in self.get('/data/plugin/scalars/scalars', run=run, tag=tag)]
                for tag in tags}


@contextlib.contextmanager
def serve(logdir: str, *, wait_for_run: str):
    """`tensorboard --logdir logdir` on 127.0.0.1, once it lists `wait_for_run`'s scalars."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, '-m', 'tensorboard.main', '--logdir', str(logdir),
                             '--host', '127.0.0.1', '--port', str(port), '--reload_interval', str(RELOAD_SEC)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    server = Server(port)
    try:
        deadline = time.monotonic() + START_TIMEOUT_SEC
        while True:
            try:
                if server.get('/data/plugin/scalars/tags').get(wait_for_run):
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f'tensorboard did not serve {wait_for_run!r}: '
                                     f'{proc.stdout.read().decode()[-3000:] if proc.poll() is not None else ""}')
            time.sleep(0.5)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def assert_every_metric_once(workdir: str, scalars: dict) -> int:
    """Every numeric field of every metrics.jsonl row is in TensorBoard at its step, once, with
    its value (TensorBoard keeps float32); no tag holds a step the file does not. The count."""
    from mecefo_jax.training.summaries import row_scalars
    expected: dict[str, list] = {}
    for row in read_metrics(workdir):
        for tag, value in row_scalars(row).items():
            expected.setdefault(tag, []).append((row['step'], np.float32(value)))
    for tag, points in expected.items():
        shown = sorted(scalars.get(tag, []))
        assert [s for s, _ in shown] == sorted(s for s, _ in points), (tag, shown, points)
        for (step, value), (_, shown_value) in zip(sorted(points), shown):
            assert np.float32(shown_value) == value or (np.isnan(value) and np.isnan(shown_value)), (tag, step)
    return sum(map(len, expected.values()))
