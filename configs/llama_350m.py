"""LLaMA 350M on C4: the shape of docs/algorithm.md with the MeCeFO paper's AdamW."""
from mecefo_jax.config import llama_config


def get_config():
    return llama_config(d_model=1024, num_layers=24, num_heads=16, ffn_hidden=2736,
                        learning_rate=1e-3)
