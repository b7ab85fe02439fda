"""Raw text documents: where they come from and how they split into train/validation.

A split is a random-access sequence of `str` (a Grain ``MapDataset.source``).
``data.source``: ``'embedded'`` (default: CPython's own documentation, read with
`tokenize`, never imported, so offline), ``'python_docs'`` (`python_docs`), ``'tfds'`` (an
``array_record`` TFDS dataset under ``data.data_dir``, read without TensorFlow, with its
own validation split) or ``'text'`` (``data.text_files``: paths or globs). Except for
TFDS, documents are chunks of paragraphs of at least ``DOCUMENT_TARGET_CHARS`` within one
file, so validation holds about ``data.val_fraction`` of the *text*; a chunk is in
validation iff a hash of its content falls below it: stable when documents are added or
reordered, and duplicates land on the same side.
"""

from __future__ import annotations

import ast
import functools
import glob
import hashlib
import os
import re
import sysconfig
import tokenize
from collections.abc import Iterator, Sequence
from typing import Any

from mecefo_jax.config.defaults import DataSection
from mecefo_jax.data import python_docs

SPLITS = ('train', 'validation')

# Standard-library folders of tests, demos or vendored packages, not documentation.
_STDLIB_DIRS_TO_SKIP = frozenset({
    'test', 'tests', 'idlelib', 'lib2to3', 'site-packages', 'dist-packages',
    'turtledemo', 'ensurepip', 'pydoc_data', 'lib-dynload', '__pycache__',
})
# Very short module docstrings ("Constants for foo.") add almost no text.
_MIN_DOCSTRING_CHARS = 200
_PARAGRAPH_BREAK = re.compile(r'\n(?:[ \t\r\f\v]*\n)+')
DOCUMENT_TARGET_CHARS = 2000


class Documents(Sequence[str]):
    """An in-memory split of documents, with a fingerprint of its exact text: caches keyed on
    it (the trained tokenizer, pipeline checkpoints) notice when the corpus changes."""

    def __init__(self, texts: Sequence[str], fingerprint: str):
        self._texts = tuple(texts)
        self.fingerprint = fingerprint

    def __len__(self) -> int:
        return len(self._texts)

    def __getitem__(self, index):
        return self._texts[index]

    def __repr__(self) -> str:
        return f'Documents(n={len(self)}, fingerprint={self.fingerprint[:12]})'


class TfdsDocuments(Sequence[str]):
    """Text documents read lazily from a TFDS ``ArrayRecordDataSource``."""

    def __init__(self, tfds_source: Any, text_key: str, fingerprint: str):
        self._tfds_source = tfds_source
        self._text_key = text_key
        self.fingerprint = fingerprint

    def __len__(self) -> int:
        return len(self._tfds_source)

    def _text_of(self, record: Any) -> str:
        text = record[self._text_key]
        return text.decode('utf-8') if isinstance(text, bytes) else str(text)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            # array_record raises ValueError here; Sequence semantics need IndexError.
            raise IndexError(f'document index {index} out of range [0, {len(self)})')
        return self._text_of(self._tfds_source[index % len(self)])

    def __repr__(self) -> str:
        return f'TfdsDocuments(n={len(self)}, source={self.fingerprint})'


def load_documents(data_cfg: DataSection, split: str) -> Sequence[str]:
    """Returns the documents of `split` ('train' or 'validation') for `data_cfg`."""
    if split not in SPLITS:
        raise ValueError(f'split must be one of {SPLITS}, got {split!r}.')
    source = data_cfg.source
    if source == 'tfds':
        return _load_tfds_documents(data_cfg, split)
    if source == 'embedded':
        corpus = _embedded_corpus()
        corpus_name = 'embedded'
    elif source == 'text':
        corpus = _text_file_corpus(_text_file_identity(data_cfg))
        corpus_name = 'text'
    elif source == 'python_docs':
        corpus = python_docs.python_docs_corpus(paragraph_chunks)
        corpus_name = 'python_docs'
    else:
        raise ValueError(
            "data.source must be 'embedded', 'python_docs', 'tfds' or 'text', got"
            f' {source!r}.')
    return _split_by_content_hash(corpus, corpus_name, split, data_cfg.val_fraction)


def corpus_fingerprint(data_cfg: DataSection) -> str:
    """Identity of the training split, keying the trained-tokenizer cache: a hash of its text,
    or for TFDS the prepared dataset's name, version, text key and size, without reading it."""
    return load_documents(data_cfg, 'train').fingerprint


