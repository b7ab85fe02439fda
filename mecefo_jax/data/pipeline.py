"""The training/validation input pipeline: documents -> sharded token batches.

    document indices -> seeded shuffle (fresh permutation every epoch, forever)
      -> tokenize + EOS            (Grain worker threads)
      -> concatenate-then-split into rows of seq_len + 1 tokens
      -> global batch of data.global_batch_size rows
      -> reshape to [num_shards, shard_batch_size, seq_len + 1]

The stream of rows does not depend on ``num_shards``, so a failure changes *where* a
shard is computed, never *which* samples it holds, and a run may resume with another
``mesh.data``. The iterator state is a small JSON dict (the document being packed and
the offset in it), so resuming re-reads one document: O(1) in the steps taken.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

import grain
import numpy as np

from mecefo_jax.config.defaults import DataSection
from mecefo_jax.data import sources as data_sources
from mecefo_jax.data.tokenizer import Tokenizer, load_or_train_tokenizer

# Validation's fixed shuffle seed: evals see the same batches whatever data.seed a run uses.
_VALIDATION_SHUFFLE_SEED = 0x5EED
# Documents sampled, evenly spaced, to train a tokenizer: first use stays cheap on C4-scale splits.
_TOKENIZER_SAMPLE_DOCUMENTS = 100_000
_STATE_FORMAT = 1


class DataPipeline:
    """An endless, checkpointable iterator over sharded token batches."""

    def __init__(
        self,
        *,
        dataset: grain.IterDataset,
        tokenizer: Tokenizer,
        num_shards: int,
        shard_batch_size: int,
        seq_len: int,
        split: str,
        fingerprint: str,
    ):
        self.tokenizer = tokenizer
        self.num_shards = num_shards
        self.shard_batch_size = shard_batch_size
        self.global_batch_size = num_shards * shard_batch_size
        self.seq_len = seq_len
        self.split = split
        self._fingerprint = fingerprint
        self._iterator = iter(dataset)

    def __iter__(self) -> DataPipeline:
        return self

    def __next__(self) -> np.ndarray:
        """int32 tokens [num_shards, shard_batch_size, seq_len + 1]."""
        tokens_sbt, _ = self.next_with_provenance()
        return tokens_sbt

    def next_with_provenance(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Next batch plus, per token and in its shape, where it came from (tests, debugging):
        'stream_index', its document's place in the endless shuffled stream (unique across
        epochs); 'document_index', in the split; 'position', within the document."""
        rows = next(self._iterator)
        shape = (self.num_shards, self.shard_batch_size, self.seq_len + 1)
        tokens_sbt = rows['tokens'].reshape(shape)
        provenance = {key: rows[key].reshape(shape) for key in _PROVENANCE_KEYS}
        return tokens_sbt, provenance

    def get_state(self) -> dict[str, Any]:
        """JSON-serialisable position; restore with `set_state` on a same-config pipeline."""
        state = {
            'format': _STATE_FORMAT,
            'fingerprint': self._fingerprint,
            'iterator': self._iterator.get_state(),
        }
        # Round-tripping proves serialisability now, not at checkpoint time, and
        # detaches the result from live iterator internals.
        return json.loads(json.dumps(state))

    def set_state(self, state: dict[str, Any]) -> None:
        if state.get('format') != _STATE_FORMAT:
            raise ValueError(
                f"Unsupported data pipeline state format {state.get('format')!r};"
                f" expected {_STATE_FORMAT}.")
        if state.get('fingerprint') != self._fingerprint:
            raise ValueError(
                'The data pipeline state was saved by a pipeline with a different'
                ' corpus, tokenizer, data.seq_len, data.global_batch_size,'
                ' data.seed or split; resume with the same data config.')
        self._iterator.set_state(copy.deepcopy(state['iterator']))


def make_pipeline(
    data_cfg: DataSection, *, vocab_size: int, num_shards: int, split: str = 'train'
) -> DataPipeline:
    """Builds the pipeline for `split`; trains/caches the tokenizer on first use."""
    seq_len, global_batch_size = _checked_batch_shape(data_cfg, num_shards)
    documents = data_sources.load_documents(data_cfg, split)
    tokenizer = load_or_train_tokenizer(
        data_cfg, vocab_size, lambda: _tokenizer_training_texts(data_cfg)
    )
    row_len = seq_len + 1
    _check_split_fills_one_batch(documents, tokenizer, global_batch_size * row_len, split)
    shuffle_seed = _shuffle_seed(data_cfg, split)
    dataset = _build_dataset(
        documents,
        tokenizer,
        row_len=row_len,
        global_batch_size=global_batch_size,
        shuffle_seed=shuffle_seed,
    )
    fingerprint = _pipeline_fingerprint(
        documents.fingerprint, tokenizer.model_sha256, row_len,
        global_batch_size, shuffle_seed, split,
    )
    return DataPipeline(
        dataset=dataset,
        tokenizer=tokenizer,
        num_shards=num_shards,
        shard_batch_size=global_batch_size // num_shards,
        seq_len=seq_len,
        split=split,
        fingerprint=fingerprint,
    )


def _checked_batch_shape(data_cfg: DataSection, num_shards: int) -> tuple[int, int]:
    seq_len, global_batch_size = data_cfg.seq_len, data_cfg.global_batch_size
    if num_shards < 1:
        raise ValueError(f'num_shards (mesh.data) must be >= 1, got {num_shards}.')
    if global_batch_size < 1 or global_batch_size % num_shards:
        raise ValueError(
            f'data.global_batch_size={global_batch_size} must be a positive'
            f' multiple of the number of data shards mesh.data={num_shards};'
            ' change data.global_batch_size or mesh.data so it divides evenly.')
    return seq_len, global_batch_size


