"""LLaMA 7B on C4: the shape of docs/algorithm.md with the MeCeFO paper's AdamW."""
from mecefo_jax.config import llama_config


def get_config():
    return llama_config(d_model=4096, num_layers=32, num_heads=32, ffn_hidden=11008,
                        learning_rate=2.5e-4)
