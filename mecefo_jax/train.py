"""The training loop: data -> step -> metrics, evals, checkpoints, progress.

The loop asks a controller, before every step, where that step runs (which
mesh, which layout of shards onto replicas), and tells it after dispatching
the step (`observe`, which must not wait for the device unless it measures). `StaticController` is fault-free
data parallelism; `faults.controller.FaultController` injects failures and
moves training between meshes. Everything else (data order, metrics,
checkpoints, NaN handling) is the same for both.
"""
import dataclasses
import functools
import logging
import math
import os
import time

import jax
import numpy as np

from mecefo_jax import checkpoint as ckpt_lib
from mecefo_jax import optim, sharding
from mecefo_jax import state as state_lib
from mecefo_jax.layout import Layout, assemble, full_layout
from mecefo_jax.metrics import MetricsWriter
from mecefo_jax.model import Llama, ModelConfig
from mecefo_jax.settings import Config
from mecefo_jax.topology import Topology, TopologyCache

log = logging.getLogger(__name__)


class NonFiniteLossError(FloatingPointError):
    """Training produced NaN/Inf; the last good state was checkpointed."""


@dataclasses.dataclass
class Plan:
    """Where the next step runs, and what the controller did to get there."""
    topology: Topology
    layout: Layout
    data_state: dict | None = None  # set when the controller rolled training back


@dataclasses.dataclass
class Run:
    """Everything built once from the config."""
    cfg: Config
    workdir: str
    model: Llama
    optimizer: object
    full_rows: tuple
    topologies: TopologyCache
    train_data: object
    val_data: object
    checkpointer: ckpt_lib.Checkpointer | None
    metrics: MetricsWriter
    val_start: dict | None = None  # validation iterator state every eval restarts from

    @functools.cached_property
    def abstract_state(self):
        """Shapes and dtypes of the train state (restore targets), traced once."""
        return state_lib.abstract_train_state(self.model, self.optimizer,
                                              rank=self.cfg.mecefo.rank)

    @property
    def num_shards(self) -> int:
        """Logical data-parallel replicas: the global batch always has this many shards."""
        return len(self.full_rows)

    @property
    def present(self) -> tuple[bool, ...]:
        """Which replicas have devices in this job (all, unless relaunched on survivors)."""
        return tuple(row is not None for row in self.full_rows)

    @property
    def present_rows(self) -> tuple:
        return tuple(row for row in self.full_rows if row is not None)

    @property
    def shard_batch(self) -> int:
        return self.cfg.data.global_batch_size // self.num_shards

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.data.global_batch_size * self.cfg.data.seq_len


def build_run(cfg, workdir: str, *, checkpoint_every: int | None = None,
              replica_rows=None) -> Run:
    """Model, optimizer, mesh rows, data pipelines, checkpointer and metrics.

    `replica_rows` lists the devices of every logical data-parallel replica,
    None for a replica whose devices are not in this job (a launcher relaunch
    on the survivors of a crash); default: the config's mesh over all
    devices. The number of replicas, not of present ones, fixes how the
    global batch is sharded, so a relaunch never changes which samples a
    shard holds.
    """
    from mecefo_jax.data import pipeline as data_lib  # grain/sentencepiece only when training

    os.makedirs(workdir, exist_ok=True)
    model = Llama(ModelConfig.from_config(cfg))
    optimizer = optim.make_optimizer(cfg.train)
    if replica_rows is None:
        replica_rows = sharding.mesh_rows(sharding.make_mesh(cfg.mesh))
    replica_rows = tuple(None if row is None else tuple(row) for row in replica_rows)
    present_rows = [row for row in replica_rows if row is not None]
    if not present_rows:
        raise ValueError('build_run: no replica has devices in this job.')
    mesh = sharding.mesh_from_rows(present_rows)
    rank = cfg.mecefo.rank
    base_shardings = state_lib.state_shardings(model, optimizer, mesh, rank)
    num_shards = len(replica_rows)
    vocab = cfg.model.vocab_size
    train_data = data_lib.make_pipeline(cfg.data, vocab_size=vocab, num_shards=num_shards,
                                        split='train')
    val_data = data_lib.make_pipeline(cfg.data, vocab_size=vocab, num_shards=num_shards,
                                      split='validation')
    every = cfg.train.checkpoint_every if checkpoint_every is None else checkpoint_every
    checkpointer = None
    if every > 0:
        checkpointer = ckpt_lib.Checkpointer(os.path.join(workdir, 'checkpoints'),
                                             save_every=every,
                                             keep=cfg.train.keep_checkpoints)
    if jax.process_index() == 0:
        with open(os.path.join(workdir, 'config.json'), 'w') as f:
            f.write(cfg.to_json())
    return Run(cfg=cfg, workdir=workdir, model=model, optimizer=optimizer,
               full_rows=replica_rows,
               topologies=TopologyCache(model, optimizer, base_shardings, rank),
               train_data=train_data, val_data=val_data, checkpointer=checkpointer,
               metrics=MetricsWriter(workdir))


