"""The repository must explain itself: no references to documents users lack.

Users get the committed files and nothing else, so no such file may point at
the project's private design notes, and every link or repository path named in
the README and in docs/ must resolve to one (or a heading in it). The files
checked are those a commit of this work tree would hold: the tracked ones still
on disk plus the new ones git does not ignore, so a change is checked before it
is committed (in a clean checkout that is exactly the tracked files).

The README is the front door: short, with the two set-up commands that CI
runs; docs/architecture.md holds the map, in the order of the layers that
tests/structure_test.py enforces.
"""
import fnmatch
import os
import re
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Built from pieces so that this file does not match its own check.
FORBIDDEN = ('DESIGN' + '.md', '..' + '/shared')
MARKDOWN_LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)\)')
# A code span naming a path inside the repository, e.g. `mecefo_jax/model/llama.py`.
REPO_PATH_SPAN = re.compile(r'`((?:mecefo_jax|studies|configs|scripts|tests|docs)/[^`\s]*)`')
README_MAX_LINES = 180
# The README's set-up commands: the first trains, the second is exactly what CI runs.
TRAIN_COMMAND = 'pip install -e . && python -m mecefo_jax.main --config configs/tiny.py --workdir runs/tiny'
TEST_COMMAND = "pip install -e '.[test]' && python -m pytest tests"


@pytest.fixture(scope='module')
def tracked():
    try:
        out = subprocess.run(['git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard'],
                             cwd=REPO, check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f'not a git checkout ({error}); the check needs the tracked file list')
    paths = {p for p in out.decode('utf-8').split('\0') if p}
    return sorted(p for p in paths if os.path.isfile(os.path.join(REPO, p)))


def _documents(tracked):
    docs = ['README.md'] + [p for p in tracked if p.startswith('docs/') and p.endswith('.md')]
    assert 'docs/algorithm.md' in docs, 'docs/algorithm.md must be tracked'
    return docs


def _read(path):
    with open(os.path.join(REPO, path), encoding='utf-8') as f:
        return f.read()


def _github_anchor(heading):
    """The id GitHub gives a Markdown heading."""
    text = heading.strip().lower().replace('`', '')
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


def _anchors(markdown):
    in_code = False
    anchors = set()
    for line in markdown.splitlines():
        if line.startswith('```'):
            in_code = not in_code
        elif not in_code and line.startswith('#'):
            anchors.add(_github_anchor(line.lstrip('#')))
    return anchors


def _exists(path, tracked):
    return path in tracked or any(p.startswith(path.rstrip('/') + '/') for p in tracked)


def test_no_tracked_file_mentions_the_private_design_notes(tracked):
    offenders = []
    for path in tracked:
        with open(os.path.join(REPO, path), 'rb') as f:
            data = f.read()
        for word in FORBIDDEN:
            if word.encode() in data:
                offenders.append(f'{path}: {word}')
    assert not offenders, (
        'users of the repository do not have these documents; cite the MeCeFO paper'
        ' (arXiv:2510.16415) or docs/algorithm.md instead:\n' + '\n'.join(offenders))


def test_markdown_links_point_at_tracked_files_and_headings(tracked):
    broken = []
    for doc in _documents(tracked):
        base = os.path.dirname(doc)
        for target in MARKDOWN_LINK.findall(_read(doc)):
            if re.match(r'^[a-z][a-z0-9+.-]*:', target):
                continue  # http(s), mailto: outside the repository
            path, _, anchor = target.partition('#')
            path = os.path.normpath(os.path.join(base, path)) if path else doc
            if not _exists(path, tracked):
                broken.append(f'{doc}: ({target}) -> {path} is not a tracked file')
            elif anchor and path.endswith('.md') and anchor not in _anchors(_read(path)):
                broken.append(f'{doc}: ({target}) -> no heading #{anchor} in {path}')
    assert not broken, '\n'.join(broken)


def test_repository_paths_named_in_docs_exist(tracked):
    missing = []
    for doc in _documents(tracked):
        for path in REPO_PATH_SPAN.findall(_read(doc)):
            if any(c in path for c in '*?['):
                found = any(fnmatch.fnmatch(p, path) for p in tracked)
            else:
                found = _exists(path, tracked)
            if not found:
                missing.append(f'{doc}: `{path}`')
    assert not missing, 'named in the docs but not in the repository:\n' + '\n'.join(missing)


def test_readme_links_the_algorithm_page(tracked):
    assert 'docs/algorithm.md' in MARKDOWN_LINK.findall(_read('README.md'))


def test_the_readme_is_a_front_door():
    lines = _read('README.md').splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f'README.md has {len(lines)} lines, over {README_MAX_LINES}: move detail and results '
        'into docs/ and link them')


def test_the_readme_gives_the_two_set_up_commands_and_ci_runs_the_second():
    readme = _read('README.md')
    for command in (TRAIN_COMMAND, TEST_COMMAND):
        assert command in readme, f'README.md lost its set-up command: {command}'
    ci = _read('.ci/run').splitlines()
    assert TEST_COMMAND in ci, f".ci/run must run exactly the README's test command: {TEST_COMMAND}"


def test_the_architecture_page_lists_the_layers_in_order_and_every_package():
    from tests.structure_test import LAYERS
    page = _read('docs/architecture.md')
    assert 'docs/architecture.md' in MARKDOWN_LINK.findall(_read('README.md'))
    layers = page[page.index('## The layers'):]
    layers = layers[:layers.index('\n## ')]
    positions = []
    for name, modules in LAYERS:
        paths = [_module_path(m) for m in modules if m != 'mecefo_jax']  # the root: no code
        missing = [p for p in paths if f'`{p}`' not in layers]
        assert not missing, f'docs/architecture.md lacks layer {name!r}: {missing}'
        positions.append(min(layers.index(f'`{p}`') for p in paths))
    assert positions == sorted(positions), 'docs/architecture.md lists the layers out of order'
    packages = sorted(p for p in os.listdir(os.path.join(REPO, 'mecefo_jax'))
                      if os.path.isfile(os.path.join(REPO, 'mecefo_jax', p, '__init__.py')))
    missing = [p for p in packages if f'`mecefo_jax/{p}/`' not in page]
    assert not missing, f'docs/architecture.md lacks packages: {missing}'


def _module_path(module: str) -> str:
    """`mecefo_jax.run` -> mecefo_jax/run.py; a package -> its folder with a slash."""
    path = module.replace('.', '/')
    if os.path.isdir(os.path.join(REPO, path)):
        return path + '/'
    return path + '.py'
