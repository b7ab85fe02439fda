"""Step-cost benchmark: what one device pays for a full train step in each role.

This module owns the per-device cost comparison of MeCeFO (Hu et al.,
NeurIPS 2025, arXiv 2510.16415) against exact and plain baselines, and the
fault-free overhead check; `scripts/bench_step.py` is its command line.

Per-device modes
----------------
For the SAME per-device batch (`batch` sequences of `seq_len + 1` random
tokens from a fixed seed; shard 0 is the device's own, shard 1 an adopted
one) each mode is compiled on ONE device (a 1x1 ("data", "model") mesh) as
the whole train step `step.make_train_step(..., programs)`: forward,
backward, gradient combination, AdamW update and the step's state checks,
with the state donated. A single program means no `lax.switch`: the role is
a compile-time constant and the program is exactly what such a device runs.

  normal            Program(ROLE_NORMAL, B): the fault-free program (plain
                    GSPMD path of step.py);
  ndb_naive         Program(ROLE_NORMAL, 2B): own + adopted shard joined,
                    exact backward (naive neighbour-do-both);
  mecefo            Program(ROLE_NEIGHBOUR, 2B): joined, MeCeFO neighbour mode;
  mecefo_per_batch  Program(ROLE_NEIGHBOUR, B): the neighbour's per-batch cost;
  plain_dp          an independently written `jax.jit` data-parallel step
                    (`make_plain_dp_step`: value_and_grad of the mean
                    next-token loss of the same model, the same optax
                    optimizer, donated params and optimizer state; no layout,
                    weights, step check or roles), on B sequences.

Figures per mode (`modes[mode]`, and `ratios[mode]` = mode / normal)
--------------------------------------------------------------------
  flops       XLA's cost analysis of the train step compiled with
              `ModelConfig.unroll_loops=True`. The model's layer scan and the
              loss's chunk scan are while loops, and XLA's cost analysis
              counts a while body ONCE whatever its trip count; unrolled, the
              program does the same arithmetic as straight-line code and the
              count is complete. `flops_xla_raw` is the count of the program
              that really runs (loops counted once), kept for reference;
              `details[mode]['while_loops_in_flops_program']` should be 0. A
              program with no loop at all (one block, one loss chunk) is
              counted as it is (`details[mode]['flops_source']`).
  temp_bytes  `memory_analysis().temp_size_in_bytes` of the real (scanned)
              step: XLA's scratch (gradients, activations kept for the
              backward pass, optimizer intermediates).
  peak_bytes  arguments + outputs + temporaries - aliased bytes of the real
              step: everything the program holds while it runs. The state is
              donated, so its outputs reuse the argument buffers and count
              once; XLA packs the temporaries into one allocation by buffer
              liveness, so temp is already their peak. (XLA's own
              `peak_memory_in_bytes`, kept in `details`, leaves temporaries
              out on XLA:CPU.)
  step_ms     median wall time of one call, after `warmup` untimed calls, the
              modes called round-robin ("interleaved", in a fresh random
              order each round) so that load changes on a shared machine hit
              every mode alike. `iters=0` skips all
              timing (and the gradient error, which needs real parameters):
              nothing is materialised, so a 350M model at full depth is costed
              on a CPU in minutes.

`grad_rel_error` is ||g_mecefo - g_exact|| / ||g_exact|| per parameter group
on the same two shards (`make_grad_fn` of the mecefo program against the
ndb_naive one: same tokens, same divisor): `attention` (MHA and its norm; the
neighbour contributes none, so it is 1.0 by construction), `ffn` (FFN
kernels: low-rank weight gradients plus the attention cotangent missing from
later blocks), `other` (embedding, ffn/final norms, head) and
`total_non_attention`; `grad_rel_error_by_param` gives it per parameter.

Fault-free overhead (`overhead`)
--------------------------------
The fault-free train step (`layout.full_layout` over the config's full mesh,
e.g. 8 fake CPU devices) against `plain_dp` on the same mesh, state and
global batch (`batch` sequences per data replica), timed interleaved; the
ratio of medians is the price of MeCeFO's machinery when nothing has failed
(the median and quartiles of the per-round ratios show how noisy it is).

Model-FLOPs utilisation (GPU only)
----------------------------------
On a GPU, `mfu` gives the normal step's model FLOPs per second over the
device's peak (`peak_tflops`, else `PEAK_TFLOPS` by device kind), with the
model FLOPs counted two ways: `formula` = 6 x matmul parameters (everything
but the embedding table, which is a gather) x tokens + 12 x layers x d_model
x seq_len x tokens (attention scores and context, forward and backward, the
PaLM convention, not halved for the causal mask), and `xla` = the unrolled
XLA count of the whole normal step. On CPU it is reported as not applicable.

Two XLA:CPU facts bias CPU figures: it computes bfloat16 dots in float32
(more temporary bytes and slower steps than a GPU would show), and its
pipeline may CSE a `jax.checkpoint`'s recomputation back into the forward.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mecefo_jax.aot import abstract, abstract_batch, count_while_loops, flops_of, memory_of
from mecefo_jax.experiments.report import fmt

MODES = ('normal', 'ndb_naive', 'mecefo', 'mecefo_per_batch', 'plain_dp')
MECEFO_MODES = MODES[:4]  # the modes that run step.make_train_step
GROUPS = ('attention', 'ffn', 'other', 'total_non_attention')
METRICS = ('flops', 'temp_bytes', 'peak_bytes', 'step_ms')
OUTPUT_FILE = 'bench_step.json'
OVERHEAD_TARGET = 1.03  # fault-free step time / plain_dp step time
# Dense bf16 peak TFLOP/s by device-kind substring, most specific first.
PEAK_TFLOPS = (('H100 PCIe', 756.0), ('H100', 989.0), ('H200', 989.0), ('A100', 312.0))


# ------------------------------------------------------------------ programs


def mode_layout(mode: str, batch: int):
    """The one-replica layout of a MeCeFO mode: shard 0 is own, shard 1 adopted."""
    from mecefo_jax.layout import ROLE_NEIGHBOUR, ROLE_NORMAL, Layout, Piece
    own, adopted = Piece(0, 0, batch), Piece(1, 0, batch)
    role, pieces = {
        'normal': (ROLE_NORMAL, (own,)),
        'ndb_naive': (ROLE_NORMAL, (own, adopted)),
        'mecefo': (ROLE_NEIGHBOUR, (own, adopted)),
        'mecefo_per_batch': (ROLE_NEIGHBOUR, (own,)),
    }[mode]
    return Layout(replicas=(0,), roles=(role,), pieces=(pieces,))


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

    from mecefo_jax import sharding

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
    from mecefo_jax import sharding
    from mecefo_jax import step as step_lib
    from mecefo_jax.optim import make_optimizer
    from mecefo_jax.state import abstract_train_state, state_shardings
    mesh = sharding.mesh_from_rows([[device or jax.devices()[0]]])
    optimizer = make_optimizer(cfg.train)
    rank = cfg.mecefo.rank
    shardings = state_shardings(model, optimizer, mesh, rank)
    state_abs = abstract(abstract_train_state(model, optimizer, rank=rank), shardings)
    programs = mode_layout('normal', batch).programs
    step = step_lib.make_train_step(model, optimizer, mesh, shardings, programs)
    batch_abs = abstract_batch(mesh, batch, cfg.data.seq_len + 1)
    return flops_of(step.lower(state_abs, batch_abs).compile())


# ------------------------------------------------------- gradient error


def _path_names(path) -> list[str]:
    return [str(getattr(k, 'key', getattr(k, 'name', k))) for k in path]


def param_group(path) -> str:
    """'attention' (MHA branch), 'ffn' (FFN kernels) or 'other' for a params path."""
    from mecefo_jax.model import is_attention_branch
    if is_attention_branch(path):
        return 'attention'
    if 'ffn' in _path_names(path):
        return 'ffn'
    return 'other'  # embedding, ffn_norm, final_norm, head


def _squared(approx, exact):
    """{'/'-joined path: (||a - e||^2, ||e||^2)} in float64 on host."""
    out = {}

    def add(path, a, e):
        a64, e64 = np.asarray(a, np.float64), np.asarray(e, np.float64)
        out['/'.join(_path_names(path))] = (path, float(np.sum((a64 - e64) ** 2)),
                                            float(np.sum(e64 ** 2)))
    jax.tree_util.tree_map_with_path(add, approx, exact)
    return out


def _ratio(err2: float, ref2: float) -> float:
    return float(np.sqrt(err2 / ref2)) if ref2 > 0 else float('nan')


def two_shard_gradients(model, mesh, state, tokens_nbt) -> dict[str, Any]:
    """Host gradients of the ndb_naive and mecefo programs on the same two shards.

    `step.make_grad_fn` of each mode's program (gradient sums divided by the
    token count, as the train step does): same tokens, same divisor.
    """
    from mecefo_jax import sharding
    from mecefo_jax import step as step_lib
    from mecefo_jax.layout import assemble
    batch = tokens_nbt.shape[1]
    grads = {}
    for mode in ('ndb_naive', 'mecefo'):
        layout = mode_layout(mode, batch)
        host = dict(assemble(layout, tokens_nbt), step=np.int32(0))
        device_batch = jax.device_put(host, sharding.batch_shardings(mesh))
        grad_fn = jax.jit(step_lib.make_grad_fn(model, mesh, layout.programs))
        grads[mode] = jax.device_get(grad_fn(state.params, state.projections, device_batch)[0])
    return grads


def grad_rel_error(approx, exact) -> dict[str, float]:
    """||approx - exact|| / ||exact|| per parameter group, in float64 on host."""
    err2 = dict.fromkeys(GROUPS[:3], 0.0)
    ref2 = dict.fromkeys(GROUPS[:3], 0.0)
    for path, e2, r2 in _squared(approx, exact).values():
        group = param_group(path)
        err2[group] += e2
        ref2[group] += r2
    err2['total_non_attention'] = err2['ffn'] + err2['other']
    ref2['total_non_attention'] = ref2['ffn'] + ref2['other']
    return {g: _ratio(err2[g], ref2[g]) for g in GROUPS}


def grad_rel_error_by_param(approx, exact) -> dict[str, float]:
    """||approx - exact|| / ||exact|| per parameter ('/'-joined path)."""
    return {name: _ratio(e2, r2) for name, (_, e2, r2) in _squared(approx, exact).items()}


# ------------------------------------------------------- compiled costs


def time_interleaved(programs: dict, *, warmup: int, iters: int, seed: int = 0):
    """Per-name wall times (ms) of `iters` rounds calling every program once.

    `programs[name]` is a `call()` that runs one step and blocks until it is
    done. Round-robin, so a change in machine load during the run (shared
    CPUs) hits every program alike instead of whichever ran last; each round
    takes a fresh random order (seeded), so no program always runs next to
    the same one (caches a big program leaves cold, its lingering threads).
    """
    names = list(programs)
    rng = np.random.default_rng(seed)
    for _ in range(warmup):
        for call in programs.values():
            call()
    times = {name: [] for name in programs}
    for _ in range(iters):
        for k in rng.permutation(len(names)):
            name = names[k]
            start = time.perf_counter()
            programs[name]()
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


class _Runner:
    """Threads ONE donated train state through every compiled step it calls.

    MeCeFO steps get a batch stamped with step 0: the first call applies its
    update and later calls leave the state as it is (same arithmetic, see
    step.py); plain_dp steps update params and optimizer state in place.
    One state for all programs keeps a large model's memory to one copy.
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


