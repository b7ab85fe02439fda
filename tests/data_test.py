"""Tests for mecefo_jax.data and mecefo_jax.data.sources.

Sample provenance (`DataPipeline.next_with_provenance`) lets these tests check
sharding and resumption token by token instead of by comparing content only.
"""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from mecefo_jax.config import base_config
from mecefo_jax.config.resolve import resolve
from mecefo_jax.data import pipeline as data
from mecefo_jax.data import sources as data_sources

VOCAB_SIZE = 512
SEQ_LEN = 16
GLOBAL_BATCH = 8
NUM_SHARDS = 4


def data_cfg_for(cache_dir, **overrides):
    """The base data section with these fields (unchecked: the module's own errors show)."""
    fields = dict(cache_dir=str(cache_dir), seq_len=SEQ_LEN, global_batch_size=GLOBAL_BATCH,
                  seed=7)
    fields.update(overrides)
    return dataclasses.replace(resolve(base_config()).data, **fields)


@pytest.fixture(scope='module')
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp('data_cache')


@pytest.fixture(scope='module')
def embedded_cfg(cache_dir):
    cfg = data_cfg_for(cache_dir)
    data.make_pipeline(cfg, vocab_size=VOCAB_SIZE, num_shards=NUM_SHARDS)  # trains once
    return cfg


@pytest.fixture(scope='module')
def tokenizer_path(embedded_cfg):
    """A trained model file, so other sources can skip tokenizer training."""
    pipeline = data.make_pipeline(embedded_cfg, vocab_size=VOCAB_SIZE, num_shards=1)
    return pipeline.tokenizer.model_path


def take(pipeline, count):
    return [next(pipeline) for _ in range(count)]


def assert_tokens_match_provenance(tokens_sbt, provenance, documents, tokenizer):
    """Every token is the token its provenance names in the EOS-terminated document."""
    encoded = {}
    for token, document_index, position in zip(tokens_sbt.ravel(),
                                               provenance['document_index'].ravel(),
                                               provenance['position'].ravel()):
        document_index = int(document_index)
        if document_index not in encoded:
            encoded[document_index] = (tokenizer.encode(documents[document_index])
                                       + [tokenizer.eos_id])
        assert token == encoded[document_index][position]


def assert_same_batches(batches_a, batches_b):
    assert len(batches_a) == len(batches_b)
    for a, b in zip(batches_a, batches_b):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------
# Shapes, determinism, sharding.


