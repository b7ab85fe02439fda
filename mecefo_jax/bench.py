"""Step-cost benchmark: what one device pays per step in each role.

For the SAME per-device batch (`batch` sequences of `seq_len + 1` random
tokens from a fixed seed, two shards: the device's own and an adopted one)
this compiles, on ONE device (a 1x1 ("data", "model") mesh), the per-device
gradient program of `step.make_grad_fn` for four modes:

  normal     one slot (own shard), exact backward (ROLE_NORMAL);
  ndb_naive  two slots (own + adopted), exact backward (naive Neighbor-Do-Both);
  mecefo     two slots (own + adopted), MeCeFO neighbour backward (ROLE_NEIGHBOUR);
  mecefo_per_batch  one slot in neighbour mode: the per-batch cost, without the
             float32 gradient accumulator two sequential slots need.

What is measured, per mode
--------------------------
The gradient computation only: `make_grad_fn(model, mesh)(params, projections,
batch)`, i.e. forward + backward over the device's slots, the `psum` (a no-op
on one device) and the division of gradient sums by token counts. The
optimizer update is NOT included in the per-mode figures: it is identical in
every mode (same parameters, same AdamW), so it would only dilute the ratios.
It is measured once on its own and reported under `optimizer_update`, with
`ratios_with_update` giving the FLOP and time ratios of grad + update.

The layout's roles are compile-time constants of the benchmarked program, so
XLA folds the step's `lax.cond` on the role and the program is exactly the
branch the device executes (at run time a `lax.cond` runs one branch anyway;
folding it also keeps the untaken branch out of the memory and cost figures).

  flops       XLA's cost analysis (`compiled.cost_analysis()['flops']`) of the
              gradient computation over all slots. XLA's cost analysis counts
              a while-loop body ONCE whatever its trip count, and the step
              scans its slots with `lax.scan` (a while loop; a one-slot scan
              is no loop after compilation). So when the compiled step program
              has a loop, the FLOPs come from a counting program with the same
              per-slot computation (`step.token_loss_sum` under
              `jax.value_and_grad`, summed over slots, then `step.combine`)
              and the slot loop unrolled in Python (`details[mode]
              ['flops_source']` says which). The raw count of the step program
              is kept as `details[mode]['flops_xla_step_program']`.
  temp_bytes  `compiled.memory_analysis().temp_size_in_bytes` of the step
              program itself (scan included): XLA's scratch buffers
              (activations kept for backward, gradient accumulators, ...),
              excluding arguments (params, projections, tokens) and outputs.
  step_ms     median wall time of calls to the compiled step program after
              `warmup` untimed calls, each timed call ending with
              `block_until_ready`; the modes are called round-robin so that
              load changes on a shared machine hit all of them alike.

`details[mode]` also keeps XLA's argument and output sizes: the outputs
(the gradients) are the same in every mode, but only a scanned multi-slot
program also needs a gradient accumulator (one float32 copy of the
parameters) as temp while it computes the next slot,
so `temp_size_in_bytes + output_size_in_bytes` (`ratios_temp_plus_output`)
is the fairer device-memory comparison between one- and multi-slot programs:
it is what a full train step (gradients + AdamW, state donated) holds as
scratch, where the gradients are temporaries in every mode.

`grad_rel_error` is ||g_mecefo - g_exact|| / ||g_exact|| per parameter group
on the same two shards (the mecefo program's output against the ndb_naive
one's: same tokens, same divisor, so it is also the error of the sums):
`attention` (MHA weights and their norm: the neighbour contributes none, so
its output there is zero and the error is 1.0 by construction), `ffn` (the
three FFN kernels: low-rank weight gradient plus the missing attention
cotangent from later blocks), `other` (embeddings, the other norms, head) and
`total_non_attention` (ffn + other).

Works unchanged on CPU and GPU; on CPU bfloat16 runs, slowly
(`--config.model.dtype=float32` to avoid it). Two XLA:CPU facts bias CPU
figures: its pipeline expands `jax.checkpoint`'s optimization barriers before
CSE, which then merges the FFN recomputation back into the forward (so on CPU
`mecefo.remat_ffn` changes neither FLOPs nor memory), and it computes bf16
dots in float32.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

MODES = ('normal', 'ndb_naive', 'mecefo', 'mecefo_per_batch')
GROUPS = ('attention', 'ffn', 'other', 'total_non_attention')
METRICS = ('flops', 'temp_bytes', 'step_ms')
OUTPUT_FILE = 'bench_step.json'


# ------------------------------------------------------------------ layouts


def mode_layouts(batch: int) -> dict:
    """The per-device layout of each mode: shard 0 is own, shard 1 adopted."""
    from mecefo_jax.layout import ROLE_NEIGHBOUR, ROLE_NORMAL, Layout, Piece
    own, adopted = Piece(0, 0, batch), Piece(1, 0, batch)
    return {
        'normal': Layout(replicas=(0,), roles=(ROLE_NORMAL,), slots=((own,),),
                         slot_batch=batch),
        'ndb_naive': Layout(replicas=(0,), roles=(ROLE_NORMAL,),
                            slots=((own, adopted),), slot_batch=batch),
        'mecefo': Layout(replicas=(0,), roles=(ROLE_NEIGHBOUR,),
                         slots=((own, adopted),), slot_batch=batch),
        # One batch in neighbour mode: the per-batch saving, without the
        # float32 gradient accumulator that two sequential slots need.
        'mecefo_per_batch': Layout(replicas=(0,), roles=(ROLE_NEIGHBOUR,), slots=((own,),),
                                   slot_batch=batch),
    }


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


def grad_rel_error(approx, exact) -> dict[str, float]:
    """||approx - exact|| / ||exact|| per parameter group, in float64 on host."""
    err2 = dict.fromkeys(GROUPS[:3], 0.0)
    ref2 = dict.fromkeys(GROUPS[:3], 0.0)

    def add(path, a, e):
        group = param_group(path)
        a64, e64 = np.asarray(a, np.float64), np.asarray(e, np.float64)
        err2[group] += float(np.sum((a64 - e64) ** 2))
        ref2[group] += float(np.sum(e64 ** 2))

    jax.tree_util.tree_map_with_path(add, approx, exact)
    err2['total_non_attention'] = err2['ffn'] + err2['other']
    ref2['total_non_attention'] = ref2['ffn'] + ref2['other']
    return {g: (float(np.sqrt(err2[g] / ref2[g])) if ref2[g] > 0 else float('nan'))
            for g in GROUPS}


# ------------------------------------------------------- compiled costs


def flops_of(compiled) -> float:
    """FLOPs from `cost_analysis()`, which is a dict, a list of dicts or None."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else None
    if not analysis:
        return float('nan')
    return float(analysis.get('flops', float('nan')))


