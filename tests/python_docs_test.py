"""Tests for mecefo_jax.data.python_docs: the prose of installed Python code as a corpus."""
import textwrap

import pytest

from configs import tiny
from mecefo_jax.config.resolve import resolve
from mecefo_jax.data import python_docs, sources

LICENCE = '# Copyright 2026 Somebody. Licensed under the Apache License, Version 2.0.'


def _write(root, relative, text):
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


@pytest.fixture
def tree(tmp_path):
    _write(tmp_path, 'pkg/b.py', f'''\
        {LICENCE}
        """Module b explains what it owns, at some length for a docstring."""


        class Widget:
            """A widget holds state that outlives a call, which is why it is a class."""

            def spin(self):
                """Spins the widget once; spinning twice is spinning once, twice over."""
                # The first comment line,
                # and its second line, in one block.
                x = 1  # noqa: E501
                return x
        ''')
    _write(tmp_path, 'pkg/a.py', f'''\
        {LICENCE}
        def short():
            """Too short."""
        ''')
    _write(tmp_path, 'pkg/tests/c.py', '"""A test module docstring long enough to count, were it read."""\n')
    _write(tmp_path, 'pkg/bad.py', 'def broken(:\n')
    return tmp_path / 'pkg'


def test_prose_is_docstrings_at_every_level_then_comment_blocks(tree):
    prose = python_docs.prose_of((tree / 'b.py').read_bytes())
    assert prose == [
        'Module b explains what it owns, at some length for a docstring.',
        'A widget holds state that outlives a call, which is why it is a class.',
        'Spins the widget once; spinning twice is spinning once, twice over.',
        LICENCE.lstrip('# '),
        'The first comment line, and its second line, in one block.',
    ]  # short docstrings and pragmas are left out
    assert python_docs.prose_of(b'def broken(:\n') == []


def test_files_are_read_sorted_without_tests_and_each_paragraph_once(tree):
    assert [p.split('/')[-1] for p in python_docs.python_files(str(tree))] == [
        'a.py', 'b.py', 'bad.py']
    documents = python_docs.corpus_texts([str(tree)], lambda text: [text])
    # a.py holds the licence only (its docstring is too short); b.py repeats it: dropped.
    assert documents[0] == LICENCE.lstrip('# ')
    assert LICENCE.lstrip('# ') not in documents[1]
    assert documents[1].startswith('Module b explains')
    assert 'A test module docstring' not in ''.join(documents)


def test_the_config_source_reads_the_corpus_and_splits_it_by_content(tree, monkeypatch):
    roots = [str(tree)]
    monkeypatch.setattr(python_docs, 'source_roots', lambda: roots)
    python_docs.python_docs_corpus.cache_clear()
    cfg = tiny.get_config()
    cfg.data.source = 'python_docs'
    cfg.data.val_fraction = 0.5
    data = resolve(cfg).data
    try:
        train = sources.load_documents(data, 'train')
        validation = sources.load_documents(data, 'validation')
    finally:
        python_docs.python_docs_corpus.cache_clear()
    assert len(train) + len(validation) == 2 and len(validation) >= 1
    assert set(train).isdisjoint(validation)
    assert train.fingerprint != validation.fingerprint


def test_the_standard_library_and_the_named_packages_are_the_roots():
    roots = python_docs.source_roots(('jax', 'no_such_package_here'))
    assert roots[0].endswith(('python3.11', 'python3.12', 'python3.13'))
    assert len(roots) == 2 and roots[1].endswith('jax')
