"""LLaMA 130M on C4: the shape of docs/algorithm.md with the MeCeFO paper's AdamW.

`--config configs/llama_130m.py:gpu`: the GPU variant (see configs/llama_350m.py).
"""
from mecefo_jax.config import llama_config
from mecefo_jax.config.defaults import with_variant

GPU = {'model.attention': 'cudnn'}


def get_config(variant: str = ''):
    return with_variant(llama_config(d_model=768, num_layers=12, num_heads=12, ffn_hidden=2048,
                                     learning_rate=1e-3), variant, GPU)