def memory_of(compiled) -> dict[str, int]:
    """The byte counts of `memory_analysis()` (temp, arguments, outputs, ...)."""
    stats = compiled.memory_analysis()
    fields = ('temp_size_in_bytes', 'argument_size_in_bytes', 'output_size_in_bytes',
              'alias_size_in_bytes', 'generated_code_size_in_bytes')
    if stats is None:
        return {f: -1 for f in fields}
    return {f: int(getattr(stats, f, -1)) for f in fields}


def time_calls(fn: Callable, args, *, warmup: int, iters: int):
    """(wall times in ms of `iters` calls after `warmup` calls, last output)."""
    out = None
    for _ in range(warmup):
        out = jax.block_until_ready(fn(*args))
    times = []
    for _ in range(max(1, iters)):
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - start) * 1e3)
    return times, out


def time_interleaved(programs: dict, *, warmup: int, iters: int):
    """Per-name wall times (ms) of `iters` rounds calling every program once.

    Round-robin over the programs, so a change in machine load during the run
    (shared CPUs) hits every mode alike instead of whichever ran last.
    Returns (times by name, last output by name).
    """
    last = {}
    for _ in range(warmup):
        for name, (fn, args) in programs.items():
            last[name] = jax.block_until_ready(fn(*args))
    times = {name: [] for name in programs}
    for _ in range(max(1, iters)):
        for name, (fn, args) in programs.items():
            start = time.perf_counter()
            last[name] = jax.block_until_ready(fn(*args))
            times[name].append((time.perf_counter() - start) * 1e3)
    return times, last


def _counting_program(model, num_slots: int, neighbour: bool):
    """The slots' gradient computation with the slot loop unrolled (FLOP counting)."""
    from mecefo_jax import step

    def program(params, projections, tokens_spt, weights_sp):
        grad_sums, loss_sum = None, 0.0
        for s in range(num_slots):
            loss, grads = jax.value_and_grad(
                lambda p, s=s: step.token_loss_sum(model, p, projections, tokens_spt[s],
                                                   weights_sp[s], neighbour=neighbour))(params)
            loss_sum = loss_sum + loss
            grad_sums = grads if grad_sums is None else jax.tree.map(jnp.add, grad_sums, grads)
        tokens = jnp.sum(weights_sp) * (tokens_spt.shape[-1] - 1)
        attn_tokens = jnp.where(neighbour, 0.0, tokens)
        return step.combine(grad_sums, tokens, attn_tokens), loss_sum

    return program


# ---------------------------------------------------------------- driver


