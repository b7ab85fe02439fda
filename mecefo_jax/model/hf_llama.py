"""Hugging Face `LlamaForCausalLM` checkpoints, both ways: the name and layout rules, config.json, the directory.

One table (`_LAYER`) maps each parameter to its Hugging Face name and layout; export and
import both read it, so they cannot drift apart. The rules:

- Linear weights: HF keeps `[out, in]` (PyTorch's), we keep kernels `[in, out]`; the
  attention projections' head axes are flattened head-major (`q_proj` is `[H * E, D]`).
- RoPE: ours pairs the two halves of each head (`model/llama.py`'s `rotary`), which is
  HF's `rotate_half` convention, so q and k need no permutation (Meta's original
  checkpoints pair neighbours; HF's converter permutes those, never these).
- GQA: query head h reads KV head h // G in both, so `k_proj` and `v_proj` are
  `[K * E, D]` as they are.
- Norms: RMSNorm scales map one to one (`input_layernorm` is our `attn_norm`,
  `post_attention_layernorm` our `ffn_norm`), float32 with eps from `model.norm_eps`.
- The head: ours is untied, exported as `lm_head.weight`; a tied checkpoint (no
  `lm_head.weight`, `tie_word_embeddings`) imports with the head a copy of the embedding.

A checkpoint of another model type, another shape or settings this model does not
compute (rope scaling, biases) is refused with the `--config.model.*` overrides that fit it.
Shape letters as in `model/llama.py`.
"""
from __future__ import annotations

import json
import os
import shutil

import numpy as np

from mecefo_jax.config.defaults import ModelSection
from mecefo_jax.host import files

CONFIG = 'config.json'
WEIGHTS = 'model.safetensors'
WEIGHTS_INDEX = 'model.safetensors.index.json'  # a sharded checkpoint's name -> file map
TOKENIZER = 'tokenizer.model'


def _flip(matrix):
    """Our kernel [in, out] as HF's weight [out, in], and back: the transpose is its own inverse."""
    return np.ascontiguousarray(matrix.T)


# Per block: (HF name after 'model.layers.<i>.', our path inside the block, export, import).
# `d` is model.d_model; exports take our array, imports the HF one.
_LAYER = (
    ('self_attn.q_proj.weight', ('attn', 'wq'), lambda w, d: _flip(w.reshape(d, -1)),
     lambda w, d, c: _flip(w).reshape(d, c.num_heads, -1)),
    ('self_attn.k_proj.weight', ('attn', 'wk'), lambda w, d: _flip(w.reshape(d, -1)),
     lambda w, d, c: _flip(w).reshape(d, c.num_kv_heads, -1)),
    ('self_attn.v_proj.weight', ('attn', 'wv'), lambda w, d: _flip(w.reshape(d, -1)),
     lambda w, d, c: _flip(w).reshape(d, c.num_kv_heads, -1)),
    ('self_attn.o_proj.weight', ('attn', 'wo'), lambda w, d: _flip(w.reshape(-1, d)),
     lambda w, d, c: _flip(w).reshape(c.num_heads, -1, d)),
    ('mlp.gate_proj.weight', ('ffn', 'w_gate', 'kernel'), lambda w, d: _flip(w), lambda w, d, c: _flip(w)),
    ('mlp.up_proj.weight', ('ffn', 'w_up', 'kernel'), lambda w, d: _flip(w), lambda w, d, c: _flip(w)),
    ('mlp.down_proj.weight', ('ffn', 'w_down', 'kernel'), lambda w, d: _flip(w), lambda w, d, c: _flip(w)),
    ('input_layernorm.weight', ('attn_norm', 'scale'), lambda w, d: np.ascontiguousarray(w),
     lambda w, d, c: np.ascontiguousarray(w)),
    ('post_attention_layernorm.weight', ('ffn_norm', 'scale'), lambda w, d: np.ascontiguousarray(w),
     lambda w, d, c: np.ascontiguousarray(w)),
)


