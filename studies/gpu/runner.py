"""Run report sections one after another, each in a child process with its own time limit.

A section that raises is reported `failed`, one that outlives its limit is
killed (its whole process group) and reported `timeout` with whatever it
saved on the way; either way the next section runs. Each section has its
seconds; one section may take the rest (`seconds=None`, the sweep): it gets
what is left of the budget once the sections after it have their seconds,
and the sections before it get theirs exactly. Without such a section, each
gets its seconds' share of the time still left, so what a fast section
leaves over goes to the later ones. Nothing here imports jax: the report
process must not claim the GPU that its sections measure.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time

from studies.gpu import child

TAIL_LINES = 30


@dataclasses.dataclass(frozen=True)
class Section:
    """`target` is 'module:function', called with a `child.Context`; `seconds`: its limit
    at the full budget, or None for the one section that takes the rest."""
    name: str
    target: str
    seconds: float | None = 60.0


def limits_left(sections, left_sec: float, min_sec: float) -> float:
    """The first of `sections`' limit out of `left_sec` (module docstring), at least `min_sec`."""
    first, later = sections[0], sections[1:]
    if sum(s.seconds is None for s in sections) > 1:
        raise ValueError(f'sections {[s.name for s in sections if s.seconds is None]}: '
                         'at most one section can take the rest of the budget.')
    fixed_later = sum(s.seconds for s in later if s.seconds is not None)
    if first.seconds is None:
        limit = left_sec - fixed_later
    elif any(s.seconds is None for s in later) and left_sec >= first.seconds + fixed_later:
        limit = first.seconds
    else:
        limit = left_sec * first.seconds / (first.seconds + fixed_later)
    return max(min_sec, limit)


def _pump(stream, name: str, tail: collections.deque, log_file, echo) -> None:
    try:
        for line in stream:
            line = line.rstrip('\n')
            tail.append(line)
            log_file.write(line + '\n')
            log_file.flush()
            echo(f'[{name}] {line}')
    except (ValueError, OSError):
        pass  # the log was closed: a grandchild still held the pipe after the section ended


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_section(section: Section, limit_sec: float, params: dict, work_dir: str,
                echo=print, env: dict | None = None) -> dict:
    """Run one section in a child process; its result object with status and timing.

    `env` is added to the child's environment (XLA_FLAGS: they must be set before jax
    starts, so a setting of XLA's is measured in a process of its own)."""
    os.makedirs(work_dir, exist_ok=True)
    result_path = os.path.join(work_dir, f'{section.name}.result.json')
    for path in (result_path, child.partial_path(result_path)):
        if os.path.exists(path):
            os.remove(path)
    params = dict(params, name=section.name, limit_sec=limit_sec)
    cmd = [sys.executable, '-m', 'studies.gpu.child', section.target,
           result_path, json.dumps(params)]
    # `studies` is not installed with the library: the child finds it from the checkout.
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join(p for p in (checkout, os.environ.get('PYTHONPATH', '')) if p)
    env = dict(os.environ, **(env or {}), PYTHONUNBUFFERED='1', PYTHONPATH=path)
    env.setdefault('XLA_PYTHON_CLIENT_MEM_FRACTION', '0.92')  # one section owns the device
    tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
    start = time.monotonic()
    with open(os.path.join(work_dir, f'{section.name}.log'), 'w') as log_file:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, env=env,
                                start_new_session=True)
        reader = threading.Thread(target=_pump, daemon=True,
                                  args=(proc.stdout, section.name, tail, log_file, echo))
        reader.start()
        try:
            proc.wait(timeout=limit_sec)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            timed_out = True
        # A grandchild (e.g. a snapshot keeper) may hold the pipe a while longer.
        reader.join(timeout=5)
    wall = time.monotonic() - start
    result = _read_result(result_path, proc.returncode, timed_out, limit_sec, tail)
    result.update(wall_sec=round(wall, 2), limit_sec=round(limit_sec, 2))
    return result


def _read_result(result_path, returncode, timed_out, limit_sec, tail) -> dict:
    if timed_out:
        result = {'status': 'timeout',
                  'error': f'killed at its time limit of {limit_sec:.0f} s'}
        partial = child.partial_path(result_path)
        if os.path.exists(partial):
            with open(partial) as f:
                result['partial'] = json.load(f)
    elif os.path.exists(result_path):
        with open(result_path) as f:
            return json.load(f)
    else:
        result = {'status': 'failed',
                  'error': f'the section process exited with code {returncode} '
                           f'and wrote no result'}
    result['output_tail'] = list(tail)[-12:]
    return result


def run_sections(sections, params: dict, work_dir: str, *, budget_sec: float,
                 min_sec: float = 5.0, echo=print) -> dict:
    """Every section in order; {name: result}. Limits share out what is left of the budget."""
    results = {}
    start = time.monotonic()
    sections = list(sections)
    for k, section in enumerate(sections):
        left = budget_sec - (time.monotonic() - start)
        limit = limits_left(sections[k:], left, min_sec)
        echo(f'== {section.name}: limit {limit:.0f} s ({left:.0f} s of the budget left)')
        results[section.name] = run_section(section, limit, params, work_dir, echo=echo)
        r = results[section.name]
        echo(f'== {section.name}: {r["status"]} in {r["wall_sec"]:.1f} s'
             + (f' ({r.get("error") or r.get("reason")})' if r['status'] != 'ok' else ''))
    return results
