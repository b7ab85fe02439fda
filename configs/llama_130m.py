"""LLaMA 130M on C4: the shape of docs/algorithm.md with the MeCeFO paper's AdamW."""
from mecefo_jax.config import llama_config


def get_config():
    return llama_config(d_model=768, num_layers=12, num_heads=12, ffn_hidden=2048,
                        learning_rate=1e-3)
