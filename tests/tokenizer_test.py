"""Tests for mecefo_jax.data.tokenizer: training, exact round trips, caching, errors."""

import dataclasses
import os

import pytest

from mecefo_jax.config import base_config
from mecefo_jax.config.resolve import resolve
from mecefo_jax.data import sources as data_sources
from mecefo_jax.data import tokenizer as tokenizer_lib

VOCAB_SIZE = 512


def text_data_cfg(cache_dir, text_files, **overrides):
    fields = dict(source='text', text_files=str(text_files), cache_dir=str(cache_dir))
    fields.update(overrides)
    return dataclasses.replace(resolve(base_config()).data, **fields)


class TrainTextsSpy:
    """A `train_texts` callable that records how often training asked for text."""

    def __init__(self, data_cfg):
        self._data_cfg = data_cfg
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return data_sources.load_documents(self._data_cfg, 'train')


@pytest.fixture(scope='module')
def corpus_file(tmp_path_factory):
    """~100 KB of real English (part of the embedded corpus): trains in about a second."""
    embedded = data_sources.load_documents(resolve(base_config()).data, 'train')
    path = tmp_path_factory.mktemp('corpus') / 'docs.txt'
    path.write_text('\n\n'.join(embedded[:60]), encoding='utf-8')
    return path


@pytest.fixture(scope='module')
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp('tokenizer_cache')


@pytest.fixture(scope='module')
def data_cfg(cache_dir, corpus_file):
    return text_data_cfg(cache_dir, corpus_file)


@pytest.fixture(scope='module')
def trained(data_cfg):
    """(tokenizer, spy) for the corpus file, trained once for this module."""
    spy = TrainTextsSpy(data_cfg)
    tokenizer = tokenizer_lib.load_or_train_tokenizer(data_cfg, VOCAB_SIZE, spy)
    return tokenizer, spy


def test_trained_tokenizer_has_requested_vocab_and_special_ids(trained):
    tokenizer, spy = trained
    assert spy.calls == 1
    assert tokenizer.vocab_size == VOCAB_SIZE
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 2, 3)


@pytest.mark.parametrize('text', [
    'Return the absolute value of a number.',
    'def f(x):\n    return x  +  1\n\n\tindented',
    '  leading and trailing spaces  ',
    'Unicode survives via byte fallback: naïve café — 日本語 ✓',
])
def test_encode_decode_round_trip_is_exact(trained, text):
    tokenizer, _ = trained
    token_ids = tokenizer.encode(text)
    assert all(isinstance(i, int) for i in token_ids)
    assert all(0 <= i < VOCAB_SIZE for i in token_ids)
    assert tokenizer.decode(token_ids) == text


def test_second_call_loads_cache_instead_of_training(trained, data_cfg):
    first, _ = trained
    model_path = tokenizer_lib.cached_model_path(data_cfg, VOCAB_SIZE)
    mtime_before = os.stat(model_path).st_mtime_ns

    spy = TrainTextsSpy(data_cfg)
    second = tokenizer_lib.load_or_train_tokenizer(data_cfg, VOCAB_SIZE, spy)

    assert spy.calls == 0
    assert os.stat(model_path).st_mtime_ns == mtime_before
    assert second.model_path == model_path
    assert second.model_sha256 == first.model_sha256
    assert not [f for f in os.listdir(os.path.dirname(model_path)) if f.endswith('.tmp')]


def test_cache_key_depends_on_corpus_and_vocab(data_cfg, cache_dir, corpus_file, tmp_path):
    other_split = text_data_cfg(cache_dir, corpus_file, val_fraction=0.2)
    edited_file = tmp_path / 'edited.txt'
    edited_file.write_text(corpus_file.read_text() + '\n\nOne more paragraph.')
    edited = text_data_cfg(cache_dir, edited_file)
    path = tokenizer_lib.cached_model_path(data_cfg, 512)
    assert path == tokenizer_lib.cached_model_path(text_data_cfg(cache_dir, corpus_file), 512)
    assert path != tokenizer_lib.cached_model_path(data_cfg, 1024)
    assert path != tokenizer_lib.cached_model_path(other_split, 512)
    assert path != tokenizer_lib.cached_model_path(edited, 512)


def test_explicit_tokenizer_path_is_loaded_without_training(trained, tmp_path, corpus_file):
    tokenizer, _ = trained
    data_cfg = text_data_cfg(tmp_path, corpus_file, tokenizer_path=tokenizer.model_path)
    spy = TrainTextsSpy(data_cfg)
    loaded = tokenizer_lib.load_or_train_tokenizer(data_cfg, VOCAB_SIZE, spy)
    assert spy.calls == 0
    assert loaded.model_sha256 == tokenizer.model_sha256


def test_missing_tokenizer_path_names_the_field(tmp_path, corpus_file):
    data_cfg = text_data_cfg(tmp_path, corpus_file, tokenizer_path=str(tmp_path / 'nope.model'))
    with pytest.raises(FileNotFoundError, match='data.tokenizer_path'):
        tokenizer_lib.load_or_train_tokenizer(data_cfg, VOCAB_SIZE, lambda: [])


def test_unloadable_tokenizer_path_names_the_field(tmp_path, corpus_file):
    garbage = tmp_path / 'garbage.model'
    garbage.write_bytes(b'this is not a sentencepiece model')
    data_cfg = text_data_cfg(tmp_path, corpus_file, tokenizer_path=str(garbage))
    with pytest.raises(ValueError, match='data.tokenizer_path'):
        tokenizer_lib.load_or_train_tokenizer(data_cfg, VOCAB_SIZE, lambda: [])


def test_vocab_size_mismatch_names_both_fields(trained, tmp_path, corpus_file):
    tokenizer, _ = trained
    data_cfg = text_data_cfg(tmp_path, corpus_file, tokenizer_path=tokenizer.model_path)
    with pytest.raises(ValueError, match='data.tokenizer_path') as error:
        tokenizer_lib.load_or_train_tokenizer(data_cfg, 256, lambda: [])
    assert 'model.vocab_size' in str(error.value)
