"""Hugging Face LLaMA in and out (`model/hf_llama.py`, `training/export.py`), checked by transformers.

transformers' own Flax LLaMA (FlaxLlamaForCausalLM, which reads the PyTorch layout of
model.safetensors through its own converter) is the implementation we did not write: it
must give our logits, its LlamaTokenizer our ids, and its weights our import; an import
exported again must be the same file; a run started from an export must see the
exporting run's validation loss. The tiny config has GQA (4 query heads, 2 KV heads) and
an untied head.
"""
import json
import os

import flax
import jax
import numpy as np
import pytest

from configs.tiny import get_config
from mecefo_jax.config.resolve import resolve, updated
from mecefo_jax.model import hf_llama
from mecefo_jax.model.llama import build_model, init_params
from mecefo_jax.training.metrics import read_metrics

STEPS = 4
TEXTS = ('def f(x):\n\treturn x + 1  # 12345\n\nHello world.', ' a leading space', 'a  b   c\n\n',
         'The os.path module: join(), split().', 'Ünïcödé ≥ 漢字')


@pytest.fixture(scope='module')
def keeper():
    from mecefo_jax.snapshot.keeper_actor import LocalKeeper
    with LocalKeeper('hf_export', slots=2) as keeper:
        yield keeper


@pytest.fixture(scope='module')
def trained(tmp_path_factory, tokenizer_cache, keeper):
    """(config, run summary, export dir): a tiny run of STEPS steps, evaluated and saved at its
    end (and snapshotted into `keeper`), exported from its Orbax checkpoint."""
    from mecefo_jax.launch.worker_state import SnapshotHook
    from mecefo_jax.run import run
    from mecefo_jax.snapshot.client import KeeperClient
    from mecefo_jax.training.export import export_run
    workdir = tmp_path_factory.mktemp('exporting_run')
    cfg = updated(resolve(get_config()), {'train.steps': STEPS, 'train.eval_every': STEPS,
                                          'train.checkpoint_every': STEPS, 'data.cache_dir': tokenizer_cache})
    hook = SnapshotHook(KeeperClient(keeper), STEPS)
    summary = run(cfg, str(workdir), observers=[hook])
    hook.close()
    out = str(workdir / 'hf')
    assert export_run(str(workdir), out) == {'step': STEPS, 'source': 'disk', 'out': out,
                                             'tokenizer': _tokens(cfg)[1].model_path}
    return cfg, summary, out


def test_an_export_from_the_keepers_memory_is_the_export_from_disk(trained, keeper, tmp_path):
    from mecefo_jax.snapshot import open_sources
    from mecefo_jax.training.export import export_run
    _, _, out = trained
    snapshots = open_sources(keeper)
    try:
        assert export_run(os.path.dirname(out), str(tmp_path), snapshots=snapshots)['source'] == 'memory'
    finally:
        for snapshot in snapshots:
            snapshot.close()
    for name in (hf_llama.WEIGHTS, hf_llama.CONFIG):
        with open(os.path.join(out, name), 'rb') as a, open(tmp_path / name, 'rb') as b:
            assert a.read() == b.read(), name


def _host(tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))


@pytest.fixture(scope='module')
def theirs(trained):
    from transformers import FlaxLlamaForCausalLM
    return FlaxLlamaForCausalLM.from_pretrained(trained[2], dtype=np.float32)


def _tokens(cfg):
    from mecefo_jax.data import pipeline
    val = pipeline.make_pipeline(cfg.data, vocab_size=cfg.model.vocab_size, num_shards=1, split='validation')
    return next(val)[0, :, :cfg.data.seq_len].astype(np.int32), val.tokenizer


def test_transformers_gives_our_logits_and_top1_tokens(trained, theirs):
    cfg, summary, _ = trained
    tokens_bl, _ = _tokens(cfg)
    ours = np.asarray(build_model(cfg).apply({'params': _host(summary['state'].params)}, tokens_bl))
    logits = np.asarray(theirs(tokens_bl).logits)
    assert logits.shape == ours.shape == (*tokens_bl.shape, cfg.model.vocab_size)
    assert np.abs(logits - ours).max() < 1e-4
    np.testing.assert_array_equal(logits.argmax(-1), ours.argmax(-1))


def test_transformers_tokenizer_gives_our_ids(trained):
    """The exported LlamaTokenizer (slow; `use_fast=False` through AutoTokenizer: transformers'
    fast conversion assumes Meta's ids, unk 0, bos 1, eos 2) adds nothing and splits alike."""
    from transformers import AutoTokenizer, LlamaTokenizer
    cfg, _, out = trained
    _, ours = _tokens(cfg)
    for tokenizer in (LlamaTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(out, use_fast=False)):
        for text in TEXTS:
            assert tokenizer(text)['input_ids'] == ours.encode(text), text
        assert tokenizer.eos_token_id == ours.eos_id