# ---------------------------------------------------------------- driver


def config_summary(cfg, batch: int) -> dict[str, Any]:
    m = cfg.model
    return {'vocab_size': m.vocab_size, 'd_model': m.d_model, 'num_layers': m.num_layers,
            'num_heads': m.num_heads, 'num_kv_heads': m.num_kv_heads,
            'ffn_hidden': m.ffn_hidden, 'dtype': m.dtype, 'seq_len': cfg.data.seq_len,
            'per_device_batch': int(batch), 'rank': cfg.mecefo.rank,
            'remat_ffn': cfg.mecefo.remat_ffn, 'remat_policy': m.remat_policy,
            'scan_layers': m.scan_layers, 'attention': m.attention,
            'loss_chunk_tokens': m.loss_chunk_tokens}


def random_tokens(cfg, batch: int, seed: int) -> np.ndarray:
    """The benchmark's two shards (own, adopted): int32 [2, batch, seq_len + 1]."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.model.vocab_size, (2, batch, cfg.data.seq_len + 1),
                        dtype=np.int32)


def model_flops_per_token(cfg, params_abstract) -> float:
    """6 x matmul params + 12 x layers x d_model x seq_len (PaLM), per trained token.

    Matmul params: every parameter but the embedding table (a gather) and the
    norm scales (elementwise; [layers, d] when scanned, so not told by rank).
    """
    def is_matmul(path) -> bool:
        names = _path_names(path)
        return 'embedding' not in names and names[-1] != 'scale'
    matmul_params = sum(int(np.prod(x.shape)) for path, x in
                        jax.tree_util.tree_leaves_with_path(params_abstract) if is_matmul(path))
    m = cfg.model
    return 6.0 * matmul_params + 12.0 * m.num_layers * m.d_model * cfg.data.seq_len


def peak_tflops_for(device, override: float | None) -> tuple[float | None, str]:
    if override:
        return float(override), 'flag --peak_tflops'
    for key, tflops in PEAK_TFLOPS:
        if key in device.device_kind:
            return tflops, f'table entry {key!r} (dense bf16)'
    return None, f'unknown device kind {device.device_kind!r}: pass --peak_tflops'


@dataclasses.dataclass
class _Bench:
    """What every stage of `run_benchmark` shares: the model, its mesh and abstract state."""
    cfg: Any
    batch: int
    device: Any
    log: Callable[[str], None]
    model: Any
    optimizer: Any
    mesh: Any
    shardings: Any
    state_abs: Any

    @property
    def seq(self) -> int:
        return self.cfg.data.seq_len + 1


def _compile_pair(bench: _Bench, make, args, mode):
    """(real program, the program whose FLOPs are counted, compile times), from abstract args.

    A real program with no while loop (one layer, one loss chunk) is already
    straight-line code: its count is complete and it is its own counting program.
    """
    t0 = time.perf_counter()
    real = make(bench.model).lower(*args).compile()
    t1 = time.perf_counter()
    if not count_while_loops(real):
        bench.log(f'bench[{mode}]: compiled in {t1 - t0:.1f} s (no loops: counted as is)')
        return real, real, {'compile_s': t1 - t0, 'flops_source': 'step (no loops)'}
    counting = make(unrolled(bench.model)).lower(*args).compile()
    t2 = time.perf_counter()
    bench.log(f'bench[{mode}]: compiled in {t1 - t0:.1f} s (+{t2 - t1:.1f} s unrolled for FLOPs)')
    return real, counting, {'compile_s': t1 - t0, 'compile_unrolled_s': t2 - t1,
                            'flops_source': 'unrolled step'}


def _mode_program(bench: _Bench, mode: str):
    """(make(model) -> jitted step, its abstract args, what it computes) for one mode."""
    from mecefo_jax import sharding
    from mecefo_jax import step as step_lib
    from mecefo_jax.layout import ROLE_NEIGHBOUR
    if mode == 'plain_dp':
        tokens_abs = jax.ShapeDtypeStruct((bench.batch, bench.seq), jnp.int32,
                                          sharding=sharding.data_sharded(bench.mesh))
        return (lambda m: make_plain_dp_step(m, bench.optimizer, bench.mesh,
                                             bench.shardings.params, bench.shardings.opt_state),
                (bench.state_abs.params, bench.state_abs.opt_state, tokens_abs),
                {'rows': bench.batch, 'neighbour': False})
    programs = mode_layout(mode, bench.batch).programs
    return (lambda m: step_lib.make_train_step(m, bench.optimizer, bench.mesh,
                                               bench.shardings, programs),
            (bench.state_abs, abstract_batch(bench.mesh, programs[0].rows, bench.seq)),
            {'program': programs[0].name, 'rows': programs[0].rows,
             'neighbour': programs[0].role == ROLE_NEIGHBOUR})


def _compile_modes(bench: _Bench):
    """Compile every mode: (figures per mode, details per mode, the real programs)."""
    modes, details, compiled = {}, {}, {}
    for mode in MODES:
        make, args, info = _mode_program(bench, mode)
        real, counting, times = _compile_pair(bench, make, args, mode)
        memory = memory_of(real)
        compiled[mode] = real
        modes[mode] = {'flops': flops_of(counting), 'flops_xla_raw': flops_of(real),
                       'temp_bytes': memory['temp_size_in_bytes'],
                       'peak_bytes': memory['peak_bytes'], 'step_ms': None}
        details[mode] = {**info, **times, **memory,
                         'while_loops_in_flops_program': count_while_loops(counting),
                         'while_loops_in_step': count_while_loops(real),
                         'conditionals_in_step': (real.as_text() or '').count(' conditional(')}
        bench.log(f'bench[{mode}]: flops={modes[mode]["flops"]:.4g} '
                  f'(raw {modes[mode]["flops_xla_raw"]:.4g}) '
                  f'temp={memory["temp_size_in_bytes"] / 2**20:.1f} MiB '
                  f'peak={memory["peak_bytes"] / 2**20:.1f} MiB')
    return modes, details, compiled


def _optimizer_update_cost(bench: _Bench) -> dict:
    """The batch-independent part of every step: AdamW (+ clipping) alone."""
    def update(grads, opt_state, params):
        import optax
        updates, opt_state = bench.optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state
    params, opt_state = bench.state_abs.params, bench.state_abs.opt_state
    upd = jax.jit(update).lower(params, opt_state, params).compile()
    return {'flops': flops_of(upd), 'temp_bytes': memory_of(upd)['temp_size_in_bytes']}


def _time_modes(bench: _Bench, result: dict, compiled: dict, *, warmup: int, iters: int,
                seed: int, peak_tflops: float | None) -> None:
    """Gradient error of mecefo vs ndb_naive, then every mode timed interleaved (and MFU)."""
    from mecefo_jax import sharding
    from mecefo_jax.layout import assemble
    from mecefo_jax.state import create_train_state
    log, mesh, modes = bench.log, bench.mesh, result['modes']
    log('bench: initialising parameters and SVD projections...')
    state, _ = create_train_state(bench.model, bench.optimizer, mesh, seed=seed,
                                  rank=bench.cfg.mecefo.rank)
    tokens_nbt = random_tokens(bench.cfg, bench.batch, seed)
    batches = {}
    for mode in MECEFO_MODES:
        host = dict(assemble(mode_layout(mode, bench.batch), tokens_nbt), step=np.int32(0))
        batches[mode] = jax.device_put(host, sharding.batch_shardings(mesh))
    log('bench: gradient error of mecefo vs ndb_naive on the same two shards...')
    grads = two_shard_gradients(bench.model, mesh, state, tokens_nbt)
    result['grad_rel_error'] = grad_rel_error(grads['mecefo'], grads['ndb_naive'])
    result['grad_rel_error_by_param'] = grad_rel_error_by_param(grads['mecefo'],
                                                                grads['ndb_naive'])
    del grads
    runner = _Runner(state)
    calls = {mode: runner.mecefo(compiled[mode], batches[mode]) for mode in MECEFO_MODES}
    calls['plain_dp'] = runner.plain(
        compiled['plain_dp'], jax.device_put(tokens_nbt[0], sharding.data_sharded(mesh)))
    log(f'bench: timing, modes interleaved ({warmup} warm-up + {iters} timed rounds)...')
    times = time_interleaved(calls, warmup=warmup, iters=iters)
    for mode in MODES:
        modes[mode]['step_ms'] = float(statistics.median(times[mode]))
        result['details'][mode]['times_ms'] = times[mode]
        log(f'bench[{mode}]: step={modes[mode]["step_ms"]:.2f} ms')
    if bench.device.platform == 'gpu':
        result['mfu'] = _mfu(bench.cfg, bench.state_abs.params, modes['normal'], bench.batch,
                             bench.device, peak_tflops)
    else:
        result['mfu'] = {'applicable': False,
                         'reason': f'model-FLOPs utilisation is reported on GPU only '
                                   f'(this is {bench.device.platform})'}


def _overhead(bench: _Bench, *, warmup: int, iters: int, seed: int) -> dict:
    """The fault-free overhead check on the config's mesh, if it fits this host."""
    from mecefo_jax import sharding
    try:  # e.g. a 4-way 'model' mesh on a one-GPU host
        sharding.mesh_shape(bench.cfg.mesh, len(jax.devices()), allow_subset=True)
    except ValueError as error:
        bench.log(f'bench[overhead]: skipped: {error}')
        return {'skipped': f"the config's mesh does not fit this host: {error}"}
    return fault_free_overhead(bench.cfg, bench.model, bench.optimizer, batch=bench.batch,
                               warmup=warmup, iters=iters, seed=seed, log=bench.log)