def _config_summary(cfg, batch: int) -> dict[str, Any]:
    m = cfg.model
    return {'vocab_size': int(m.vocab_size), 'd_model': int(m.d_model),
            'num_layers': int(m.num_layers), 'num_heads': int(m.num_heads),
            'num_kv_heads': int(m.num_kv_heads), 'ffn_hidden': int(m.ffn_hidden),
            'dtype': str(m.dtype), 'seq_len': int(cfg.data.seq_len),
            'per_device_batch': int(batch), 'rank': cfg.mecefo.rank,
            'remat_ffn': bool(cfg.mecefo.remat_ffn)}


def run_benchmark(cfg, out_dir: str | None = None, *, batch: int = 4, warmup: int = 2,
                  iters: int = 5, seed: int = 0, device=None, with_update: bool = True,
                  log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Compile, cost and time the three modes; write `out_dir/bench_step.json`.

    `cfg` is the full ConfigDict (model, data.seq_len, mecefo.rank/remat_ffn,
    train for the optimizer). Returns the dict written to the JSON file.
    """
    from mecefo_jax import sharding, step
    from mecefo_jax.layout import ROLE_NEIGHBOUR, assemble
    from mecefo_jax.model import Llama, ModelConfig
    from mecefo_jax.optim import make_optimizer
    from mecefo_jax.state import create_train_state

    if log is None:
        log = lambda msg: print(msg, flush=True)
    if batch < 1 or iters < 1 or warmup < 0:
        raise ValueError(f'need batch >= 1, iters >= 1, warmup >= 0; got batch={batch}, '
                         f'iters={iters}, warmup={warmup}')
    device = jax.devices()[0] if device is None else device
    model = Llama(ModelConfig.from_config(cfg))
    mesh = sharding.mesh_from_rows([[device]])
    optimizer = make_optimizer(cfg.train)
    summary = _config_summary(cfg, batch)
    log(f'bench: {summary} on {device.platform}:{device.device_kind}')

    log('bench: initialising parameters and SVD projections...')
    state, _ = create_train_state(model, optimizer, mesh, seed=seed, rank=cfg.mecefo.rank)
    params, projections = state.params, state.projections
    rng = np.random.default_rng(seed)
    seq = int(cfg.data.seq_len) + 1
    tokens_nbt = rng.integers(0, int(cfg.model.vocab_size), (2, batch, seq), dtype=np.int32)
    data_sharding = sharding.data_sharded(mesh)
    grad_fn = step.make_grad_fn(model, mesh)

    modes, details, outputs, programs = {}, {}, {}, {}
    for mode, layout in mode_layouts(batch).items():
        assembled = assemble(layout, tokens_nbt)
        roles = np.asarray(assembled['roles'])  # a constant: XLA folds the role cond
        tokens = jax.device_put(assembled['tokens'], data_sharding)
        weights = jax.device_put(assembled['weights'], data_sharding)
        args = (params, projections, tokens, weights)

        def program(p, v, tok, w, roles=roles):
            return grad_fn(p, v, {'tokens': tok, 'weights': w, 'roles': roles})

        log(f'bench[{mode}]: compiling step program ({layout.num_slots} slot(s))...')
        t0 = time.perf_counter()
        compiled = jax.jit(program).lower(*args).compile()
        compile_s = time.perf_counter() - t0
        memory = memory_of(compiled)
        hlo = compiled.as_text() or ''

        neighbour = bool(layout.roles[0] == ROLE_NEIGHBOUR)
        loops = hlo.count(' while(')
        if loops:
            log(f'bench[{mode}]: compiling FLOP-counting program (slots unrolled)...')
            counting = jax.jit(_counting_program(model, layout.num_slots, neighbour))
            flops, flops_source = flops_of(counting.lower(*args).compile()), 'unrolled_slots'
        else:  # no loop: XLA's count of the step program is complete
            flops, flops_source = flops_of(compiled), 'step_program'

        programs[mode] = (compiled, args)
        modes[mode] = {'flops': flops, 'temp_bytes': memory['temp_size_in_bytes']}
        details[mode] = {'slots': layout.num_slots, 'neighbour': neighbour,
                         'flops_source': flops_source,
                         'flops_xla_step_program': flops_of(compiled), 'compile_s': compile_s,
                         'conditionals_in_hlo': hlo.count(' conditional('),
                         'while_loops_in_hlo': loops, **memory,
                         'temp_plus_output_bytes': (memory['temp_size_in_bytes']
                                                    + memory['output_size_in_bytes'])}
        log(f'bench[{mode}]: flops={flops:.4g} '
            f'temp={memory["temp_size_in_bytes"] / 2**20:.1f} MiB (compile {compile_s:.1f} s)')

    log(f'bench: timing, modes interleaved ({warmup} warm-up + {iters} timed rounds)...')
    times, last = time_interleaved(programs, warmup=warmup, iters=iters)
    for mode, (grads, stats) in last.items():
        outputs[mode] = grads
        modes[mode]['step_ms'] = float(statistics.median(times[mode]))
        details[mode].update(times_ms=times[mode], loss=float(stats['loss']))
        log(f'bench[{mode}]: step={modes[mode]["step_ms"]:.1f} ms')

    base = modes['normal']
    ratios = {mode: {k: (v[k] / base[k] if base[k] else float('nan')) for k in METRICS}
              for mode, v in modes.items()}
    result: dict[str, Any] = {
        'modes': modes, 'ratios': ratios,
        'grad_rel_error': grad_rel_error(outputs['mecefo'], outputs['ndb_naive']),
        'measured': ('gradient computation only (make_grad_fn: forward + backward over the '
                     'slots, psum, division by token counts); optimizer update excluded, '
                     'reported separately under optimizer_update'),
        'flops_note': ('XLA counts a while-loop body once; for programs with a slot loop, '
                       'flops are from the same per-slot computation with the slot loop '
                       'unrolled (details.flops_source); details.flops_xla_step_program is '
                       'the raw count of the step program'),
        'grad_rel_error_note': ('mecefo vs exact (ndb_naive) gradients of the same two shards; '
                                'attention is 1.0 by construction: the neighbour contributes no '
                                'attention-branch gradient'),
        'ratios_temp_plus_output': {
            mode: details[mode]['temp_plus_output_bytes']
            / details['normal']['temp_plus_output_bytes'] for mode in modes},
        'config': summary, 'device': f'{device.platform}:{device.device_kind}',
        'jax_version': jax.__version__, 'warmup': warmup, 'iters': iters, 'seed': seed,
        'details': details,
    }

    if with_update:
        log('bench[optimizer_update]: compiling and timing the AdamW update alone...')
        import optax

        def update(grads, opt_state, p):
            updates, opt_state = optimizer.update(grads, opt_state, p)
            return optax.apply_updates(p, updates), opt_state

        upd_args = (outputs['normal'], state.opt_state, params)
        upd = jax.jit(update).lower(*upd_args).compile()
        times, _ = time_calls(upd, upd_args, warmup=warmup, iters=iters)
        opt = {'flops': flops_of(upd), 'temp_bytes': memory_of(upd)['temp_size_in_bytes'],
               'step_ms': float(statistics.median(times))}
        result['optimizer_update'] = opt
        result['ratios_with_update'] = {
            mode: {k: (v[k] + opt[k]) / (base[k] + opt[k]) for k in ('flops', 'step_ms')}
            for mode, v in modes.items()}

    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, OUTPUT_FILE)
        with open(path, 'w') as f:
            json.dump(result, f, indent=2)
        log(f'bench: wrote {path}')
    return result


def format_table(result: dict[str, Any]) -> str:
    """A plain-text table of the figures, their ratios and the gradient error."""
    lines = [f"{'mode':<16} {'GFLOPs':>10} {'x':>6} {'temp MiB':>10} {'x':>6} "
             f"{'step ms':>10} {'x':>6}"]
    for mode, v in result['modes'].items():
        r = result['ratios'][mode]
        lines.append(f"{mode:<16} {v['flops'] / 1e9:>10.3f} {r['flops']:>6.3f} "
                     f"{v['temp_bytes'] / 2**20:>10.1f} {r['temp_bytes']:>6.3f} "
                     f"{v['step_ms']:>10.1f} {r['step_ms']:>6.3f}")
    if 'ratios_temp_plus_output' in result:
        lines.append('temp + output bytes (what a train step holds besides its state): ' + ', '.join(
            f'{m} x{r:.3f}' for m, r in result['ratios_temp_plus_output'].items()))
    if 'optimizer_update' in result:
        o = result['optimizer_update']
        lines.append(f"{'(update)':<16} {o['flops'] / 1e9:>10.3f} {'':>6} "
                     f"{o['temp_bytes'] / 2**20:>10.1f} {'':>6} {o['step_ms']:>10.1f}")
        lines.append('with update: ' + ', '.join(
            f"{m} flops x{r['flops']:.3f} time x{r['step_ms']:.3f}"
            for m, r in result['ratios_with_update'].items()))
    err = result['grad_rel_error']
    lines.append('grad rel error (mecefo vs exact, same 2 shards): ' + ', '.join(
        f'{g}={err[g]:.4f}' for g in GROUPS)
        + '  [attention=1 by construction: the neighbour gives no attention gradient]')
    return '\n'.join(lines)


def main(cfg, out_dir: str, *, batch: int = 4, warmup: int = 2, iters: int = 5,
         seed: int = 0) -> dict[str, Any]:
    """Entry point for scripts/bench_step.py: run, print the table, write JSON."""
    result = run_benchmark(cfg, out_dir, batch=batch, warmup=warmup, iters=iters, seed=seed)
    print(format_table(result), flush=True)
    return result
