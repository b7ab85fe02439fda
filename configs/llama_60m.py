"""LLaMA 60M on C4 (DESIGN.md shapes, the paper's AdamW settings).

Learning rate, sequence length and batch are not given by the paper: these
are our choices, documented in the README. Data defaults to TFDS c4/en from a
local data_dir; GPUs compute in bfloat16.
"""
from mecefo_jax.config import base_config


def get_config():
    cfg = base_config()
    cfg.model.vocab_size = 32000  # LLaMA-sized sentencepiece vocab
    cfg.model.d_model = 512  # residual width
    cfg.model.num_layers = 8  # blocks
    cfg.model.num_heads = 8  # query heads
    cfg.model.num_kv_heads = 8  # plain multi-head attention, as in the paper
    cfg.model.ffn_hidden = 1376  # SwiGLU width
    cfg.model.dtype = 'bfloat16'  # GPU compute dtype; params stay float32
    cfg.data.source = 'tfds'  # C4 from a local TFDS data_dir
    cfg.data.seq_len = 256  # tokens per sequence (our choice)
    cfg.data.global_batch_size = 512  # sequences per step (our choice)
    cfg.train.steps = 20000  # optimizer steps (our choice)
    cfg.train.learning_rate = 3e-3  # peak LR (our choice; smaller for wider models)
    cfg.train.eval_every = 1000  # validation cadence
    cfg.train.checkpoint_every = 1000  # Orbax cadence
    cfg.mecefo.rank = 128  # low-rank r (the benchmark's target setting)
    cfg.mecefo.tau = 100  # SVD refresh period (paper)
    return cfg
