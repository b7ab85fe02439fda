"""A crashed job's final parameters against the same failures simulated in one process."""
import os

import jax
import numpy as np

from mecefo_jax import run as run_lib


def assert_params_equal_simulated(workdir, cfg, sim_dir, replicas):
    """`workdir`'s `launch/final_params.npz` against `cfg` run here on `replicas` devices.

    The job's replicas on that many of this process's devices, chosen explicitly:
    a config's mesh alone must use every device. Same samples, same roles, same
    arithmetic; only the order in which the cross-process (gloo) all-reduce sums
    the replicas differs from the in-process one. Measured ~3e-7 of each leaf's
    scale after 14 steps; 1e-5 leaves room for 8 steps of AdamW amplifying that.
    """
    from mecefo_jax.training.run_setup import build_run
    sim_dir = str(sim_dir)
    run = build_run(cfg, sim_dir, replica_rows=[(d,) for d in jax.devices()[:replicas]])
    simulated = run_lib.run(cfg, sim_dir, run=run)['state'].params
    real = np.load(os.path.join(workdir, 'launch', 'final_params.npz'))
    for path, leaf in jax.tree_util.tree_leaves_with_path(jax.device_get(simulated)):
        name = jax.tree_util.keystr(path)
        np.testing.assert_allclose(real[name], leaf, rtol=0,
                                   atol=1e-5 * float(np.max(np.abs(leaf))), err_msg=name)