def restore_onto(run: Run, checkpointer: ckpt_lib.Checkpointer, topology: Topology):
    """The latest checkpoint's (state, data state), placed on `topology`'s mesh."""
    return checkpointer.restore(ckpt_lib.abstract_like(run.abstract_state,
                                                       topology.state_shardings))


def init_or_restore(run: Run, restore=None):
    """The state to start from, placed on the mesh of the present replicas.

    `restore(run, topology) -> (state, data_state, source)` (e.g. from the
    in-memory snapshots of a launcher relaunch) wins; otherwise the latest
    Orbax checkpoint and its data state; otherwise a fresh initialisation.
    """
    topo = run.topologies.get(run.present_rows)
    cfg = run.cfg
    restored = restore(run, topo) if restore is not None else None
    if restored is None and run.checkpointer is not None \
            and run.checkpointer.latest_step() is not None:
        state, data_state = restore_onto(run, run.checkpointer, topo)
        restored = state, data_state, run.checkpointer.directory
    if restored is not None:
        state, data_state, source = restored
        run.train_data.set_state(data_state)
        step = int(state.step)
        if jax.process_index() == 0:
            print(f'resumed from step {step} ({source})', flush=True)
        run.metrics.write({'event': 'resumed', 'step': step})
        return state
    state, _ = state_lib.create_train_state(run.model, run.optimizer, topo.mesh,
                                            seed=cfg.train.seed, rank=cfg.mecefo.rank)
    return state


class StaticController:
    """Fault-free data parallelism on the full mesh."""

    def __init__(self, run: Run):
        if not all(run.present):
            raise ValueError('Some replicas have no devices in this job: train it under the '
                             'fault controller (faults.controller.FaultController).')
        self._topology = run.topologies.get(run.full_rows)
        self._layout = full_layout(run.num_shards, run.shard_batch)

    def prepare(self, clock: int, step: int, state):
        del clock, step
        return state, Plan(self._topology, self._layout)

    def observe(self, clock: int, step: int, state, metrics, dispatched: float) -> None:
        """Nothing to account without failures.

        `metrics` are the step's device arrays (reading them waits for the
        step); `dispatched` is `time.perf_counter()` when the step was launched.
        """


