"""The exact validation loss, on the same fixed batches at every evaluation."""
import math

import jax
import numpy as np

from mecefo_jax.parallel.topology import Topology
from mecefo_jax.training.run_setup import Run


def val_batches(run: Run):
    """The `train.eval_batches` validation batches, [global batch, seq_len + 1] each."""
    if run.val_start is None:
        run.val_start = run.val_data.get_state()
    run.val_data.set_state(run.val_start)  # same batches at every eval
    for _ in range(run.cfg.train.eval_batches):
        yield next(run.val_data).reshape(-1, run.val_data.seq_len + 1)


def evaluate(run: Run, topology: Topology, params) -> dict:
    """Exact validation loss over `train.eval_batches` fixed batches."""
    loss_sum = count = 0.0
    replicas = topology.num_replicas
    for tokens_nt in val_batches(run):
        pad = -len(tokens_nt) % replicas  # rows must split evenly over live replicas
        weights_n = np.concatenate([np.ones(len(tokens_nt)), np.zeros(pad)]).astype(np.float32)
        tokens_nt = np.concatenate([tokens_nt, np.zeros((pad, tokens_nt.shape[1]), np.int32)])
        batch = topology.put_batch({'tokens': tokens_nt, 'weights': weights_n})
        s, c = jax.device_get(topology.eval_step(params, batch['tokens'], batch['weights']))
        loss_sum, count = loss_sum + float(s), count + float(c)
    val_loss = loss_sum / max(count, 1.0)
    return {'val_loss': val_loss, 'val_ppl': math.exp(min(val_loss, 50.0))}
