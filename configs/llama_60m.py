"""LLaMA 60M on C4: the shape of docs/algorithm.md with the MeCeFO paper's AdamW."""
from mecefo_jax.config import llama_config


def get_config():
    return llama_config(d_model=512, num_layers=8, num_heads=8, ffn_hidden=1376,
                        learning_rate=3e-3)