def _unit_interval_hash(text: str) -> float:
    digest = hashlib.sha256(text.encode('utf-8')).digest()
    return int.from_bytes(digest[:8], 'big') / 2.0**64


def _fingerprint_texts(texts: Sequence[str], label: str) -> str:
    hasher = hashlib.sha256(label.encode('utf-8'))
    for text in texts:
        encoded = text.encode('utf-8')
        # Length-prefix each document so ["ab", "c"] and ["a", "bc"] differ.
        hasher.update(len(encoded).to_bytes(8, 'big'))
        hasher.update(encoded)
    return hasher.hexdigest()


def _split_by_content_hash(
    corpus: Sequence[str], corpus_name: str, split: str, val_fraction: float
) -> Documents:
    if not corpus:
        raise ValueError(
            f'The {corpus_name!r} corpus has no documents; check data.source'
            ' and data.text_files.')
    hashes = [_unit_interval_hash(text) for text in corpus]
    in_validation = [h < val_fraction for h in hashes]
    if val_fraction > 0 and not any(in_validation) and len(corpus) > 1:
        # A tiny corpus may get no validation document by chance; hold out the
        # one with the smallest hash so the split is still deterministic.
        in_validation[min(range(len(corpus)), key=hashes.__getitem__)] = True
    wanted = split == 'validation'
    texts = [text for text, is_val in zip(corpus, in_validation) if is_val == wanted]
    if not texts:
        if wanted:
            raise ValueError(
                f'The {corpus_name!r} corpus has no validation documents with'
                f' data.val_fraction={val_fraction}; set data.val_fraction > 0'
                ' and provide at least two documents.')
        raise ValueError(
            f'The {corpus_name!r} corpus has no training documents left after'
            f' holding out data.val_fraction={val_fraction}; lower'
            ' data.val_fraction or add documents.')
    label = f'{corpus_name}:{split}:val_fraction={val_fraction!r}'
    return Documents(texts, _fingerprint_texts(texts, label))


@functools.lru_cache(maxsize=1)
def _embedded_corpus() -> tuple[str, ...]:
    """pydoc help topics plus stdlib module docstrings, in a fixed order."""
    from pydoc_data import topics  # pylint: disable=import-outside-toplevel

    texts = [topics.topics[name] for name in sorted(topics.topics)]
    texts.extend(_stdlib_module_docstrings())
    documents = [chunk for text in texts for chunk in paragraph_chunks(text)]
    if not documents:
        raise ValueError(
            "The embedded corpus is empty (this Python has no pydoc_data);"
            " set data.source='text' with data.text_files, or 'tfds'.")
    return tuple(documents)


def _stdlib_module_docstrings() -> list[str]:
    stdlib_root = sysconfig.get_paths()['stdlib']
    docstrings = []
    for path in _stdlib_source_files(stdlib_root):
        docstring = _leading_docstring(path)
        if docstring and len(docstring) >= _MIN_DOCSTRING_CHARS:
            docstrings.append(docstring.strip())
    return docstrings


def _stdlib_source_files(stdlib_root: str) -> Iterator[str]:
    for dirpath, dirnames, filenames in os.walk(stdlib_root):
        # Sorting in place fixes os.walk's traversal order across machines.
        dirnames[:] = sorted(
            d for d in dirnames
            if d not in _STDLIB_DIRS_TO_SKIP and not d.startswith('config-')
        )
        for filename in sorted(filenames):
            if filename.endswith('.py'):
                yield os.path.join(dirpath, filename)


def _leading_docstring(path: str) -> str | None:
    """The module docstring, found by tokenizing only the head of the file."""
    skippable = (tokenize.ENCODING, tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE)
    try:
        with open(path, 'rb') as source_file:
            for token in tokenize.tokenize(source_file.readline):
                if token.type in skippable:
                    continue
                if token.type != tokenize.STRING:
                    return None
                value = ast.literal_eval(token.string)
                return value if isinstance(value, str) else None
    except (OSError, SyntaxError, ValueError, tokenize.TokenError):
        return None
    return None


