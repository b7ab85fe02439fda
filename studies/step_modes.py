"""The step-cost benchmark's per-device modes: which program one device runs in each role.

For the same per-device batch (shard 0 the device's own, shard 1 an adopted
one) each mode is the whole train step on one device, its role a
compile-time constant: `normal` (B rows), `ndb_naive` (own + adopted, exact),
`mecefo` (own + adopted, neighbour mode), `mecefo_per_batch` (B rows,
neighbour mode), and `plain_dp`, an independently written `jax.jit`
data-parallel step on B rows (the baseline).
"""
from __future__ import annotations

import jax
import numpy as np

from mecefo_jax.parallel.aot import abstract, abstract_batch
from studies.xla_costs import flops_of

MODES = ('normal', 'ndb_naive', 'mecefo', 'mecefo_per_batch', 'plain_dp')
MECEFO_MODES = MODES[:4]  # the modes that run step.make_train_step


def mode_layout(mode: str, batch: int):
    """The one-replica layout of a MeCeFO mode: shard 0 is own, shard 1 adopted."""
    from mecefo_jax.neighbour.layout import ROLE_NEIGHBOUR, ROLE_NORMAL, Layout, Piece
    own, adopted = Piece(0, 0, batch), Piece(1, 0, batch)
    role, pieces = {
        'normal': (ROLE_NORMAL, (own,)),
        'ndb_naive': (ROLE_NORMAL, (own, adopted)),
        'mecefo': (ROLE_NEIGHBOUR, (own, adopted)),
        'mecefo_per_batch': (ROLE_NEIGHBOUR, (own,)),
    }[mode]
    return Layout(replicas=(0,), roles=(role,), pieces=(pieces,))


def random_tokens(cfg, batch: int, seed: int) -> np.ndarray:
    """The benchmark's two shards (own, adopted): int32 [2, batch, seq_len + 1]."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.model.vocab_size, (2, batch, cfg.data.seq_len + 1),
                        dtype=np.int32)


def make_plain_dp_step(model, optimizer, mesh, param_shardings, opt_shardings):
    """Plain data parallelism: `step(params, opt_state, tokens) -> (params, opt_state, loss)`.

    Written independently of step.py on purpose (it is the baseline): the
    mean next-token loss of the model over the batch split on 'data', its
    gradient by `value_and_grad` (GSPMD inserts the all-reduce), the optimizer
    update, params and optimizer state donated. The loss is the model's own
    (chunked, fused) cross-entropy, so the comparison isolates the step's
    machinery, not the loss implementation.
    """
    import optax

    from mecefo_jax.parallel import sharding

    def mean_loss(params, tokens_nt):
        targets_nl = tokens_nt[:, 1:]
        loss_sum = model.apply({'params': params}, tokens_nt[:, :-1], targets_bl=targets_nl)
        return loss_sum / targets_nl.size

    def train_step(params, opt_state, tokens_nt):
        loss, grads = jax.value_and_grad(mean_loss)(params, tokens_nt)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(train_step,
                   in_shardings=(param_shardings, opt_shardings, sharding.data_sharded(mesh)),
                   out_shardings=(param_shardings, opt_shardings, sharding.replicated(mesh)),
                   donate_argnums=(0, 1))


def unrolled(model):
    """The same model with straight-line layers and loss chunks (FLOP counting)."""
    return model.variant(unroll_loops=True)


def normal_step_flops(model, cfg, batch: int, device=None) -> float:
    """XLA's FLOP count of `model`'s normal train step on one device, as compiled.

    Loops are counted once: pass `unrolled(model)` for the complete count.
    """
    from mecefo_jax.model.optim import make_optimizer
    from mecefo_jax.parallel import sharding
    from mecefo_jax.parallel import step as step_lib
    from mecefo_jax.parallel.state import abstract_train_state, state_shardings
    mesh = sharding.mesh_from_rows([[device or jax.devices()[0]]])
    optimizer = make_optimizer(cfg.train)
    rank = cfg.mecefo.rank
    shardings = state_shardings(model, optimizer, mesh, rank)
    state_abs = abstract(abstract_train_state(model, optimizer, rank=rank), shardings)
    programs = mode_layout('normal', batch).programs
    step = step_lib.make_train_step(model, optimizer, mesh, shardings, programs)
    batch_abs = abstract_batch(mesh, batch, cfg.data.seq_len + 1)
    return flops_of(step.lower(state_abs, batch_abs).compile())
