"""Report section `compile`: the compile time of a new failure topology's step at 24 layers.

After a failure every survivor compiles a step it has not seen. With two or
more devices this is `studies/compile_time.py`'s program: the MeCeFO
failure step on the config's full mesh, replica 3 (or the last) down, its
neighbour running two shards in neighbour mode. On one device no replica
can fail and leave a survivor, and a one-replica mesh runs one program
without the per-device role switch (XLA rejects the psum over a one-device
manual axis), so it compiles each program a survivor holds on its own: the
normal step over B rows and the neighbour step over 2B. Their sum bounds the
two-program step from above (the switched step shares one optimizer update).
Compiled ahead of time from shapes, with the persistent compilation cache
off: the figures are cold compiles.
"""
from __future__ import annotations

import time

from studies.gpu import configs

SHAPES = {'full': {'config': 'llama_350m', 'overrides': {}, 'layers': 24},
          'smoke': {'config': 'tiny', 'overrides': {'model.attention': 'xla'}, 'layers': 24}}
CPU_DEVICES = 2  # fake CPU devices (smoke): the smallest mesh with a failure and a survivor


def one_device_program_sec(cfg, layers: int, role: str, rows: int) -> float:
    """One program's step (normal or neighbour over `rows`) on one device, compiled cold."""

    import jax

    from mecefo_jax.model.llama import build_model
    from mecefo_jax.neighbour.layout import Program
    from mecefo_jax.parallel import step as step_lib
    from mecefo_jax.parallel.aot import abstract_batch
    from studies.gpu.step import Setup
    model = build_model(cfg, num_layers=layers)
    setup = Setup.build(cfg, model, jax.devices()[0])
    fn = step_lib.make_train_step(setup.model, setup.optimizer, setup.mesh, setup.shardings,
                                  (Program(role, rows),))
    args = (setup.state_abs, abstract_batch(setup.mesh, rows, cfg.data.seq_len + 1))
    start = time.perf_counter()
    fn.lower(*args).compile()
    return time.perf_counter() - start


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
    out = {'config_name': shape['config'], 'num_layers': shape['layers'],
           'devices': devices, 'scan_layers': cfg.model.scan_layers, 'cache': 'off (cold)'}
    if devices >= 2:
        seconds = compile_time.compile_seconds(cfg, shape['layers'], scan_layers=True)
        replicas, width = sharding.mesh_shape(cfg.mesh, devices)
        out.update(what=f'MeCeFO failure step on a {replicas}x{width} mesh, one replica down '
                        '(studies/compile_time.py)')
    else:
        from mecefo_jax.neighbour.layout import ROLE_NEIGHBOUR, ROLE_NORMAL
        batch = STEP_SHAPES['step'][kind]['batch']
        out['normal_compile_sec'] = one_device_program_sec(cfg, shape['layers'], ROLE_NORMAL,
                                                           batch)
        out['neighbour_compile_sec'] = one_device_program_sec(cfg, shape['layers'],
                                                              ROLE_NEIGHBOUR, 2 * batch)
        seconds = out['normal_compile_sec'] + out['neighbour_compile_sec']
        out.update(what=f'one device: the normal step (x {batch}) and the neighbour step '
                        f'(x {2 * batch}) compiled apart, their sum')
    out['compile_sec'] = seconds
    ctx.log(f'{out["what"]}: {seconds:.2f} s')
    return out