def _new_bench(cfg, batch: int, device, log) -> _Bench:
    from mecefo_jax import sharding
    from mecefo_jax.model import build_model
    from mecefo_jax.optim import make_optimizer
    from mecefo_jax.state import abstract_train_state, state_shardings
    model = build_model(cfg)
    mesh = sharding.mesh_from_rows([[device]])
    optimizer = make_optimizer(cfg.train)
    rank = cfg.mecefo.rank
    shardings = state_shardings(model, optimizer, mesh, rank)
    state_abs = abstract(abstract_train_state(model, optimizer, rank=rank), shardings)
    return _Bench(cfg, batch, device, log, model, optimizer, mesh, shardings, state_abs)


def run_benchmark(cfg, out_dir: str | None = None, *, batch: int = 4, warmup: int = 2,
                  iters: int = 5, seed: int = 0, device=None, overhead: bool = True,
                  overhead_iters: int = 30, peak_tflops: float | None = None,
                  log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Cost (and with `iters > 0` time) every mode; write `out_dir/bench_step.json`.

    `cfg` is the full config (model, data.seq_len, mecefo.rank/remat_ffn,
    train for the optimizer, mesh for the overhead check). Returns the dict
    written to the JSON file.
    """
    if log is None:
        def log(msg):
            print(msg, flush=True)
    if batch < 1 or iters < 0 or warmup < 0 or overhead_iters < 1:
        raise ValueError(f'need --batch >= 1, --iters >= 0, --warmup >= 0 and '
                         f'--overhead_iters >= 1; got batch={batch}, iters={iters}, '
                         f'warmup={warmup}, overhead_iters={overhead_iters}')
    device = jax.devices()[0] if device is None else device
    bench = _new_bench(cfg, batch, device, log)
    summary = config_summary(cfg, batch)
    log(f'bench: {summary} on {device.platform}:{device.device_kind}')
    modes, details, compiled = _compile_modes(bench)
    result: dict[str, Any] = {
        'modes': modes, 'ratios': {}, 'grad_rel_error': None,
        'grad_rel_error_by_param': None, 'optimizer_update': _optimizer_update_cost(bench),
        'overhead': None, 'mfu': None,
        'measured': ('the full train step (step.make_train_step: forward, backward, '
                     'gradient combination, AdamW update, state checks; state donated) on '
                     'one device; plain_dp is an independent jax.jit data-parallel step'),
        'flops_note': ('flops: XLA cost analysis of the step compiled with '
                       'ModelConfig.unroll_loops=True (XLA counts a while body once); '
                       'flops_xla_raw: the count of the scanned program that runs'),
        'memory_note': ('peak_bytes = argument + output + temp - alias bytes of the real '
                        'step (state donated). XLA:CPU computes bf16 dots in float32, so CPU '
                        'bytes of a bf16 model estimate, and may exceed, GPU bytes'),
        'config': summary, 'device': f'{device.platform}:{device.device_kind}',
        'jax_version': jax.__version__, 'warmup': warmup, 'iters': iters, 'seed': seed,
        'details': details,
    }
    if iters > 0:
        _time_modes(bench, result, compiled, warmup=warmup, iters=iters, seed=seed,
                    peak_tflops=peak_tflops)
    else:
        result['mfu'] = {'applicable': False, 'reason': '--iters 0: nothing was timed'}
    base = modes['normal']
    result['ratios'] = {
        mode: {k: (v[k] / base[k] if v[k] is not None and base[k] else None)
               for k in METRICS} for mode, v in modes.items()}
    if overhead and iters > 0:
        result['overhead'] = _overhead(bench, warmup=warmup, iters=overhead_iters, seed=seed)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, OUTPUT_FILE)
        with open(path, 'w') as f:
            json.dump(result, f, indent=2)
        log(f'bench: wrote {path}')
    return result


def _mfu(cfg, params_abs, normal, batch, device, peak_override):
    """Model-FLOPs utilisation of the normal step (GPU): see the module docstring."""
    peak, source = peak_tflops_for(device, peak_override)
    tokens = batch * cfg.data.seq_len
    formula = model_flops_per_token(cfg, params_abs) * tokens
    seconds = normal['step_ms'] / 1e3
    out = {'applicable': peak is not None, 'peak_tflops': peak, 'peak_source': source,
           'tokens_per_step': tokens, 'formula_flops': formula, 'xla_flops': normal['flops'],
           'counting': ('formula: 6 x matmul params (all but the embedding table) x tokens '
                        '+ 12 x layers x d_model x seq_len x tokens (PaLM; causal mask not '
                        'halved); xla: XLA cost analysis of the unrolled normal train step'),
           'dtype': cfg.model.dtype}
    if peak is not None:
        out['formula'] = formula / seconds / (peak * 1e12)
        out['xla'] = normal['flops'] / seconds / (peak * 1e12)
    return out


def fault_free_overhead(cfg, model, optimizer, *, batch: int, warmup: int, iters: int,
                        seed: int = 0, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Fault-free train step vs plain_dp on the config's full mesh, timed interleaved."""
    from mecefo_jax import sharding
    from mecefo_jax import step as step_lib
    from mecefo_jax.layout import assemble, full_layout
    from mecefo_jax.state import create_train_state

    mesh = sharding.make_mesh(cfg.mesh, allow_subset=True)  # e.g. the tests' 1x1 mesh
    data, model_width = mesh.shape[sharding.DATA_AXIS], mesh.shape[sharding.MODEL_AXIS]
    layout = full_layout(data, batch)
    rank = cfg.mecefo.rank
    seq = cfg.data.seq_len + 1
    log(f'bench[overhead]: fault-free step vs plain_dp on a {data}x{model_width} mesh, '
        f'{batch} sequences per replica...')
    state, shardings = create_train_state(model, optimizer, mesh, seed=seed, rank=rank)
    rng = np.random.default_rng(seed + 1)
    tokens_nbt = rng.integers(0, cfg.model.vocab_size, (data, batch, seq), dtype=np.int32)
    host = dict(assemble(layout, tokens_nbt), step=np.int32(0))
    step_batch = jax.device_put(host, sharding.batch_shardings(mesh))
    tokens = jax.device_put(tokens_nbt.reshape(data * batch, seq), sharding.data_sharded(mesh))

    fault_free = step_lib.make_train_step(model, optimizer, mesh, shardings,
                                          layout.programs).lower(state, step_batch).compile()
    plain = make_plain_dp_step(model, optimizer, mesh, shardings.params,
                               shardings.opt_state).lower(
        state.params, state.opt_state, tokens).compile()
    runner = _Runner(state)
    times = time_interleaved({'fault_free': runner.mecefo(fault_free, step_batch),
                              'plain_dp': runner.plain(plain, tokens)},
                             warmup=max(warmup, 2), iters=iters)
    ff, pd = (float(statistics.median(times[k])) for k in ('fault_free', 'plain_dp'))
    # Each round ran both steps back to back: the per-round ratio cancels
    # load changes slower than a round; its quartiles show the noise.
    paired = sorted(a / b for a, b in zip(times['fault_free'], times['plain_dp']))
    quartiles = (statistics.quantiles(paired, n=4) if len(paired) > 1
                 else [paired[0]] * 3)
    out = {'mesh': {'data': int(data), 'model': int(model_width)},
           'global_batch': int(data * batch), 'iters': iters,
           'fault_free_ms': ff, 'plain_dp_ms': pd, 'ratio': ff / pd,
           'paired_ratio_median': float(statistics.median(paired)),
           'paired_ratio_quartiles': [float(quartiles[0]), float(quartiles[2])],
           'target': OVERHEAD_TARGET, 'met': ff / pd <= OVERHEAD_TARGET,
           'flops_xla_raw': {'fault_free': flops_of(fault_free), 'plain_dp': flops_of(plain)},
           'peak_bytes': {'fault_free': memory_of(fault_free)['peak_bytes'],
                          'plain_dp': memory_of(plain)['peak_bytes']},
           'times_ms': times}
    log(f'bench[overhead]: fault-free {ff:.2f} ms, plain_dp {pd:.2f} ms, '
        f'ratio {ff / pd:.3f} (target <= {OVERHEAD_TARGET})')
    return out


# ---------------------------------------------------------------- output


def format_table(result: dict[str, Any]) -> str:
    """A plain-text table of the figures, their ratios and the gradient error."""
    lines = [f"{'mode':<17}{'GFLOPs':>10}{'x':>7}{'raw GF':>9}{'temp MiB':>10}{'x':>7}"
             f"{'peak MiB':>10}{'x':>7}{'step ms':>10}{'x':>7}"]
    for mode, v in result['modes'].items():
        r = result['ratios'][mode]
        lines.append(
            f"{mode:<17}{v['flops'] / 1e9:>10.2f}{r['flops']:>7.3f}"
            f"{v['flops_xla_raw'] / 1e9:>9.2f}"
            f"{v['temp_bytes'] / 2**20:>10.1f}{r['temp_bytes']:>7.3f}"
            f"{v['peak_bytes'] / 2**20:>10.1f}{r['peak_bytes']:>7.3f}"
            + fmt(v['step_ms'], '>10.2f', missing=f'{"-":>10}')
            + fmt(r['step_ms'], '>7.3f', missing=f'{"-":>7}'))
    o = result['optimizer_update']
    lines.append(f"(AdamW update alone: {o['flops'] / 1e9:.3f} GFLOPs; GFLOPs are XLA's count "
                 f"of the unrolled step, raw GF of the scanned one)")
    err = result['grad_rel_error']
    if err is not None:
        lines.append('grad rel error (mecefo vs exact, same 2 shards): ' + ', '.join(
            f'{g}={err[g]:.4g}' for g in GROUPS)
            + '  [attention=1 by construction: the neighbour gives no attention gradient]')
    ov = result.get('overhead')
    if ov and 'skipped' in ov:
        lines.append(f"fault-free overhead: skipped ({ov['skipped']})")
    elif ov:
        lines.append(f"fault-free overhead on a {ov['mesh']['data']}x{ov['mesh']['model']} mesh "
                     f"(global batch {ov['global_batch']}, {ov['iters']} interleaved rounds): "
                     f"fault-free {ov['fault_free_ms']:.2f} ms / plain_dp "
                     f"{ov['plain_dp_ms']:.2f} ms = {ov['ratio']:.3f} "
                     f"(target <= {ov['target']}: {'met' if ov['met'] else 'MISSED'}); "
                     f"per-round ratio median {ov['paired_ratio_median']:.3f}, quartiles "
                     f"{ov['paired_ratio_quartiles'][0]:.3f}-{ov['paired_ratio_quartiles'][1]:.3f}")
    mfu = result.get('mfu') or {}
    if mfu.get('applicable'):
        lines.append(f"MFU of the normal step: {mfu['formula']:.1%} (formula FLOPs), "
                     f"{mfu['xla']:.1%} (XLA count); peak {mfu['peak_tflops']} TFLOP/s "
                     f"from {mfu['peak_source']}")
    elif mfu:
        lines.append(f"MFU: not applicable ({mfu.get('reason', mfu.get('peak_source'))})")
    return '\n'.join(lines)


def main(cfg, out_dir: str, **kwargs) -> dict[str, Any]:
    """Entry point for scripts/bench_step.py: run, print the table, write JSON."""
    result = run_benchmark(cfg, out_dir, **kwargs)
    print(format_table(result), flush=True)
    return result
