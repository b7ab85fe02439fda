"""LLaMA 350M on C4: the shape of docs/algorithm.md with the MeCeFO paper's AdamW.

`--config configs/llama_350m.py:gpu` is the GPU variant: the settings below,
the fastest the GPU sweep has measured (docs/gpu.md, "GPU defaults"); with
no variant the config is as it is on a CPU.
"""
from mecefo_jax.config import llama_config
from mecefo_jax.config.defaults import with_variant

GPU = {'model.attention': 'cudnn', 'model.remat_policy': 'none', 'model.scan_layers': True,
       'train.flat_optimizer': False}


def get_config(variant: str = ''):
    return with_variant(llama_config(d_model=1024, num_layers=24, num_heads=16, ffn_hidden=2736,
                                     learning_rate=1e-3), variant, GPU)