def test_batches_have_sharded_shape_and_dtype(embedded_cfg):
    pipeline = data.make_pipeline(embedded_cfg, vocab_size=VOCAB_SIZE, num_shards=NUM_SHARDS)
    tokens_sbt = next(iter(pipeline))
    assert tokens_sbt.shape == (NUM_SHARDS, GLOBAL_BATCH // NUM_SHARDS, SEQ_LEN + 1)
    assert tokens_sbt.dtype == np.int32
    assert pipeline.shard_batch_size == GLOBAL_BATCH // NUM_SHARDS
    assert pipeline.num_shards == NUM_SHARDS and pipeline.seq_len == SEQ_LEN
    assert tokens_sbt.min() >= 0 and tokens_sbt.max() < VOCAB_SIZE


def test_same_config_gives_same_batches(embedded_cfg):
    first = data.make_pipeline(embedded_cfg, vocab_size=VOCAB_SIZE, num_shards=NUM_SHARDS)
    second = data.make_pipeline(embedded_cfg, vocab_size=VOCAB_SIZE, num_shards=NUM_SHARDS)
    assert_same_batches(take(first, 6), take(second, 6))


def test_seed_changes_document_order(embedded_cfg):
    reseeded_cfg = data_cfg_for(embedded_cfg.cache_dir, seed=8)
    first = data.make_pipeline(embedded_cfg, vocab_size=VOCAB_SIZE, num_shards=1)
    reseeded = data.make_pipeline(reseeded_cfg, vocab_size=VOCAB_SIZE, num_shards=1)
    assert not np.array_equal(next(first), next(reseeded))


def test_shard_count_does_not_change_which_rows_are_in_the_global_batch(embedded_cfg):
    two_shards = data.make_pipeline(embedded_cfg, vocab_size=VOCAB_SIZE, num_shards=2)
    eight_shards = data.make_pipeline(embedded_cfg, vocab_size=VOCAB_SIZE, num_shards=8)
    for _ in range(3):
        np.testing.assert_array_equal(
            next(two_shards).reshape(GLOBAL_BATCH, -1),
            next(eight_shards).reshape(GLOBAL_BATCH, -1),
        )


def test_shards_are_disjoint_fixed_slices_of_one_token_stream(embedded_cfg):
    """Flattened in shard order, batches are exactly the packed document stream."""
    pipeline = data.make_pipeline(embedded_cfg, vocab_size=VOCAB_SIZE, num_shards=NUM_SHARDS)
    documents = data_sources.load_documents(embedded_cfg, 'train')
    seen_tokens = set()
    previous = (-1, 0)  # (stream_index, position) before the stream's first token
    for _ in range(5):
        tokens_sbt, provenance = pipeline.next_with_provenance()
        for shard in range(NUM_SHARDS):
            shard_tokens = {
                (int(s), int(p))
                for s, p in zip(provenance['stream_index'][shard].ravel(),
                                provenance['position'][shard].ravel())
            }
            assert not shard_tokens & seen_tokens, 'a token appears in two shards'
            seen_tokens |= shard_tokens
        stream = provenance['stream_index'].ravel()
        position = provenance['position'].ravel()
        for s, p in zip(stream, position):
            same_document_next_token = (s, p) == (previous[0], previous[1] + 1)
            next_document_start = (s, p) == (previous[0] + 1, 0)
            assert same_document_next_token or next_document_start
            previous = (s, p)
    assert_tokens_match_provenance(tokens_sbt, provenance, documents, pipeline.tokenizer)


def test_every_document_is_seen_once_per_epoch(tmp_path, tokenizer_path):
    # Long paragraphs, so that paragraph chunking yields many documents.
    paragraphs = [f'Paragraph {i} talks about topic number {i}. ' * 20 for i in range(30)]
    corpus_file = tmp_path / 'small.txt'
    corpus_file.write_text('\n\n'.join(paragraphs))
    cfg = data_cfg_for(tmp_path, source='text', text_files=str(corpus_file),
                       tokenizer_path=tokenizer_path, val_fraction=0.0,
                       seq_len=31, global_batch_size=2)
    pipeline = data.make_pipeline(cfg, vocab_size=VOCAB_SIZE, num_shards=2)
    num_documents = len(data_sources.load_documents(cfg, 'train'))
    starts = {}  # stream_index -> document_index, for documents that started
    while len(starts) < 3 * num_documents:
        _, provenance = pipeline.next_with_provenance()
        is_start = provenance['position'] == 0
        starts.update(zip(provenance['stream_index'][is_start].tolist(),
                          provenance['document_index'][is_start].tolist()))
    epoch_orders = [
        [starts[epoch * num_documents + i] for i in range(num_documents)] for epoch in range(3)
    ]
    for order in epoch_orders:
        assert sorted(order) == list(range(num_documents))
    assert epoch_orders[0] != epoch_orders[1], 'each epoch should be reshuffled'


# --------------------------------------------------------------------------
# Train/validation split.


def test_embedded_train_and_validation_documents_are_disjoint(embedded_cfg):
    train = data_sources.load_documents(embedded_cfg, 'train')
    validation = data_sources.load_documents(embedded_cfg, 'validation')
    assert len(validation) > 0 and len(train) > 10 * len(validation)
    assert not set(train) & set(validation)
    assert sum(map(len, train)) + sum(map(len, validation)) > 500_000  # ~0.5 MB of text
    # Deterministic: loading again yields the same split.
    assert list(data_sources.load_documents(embedded_cfg, 'validation')) == list(validation)


def test_validation_pipeline_reads_only_validation_documents(embedded_cfg):
    validation = data_sources.load_documents(embedded_cfg, 'validation')
    pipeline = data.make_pipeline(embedded_cfg, vocab_size=VOCAB_SIZE,
                                  num_shards=NUM_SHARDS, split='validation')
    tokens_sbt, provenance = pipeline.next_with_provenance()
    assert tokens_sbt.shape == (NUM_SHARDS, GLOBAL_BATCH // NUM_SHARDS, SEQ_LEN + 1)
    assert_tokens_match_provenance(tokens_sbt, provenance, validation, pipeline.tokenizer)


# --------------------------------------------------------------------------
# Checkpointing.


@pytest.mark.parametrize('batches_before_save', [0, 3, 7])
def test_resume_from_state_reproduces_following_batches(embedded_cfg, batches_before_save):
    original = data.make_pipeline(embedded_cfg, vocab_size=VOCAB_SIZE, num_shards=NUM_SHARDS)
    take(original, batches_before_save)
    state = json.loads(json.dumps(original.get_state()))  # as a checkpoint would
    expected = take(original, 5)

    resumed = data.make_pipeline(embedded_cfg, vocab_size=VOCAB_SIZE, num_shards=NUM_SHARDS)
    next(resumed)  # a fresh pipeline that already moved must still jump back
    resumed.set_state(state)
    assert_same_batches(take(resumed, 5), expected)


def test_resume_across_document_boundaries_with_long_rows(embedded_cfg):
    cfg = data_cfg_for(embedded_cfg.cache_dir, seq_len=300, global_batch_size=4)
    original = data.make_pipeline(cfg, vocab_size=VOCAB_SIZE, num_shards=2)
    states_and_batches = []
    for _ in range(6):
        states_and_batches.append((original.get_state(), next(original)))
    resumed = data.make_pipeline(cfg, vocab_size=VOCAB_SIZE, num_shards=2)
    for state, batch in states_and_batches:
        resumed.set_state(state)
        np.testing.assert_array_equal(next(resumed), batch)


def test_state_from_a_different_config_is_refused(embedded_cfg):
    state = data.make_pipeline(embedded_cfg, vocab_size=VOCAB_SIZE, num_shards=1).get_state()
    other_cfg = data_cfg_for(embedded_cfg.cache_dir, seed=123)
    other = data.make_pipeline(other_cfg, vocab_size=VOCAB_SIZE, num_shards=1)
    with pytest.raises(ValueError, match='same data config'):
        other.set_state(state)


# --------------------------------------------------------------------------
# Text-file and TFDS sources.


def write_text_corpus(directory, embedded_cfg, num_files=3):
    """Real English paragraphs (from the embedded corpus) spread over files."""
    documents = data_sources.load_documents(embedded_cfg, 'train')
    directory.mkdir(parents=True, exist_ok=True)
    for file_index in range(num_files):
        chunk = documents[file_index * 20:(file_index + 1) * 20]
        (directory / f'part{file_index}.txt').write_text('\n\n'.join(chunk), encoding='utf-8')
    return documents[:num_files * 20]


def test_text_file_source_trains_tokenizer_and_batches(tmp_path, embedded_cfg):
    written = write_text_corpus(tmp_path / 'corpus', embedded_cfg)
    cfg = data_cfg_for(tmp_path / 'cache', source='text',
                       text_files=f'{tmp_path}/corpus/part0.txt, {tmp_path}/corpus/part[12].txt',
                       val_fraction=0.1)
    pipeline = data.make_pipeline(cfg, vocab_size=256, num_shards=2)
    assert pipeline.tokenizer.vocab_size == 256
    assert str(tmp_path / 'cache') in pipeline.tokenizer.model_path
    tokens_sbt = next(pipeline)
    assert tokens_sbt.shape == (2, GLOBAL_BATCH // 2, SEQ_LEN + 1)

    train = data_sources.load_documents(cfg, 'train')
    validation = data_sources.load_documents(cfg, 'validation')
    assert len(validation) > 0 and not set(train) & set(validation)
    written_text = '\n\n'.join(written)
    assert all(document in written_text for document in list(train) + list(validation))


def test_text_file_documents_are_paragraph_chunks():
    text = 'first para\nline two\n\n  \nsecond para\n\n\nthird'
    assert data_sources.paragraph_chunks(text, target_chars=1) == [
        'first para\nline two', 'second para', 'third']
    assert data_sources.paragraph_chunks(text, target_chars=25) == [
        'first para\nline two\n\nsecond para', 'third']


@pytest.fixture(scope='module')
def tiny_tfds_dir(tmp_path_factory, embedded_cfg):
    """A real array_record TFDS dataset, written without TensorFlow."""
    tfds = pytest.importorskip('tensorflow_datasets')
    documents = list(data_sources.load_documents(embedded_cfg, 'train'))[:60]

    class MecefoTinyText(tfds.core.GeneratorBasedBuilder):
        """Stand-in for c4/en: a 'text' feature, 'train' and 'validation' splits."""

        VERSION = tfds.core.Version('1.0.0')
        BUILDER_CONFIGS = [tfds.core.BuilderConfig(name='en')]

        def _info(self):
            features = tfds.features.FeaturesDict({'text': tfds.features.Text()})
            return tfds.core.DatasetInfo(builder=self, features=features)

        def _split_generators(self, dl_manager):
            return {
                'train': self._generate_examples(documents[:50], 'train'),
                'validation': self._generate_examples(documents[50:], 'validation'),
            }

        def _generate_examples(self, texts, split):
            for index, text in enumerate(texts):
                yield f'{split}-{index}', {'text': text}

    data_dir = tmp_path_factory.mktemp('tfds')
    builder = MecefoTinyText(config='en', data_dir=str(data_dir), file_format='array_record')
    builder.download_and_prepare()
    return data_dir, documents


def test_tfds_source_reads_array_record_splits(tiny_tfds_dir, tokenizer_path, cache_dir):
    data_dir, documents = tiny_tfds_dir
    cfg = data_cfg_for(cache_dir, source='tfds', tfds_name='mecefo_tiny_text/en',
                       data_dir=str(data_dir), tokenizer_path=tokenizer_path)
    train = data_sources.load_documents(cfg, 'train')
    validation = data_sources.load_documents(cfg, 'validation')
    assert (len(train), len(validation)) == (50, 10)
    assert sorted(train) == sorted(documents[:50])
    assert sorted(validation) == sorted(documents[50:])
    for split in ('train', 'validation'):
        pipeline = data.make_pipeline(cfg, vocab_size=VOCAB_SIZE, num_shards=2, split=split)
        assert next(pipeline).shape == (2, GLOBAL_BATCH // 2, SEQ_LEN + 1)


def test_tfds_source_trains_its_own_tokenizer(tiny_tfds_dir, tmp_path):
    data_dir, _ = tiny_tfds_dir
    cfg = data_cfg_for(tmp_path, source='tfds', tfds_name='mecefo_tiny_text/en',
                       data_dir=str(data_dir))
    pipeline = data.make_pipeline(cfg, vocab_size=256, num_shards=2)
    state = pipeline.get_state()
    expected = take(pipeline, 3)
    resumed = data.make_pipeline(cfg, vocab_size=256, num_shards=2)
    resumed.set_state(state)
    assert_same_batches(take(resumed, 3), expected)


@pytest.mark.subprocess
def test_non_tfds_sources_do_not_import_tensorflow_datasets():
    """GPU benchmark machines lack tensorflow_datasets; only source='tfds' may need it."""
    probe = (
        "import sys\n"
        "from mecefo_jax.config import base_config\n"
        "from mecefo_jax.data import pipeline, sources as data_sources, tokenizer\n"
        "from mecefo_jax.config.resolve import resolve\n"
        "data_sources.load_documents(resolve(base_config()).data, 'train')\n"
        "assert 'tensorflow_datasets' not in sys.modules, 'tensorflow_datasets was imported'\n"
    )
    subprocess.run([sys.executable, '-c', probe], check=True)


# --------------------------------------------------------------------------
# Error paths: each names the config field to fix.


def test_tfds_without_data_dir_names_the_field(tmp_path):
    cfg = data_cfg_for(tmp_path, source='tfds', data_dir='')
    with pytest.raises(ValueError, match='data.data_dir'):
        data.make_pipeline(cfg, vocab_size=VOCAB_SIZE, num_shards=1)


def test_tfds_with_nonexistent_data_dir_names_the_field(tmp_path):
    cfg = data_cfg_for(tmp_path, source='tfds', data_dir=str(tmp_path / 'missing'))
    with pytest.raises(FileNotFoundError, match='data.data_dir'):
        data.make_pipeline(cfg, vocab_size=VOCAB_SIZE, num_shards=1)


def test_tfds_dataset_not_in_data_dir_names_the_fields(tmp_path):
    cfg = data_cfg_for(tmp_path, source='tfds', tfds_name='no_such_dataset_xyz',
                       data_dir=str(tmp_path))
    with pytest.raises(ValueError, match='data.tfds_name') as error:
        data_sources.load_documents(cfg, 'train')
    assert 'data.data_dir' in str(error.value)


def test_text_glob_matching_nothing_names_the_field(tmp_path):
    cfg = data_cfg_for(tmp_path, source='text', text_files=str(tmp_path / '*.txt'))
    with pytest.raises(FileNotFoundError, match='data.text_files'):
        data.make_pipeline(cfg, vocab_size=VOCAB_SIZE, num_shards=1)


def test_text_files_unset_names_the_field(tmp_path):
    cfg = data_cfg_for(tmp_path, source='text', text_files='')
    with pytest.raises(ValueError, match='data.text_files'):
        data_sources.load_documents(cfg, 'train')


def test_text_files_without_text_names_the_field(tmp_path):
    (tmp_path / 'blank.txt').write_text('\n\n   \n')
    cfg = data_cfg_for(tmp_path, source='text', text_files=str(tmp_path / '*.txt'))
    with pytest.raises(ValueError, match='data.text_files'):
        data.make_pipeline(cfg, vocab_size=VOCAB_SIZE, num_shards=1)


def test_unknown_source_names_the_field(tmp_path):
    with pytest.raises(ValueError, match='data.source'):
        data_sources.load_documents(data_cfg_for(tmp_path, source='web'), 'train')


def test_validation_without_held_out_fraction_names_the_field(embedded_cfg):
    cfg = data_cfg_for(embedded_cfg.cache_dir, val_fraction=0.0)
    with pytest.raises(ValueError, match='data.val_fraction'):
        data_sources.load_documents(cfg, 'validation')


def test_batch_not_divisible_by_shards_names_both_fields(embedded_cfg):
    cfg = data_cfg_for(embedded_cfg.cache_dir, global_batch_size=6)
    with pytest.raises(ValueError, match='data.global_batch_size') as error:
        data.make_pipeline(cfg, vocab_size=VOCAB_SIZE, num_shards=4)
    assert 'mesh.data' in str(error.value)


def test_corpus_too_small_for_one_batch_names_the_fields(tmp_path, tokenizer_path):
    (tmp_path / 'tiny.txt').write_text('A short first paragraph.\n\nAnd a second one.')
    cfg = data_cfg_for(tmp_path, source='text', text_files=str(tmp_path / 'tiny.txt'),
                       tokenizer_path=tokenizer_path, seq_len=64, global_batch_size=4)
    with pytest.raises(ValueError, match='data.global_batch_size') as error:
        data.make_pipeline(cfg, vocab_size=VOCAB_SIZE, num_shards=2)
    assert 'data.seq_len' in str(error.value)


def test_bad_tokenizer_path_names_the_field(tmp_path):
    cfg = data_cfg_for(tmp_path, tokenizer_path=str(tmp_path / 'missing.model'))
    with pytest.raises(FileNotFoundError, match='data.tokenizer_path'):
        data.make_pipeline(cfg, vocab_size=VOCAB_SIZE, num_shards=1)


def test_tokenizer_vocab_mismatch_names_the_fields(tmp_path, tokenizer_path):
    cfg = data_cfg_for(tmp_path, tokenizer_path=tokenizer_path)
    with pytest.raises(ValueError, match='model.vocab_size'):
        data.make_pipeline(cfg, vocab_size=VOCAB_SIZE * 2, num_shards=1)
