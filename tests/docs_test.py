"""The repository must explain itself: no references to documents users lack.

Users get the tracked files and nothing else, so no tracked file may point at
the project's private design notes, and every link or repository path named in
the README and in docs/ must resolve to a tracked file (or a heading in it).
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
REPO_PATH_SPAN = re.compile(r'`((?:mecefo_jax|configs|scripts|tests|docs)/[^`\s]*)`')


@pytest.fixture(scope='module')
def tracked():
    try:
        out = subprocess.run(['git', 'ls-files', '-z'], cwd=REPO, check=True,
                             capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f'not a git checkout ({error}); the check needs the tracked file list')
    return sorted(p for p in out.decode('utf-8').split('\0') if p)


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
        full = os.path.join(REPO, path)
        if not os.path.isfile(full):
            continue  # deleted in the work tree but not yet in the index
        with open(full, 'rb') as f:
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
