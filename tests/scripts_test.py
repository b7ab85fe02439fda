"""Every script starts, and every committed result names the command that rebuilds it.

A result nobody can rebuild, or a script that no longer starts, is a claim a
reader cannot check. So:

* every `scripts/*.py` prints its `--help` (the shell script is only parsed:
  it needs a GPU machine to run);
* every result under `docs/results/` (its `.json` and `.md` files, at any
  depth) names a command, `python scripts/NAME.py ...`, `python -m MODULE ...`
  or `bash scripts/NAME.sh ...`, and every command it names still exists.
  A file that names none itself is covered by a `README.md` in a folder between
  it and `docs/results/` that names one: the records of many runs that one
  report is built from (`docs/results/verdict_runs/<point>/seed<s>/<run>.json`)
  share the command written once at their folder's top. Images (`.png`) and
  metric logs (`.jsonl`) are covered by the JSON result beside them.
"""
import glob
import importlib.util
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, 'docs', 'results')
HELP_TIMEOUT_SEC = 300  # all scripts start at once on a shared 2-core machine
SCRIPT_COMMAND = re.compile(r'\b(?:python3?|bash)\s+(scripts/[\w./-]+\.(?:py|sh))')
MODULE_COMMAND = re.compile(r'\bpython3?\s+-m\s+([A-Za-z_][\w.]*)')


def _scripts(pattern: str) -> list[str]:
    return sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, 'scripts', pattern)))


@pytest.mark.subprocess
def test_every_script_prints_its_help():
    """absl ends `--help` with status 1 by design (`HelpFlag`), after printing the usage on
    stdout; a script that fails to import ends with status 1 too, but with a traceback and
    no usage. So the status is 0, or 1 with absl's closing line and the script's flags."""
    scripts = _scripts('*.py')
    assert scripts, 'no scripts/*.py found'
    env = dict(os.environ, PYTHONPATH=REPO)  # as a fresh checkout runs them: no install of studies
    procs = {s: subprocess.Popen([sys.executable, s, '--help'], cwd=REPO, env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for s in scripts}  # all at once: their imports overlap instead of queueing
    failed = []
    for script, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=HELP_TIMEOUT_SEC)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            failed.append(f'{script}: no help within {HELP_TIMEOUT_SEC} s')
            continue
        absl_help = proc.returncode == 1 and 'Try --helpfull' in out
        usage = f'{script}:' in out and '--' in out.split(f'{script}:', 1)[1]
        if not ((proc.returncode == 0 or absl_help) and usage and 'Traceback' not in err):
            failed.append(f'{script}: exit {proc.returncode}, no usage of its flags\n'
                          f'{out[-500:]}{err[-1500:]}')
    assert not failed, '\n\n'.join(failed)


def test_the_shell_script_parses():
    shells = _scripts('*.sh')
    assert shells, 'no scripts/*.sh found'
    for script in shells:
        proc = subprocess.run(['bash', '-n', script], cwd=REPO, capture_output=True, text=True)
        assert proc.returncode == 0, f'{script}: {proc.stderr}'


def _results() -> list[str]:
    paths = glob.glob(os.path.join(RESULTS, '**', '*.json'), recursive=True)
    paths += glob.glob(os.path.join(RESULTS, '**', '*.md'), recursive=True)
    return sorted(os.path.relpath(p, REPO) for p in paths)


def _commands(path: str) -> set[str]:
    """The scripts (`scripts/x.py`) and modules (`-m a.b`) that `path`'s text names."""
    with open(os.path.join(REPO, path), encoding='utf-8') as f:
        text = f.read()
    return set(SCRIPT_COMMAND.findall(text)) | {f'-m {m}' for m in MODULE_COMMAND.findall(text)}


def _covering_readme(path: str) -> str | None:
    """The nearest README.md in a folder above `path`, below docs/results/ itself."""
    folder = os.path.dirname(path)
    top = os.path.relpath(RESULTS, REPO)
    while folder != top and folder.startswith(top + os.sep):
        readme = os.path.join(folder, 'README.md')
        if readme != path and os.path.exists(os.path.join(REPO, readme)):
            return readme
        folder = os.path.dirname(folder)
    return None


def _exists(command: str) -> bool:
    if not command.startswith('-m '):
        return os.path.isfile(os.path.join(REPO, command))
    module = command[3:]
    base = os.path.join(REPO, *module.split('.'))
    if any(os.path.isfile(base + tail) for tail in ('.py', '/__main__.py', '/__init__.py')):
        return True
    if module.split('.')[0] in ('mecefo_jax', 'studies', 'scripts', 'tests', 'configs'):
        return False  # the repository's own: its file is gone
    sys.path.insert(0, REPO)
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False
    finally:
        sys.path.remove(REPO)


def test_every_result_names_an_existing_command_that_rebuilds_it():
    results = _results()
    assert results, 'no results under docs/results/'
    unnamed, missing = [], []
    for path in results:
        commands = _commands(path)
        if not commands:
            readme = _covering_readme(path)
            commands = _commands(readme) if readme else set()
            if not commands:
                unnamed.append(path)
                continue
        missing += [f'{path}: {c}' for c in sorted(commands) if not _exists(c)]
    assert not unnamed and not missing, (
        'each result must name the command that rebuilds it (`python scripts/NAME.py ...`), '
        'and that script must exist; write the command into the result (its writer) or into a '
        'README.md at the top of its folder of records.\n'
        + ''.join(f'names no command: {p}\n' for p in unnamed)
        + ''.join(f'names a command that is gone: {m}\n' for m in missing))
