"""The layout holds: one-way layers, no import cycles, a job per module, tables that name them.

These read the source, not the running program, so they are fast and
deterministic: imports are every `import` statement anywhere in a module,
function-level (lazy) ones and those under `if TYPE_CHECKING:` included (a
cycle hidden behind a guard is still a cycle for a reader).
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / 'mecefo_jax'

# The layers, lowest first: a module imports only modules of its own layer or
# of lower ones. A module belongs to the layer of the longest prefix naming it.
LAYERS = (
    ('host', ('mecefo_jax.host',)),  # files, locks, disk space, processes
    ('traces', ('mecefo_jax.failure_schedule',)),  # failure traces: pure Python, what fault.* names
    ('config', ('mecefo_jax.config',)),  # every field declared, resolved and recorded
    ('checkpointing', ('mecefo_jax.checkpointing',)),  # checkpoints on disk
    ('snapshot', ('mecefo_jax.snapshot',)),  # keepers and what they hold
    ('data', ('mecefo_jax.data',)),  # sources, tokenizer, pipeline
    ('neighbour', ('mecefo_jax.neighbour',)),  # MeCeFO's approximate backward
    ('model', ('mecefo_jax.model',)),  # LLaMA, loss, optimizer
    ('parallel', ('mecefo_jax.parallel',)),  # mesh, state, step, topologies
    ('training', ('mecefo_jax.training',)),  # the loop and what it drives
    ('faults', ('mecefo_jax.faults',)),  # strategies, costs, the fault controllers
    ('entry', ('mecefo_jax', 'mecefo_jax.run', 'mecefo_jax.main')),  # what a command line runs
    ('launch', ('mecefo_jax.launch',)),  # the launcher on Ray
)
MAX_ROOT_MODULES = 8
MAX_FUNCTION_LINES = 80


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob('*.py'))}


def _imported_names(path: pathlib.Path) -> list[str]:
    """Every module name `path` imports anywhere, lazy and TYPE_CHECKING imports included."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f'{node.module}.{a.name}' for a in node.names]
    return names


def _imports(path: pathlib.Path) -> set[str]:
    """The project modules `path` imports anywhere (the longest known prefix of each)."""
    found = set()
    for name in _imported_names(path):
        while name and name not in MODULES:
            name = name.rpartition('.')[0]
        if name:
            found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> modules it imports; a submodule importing its own package is no edge."""
    return {m: {t for t in _imports(p) if t != m and not m.startswith(t + '.')}
            for m, p in MODULES.items()}


def test_the_library_never_imports_the_studies():
    offenders = {m: sorted(n for n in _imported_names(p) if n == 'studies' or n.startswith('studies.'))
                 for m, p in MODULES.items()}
    assert not {m: t for m, t in offenders.items() if t}, offenders


def test_the_package_root_holds_few_modules():
    root = sorted(p.name for p in PACKAGE.glob('*.py'))
    assert len(root) <= MAX_ROOT_MODULES, root


def test_there_is_no_import_cycle():
    graph, state, cycles = _graph(), {}, []

    def visit(module, path):
        state[module] = 'open'
        for target in sorted(graph[module]):
            if state.get(target) == 'open':
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = 'done'

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles


def _layer(module: str) -> int:
    """The index in LAYERS of `module`'s layer (its longest matching prefix)."""
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + '.')) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    assert best is not None, f'{module} is in no layer; add it to LAYERS'
    return best


def test_no_module_imports_a_higher_layer():
    graph = _graph()
    upward = [f'{m} ({LAYERS[_layer(m)][0]}) -> {t} ({LAYERS[_layer(t)][0]})'
              for m in sorted(graph) for t in sorted(graph[m]) if _layer(t) > _layer(m)]
    assert not upward, upward


def test_every_module_says_its_one_job_first():
    """A module is split where a reader's question splits, not at a line count: each opens
    with a docstring whose first line says what it owns."""
    silent = [str(p.relative_to(ROOT)) for p in sorted(list(PACKAGE.rglob('*.py'))
                                                       + list((ROOT / 'studies').rglob('*.py')))
              if not (ast.get_docstring(ast.parse(p.read_text())) or '').split('\n')[0].strip()]
    assert not silent, silent