def _check_split_fills_one_batch(
    documents: Sequence[str], tokenizer: Tokenizer, tokens_needed: int, split: str
) -> None:
    """Refuses splits so small that one batch would repeat its own documents; stops tokenizing
    once one batch is filled, so C4-sized splits cost only a few documents."""
    tokens_seen = 0
    for document in documents:
        tokens_seen += len(tokenizer.encode(document)) + 1  # + EOS
        if tokens_seen >= tokens_needed:
            return
    raise ValueError(
        f'The {split!r} split has only {tokens_seen} tokens, fewer than one'
        f' global batch needs (data.global_batch_size x (data.seq_len + 1) ='
        f' {tokens_needed}). Add text to the corpus, lower'
        ' data.global_batch_size or data.seq_len, or (for validation) raise'
        ' data.val_fraction.')


def _shuffle_seed(data_cfg: DataSection, split: str) -> int:
    if split != 'train':
        return _VALIDATION_SHUFFLE_SEED
    # Grain shuffles need a seed in [0, 2**32).
    return data_cfg.seed % 2**32


def _pipeline_fingerprint(*parts: Any) -> str:
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode('utf-8')).hexdigest()


def _tokenizer_training_texts(data_cfg: DataSection) -> Iterable[str]:
    """An evenly spaced sample of training documents (all of them if few)."""
    train_documents = data_sources.load_documents(data_cfg, 'train')
    stride = max(1, len(train_documents) // _TOKENIZER_SAMPLE_DOCUMENTS)
    if stride == 1:
        return train_documents
    return (train_documents[i] for i in range(0, len(train_documents), stride))


_PROVENANCE_KEYS = ('stream_index', 'document_index', 'position')


def _build_dataset(
    documents: Sequence[str],
    tokenizer: Tokenizer,
    *,
    row_len: int,
    global_batch_size: int,
    shuffle_seed: int,
) -> grain.IterDataset:
    def tokenize(stream_index: int, document_index: int) -> dict[str, Any]:
        token_ids = tokenizer.encode(documents[document_index])
        token_ids.append(tokenizer.eos_id)
        return {
            'tokens': np.asarray(token_ids, dtype=np.int32),
            'stream_index': stream_index,
            'document_index': int(document_index),
        }

    # shuffle-then-repeat: each epoch gets its own permutation (seed + epoch).
    document_stream = (
        grain.MapDataset.range(len(documents))
        .shuffle(seed=shuffle_seed)
        .repeat()
        .map_with_index(tokenize)
    )
    tokenized = document_stream.to_iter_dataset(
        grain.ReadOptions(num_threads=min(8, os.cpu_count() or 1),
                          prefetch_buffer_size=_prefetch_documents(global_batch_size))
    )
    rows = _PackedRowsIterDataset(tokenized, row_len=row_len)
    return rows.batch(global_batch_size, drop_remainder=True)


def _prefetch_documents(global_batch_size: int) -> int:
    """Documents tokenized ahead of the batch being packed: two per row, from 32 to 256. A tiny
    run prefetching 256 for batches of 16 rows spent several times its data's CPU on documents
    it never used; prefetching changes when a document is tokenized, never which one."""
    return max(32, min(256, 2 * global_batch_size))


class _PackedRowsIterDataset(grain.IterDataset):
    """Concatenates tokenized documents and cuts the stream into rows of row_len."""

    def __init__(self, parent: grain.IterDataset, *, row_len: int):
        super().__init__(parent)
        self._row_len = row_len

    def __iter__(self) -> _PackedRowsIterator:
        return _PackedRowsIterator(self._parent.__iter__(), row_len=self._row_len)


class _PackedRowsIterator(grain.DatasetIterator):
    """Packs without padding, every token in exactly one row. The state is (parent state *before*
    the current document, offset into it): a restore fetches that one document again."""

    def __init__(self, parent: grain.DatasetIterator, *, row_len: int):
        super().__init__(parent)
        self._row_len = row_len
        self._document: dict[str, Any] | None = None
        self._state_before_document = copy.deepcopy(parent.get_state())
        self._offset = 0

    def _advance_to_next_document(self) -> None:
        self._state_before_document = copy.deepcopy(self._parent.get_state())
        self._document = next(self._parent)
        self._offset = 0

    def _remaining_in_document(self) -> int:
        if self._document is None:
            return 0
        return len(self._document['tokens']) - self._offset

    def __next__(self) -> dict[str, np.ndarray]:
        row = {
            'tokens': np.empty(self._row_len, np.int32),
            'stream_index': np.empty(self._row_len, np.int64),
            'document_index': np.empty(self._row_len, np.int64),
            'position': np.empty(self._row_len, np.int32),
        }
        filled = 0
        while filled < self._row_len:
            if self._remaining_in_document() == 0:
                self._advance_to_next_document()
                continue
            take = min(self._row_len - filled, self._remaining_in_document())
            self._copy_into(row, filled, take)
            filled += take
            self._offset += take
        return row

    def _copy_into(self, row: dict[str, np.ndarray], start: int, count: int) -> None:
        document = self._document
        stop = start + count
        row['tokens'][start:stop] = document['tokens'][self._offset:self._offset + count]
        row['stream_index'][start:stop] = document['stream_index']
        row['document_index'][start:stop] = document['document_index']
        row['position'][start:stop] = np.arange(self._offset, self._offset + count)

    def get_state(self) -> dict[str, Any]:
        return {
            'state_before_document': copy.deepcopy(self._state_before_document),
            'has_document': self._document is not None,
            'offset': self._offset,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(copy.deepcopy(state['state_before_document']))
        self._state_before_document = copy.deepcopy(state['state_before_document'])
        self._document = next(self._parent) if state['has_document'] else None
        self._offset = int(state['offset'])
