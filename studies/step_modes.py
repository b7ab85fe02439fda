"""What one device runs in each role, built once for the step-cost benchmark and the GPU report.

For the same per-device batch (shard 0 the device's own, shard 1 an adopted
one) each mode is the whole train step on one device, its role a
compile-time constant: `normal` (B rows), `ndb_naive` (own + adopted, exact),
`mecefo` (own + adopted, neighbour mode), `mecefo_per_batch` (B rows,
neighbour mode), and `plain_dp`, an independently written `jax.jit`
data-parallel step on B rows (the baseline). `time_interleaved` and
`StepRunner` time them on one donated state.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import numpy as np

from mecefo_jax.parallel.sharding import abstract, abstract_batch
from studies.fidelity import path_names

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
    return rng.integers(0, cfg.model.vocab_size, (2, batch, cfg.data.seq_len + 1), dtype=np.int32)


def make_plain_dp_step(model, optimizer, mesh, param_shardings, opt_shardings):
    """Plain data parallelism: `step(params, opt_state, tokens) -> (params, opt_state, loss)`.

    Written independently of step.py on purpose (it is the baseline): the
    mean next-token loss over the batch split on 'data', its gradient by
    `value_and_grad` (GSPMD inserts the all-reduce), the optimizer update,
    params and optimizer state donated. The loss is the model's own (chunked,
    fused) cross-entropy, so the comparison isolates the step's machinery.
    """
    import optax

    from mecefo_jax.parallel import sharding

    def mean_loss(params, tokens_nt):
        targets_nl = tokens_nt[:, 1:]
        return model.apply({'params': params}, tokens_nt[:, :-1], targets_bl=targets_nl) / targets_nl.size

    def train_step(params, opt_state, tokens_nt):
        loss, grads = jax.value_and_grad(mean_loss)(params, tokens_nt)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(train_step, in_shardings=(param_shardings, opt_shardings, sharding.data_sharded(mesh)),
                   out_shardings=(param_shardings, opt_shardings, sharding.replicated(mesh)),
                   donate_argnums=(0, 1))


def model_flops_per_token(cfg, params_abstract) -> float:
    """6 x matmul params + 12 x layers x d_model x seq_len (PaLM, causal mask not halved), per token.

    Matmul params: every parameter but the embedding table (a gather) and the
    norm scales (elementwise; [layers, d] when scanned, so not told by rank).
    """
    def is_matmul(path) -> bool:
        names = path_names(path)
        return 'embedding' not in names and names[-1] != 'scale'
    matmul_params = sum(int(np.prod(x.shape)) for path, x in
                        jax.tree_util.tree_leaves_with_path(params_abstract) if is_matmul(path))
    m = cfg.model
    return 6.0 * matmul_params + 12.0 * m.num_layers * m.d_model * cfg.data.seq_len


@dataclasses.dataclass
class Bench:
    """One model on a one-device mesh with its abstract state: what every mode compiles from."""
    cfg: Any
    batch: int
    device: Any
    model: Any
    optimizer: Any
    mesh: Any
    shardings: Any
    state_abs: Any

    @classmethod
    def build(cls, cfg, batch: int, device=None, model=None) -> Bench:
        from mecefo_jax.model.llama import build_model
        from mecefo_jax.model.optim import make_optimizer
        from mecefo_jax.parallel import sharding
        from mecefo_jax.parallel.state import trace_layout
        model = build_model(cfg) if model is None else model
        device = device or jax.devices()[0]
        mesh, optimizer, rank = sharding.mesh_from_rows([[device]]), make_optimizer(cfg.train), cfg.mecefo.rank
        state_layout = trace_layout(model, optimizer, rank)
        shardings = state_layout.shardings(mesh)
        state_abs = abstract(state_layout.abstract, shardings)
        return cls(cfg, batch, device, model, optimizer, mesh, shardings, state_abs)

    def program(self, mode: str):
        """(make(model) -> jitted step, its abstract args, what it computes) for one mode."""
        from mecefo_jax.neighbour.layout import ROLE_NEIGHBOUR
        from mecefo_jax.parallel import sharding
        from mecefo_jax.parallel import step as step_lib
        seq = self.cfg.data.seq_len + 1
        if mode == 'plain_dp':
            tokens = jax.ShapeDtypeStruct((self.batch, seq), np.int32, sharding=sharding.data_sharded(self.mesh))
            return (lambda m: make_plain_dp_step(m, self.optimizer, self.mesh, self.shardings.params,
                                                 self.shardings.opt_state),
                    (self.state_abs.params, self.state_abs.opt_state, tokens),
                    {'rows': self.batch, 'neighbour': False})
        (program,) = programs = mode_layout(mode, self.batch).programs
        return (lambda m: step_lib.make_train_step(m, self.optimizer, self.mesh, self.shardings, programs,
                                                        ordered_reduction=False),
                (self.state_abs, abstract_batch(self.mesh, program.rows, seq)),
                {'program': program.name, 'rows': program.rows, 'neighbour': program.role == ROLE_NEIGHBOUR})


def time_interleaved(programs: dict, *, warmup: int, iters: int, seed: int = 0) -> dict:
    """Per-name wall times (ms) of `iters` rounds calling every program (`call()`, blocking) once.

    Round-robin, so a change in machine load (shared CPUs) hits every program
    alike; each round takes a fresh random order (seeded), so no program
    always runs next to the same one (the caches it leaves cold, its threads).
    """
    names, rng = list(programs), np.random.default_rng(seed)
    for _ in range(warmup):
        for call in programs.values():
            call()
    times = {name: [] for name in names}
    for _ in range(iters):
        for k in rng.permutation(len(names)):
            start = time.perf_counter()
            programs[names[k]]()
            times[names[k]].append((time.perf_counter() - start) * 1e3)
    return times


class StepRunner:
    """Threads ONE donated train state through every compiled step it calls.

    MeCeFO steps get a batch stamped with step 0: the first call applies its
    update and later calls leave the state as it is (same arithmetic, see
    step.py); plain_dp steps update params and optimizer state in place. One
    state for all programs keeps a large model's memory to one copy.
    """

    def __init__(self, state):
        self.state = state

    def mecefo(self, compiled, batch):
        def call():
            self.state, metrics = compiled(self.state, batch)
            jax.block_until_ready((self.state, metrics))
        return call

    def plain(self, compiled, tokens):
        def call():
            params, opt_state, loss = compiled(self.state.params, self.state.opt_state, tokens)
            self.state = self.state.replace(params=params, opt_state=opt_state)
            jax.block_until_ready((self.state, loss))
        return call