def test_every_package_table_names_each_of_its_modules():
    """A package's `__init__` docstring names every module it holds (`module`), so the
    table a reader starts from is the whole package."""
    unnamed = []
    for init in sorted(list(PACKAGE.rglob('__init__.py')) + list((ROOT / 'studies').rglob('__init__.py'))):
        text = ast.get_docstring(ast.parse(init.read_text())) or ''
        for module in sorted(init.parent.glob('*.py')):
            if module.name != '__init__.py' and f'`{module.stem}`' not in text:
                unnamed.append(str(module.relative_to(ROOT)))
        for package in sorted(p for p in init.parent.iterdir() if (p / '__init__.py').exists()):
            if f'`{package.name}/`' not in text and f'`{package.name}`' not in text:
                unnamed.append(str(package.relative_to(ROOT)) + '/')
    assert not unnamed, unnamed


def test_no_function_outside_tests_is_over_80_lines():
    long = []
    for path in sorted(list(PACKAGE.rglob('*.py')) + list((ROOT / 'scripts').glob('*.py'))
                       + list((ROOT / 'studies').rglob('*.py'))):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f'{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})')
    assert not long, long


def test_every_package_says_what_it_owns():
    silent = [str(p.relative_to(ROOT)) for p in list(PACKAGE.rglob('__init__.py'))
              + list((ROOT / 'studies').rglob('__init__.py'))
              if not ast.get_docstring(ast.parse(p.read_text()))]
    assert not silent, silent


# One fault-free training step from the loop's `run_step` to the optimizer's update: the
# library modules whose code runs on the way, in order (a subprocess: its own jax, profiler).
_STEP_PATH = """
import os, sys
import optax
import mecefo_jax
from configs.tiny import get_config
from mecefo_jax.config.resolve import start, updated
from mecefo_jax.model import optim
from mecefo_jax.training import loop
cfg = updated(start(get_config()), {'train.steps': 1, 'train.checkpoint_every': 0, 'train.eval_every': 0,
                                    'data.cache_dir': sys.argv[2]})
root, seen, state = os.path.dirname(mecefo_jax.__file__), [], {'done': False}
make = optim.make_optimizer
def wrapped(train):
    inner = make(train)
    def update(*args, **kwargs):
        state['done'] = True
        return inner.update(*args, **kwargs)
    return optax.GradientTransformation(inner.init, update)
optim.make_optimizer = wrapped
def profile(frame, event, arg):
    name = frame.f_code.co_filename
    if event == 'call' and not state['done'] and name.startswith(root):
        module = os.path.relpath(name, os.path.dirname(root))[:-3]
        if module not in seen:
            seen.append(module)
run_step = loop._Loop.run_step
def traced(self, st):
    sys.setprofile(profile)
    try:
        return run_step(self, st)
    finally:
        sys.setprofile(None)
loop._Loop.run_step = traced
from mecefo_jax.run import run
run(cfg, sys.argv[1])
print('\\n'.join(seen))
"""


@pytest.mark.subprocess
def test_a_step_reaches_the_optimizer_update_through_the_modules_the_architecture_page_lists(
        tmp_path, tokenizer_cache):
    import re
    import subprocess
    import sys
    done = subprocess.run([sys.executable, '-c', _STEP_PATH, str(tmp_path), tokenizer_cache],
                          capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**__import__('os').environ, 'PYTHONPATH': str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    measured = [line + '.py' for line in done.stdout.split() if line.startswith('mecefo_jax/')]
    page = (ROOT / 'docs' / 'architecture.md').read_text()
    listed = re.findall(r'^\d+\. `(mecefo_jax/[\w/]+\.py)`', page.split('<!-- step-path -->')[1]
                        .split('<!-- /step-path -->')[0], re.M)
    assert measured == listed
    assert len(measured) <= 15
