"""The sentencepiece tokenizer: loading a given model, or training and caching one.

``data.tokenizer_path`` is loaded and checked against ``vocab_size``; otherwise a model
is trained on (a sample of) the training split once and cached under ``data.cache_dir``
by a hash of (corpus fingerprint, vocab_size, recipe). The recipe keeps text *exactly*
recoverable: identity normalisation, whitespace verbatim (code indentation survives),
newline and tab as pieces, and byte fallback once the vocabulary holds the 256 byte
pieces. Special ids: pad=0, unk=1, bos=2, eos=3. Every process of a job tokenizes with
the same bytes (`multihost.agreed_bytes`): process 0 loads or trains and broadcasts.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import sentencepiece as spm

from mecefo_jax.config.defaults import DataSection
from mecefo_jax.data import sources as data_sources
from mecefo_jax.host import files, multihost

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
# Bump when the training recipe below changes, so stale cached models are not reused.
_RECIPE_VERSION = 1
# Below this size the 256 byte-fallback pieces would crowd out real pieces (or
# not fit at all next to the corpus's characters).
_MIN_VOCAB_FOR_BYTE_FALLBACK = 512
# Enough text for a good vocabulary; more only slows training (C4 is ~800 GB).
_TRAINING_CHAR_BUDGET = 30_000_000
# sentencepiece silently drops training "sentences" over max_sentence_length: longer lines are cut.
_MAX_TRAINING_LINE_CHARS = 4096


class Tokenizer:
    """A thin wrapper over a sentencepiece model with the ids the pipeline needs."""

    def __init__(self, processor: spm.SentencePieceProcessor, model_path: str):
        self._processor = processor
        self.model_path = model_path
        self.vocab_size: int = processor.vocab_size()
        self.eos_id: int = processor.eos_id()
        self.bos_id: int = processor.bos_id()
        # Packed pretraining never pads; models without a pad piece pad with BOS (or EOS).
        self.pad_id: int = next(
            i for i in (processor.pad_id(), self.bos_id, self.eos_id) if i >= 0
        )
        serialized_model = processor.serialized_model_proto()
        self.model_sha256: str = hashlib.sha256(serialized_model).hexdigest()

    @classmethod
    def from_file(cls, model_path: str) -> Tokenizer:
        processor = spm.SentencePieceProcessor()
        processor.Load(model_path)
        return cls(processor, model_path)

    def encode(self, text: str) -> list[int]:
        return self._processor.EncodeAsIds(text)

    def decode(self, ids: Sequence[int] | Any) -> str:
        # Accepts numpy/JAX arrays too; sentencepiece wants a list of Python ints.
        return self._processor.DecodeIds([int(i) for i in ids])

    def __repr__(self) -> str:
        return f'Tokenizer(vocab_size={self.vocab_size}, model_path={self.model_path!r})'


# How to fix tokenizer models that differ between hosts (multihost.agreed_bytes).
_TOKENIZER_MISMATCH_HINT = (
    "data.tokenizer_path must name the same sentencepiece model on every host. Copy"
    " one .model file to every host (or onto a shared filesystem), or set"
    " data.tokenizer_path='' to let process 0 train one for all.")


def load_or_train_tokenizer(
    data_cfg: DataSection, vocab_size: int, train_texts: Callable[[], Iterable[str]]
) -> Tokenizer:
    """Loads `data.tokenizer_path`, or the cached or newly trained model for this corpus
    (`train_texts` is called only to train, so cache hits never touch the corpus)."""
    multi_process = _process_count() > 1
    tokenizer_path = data_cfg.tokenizer_path
    if tokenizer_path:
        if multi_process:
            multihost.agreed_bytes(lambda: _read_user_model(tokenizer_path), every_process_reads=True,
                mismatch_hint=_TOKENIZER_MISMATCH_HINT)
        tokenizer = _load_user_tokenizer(tokenizer_path)
        _check_vocab_size(tokenizer, vocab_size, 'data.tokenizer_path')
        return tokenizer
    model_path = cached_model_path(data_cfg, vocab_size)
    if multi_process:
        model_bytes = multihost.agreed_bytes(
            lambda: _cached_or_trained_bytes(model_path, vocab_size, train_texts),
            every_process_reads=False)
        _replace_if_different(model_bytes, model_path)
    elif not os.path.exists(model_path):
        model_bytes = train_sentencepiece(train_texts(), vocab_size)
        _publish_atomically(model_bytes, model_path)
    tokenizer = Tokenizer.from_file(model_path)
    _check_vocab_size(tokenizer, vocab_size, 'data.cache_dir')
    return tokenizer


def cached_model_path(data_cfg: DataSection, vocab_size: int) -> str:
    """Where the tokenizer trained for this corpus and vocab size is cached."""
    key = json.dumps(
        {
            'corpus': data_sources.corpus_fingerprint(data_cfg),
            'vocab_size': int(vocab_size),
            'recipe': _RECIPE_VERSION,
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode('utf-8')).hexdigest()[:20]
    filename = f'spm_v{int(vocab_size)}_{digest}.model'
    return os.path.join(os.path.expanduser(data_cfg.cache_dir), 'tokenizers', filename)


def train_sentencepiece(texts: Iterable[str], vocab_size: int) -> bytes:
    """Trains a unigram sentencepiece model on `texts`; returns the serialized model."""
    model_buffer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.Train(
            sentence_iterator=_training_lines(texts),
            model_writer=model_buffer,
            vocab_size=int(vocab_size),
            model_type='unigram',
            normalization_rule_name='identity',
            remove_extra_whitespaces=False,
            add_dummy_prefix=False,
            allow_whitespace_only_pieces=True,
            split_digits=True,
            byte_fallback=vocab_size >= _MIN_VOCAB_FOR_BYTE_FALLBACK,
            user_defined_symbols=['\n', '\t'],
            character_coverage=0.9995,
            max_sentence_length=4 * _MAX_TRAINING_LINE_CHARS,  # bytes; UTF-8 <= 4/char
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            num_threads=min(16, os.cpu_count() or 1),
            minloglevel=2,
        )
    except RuntimeError as error:
        raise ValueError(
            f'Training a sentencepiece tokenizer with vocab_size={vocab_size}'
            f' failed: {error}. The training corpus may be too small or too'
            ' varied for this vocabulary: change model.vocab_size, add text,'
            ' or set data.tokenizer_path to a pretrained model.') from error
    return model_buffer.getvalue()


def _training_lines(texts: Iterable[str]) -> Iterator[str]:
    """Non-blank lines of `texts`, cut to a safe length, up to the character budget."""
    chars_yielded = 0
    for text in texts:
        for line in text.split('\n'):
            if not line.strip():
                continue
            for start in range(0, len(line), _MAX_TRAINING_LINE_CHARS):
                piece = line[start:start + _MAX_TRAINING_LINE_CHARS]
                yield piece
                chars_yielded += len(piece)
                if chars_yielded >= _TRAINING_CHAR_BUDGET:
                    return


def _process_count() -> int:
    # A multi-process run has imported jax (jax.distributed.initialize); tokenizer tooling
    # without it stays free of JAX start-up.
    if 'jax' not in sys.modules:
        return 1
    import jax
    return jax.process_count()


def _cached_or_trained_bytes(
    model_path: str, vocab_size: int, train_texts: Callable[[], Iterable[str]]
) -> bytes:
    if not os.path.exists(model_path):
        _publish_atomically(train_sentencepiece(train_texts(), vocab_size), model_path)
    # Read back what was published: another job sharing the cache may have won.
    with open(model_path, 'rb') as f:
        return f.read()


def _replace_if_different(model_bytes: bytes, model_path: str) -> None:
    """Makes `model_path` hold exactly `model_bytes` (a stale model is replaced)."""
    try:
        with open(model_path, 'rb') as f:
            if f.read() == model_bytes:
                return
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(model_path), exist_ok=True)
    files.write_bytes(model_path, model_bytes)  # readers see the old or the new model


def _publish_atomically(model_bytes: bytes, model_path: str) -> None:
    """Writes the model so that concurrent trainers all load one file, never a partial one: the
    first to link it into place wins (sentencepiece training is not bit-reproducible across
    thread schedules); without hard links the last writer wins."""
    os.makedirs(os.path.dirname(model_path), exist_ok=True)
    files.create_bytes(model_path, model_bytes, replace_without_links=True)


def _user_model_file(tokenizer_path: str) -> str:
    path = os.path.expanduser(tokenizer_path)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"data.tokenizer_path={tokenizer_path!r} does not exist; point it at"
            " a sentencepiece .model file, or set it to '' to train one.")
    return path


def _read_user_model(tokenizer_path: str) -> bytes:
    with open(_user_model_file(tokenizer_path), 'rb') as f:
        return f.read()


def _load_user_tokenizer(tokenizer_path: str) -> Tokenizer:
    path = _user_model_file(tokenizer_path)
    try:
        tokenizer = Tokenizer.from_file(path)
    except (OSError, RuntimeError) as error:
        raise ValueError(
            f"data.tokenizer_path={tokenizer_path!r} is not a loadable"
            f" sentencepiece model ({error}); point it at a .model file, or set"
            " it to '' to train one.") from error
    if tokenizer.eos_id < 0:
        raise ValueError(
            f'The model at data.tokenizer_path={tokenizer_path!r} has no EOS'
            ' piece, which packing needs between documents; use a model'
            ' trained with an eos_id.')
    return tokenizer


def _check_vocab_size(tokenizer: Tokenizer, vocab_size: int, source_field: str) -> None:
    if tokenizer.vocab_size != vocab_size:
        raise ValueError(
            f"The tokenizer from {source_field} ({tokenizer.model_path}) has"
            f" vocab size {tokenizer.vocab_size}, but model.vocab_size is"
            f" {vocab_size}; make them equal (or set data.tokenizer_path='' to"
            " train a matching tokenizer).")
