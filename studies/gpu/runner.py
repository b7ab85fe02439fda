"""Run report sections one after another, each in a child process with its own time limit.

A hung XLA call cannot be interrupted from a thread, so a section runs as
`python -m studies.gpu.runner TARGET RESULT_PATH PARAMS_JSON`, its process
group killed at its limit. Its status: `ok`, `skipped` (this machine cannot
measure it), `failed` or `timeout`, the last two with the figures it saved on
the way (`Context.partial`). Nothing here imports jax: the report process must
not claim the GPU it measures. `in_process` (the CPU smoke) calls a section in
this process instead: the same statuses, one jax start, no kill.
"""
import collections
import contextlib
import dataclasses
import importlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import traceback

from studies.report import write_json

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Section:
    """`target`: 'module:function', called with a `Context`, returning its figures (with
    `status` 'skipped' and a `reason` where this machine cannot measure them); `seconds`:
    its limit at the full budget, or None for the one section that takes the rest."""
    name: str
    target: str
    seconds: float | None = 60.0


class Context:
    """What a section gets: its parameters, its deadline, a logger and partial saves
    (`partial(figures)`: reported if the section fails or times out)."""

    def __init__(self, params: dict, result_path: str, log=print):
        self.params, self.smoke, self.out = params, bool(params.get('smoke')), params.get('out', '')
        self.deadline = time.monotonic() + float(params.get('limit_sec', 1e9))
        self.partial_path, self.log = f'{result_path}.partial', log
        self.partial = lambda figures: save(self.partial_path, figures)
        self.left = lambda: self.deadline - time.monotonic()  # seconds before the kill


def save(path: str, figures) -> None:
    """Atomically, as plain JSON (a numpy or jax scalar becomes its str)."""
    write_json(path, json.loads(json.dumps(figures, default=str)))


def load(path: str) -> dict | None:
    """The JSON at `path`, or None where there is none."""
    return json.loads(pathlib.Path(path).read_text()) if os.path.exists(path) else None


def run_target(target: str, result_path: str, params: dict, log=print) -> dict:
    """Call the section `target`, write its result (a child's whole work) and return it."""
    ctx, cpu = Context(params, result_path, log), time.process_time()
    try:
        if params.get('xla_cache_dir'):  # sections share compiled programs
            import jax
            jax.config.update('jax_compilation_cache_dir', params['xla_cache_dir'])
            jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
        module, _, name = target.partition(':')
        result = {'status': 'ok', **(getattr(importlib.import_module(module), name)(ctx) or {})}
    except Exception as error:  # noqa: BLE001  (reported, and the next section runs)
        traceback.print_exc()
        result = {'status': 'failed', 'error': f'{type(error).__name__}: {error}',
                  'traceback': traceback.format_exc()[-4000:]}
        if (partial := load(ctx.partial_path)) is not None:
            result['partial'] = partial
    save(result_path, dict(result, cpu_sec=round(time.process_time() - cpu, 2)))
    return load(result_path)


def limits_left(sections, left_sec: float, min_sec: float) -> float:
    """The first section's limit out of `left_sec`: before the rest-taker its seconds, the
    rest-taker what the later ones leave; with no rest-taker, its seconds' share."""
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


def _pump(stream, name: str, tail, log_file, echo) -> None:
    try:
        for line in stream:
            log_file.write(line)
            log_file.flush()
            tail.append(line.rstrip('\n'))
            echo(f'[{name}] {tail[-1]}')
    except (ValueError, OSError):
        pass  # the log was closed: a grandchild still held the pipe after the section ended


def _child(section: Section, limit_sec: float, params: dict, result_path: str, echo,
           env: dict) -> dict:
    """The section in a process of its own, killed at `limit_sec`; its result."""
    # `studies` is not installed with the library: the child finds it from the checkout.
    path = os.pathsep.join(p for p in (CHECKOUT, os.environ.get('PYTHONPATH', '')) if p)
    env = dict(os.environ, **env, PYTHONUNBUFFERED='1', PYTHONPATH=path)
    env.setdefault('XLA_PYTHON_CLIENT_MEM_FRACTION', '0.92')  # one section owns the device
    tail = collections.deque(maxlen=12)
    with open(result_path.replace('.result.json', '.log'), 'w') as log_file:
        proc = subprocess.Popen([sys.executable, '-m', 'studies.gpu.runner', section.target,
                                 result_path, json.dumps(params)], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        reader = threading.Thread(target=_pump, daemon=True,
                                  args=(proc.stdout, section.name, tail, log_file, echo))
        reader.start()
        try:
            proc.wait(timeout=limit_sec)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            partial = load(f'{result_path}.partial')
            return {'status': 'timeout', 'error': f'killed at its time limit of {limit_sec:.0f} s',
                    'output_tail': list(tail), **({'partial': partial} if partial else {})}
        finally:
            reader.join(timeout=5)  # a grandchild (a snapshot keeper) may hold the pipe a while
    return load(result_path) or {'status': 'failed', 'output_tail': list(tail), 'error':
                                  f'the section process exited with code {proc.returncode} '
                                  'and wrote no result'}


def run_section(section: Section, limit_sec: float, params: dict, work_dir: str,
                echo=print, env: dict | None = None) -> dict:
    """One section's result with its timing: in a child process, or in this one where
    `params['in_process']` and no `env` (XLA_FLAGS act only where set before jax starts)."""
    os.makedirs(work_dir, exist_ok=True)
    result_path = os.path.join(work_dir, f'{section.name}.result.json')
    for path in (result_path, f'{result_path}.partial'):
        pathlib.Path(path).unlink(missing_ok=True)
    params, start = dict(params, name=section.name, limit_sec=limit_sec), time.monotonic()
    if params.get('in_process') and not env:
        result = run_target(section.target, result_path, params,
                            log=lambda msg: echo(f'[{section.name}] {msg}'))
    else:
        result = _child(section, limit_sec, params, result_path, echo, env or {})
    return dict(result, wall_sec=round(time.monotonic() - start, 2), limit_sec=round(limit_sec, 2))


def run_sections(sections, params: dict, work_dir: str, *, budget_sec: float,
                 min_sec: float = 5.0, echo=print) -> dict:
    """Every section in order; {name: result}. Limits share out what is left of the budget."""
    results, start, sections = {}, time.monotonic(), list(sections)
    for k, section in enumerate(sections):
        left = budget_sec - (time.monotonic() - start)
        limit = limits_left(sections[k:], left, min_sec)
        echo(f'== {section.name}: limit {limit:.0f} s ({left:.0f} s of the budget left)')
        r = results[section.name] = run_section(section, limit, params, work_dir, echo=echo)
        echo(f'== {section.name}: {r["status"]} in {r["wall_sec"]:.1f} s'
             + (f' ({r.get("error") or r.get("reason")})' if r['status'] != 'ok' else ''))
    return results


if __name__ == '__main__':
    run_target(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