def _text_file_identity(data_cfg: DataSection) -> tuple[tuple[str, int, int], ...]:
    """(path, size, mtime) of every matched file: the cache key for the corpus."""
    patterns = [p.strip() for p in data_cfg.text_files.split(',')]
    patterns = [p for p in patterns if p]
    if not patterns:
        raise ValueError(
            "data.source='text' needs data.text_files: a comma-separated list of"
            " paths or globs of UTF-8 text files.")
    paths: list[str] = []
    for pattern in patterns:
        matches = sorted(
            p for p in glob.glob(os.path.expanduser(pattern), recursive=True)
            if os.path.isfile(p)
        )
        if not matches:
            raise FileNotFoundError(
                f"data.text_files entry {pattern!r} matches no files; fix the"
                " path or glob (comma-separated, '**' allowed).")
        paths.extend(os.path.abspath(p) for p in matches)
    unique_paths = list(dict.fromkeys(paths))  # keeps first-seen order
    identity = []
    for path in unique_paths:
        stat = os.stat(path)
        identity.append((path, stat.st_size, stat.st_mtime_ns))
    return tuple(identity)


@functools.lru_cache(maxsize=8)
def _text_file_corpus(file_identity: tuple[tuple[str, int, int], ...]) -> tuple[str, ...]:
    documents: list[str] = []
    for path, _, _ in file_identity:
        try:
            with open(path, encoding='utf-8') as text_file:
                text = text_file.read()
        except UnicodeDecodeError as error:
            raise ValueError(
                f'{path} (from data.text_files) is not valid UTF-8: {error}.'
                ' Convert it to UTF-8 or drop it from data.text_files.') from error
        documents.extend(paragraph_chunks(text))
    if not documents:
        raise ValueError(
            'The files matched by data.text_files contain no text; point'
            ' data.text_files at non-empty UTF-8 files.')
    return tuple(documents)


def paragraph_chunks(text: str, target_chars: int = DOCUMENT_TARGET_CHARS) -> list[str]:
    """Splits `text` on blank lines and regroups paragraphs into >= target_chars chunks."""
    paragraphs = _PARAGRAPH_BREAK.split(text.replace('\r\n', '\n'))
    paragraphs = [p.strip('\n') for p in paragraphs if p.strip()]
    chunks: list[str] = []
    current: list[str] = []
    current_chars = 0
    for paragraph in paragraphs:
        current.append(paragraph)
        current_chars += len(paragraph)
        if current_chars >= target_chars:
            chunks.append('\n\n'.join(current))
            current, current_chars = [], 0
    if current:
        chunks.append('\n\n'.join(current))
    return chunks


def _load_tfds_documents(data_cfg: DataSection, split: str) -> TfdsDocuments:
    data_dir, name, text_key = data_cfg.data_dir, data_cfg.tfds_name, data_cfg.tfds_text_key
    if not data_dir:
        raise ValueError(
            "data.source='tfds' needs data.data_dir: the local TFDS data_dir"
            f" holding {name!r} prepared as array_record (downloads are"
            " disabled).")
    data_dir = os.path.abspath(os.path.expanduser(data_dir))
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(
            f'data.data_dir={data_dir!r} does not exist; set data.data_dir to'
            f' the TFDS data_dir that holds {name!r}.')
    tfds_source = _open_tfds_source(name, split, data_dir)
    features = getattr(tfds_source.dataset_info, 'features', None)
    if features is not None and text_key not in features:
        raise ValueError(
            f'data.tfds_text_key={text_key!r} is not a feature of {name!r};'
            f' it has {sorted(features.keys())}.')
    if len(tfds_source) == 0:
        raise ValueError(
            f'The {split!r} split of {name!r} in data.data_dir={data_dir!r} has'
            ' no documents; prepare the dataset there.')
    # Name/config/version identify the data; the data_dir path does not (the
    # same prepared dataset may be mounted elsewhere when a run resumes).
    fingerprint = (
        f'tfds:{tfds_source.dataset_info.full_name}:{text_key}:{split}:{len(tfds_source)}')
    return TfdsDocuments(tfds_source, text_key, fingerprint)


def _open_tfds_source(name: str, split: str, data_dir: str) -> Any:
    # Imported here: GPU benchmark machines do not have tensorflow_datasets.
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

    try:
        return tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    except Exception as error:  # tfds raises many types; all mean "not usable".
        raise ValueError(
            f'Could not open TFDS dataset data.tfds_name={name!r} split={split!r}'
            f' from data.data_dir={data_dir!r}: {type(error).__name__}:'
            f' {_first_line(error)}. Prepare it there in array_record format'
            ' (e.g. `tfds build --file_format=array_record`), or fix'
            ' data.tfds_name / data.data_dir.') from error


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ''
