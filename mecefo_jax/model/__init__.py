"""The LLaMA model, its loss and its optimizer.

| module | what it owns |
|---|---|
| `llama` | the Flax LLaMA, with MeCeFO's neighbour mode selectable per call |
| `loss` | chunked, fused next-token cross-entropy |
| `optim` | AdamW with the paper's settings and its learning-rate schedule |
| `hf_llama` | Hugging Face `LlamaForCausalLM` checkpoints in and out: the name and layout rules, config.json |
"""