def test_import_holds_transformers_weights_and_exports_the_same_file(trained, theirs, tmp_path):
    cfg, summary, out = trained
    imported = hf_llama.load(out, cfg.model)
    trained_params = _host(summary['state'].params)
    jax.tree.map(np.testing.assert_array_equal, imported, trained_params)
    # transformers' Flax tree, from its own converter: kernels [in, out], heads flattened.
    hf = flax.traverse_util.flatten_dict(_host(theirs.params), sep='.')
    d = cfg.model.d_model
    assert len(hf) == 2 + 9 * cfg.model.num_layers + 1
    np.testing.assert_array_equal(hf['model.embed_tokens.embedding'], imported['embedding'])
    np.testing.assert_array_equal(hf['lm_head.kernel'], imported['head'])
    np.testing.assert_array_equal(hf['model.norm.weight'], imported['final_norm']['scale'])
    layers = imported['layers']
    for i in range(cfg.model.num_layers):
        at = f'model.layers.{i}.'
        for name, ours in (('self_attn.q_proj', layers['attn']['wq'][i].reshape(d, -1)),
                           ('self_attn.k_proj', layers['attn']['wk'][i].reshape(d, -1)),
                           ('self_attn.v_proj', layers['attn']['wv'][i].reshape(d, -1)),
                           ('self_attn.o_proj', layers['attn']['wo'][i].reshape(-1, d)),
                           ('mlp.gate_proj', layers['ffn']['w_gate']['kernel'][i]),
                           ('mlp.up_proj', layers['ffn']['w_up']['kernel'][i]),
                           ('mlp.down_proj', layers['ffn']['w_down']['kernel'][i])):
            np.testing.assert_array_equal(hf[at + name + '.kernel'], ours)
        np.testing.assert_array_equal(hf[at + 'input_layernorm.weight'], layers['attn_norm']['scale'][i])
        np.testing.assert_array_equal(hf[at + 'post_attention_layernorm.weight'], layers['ffn_norm']['scale'][i])
    again = str(tmp_path / 'again')
    hf_llama.save(again, imported, cfg.model, max_positions=cfg.data.seq_len,
                  tokenizer_path=os.path.join(out, hf_llama.TOKENIZER))
    for name in (hf_llama.WEIGHTS, hf_llama.CONFIG, hf_llama.TOKENIZER, 'tokenizer_config.json'):
        with open(os.path.join(out, name), 'rb') as a, open(os.path.join(again, name), 'rb') as b:
            assert a.read() == b.read(), name


def test_a_run_started_from_the_export_sees_the_exporting_runs_validation_loss(trained, tmp_path):
    """train.init_from: the weights bit for bit, the optimizer fresh, and the step-0
    evaluation equal to the exporting run's at its last step."""
    from mecefo_jax.run import run
    cfg, summary, out = trained
    started = run(updated(cfg, {'train.init_from': out}), str(tmp_path), stop_at=0)
    state = started['state']
    assert int(state.step) == 0
    jax.tree.map(np.testing.assert_array_equal, _host(state.params), _host(summary['state'].params))
    assert all(not np.any(x) for x in jax.tree.leaves(_host(state.opt_state)) if np.ndim(x))
    (row,) = [r for r in read_metrics(str(tmp_path)) if 'val_loss' in r]
    assert row['step'] == 0
    assert row['val_loss'] == summary['final_val_loss']


def _params(cfg):
    return _host(flax.linen.unbox(init_params(build_model(cfg), jax.random.key(1))))


def test_scanned_and_unrolled_blocks_map_to_the_same_tensors_and_logits():
    scanned = resolve(get_config())
    unrolled = updated(scanned, {'model.scan_layers': False})
    params = _params(scanned)
    tensors = hf_llama.to_hf(params, scanned.model)
    jax.tree.map(np.testing.assert_array_equal, hf_llama.from_hf(tensors, scanned.model, 'here'), params)
    as_unrolled = hf_llama.from_hf(tensors, unrolled.model, 'here')
    assert set(as_unrolled) > {'layers_0', 'layers_1'}
    jax.tree.map(np.testing.assert_array_equal, hf_llama.to_hf(as_unrolled, unrolled.model), tensors)
    tokens_bl = np.arange(2 * 16, dtype=np.int32).reshape(2, 16) % scanned.model.vocab_size
    np.testing.assert_allclose(build_model(unrolled).apply({'params': as_unrolled}, tokens_bl),
                               build_model(scanned).apply({'params': params}, tokens_bl), atol=1e-5)


def test_a_tied_checkpoint_imports_with_the_embedding_as_head():
    cfg = resolve(get_config())
    tensors = hf_llama.to_hf(_params(cfg), cfg.model)
    del tensors['lm_head.weight']
    with pytest.raises(ValueError, match="lacks 1 tensor.*'lm_head.weight'"):
        hf_llama.from_hf(tensors, cfg.model, 'here')  # untied, as LlamaConfig's default says
    params = hf_llama.from_hf(tensors, cfg.model, 'here', tied=True)
    np.testing.assert_array_equal(params['head'], tensors['model.embed_tokens.weight'].T)


def _config(cfg, **changes):
    return dict(hf_llama.hf_config(cfg.model, max_positions=32, special_ids={}), **changes)


@pytest.mark.parametrize('changes, says', [
    ({'model_type': 'mistral'}, "model_type='mistral', not 'llama'"),
    ({'rope_scaling': {'type': 'linear', 'factor': 2.0}}, 'rope_scaling='),
    ({'attention_bias': True}, 'attention_bias=True'),
    ({'num_key_value_heads': 4, 'intermediate_size': 128},
     'Fix: --config.model.ffn_hidden=128 --config.model.num_kv_heads=4'),
])
def test_another_model_is_refused_with_the_fix(changes, says, tmp_path):
    cfg = resolve(get_config())
    hf_llama.check_config(_config(cfg), cfg.model, 'here')  # its own config fits
    with open(tmp_path / hf_llama.CONFIG, 'w') as f:
        json.dump(_config(cfg, **changes), f)
    with pytest.raises(ValueError, match='train.init_from=') as error:
        hf_llama.load(str(tmp_path), cfg.model)
    assert says in str(error.value)
