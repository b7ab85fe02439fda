"""LLaMA 1B on C4: the shape of docs/algorithm.md with the MeCeFO paper's AdamW."""
from mecefo_jax.config import llama_config


def get_config():
    return llama_config(d_model=2048, num_layers=24, num_heads=32, ffn_hidden=5461,
                        learning_rate=5e-4)
