"""LLaMA 7B on C4: the shape of docs/algorithm.md with the MeCeFO paper's AdamW.

Mesh: 4-way tensor parallelism (mesh.model=4, within a node) and full block
remat: on 32 devices, 8 replicas of 512/8 = 64 sequences (a neighbour 128).
`python scripts/memory_plan.py --config configs/llama_7b.py --failure_step`
printed, per device (GB = 1e9 bytes; compiled for XLA:CPU, which computes
bf16 dots in float32, so an estimate of the GPU's bytes):

                      normal  neighbour  failure_step
  params + Adam + V    20.40      20.40         20.40
  temporaries          20.35      31.10         33.24   (gradients 6.74)
  peak                 40.74      51.49         53.64   (budget 70)

Alternatives the plan rejected (with the FFN recomputation then on):
mesh.model=8 without remat, 180 GB for the normal role (128 sequences per
replica); mesh.model=8 with full remat, 68.9 GB for the neighbour (too close
to 70): the residual stream is replicated
over 'model', so a wider 'model' axis (more sequences per replica) grows
what full remat keeps, the block inputs, and the neighbour keeps twice as many.
`--config configs/llama_7b.py:gpu`: the GPU variant (see configs/llama_350m.py).
"""
from mecefo_jax.config import llama_config
from mecefo_jax.config.defaults import with_variant

GPU = {'model.attention': 'cudnn'}


def get_config(variant: str = ''):
    cfg = llama_config(d_model=4096, num_layers=32, num_heads=32, ffn_hidden=11008,
                       learning_rate=2.5e-4)
    cfg.mesh.model = 4  # 27 GB of float32 params, Adam and gradients per device
    cfg.model.remat_policy = 'full'  # keep block inputs only (see above)
    return with_variant(cfg, variant, GPU)
