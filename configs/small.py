"""CPU demo that learns visibly in a few minutes on 8 simulated devices."""
from mecefo_jax.config import base_config


def get_config():
    cfg = base_config()
    cfg.model.vocab_size = 1024  # subword vocab for the embedded corpus
    cfg.model.d_model = 128  # residual width
    cfg.model.num_layers = 4  # blocks
    cfg.model.num_heads = 4  # query heads
    cfg.model.num_kv_heads = 4  # plain multi-head attention
    cfg.model.ffn_hidden = 344  # ~8/3 d, like LLaMA
    cfg.data.seq_len = 128  # tokens per sequence
    cfg.data.global_batch_size = 32  # 4 sequences per replica on 8 devices
    cfg.train.steps = 300  # a few minutes on a laptop
    cfg.train.learning_rate = 3e-3  # peak LR
    cfg.train.log_every = 10  # progress rows
    cfg.train.eval_every = 100  # three evals
    cfg.train.checkpoint_every = 100  # three checkpoints
    cfg.mecefo.rank = 32  # r = d/4
    cfg.mecefo.tau = 50  # refresh twice per failure-heavy demo
    return cfg
