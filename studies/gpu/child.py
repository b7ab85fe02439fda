"""One report section in its own process: `python -m studies.gpu.child ...`.

A hung XLA call cannot be interrupted from another thread, so every section
runs in a child process that the report can kill at its time limit. The
child imports the section's function (`module:function`), calls it with a
`Context`, and writes `{'status', ...figures}` to the result file: `ok`,
`skipped` (the section raised `Skipped`: this machine cannot measure it) or
`failed` (any other exception, with its traceback). Figures a section saves
with `Context.partial` on the way survive a kill at the time limit.

    python -m studies.gpu.child TARGET RESULT_PATH PARAMS_JSON
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback

from mecefo_jax.host import atomic_file


class Skipped(Exception):
    """This machine cannot measure the section (e.g. cuDNN on a CPU); `figures` are kept."""

    def __init__(self, reason: str, figures: dict | None = None):
        super().__init__(reason)
        self.reason = reason
        self.figures = figures or {}


def write_json(path: str, obj) -> None:
    """Write atomically (a kill mid-write leaves the previous file whole)."""
    atomic_file.write_json(path, obj, indent=1, default=str)


class Context:
    """What a section gets: its parameters, its deadline, a logger and partial saves."""

    def __init__(self, params: dict, result_path: str):
        self.params = params
        self.smoke = bool(params.get('smoke'))
        self.out = params.get('out', '')
        self.name = params.get('name', 'section')
        self.deadline = time.monotonic() + float(params.get('limit_sec', 1e9))
        self._partial_path = partial_path(result_path)

    def left(self) -> float:
        """Seconds left before the report kills this section."""
        return self.deadline - time.monotonic()

    def log(self, msg: str) -> None:
        print(msg, flush=True)

    def partial(self, figures: dict) -> None:
        """Save the figures measured so far (reported if the section times out)."""
        write_json(self._partial_path, figures)


def partial_path(result_path: str) -> str:
    return f'{result_path}.partial'


def load_target(target: str):
    module, _, name = target.partition(':')
    return getattr(importlib.import_module(module), name)


def use_compilation_cache(path: str) -> None:
    """Share compiled programs between sections (the same step at the same shape)."""
    import jax
    jax.config.update('jax_compilation_cache_dir', path)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)


def run(target: str, result_path: str, params: dict) -> dict:
    ctx = Context(params, result_path)
    try:
        if params.get('xla_cache_dir'):
            use_compilation_cache(params['xla_cache_dir'])
        figures = load_target(target)(ctx) or {}
        result = {'status': 'ok', **figures}
    except Skipped as skip:
        result = {'status': 'skipped', 'reason': skip.reason, **skip.figures}
    except Exception as error:  # noqa: BLE001  (reported, and the next section runs)
        traceback.print_exc()
        result = {'status': 'failed', 'error': f'{type(error).__name__}: {error}',
                  'traceback': traceback.format_exc()[-4000:]}
        if os.path.exists(partial_path(result_path)):
            with open(partial_path(result_path)) as f:
                result['partial'] = json.load(f)
    result['cpu_sec'] = cpu_seconds()
    write_json(result_path, result)
    return result


def cpu_seconds() -> float:
    """User + system CPU time of this process (and its reaped children) so far."""
    import resource
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return round(own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime, 2)


def main(argv=None) -> int:
    target, result_path, params = (argv or sys.argv)[1:4]
    # Run as __main__, this file's `Skipped` is not the one sections raise:
    # call the package module's `run`, which catches that one.
    from studies.gpu import child
    child.run(target, result_path, json.loads(params))
    return 0


if __name__ == '__main__':
    sys.exit(main())
