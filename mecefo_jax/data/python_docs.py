"""The `python_docs` corpus: the prose inside installed Python code, offline and large.

For runs that must not repeat their data (the embedded corpus is read about five times
over by `configs/small.py`): the standard library's docstrings at every level and its
comments, then the same from the packages in `PACKAGES`. Files are read in sorted
order, never imported; a paragraph seen before anywhere (a licence header) is dropped,
and each file's text is cut into the same chunks as the other sources. The text
depends on the installed versions: `data_sources.corpus_fingerprint` hashes it and
every run's metrics record that hash.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import io
import os
import sysconfig
import tokenize
from collections.abc import Callable, Iterable, Iterator, Sequence

# This project's dependencies (pyproject.toml) and the larger packages they install.
PACKAGES = ('absl', 'etils', 'flax', 'grain', 'jax', 'matplotlib', 'ml_collections', 'numpy',
            'optax', 'orbax', 'ray', 'tensorflow_datasets')
MIN_DOCSTRING_CHARS = 40  # "Returns x." adds nothing; a sentence or two does
_SKIP_DIRS = frozenset({
    'test', 'tests', 'testing', '__pycache__', 'idlelib', 'lib2to3', 'site-packages',
    'dist-packages', 'turtledemo', 'ensurepip', 'pydoc_data', 'lib-dynload', '_vendor',
    'encodings',  # codec tables: their comments are character names, one per line
})
_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def source_roots(packages: Sequence[str] = PACKAGES) -> list[str]:
    """The standard library's folder, then each installed package's (missing ones skipped),
    wherever this interpreter imports it from (`find_spec` imports nothing)."""
    roots = [sysconfig.get_paths()['stdlib']]
    for package in packages:
        spec = importlib.util.find_spec(package)
        folders = list(spec.submodule_search_locations or ()) if spec is not None else []
        if folders and os.path.isdir(folders[0]):
            roots.append(folders[0])
    return roots


def python_files(root: str) -> Iterator[str]:
    """`root`'s .py files in a fixed (sorted) order, without tests or vendored code."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in _SKIP_DIRS and not d.startswith('config-'))
        for filename in sorted(filenames):
            if filename.endswith('.py') and not filename.startswith('test_'):
                yield os.path.join(dirpath, filename)


def prose_of(source: bytes) -> list[str]:
    """A file's docstrings (every level), then its comment blocks, as paragraphs."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    paragraphs = [doc for node in ast.walk(tree) if isinstance(node, _DOCUMENTED)
                  for doc in [ast.get_docstring(node, clean=True)]
                  if doc and len(doc) >= MIN_DOCSTRING_CHARS]
    return paragraphs + list(_comment_blocks(source))


def _comment_blocks(source: bytes) -> Iterator[str]:
    """Runs of comments on consecutive lines, joined; shebangs and pragmas left out."""
    block, last_line = [], -2
    try:
        for token in tokenize.tokenize(io.BytesIO(source).readline):
            if token.type != tokenize.COMMENT:
                continue
            text = token.string.lstrip('#').strip()
            if not text or text.startswith('!') or text.startswith(('type:', 'noqa', 'pylint:')):
                continue
            if token.start[0] != last_line + 1 and block:
                yield ' '.join(block)
                block = []
            block.append(text)
            last_line = token.start[0]
    except (tokenize.TokenError, SyntaxError):
        pass
    if block:
        yield ' '.join(block)


def corpus_texts(roots: Iterable[str], chunk: Callable[[str], list[str]]) -> tuple[str, ...]:
    """Every file's new paragraphs under `roots`, cut by `chunk`, in order."""
    seen: set[str] = set()
    documents = []
    for root in roots:
        for path in python_files(root):
            try:
                with open(path, 'rb') as source_file:
                    source = source_file.read()
            except OSError:
                continue
            fresh = []
            for paragraph in prose_of(source):
                if paragraph not in seen:
                    seen.add(paragraph)
                    fresh.append(paragraph)
            if fresh:
                documents.extend(chunk('\n\n'.join(fresh)))
    return tuple(documents)


@functools.lru_cache(maxsize=1)
def python_docs_corpus(chunk: Callable[[str], list[str]]) -> tuple[str, ...]:
    """The whole corpus of this install (about 40 s to read; cached per process)."""
    return corpus_texts(source_roots(), chunk)
