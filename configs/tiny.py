"""Tests and smoke runs: seconds per step on CPU."""
from mecefo_jax.config import base_config


def get_config():
    cfg = base_config()
    cfg.model.vocab_size = 256  # small tokenizer trains in seconds
    cfg.model.d_model = 32  # residual width
    cfg.model.num_layers = 2  # blocks
    cfg.model.num_heads = 4  # query heads
    cfg.model.num_kv_heads = 2  # grouped KV heads, to exercise GQA
    cfg.model.ffn_hidden = 64  # SwiGLU width
    cfg.data.seq_len = 32  # tokens per sequence
    cfg.data.global_batch_size = 16  # 2 sequences per replica on 8 devices
    cfg.train.steps = 40  # a short run
    # The schedule spans 40 steps whatever train.steps a test or smoke sets: the LR is
    # a constant of the compiled step, so runs of any length share their programs.
    cfg.train.lr_schedule_steps = 40
    cfg.train.learning_rate = 1e-2  # tiny models tolerate a high peak LR
    cfg.train.log_every = 5  # rows per 5 steps
    cfg.train.eval_every = 20  # two evals in the default run
    cfg.train.eval_batches = 2  # quick evals
    cfg.train.checkpoint_every = 20  # checkpoints at 20 and 40
    cfg.mecefo.rank = 8  # r for 32x64 FFN matrices
    cfg.mecefo.tau = 10  # refresh often in short runs
    return cfg