def evaluate(run: Run, topology: Topology, params) -> dict:
    """Exact validation loss over `train.eval_batches` fixed batches."""
    if run.val_start is None:
        run.val_start = run.val_data.get_state()
    run.val_data.set_state(run.val_start)  # same batches at every eval
    loss_sum = count = 0.0
    replicas = topology.num_replicas
    for _ in range(run.cfg.train.eval_batches):
        tokens_nt = next(run.val_data).reshape(-1, run.val_data.seq_len + 1)
        pad = -len(tokens_nt) % replicas  # rows must split evenly over live replicas
        weights_n = np.concatenate([np.ones(len(tokens_nt)), np.zeros(pad)]).astype(np.float32)
        tokens_nt = np.concatenate([tokens_nt, np.zeros((pad, tokens_nt.shape[1]), np.int32)])
        batch = topology.put_batch({'tokens': tokens_nt, 'weights': weights_n})
        s, c = jax.device_get(topology.eval_step(params, batch['tokens'], batch['weights']))
        loss_sum, count = loss_sum + float(s), count + float(c)
    val_loss = loss_sum / max(count, 1.0)
    return {'val_loss': val_loss, 'val_ppl': math.exp(min(val_loss, 50.0))}


def _progress(total: int, initial: int):
    from tqdm.auto import tqdm
    return tqdm(total=total, initial=initial, unit='step', mininterval=1.0,
                disable=jax.process_index() != 0, dynamic_ncols=True)


@dataclasses.dataclass
class StepDone:
    """What `train(on_step=...)` is told after each step is dispatched.

    `state` is the step's output (not yet computed: reading it waits), the
    state the checkpoint of step `step + 1` would hold; `data_position` the
    data iterator's position after this step's batch, which belongs with it;
    `tokens_nbt` the global batch and `layout` where its shards were computed;
    `loss` the step's loss array (`loss.is_ready()` tells, without waiting,
    whether the step has finished: its state may be donated by then).
    """
    step: int
    state: object
    layout: Layout
    tokens_nbt: np.ndarray
    data_position: dict
    loss: object
    compile_sec: float = 0.0  # compiling this step's program in the loop (0: cached)


@dataclasses.dataclass
class _InFlight:
    """A dispatched step whose metrics have not been read yet."""
    step: int
    replicas: int
    metrics: dict  # device arrays
    position: dict  # data position before this step's batch


