"""LLaMA 60M on C4: the shape of docs/algorithm.md with the MeCeFO paper's AdamW.

`--config configs/llama_60m.py:gpu`: the GPU variant (see configs/llama_350m.py).
"""
from mecefo_jax.config import llama_config
from mecefo_jax.config.defaults import with_variant

GPU = {'model.attention': 'cudnn'}


def get_config(variant: str = ''):
    return with_variant(llama_config(d_model=512, num_layers=8, num_heads=8, ffn_hidden=1376,
                                     learning_rate=3e-3), variant, GPU)
