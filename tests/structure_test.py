"""The layout holds: the library never imports its experiments, no import cycles, small units.

These read the source, not the running program, so they are fast and
deterministic: imports are every `import` statement anywhere in a module,
function-level (lazy) ones included.
"""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / 'mecefo_jax'
MAX_TOP_LEVEL_LINES = 400
MAX_FUNCTION_LINES = 80


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob('*.py'))}


def _type_checking_imports(tree) -> set[int]:
    """ids of import nodes under `if TYPE_CHECKING:` (annotations only: never run)."""
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, 'id', None) == 'TYPE_CHECKING':
            guarded |= {id(n) for n in ast.walk(node)}
    return guarded


def _imports(path: pathlib.Path) -> set[str]:
    """The project modules `path` imports at run time (the longest known prefix of each)."""
    found = set()
    tree = ast.parse(path.read_text())
    skip = _type_checking_imports(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f'{node.module}.{a.name}' for a in node.names]
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition('.')[0]
            if name:
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> modules it imports; a submodule importing its own package is no edge."""
    return {m: {t for t in _imports(p) if t != m and not m.startswith(t + '.')}
            for m, p in MODULES.items()}


def test_the_library_never_imports_the_experiments():
    offenders = {m: sorted(t for t in targets if t.startswith('mecefo_jax.experiments'))
                 for m, targets in _graph().items()
                 if not m.startswith('mecefo_jax.experiments')}
    assert not {m: t for m, t in offenders.items() if t}, offenders


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


def test_top_level_modules_stay_small():
    sizes = {p.name: len(p.read_text().splitlines()) for p in PACKAGE.glob('*.py')}
    assert {n: s for n, s in sizes.items() if s > MAX_TOP_LEVEL_LINES} == {}


def test_no_function_outside_tests_is_over_80_lines():
    long = []
    for path in sorted(list(PACKAGE.rglob('*.py')) + list((ROOT / 'scripts').glob('*.py'))):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f'{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})')
    assert not long, long


def test_every_package_says_what_it_owns():
    silent = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob('__init__.py')
              if not ast.get_docstring(ast.parse(p.read_text()))]
    assert not silent, silent