def train(cfg, workdir: str, *, controller_factory=None, run: Run | None = None,
          stop_at: int | None = None, restore=None, on_step=None) -> dict:
    """Train for `train.steps` steps (resuming if `workdir` has checkpoints).

    `stop_at` ends the job early, as a preempted or time-limited job would,
    after checkpointing; the learning-rate schedule still spans `train.steps`.
    `restore` and `on_step` serve a launcher: see `init_or_restore` and
    `StepDone` (called after every dispatched step: snapshots, heartbeats).

    The loop never waits for a step it has just dispatched: while step k runs
    on the devices, the host draws, assembles and transfers batch k + 1.
    Metrics reach the host every `train.log_every` steps (and before evals,
    checkpoints and the end); a non-finite step is then found among the steps
    in flight, and because the step guard froze the state there, the stop
    saves that step's state with the data position before its batch.

    Returns a summary: final loss, final validation loss/perplexity, measured
    tokens/s, and what the controller reported.
    """
    run = run or build_run(cfg, workdir)
    state = init_or_restore(run, restore)
    controller = (controller_factory or StaticController)(run)
    total = cfg.train.steps
    end = total if stop_at is None else min(total, int(stop_at))
    log_every, every_eval = cfg.train.log_every, cfg.train.eval_every
    step = int(state.step)
    clock = step  # executed steps, redone ones included: the failure timeline
    summary = {'start_step': step}
    bar = _progress(total, step)
    window_start, window_tokens = time.perf_counter(), 0
    in_flight: list[_InFlight] = []
    row = {}
    try:
        while step < end:
            state, plan = controller.prepare(clock, step, state)
            if plan.data_state is not None:
                in_flight.clear()  # rolled back: those steps are redone
                run.train_data.set_state(plan.data_state)
                step = int(state.step)
                bar.n = step
            position = run.train_data.get_state()
            tokens_nbt = next(run.train_data)
            host_batch = assemble(plan.layout, tokens_nbt)
            host_batch['step'] = np.int32(step)
            batch = plan.topology.put_batch(host_batch)
            step_fn, compile_sec = plan.topology.compiled_step(state, batch, plan.layout)
            dispatched = time.perf_counter()
            state, metrics = step_fn(state, batch)
            in_flight.append(_InFlight(step, plan.topology.num_replicas, metrics, position))
            controller.observe(clock, step, state, metrics, dispatched)
            if on_step is not None:
                on_step(StepDone(step, state, plan.layout, tokens_nbt,
                                 run.train_data.get_state(), metrics['loss'], compile_sec))
            step, clock = step + 1, clock + 1
            window_tokens += run.tokens_per_step
            bar.update(1)
            # The run's last step always evaluates; an early stop (stop_at: a
            # preemption, or a launcher's planned rejoin) only on the cadence.
            evaluate_now = (every_eval and step % every_eval == 0) or step == total
            save_now = run.checkpointer is not None and (
                step % run.checkpointer.save_every == 0 or step == end)
            if step % log_every == 0 or evaluate_now or save_now:
                row = _read_metrics(run, state, in_flight)
                if step % log_every == 0 or step == end:
                    elapsed = time.perf_counter() - window_start
                    row['tokens_per_sec'] = window_tokens / max(elapsed, 1e-9)
                    window_start, window_tokens = time.perf_counter(), 0
                    bar.set_postfix(loss=f"{row['loss']:.3f}",
                                    tok_s=f"{row['tokens_per_sec']:.0f}")
                    run.metrics.write(row)
            if evaluate_now:
                row.update(evaluate(run, plan.topology, state.params))
                run.metrics.write({'step': step, 'val_loss': row['val_loss'],
                                   'val_ppl': row['val_ppl']})
                window_start = time.perf_counter()  # keep eval out of tokens/s
            if save_now:
                run.checkpointer.maybe_save(step, state, run.train_data.get_state(),
                                            force=step == end)
    finally:
        bar.close()
        if run.checkpointer is not None:
            run.checkpointer.wait()
    summary.update(final_step=step, executed_steps=clock, final_loss=row.get('loss'),
                   final_val_loss=row.get('val_loss'), final_val_ppl=row.get('val_ppl'))
    if hasattr(controller, 'summary'):
        summary.update(controller.summary())
    summary['state'] = state
    return summary


def _read_metrics(run: Run, state, in_flight: list) -> dict:
    """Fetch the metrics of the steps in flight; stop at the first non-finite one.

    Returns the metrics row of the newest step and empties `in_flight`.
    """
    fetched = jax.device_get([f.metrics for f in in_flight])
    for flight, metrics in zip(in_flight, fetched):
        if not bool(metrics['finite']):
            _stop_non_finite(run, state, flight.step, metrics, flight.position)
    newest, metrics = in_flight[-1], fetched[-1]
    in_flight.clear()
    return {'step': newest.step + 1, 'loss': float(metrics['loss']),
            'grad_norm': float(metrics['grad_norm']), 'replicas': newest.replicas}


def _stop_non_finite(run: Run, state, step: int, metrics, position: dict) -> None:
    """Checkpoint the last good state (the step guard froze it) and stop.

    `state` is the state entering `step` (every step from there on left it
    untouched) and `position` the data position before that step's batch, so
    a resumed run sees the failed batch again instead of silently skipping it.
    """
    if int(state.step) != step:
        raise AssertionError(f'step guard broken: state at {int(state.step)}, failed step {step}')
    where = 'no checkpoint (train.checkpoint_every=0)'
    if run.checkpointer is not None:
        run.checkpointer.maybe_save(step, state, position, force=True)
        run.checkpointer.wait()
        where = f'checkpoint at step {step} in {run.checkpointer.directory}'
    raise NonFiniteLossError(
        f'Non-finite loss {float(metrics["loss"])} / grad norm '
        f'{float(metrics["grad_norm"])} at step {step + 1}; saved the last good state '
        f'({where}). Lower train.learning_rate or set train.grad_clip, then resume.')