def _get(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def _put(tree: dict, path, value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _block(params, c: ModelSection, i: int):
    """Block i's parameters: a slice of the scanned stack, or `layers_<i>`."""
    return (_get(params, ('layers',)) if c.scan_layers else params[f'layers_{i}']), (i if c.scan_layers else None)


def to_hf(params, c: ModelSection) -> dict[str, np.ndarray]:
    """Our parameter tree (float32) as HF `LlamaForCausalLM` tensors, by HF name."""
    params = _as_numpy(params)
    out = {'model.embed_tokens.weight': np.ascontiguousarray(params['embedding'])}
    for i in range(c.num_layers):
        block, index = _block(params, c, i)
        for name, path, export, _ in _LAYER:
            leaf = _get(block, path)
            out[f'model.layers.{i}.{name}'] = export(leaf if index is None else leaf[index], c.d_model)
    out['model.norm.weight'] = np.ascontiguousarray(params['final_norm']['scale'])
    out['lm_head.weight'] = _flip(params['head'])
    return out


def from_hf(tensors: dict[str, np.ndarray], c: ModelSection, where: str, *, tied: bool = False) -> dict:
    """HF `LlamaForCausalLM` tensors as our parameter tree (float32 numpy), for `c`'s layout; a
    `tied` checkpoint's head is its embedding."""
    missing = [n for n in _expected_names(c, tied) if n not in tensors]
    if missing:
        raise ValueError(f'{where} lacks {len(missing)} tensor(s) a LLaMA of this shape has, e.g. '
                         f'{missing[:3]}: export it with scripts/hf_export.py, or point at a '
                         'LlamaForCausalLM directory.')
    t = {k: np.asarray(v, np.float32) for k, v in tensors.items()}
    params = {'embedding': t['model.embed_tokens.weight'], 'final_norm': {'scale': t['model.norm.weight']},
              'head': _flip(t['model.embed_tokens.weight' if tied else 'lm_head.weight'])}
    for name, path, _, load in _LAYER:
        blocks = [load(t[f'model.layers.{i}.{name}'], c.d_model, c) for i in range(c.num_layers)]
        if c.scan_layers:
            _put(params, ('layers', *path), np.stack(blocks))
        else:
            for i, leaf in enumerate(blocks):
                _put(params, (f'layers_{i}', *path), leaf)
    return params


def _expected_names(c: ModelSection, tied: bool) -> list[str]:
    return (['model.embed_tokens.weight', 'model.norm.weight'] + ([] if tied else ['lm_head.weight'])
            + [f'model.layers.{i}.{name}' for i in range(c.num_layers) for name, *_ in _LAYER])


def _as_numpy(tree):
    if isinstance(tree, dict) or hasattr(tree, 'items'):
        return {k: _as_numpy(v) for k, v in tree.items()}
    return np.asarray(tree, np.float32)


# ------------------------------------------------------------------ config.json

def hf_config(c: ModelSection, *, max_positions: int, special_ids: dict) -> dict:
    """config.json of a `LlamaForCausalLM` that computes what `c` does (float32 weights)."""
    return {'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'vocab_size': c.vocab_size,
            'hidden_size': c.d_model, 'intermediate_size': c.ffn_hidden, 'num_hidden_layers': c.num_layers,
            'num_attention_heads': c.num_heads, 'num_key_value_heads': c.num_kv_heads,
            'head_dim': c.d_model // c.num_heads, 'hidden_act': 'silu', 'max_position_embeddings': max_positions,
            'rms_norm_eps': c.norm_eps, 'rope_theta': c.rope_theta, 'rope_scaling': None,
            'tie_word_embeddings': False, 'attention_bias': False, 'mlp_bias': False, 'attention_dropout': 0.0,
            'initializer_range': 0.02, 'pretraining_tp': 1, 'use_cache': True, 'torch_dtype': 'float32',
            **special_ids}


# config.json key -> our model.* field
_SHAPE = (('vocab_size', 'vocab_size'), ('hidden_size', 'd_model'), ('intermediate_size', 'ffn_hidden'),
          ('num_hidden_layers', 'num_layers'), ('num_attention_heads', 'num_heads'),
          ('num_key_value_heads', 'num_kv_heads'), ('rms_norm_eps', 'norm_eps'), ('rope_theta', 'rope_theta'))


def check_config(hf: dict, c: ModelSection, where: str) -> None:
    """Refuse a config.json this model cannot load, naming what differs and the fix."""
    if hf.get('model_type') != 'llama':
        raise ValueError(f"{where}: model_type={hf.get('model_type')!r}, not 'llama'; only Hugging Face "
                         'LlamaForCausalLM checkpoints load here.')
    unsupported = [f'{k}={hf[k]!r}' for k, ok in (('hidden_act', 'silu'), ('rope_scaling', None),
                                                   ('attention_bias', False), ('mlp_bias', False))
                   if k in hf and hf[k] != ok]
    if unsupported:
        raise ValueError(f'{where}: {", ".join(unsupported)}: this LLaMA computes silu, plain RoPE and no '
                         'biases only; such a checkpoint does not load here.')
    fitting = dict(hf, num_key_value_heads=hf.get('num_key_value_heads', hf.get('num_attention_heads')))
    differs = [(ours, fitting.get(key), getattr(c, ours)) for key, ours in _SHAPE
               if fitting.get(key) != getattr(c, ours)]
    head_dim = hf.get('head_dim')
    if head_dim is not None and head_dim * hf.get('num_attention_heads', 0) != hf.get('hidden_size'):
        raise ValueError(f'{where}: head_dim={head_dim} x num_attention_heads != hidden_size: this LLaMA '
                         'keeps d_model = heads x head dim.')
    if differs:
        lines = '; '.join(f'model.{ours}={mine!r} here, {theirs!r} there' for ours, theirs, mine in differs)
        fix = ' '.join(f'--config.model.{ours}={theirs!r}' for ours, theirs, _ in differs)
        raise ValueError(f'{where} holds another shape: {lines}. Fix: {fix}')


# ------------------------------------------------------------------ the directory

def save(directory: str, params, c: ModelSection, *, max_positions: int, tokenizer_path: str | None) -> None:
    """Write `directory` as HF `LlamaForCausalLM`: config.json, model.safetensors and, given the
    run's sentencepiece model, a `LlamaTokenizer` that encodes as the run did (no BOS/EOS added)."""
    from safetensors.numpy import save_file
    os.makedirs(directory, exist_ok=True)
    special = {'pad_token_id': 0, 'bos_token_id': 2, 'eos_token_id': 3}
    pieces = {}
    if tokenizer_path:
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=tokenizer_path)
        special = {f'{k}_token_id': i for k, i in (('pad', sp.pad_id()), ('bos', sp.bos_id()),
                                                   ('eos', sp.eos_id())) if i >= 0}
        pieces = {f'{k}_token': sp.id_to_piece(i) for k, i in (('pad', sp.pad_id()), ('bos', sp.bos_id()),
                                                               ('eos', sp.eos_id()), ('unk', sp.unk_id())) if i >= 0}
        shutil.copyfile(tokenizer_path, os.path.join(directory, TOKENIZER))
        files.write_json(os.path.join(directory, 'tokenizer_config.json'), {
            'tokenizer_class': 'LlamaTokenizer', 'add_bos_token': False, 'add_eos_token': False,
            'legacy': True, 'model_max_length': max_positions, 'clean_up_tokenization_spaces': False,
            **pieces})
        files.write_json(os.path.join(directory, 'special_tokens_map.json'), pieces)
    save_file(to_hf(params, c), os.path.join(directory, WEIGHTS), metadata={'format': 'pt'})
    files.write_text(os.path.join(directory, CONFIG),
                     json.dumps(hf_config(c, max_positions=max_positions, special_ids=special), indent=2) + '\n')


def load(directory: str, c: ModelSection, *, where: str = 'train.init_from') -> dict:
    """The parameter tree (float32 numpy) of the HF LLaMA in `directory`, checked against `c`."""
    where = f'{where}={directory!r}'
    config_path = os.path.join(directory, CONFIG)
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f'{where} has no {CONFIG}: point it at a Hugging Face LlamaForCausalLM '
                                'directory (scripts/hf_export.py writes one).')
    with open(config_path, encoding='utf-8') as f:
        hf = json.load(f)
    check_config(hf, c, where)
    return from_hf(_read_tensors(directory, where), c, where, tied=bool(hf.get('tie_word_embeddings')))


def _read_tensors(directory: str, where: str) -> dict[str, np.ndarray]:
    """Every tensor of model.safetensors, or of the shards a sharded checkpoint's index names;
    bfloat16 ones read through JAX on the CPU (numpy has no bfloat16)."""
    import jax
    from safetensors import safe_open
    index = os.path.join(directory, WEIGHTS_INDEX)
    if os.path.isfile(index):
        with open(index, encoding='utf-8') as f:
            shards = sorted(set(json.load(f)['weight_map'].values()))
    elif os.path.isfile(os.path.join(directory, WEIGHTS)):
        shards = [WEIGHTS]
    else:
        raise FileNotFoundError(f'{where} has neither {WEIGHTS} nor {WEIGHTS_INDEX}; PyTorch .bin '
                                'checkpoints do not load here: save it with safetensors.')
    tensors = {}
    with jax.default_device(jax.devices('cpu')[0]):
        for shard in shards:
            with safe_open(os.path.join(directory, shard), framework='flax') as f:
                tensors.update({name: np.asarray(f.get_tensor(name)) for name in f.keys()})
    return tensors
