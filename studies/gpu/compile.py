"""Report section `compile`: a new failure topology's compile time at 24 layers, cold.

The measurement is `studies/compile_time.py`'s `failure_step_compile`; this
section picks the shape, simulates two CPU devices for the smoke (the
smallest mesh with a failure and a survivor; ignored by GPUs) and turns the
persistent compilation cache off, so the figures are cold compiles.
"""
from __future__ import annotations

from studies.gpu import configs

SHAPES = {'full': {'config': 'llama_350m', 'overrides': {}, 'layers': 24},
          'smoke': {'config': 'tiny', 'overrides': {'model.attention': 'xla'}, 'layers': 24}}
CPU_DEVICES = 2  # fake CPU devices (smoke): the smallest mesh with a failure and a survivor


def run(ctx) -> dict:
    from mecefo_jax.parallel import sharding
    from studies import compile_time
    from studies.gpu.step import SHAPES as STEP_SHAPES
    kind = 'smoke' if ctx.smoke else 'full'
    shape = SHAPES[kind]
    cfg = configs.load(shape['config'], shape['overrides'])
    sharding.simulate_cpu_devices(CPU_DEVICES)  # before jax starts; ignored by GPUs
    import jax
    jax.config.update('jax_enable_compilation_cache', False)
    devices = jax.device_count()
    one_device_batch = STEP_SHAPES['step'][kind]['batch'] if devices == 1 else None
    out = {'config_name': shape['config'], 'num_layers': shape['layers'], 'devices': devices,
           'scan_layers': cfg.model.scan_layers,
           **compile_time.failure_step_compile(cfg, shape['layers'],
                                               scan_layers=cfg.model.scan_layers,
                                               shard_batch=one_device_batch)}
    ctx.log(f'{out["what"]}: {out["compile_sec"]:.2f} s')
    return out
