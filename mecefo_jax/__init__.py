"""mecefo_jax: fault-tolerant LLM pretraining in JAX (MeCeFO)."""
