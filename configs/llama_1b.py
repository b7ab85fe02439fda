"""LLaMA 1B on C4: the shape of docs/algorithm.md with the MeCeFO paper's AdamW.

Mesh: pure data parallelism (mesh.model=1, no block remat): on 32 devices
each replica takes 512/32 = 16 sequences (a neighbour 32).
`python scripts/memory_plan.py --config configs/llama_1b.py --failure_step`
printed, per device (GB = 1e9 bytes; compiled for XLA:CPU, which computes
bf16 dots in float32, so an estimate of the GPU's bytes):

                      normal  neighbour  failure_step
  params + Adam + V    16.19      16.19         16.19
  temporaries          39.25      31.42         42.65   (gradients 5.36)
  peak                 55.44      47.61         58.83   (budget 70)

The normal role's activations dominate; the neighbour's two shards take
less because neighbour mode keeps no attention activations.
`--config configs/llama_1b.py:gpu`: the GPU variant (see configs/llama_350m.py).
"""
from mecefo_jax.config import llama_config
from mecefo_jax.config.defaults import with_variant

GPU = {'model.attention': 'cudnn', 'model.remat_policy': 'none', 'model.scan_layers': True,
       'train.flat_optimizer': False}


def get_config(variant: str = ''):
    cfg = llama_config(d_model=2048, num_layers=24, num_heads=32, ffn_hidden=5461,
                       learning_rate=5e-4)
    cfg.mesh.model = 1  # 5.4 GB of float32 params + 10.7 GB of Adam fit one device
    cfg.model.remat_policy = 'none'  # 58.8 GB peak without remat (see above)
    return with_variant(cfg, variant, GPU)
