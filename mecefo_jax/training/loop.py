"""The training loop: data -> step -> metrics, evals, checkpoints, progress.

A controller says where each step runs (`training/controller.py`); its `after_dispatch`
must not wait for the device unless it measures a recovery. Data order, metrics,
checkpoints and NaN handling are the same under every controller; measurement is the
observers' (observers.py).
"""
import dataclasses
import math
import time

import jax
import numpy as np

from mecefo_jax.config.defaults import step_window
from mecefo_jax.model.optim import learning_rate_schedule
from mecefo_jax.parallel.topology import Topology
from mecefo_jax.training import resume
from mecefo_jax.training.controller import Plan, StaticController
from mecefo_jax.training.metrics import preempted_row
from mecefo_jax.training.observers import Observer, PlannedStep, StepDone
from mecefo_jax.training.preemption import Preempted
from mecefo_jax.training.run_setup import Run, build_run
from mecefo_jax.training.summaries import TRAIN_RUN, run_dir


class NonFiniteLossError(FloatingPointError):
    """Training produced NaN/Inf; the last good state was checkpointed."""


def _progress(total: int, initial: int):
    from tqdm.auto import tqdm
    return tqdm(total=total, initial=initial, unit='step', mininterval=1.0,
                disable=jax.process_index() != 0, dynamic_ncols=True)


@dataclasses.dataclass
class _InFlight:
    """A dispatched step whose metrics have not been read yet."""
    step: int
    replicas: int
    neighbour_rows: int  # rows computed in neighbour mode (MeCeFO's approximate backward)
    metrics: dict  # device arrays
    position: dict  # data position before this step's batch


def train(cfg, workdir: str, *, controller=None, run: Run | None = None,
          stop_at: int | None = None, restore=None, observers=(), preemption=None) -> dict:
    """Train for `train.steps` steps (resuming if `workdir` has checkpoints); returns a summary
    (final losses, then what the controller and each observer reported, and `state`).

    `controller` defaults to `StaticController`; `stop_at` ends the job early after
    checkpointing (the schedule still spans `train.steps`), as does an observer's
    `stop_requested`; `restore` serves a launcher (`resume.init_or_restore`); `preemption`
    is asked before every step whether to stop.

    The loop never waits for a step it has just dispatched: while step k runs, the host
    prepares batch k + 1. Metrics reach the host every `train.log_every` steps (and before
    evals, checkpoints and the end); a non-finite step is then found among those in
    flight and, the step guard having frozen the state there, saved with the data
    position before its batch.
    """
    run = run or build_run(cfg, workdir)
    state = resume.init_or_restore(run, restore)
    if cfg.train.init_from and int(state.step) == 0 and cfg.train.eval_every:
        # The imported model's own validation loss, at step 0, before training moves it.
        run.metrics.write({'step': 0, **evaluate(run, run.topologies.get(run.present_rows), state.params)})
    controller = StaticController(run) if controller is None else controller
    window = step_window(cfg.train.profile_steps)
    profiler = ProfileSteps(run.workdir, *window) if window else None
    total = cfg.train.steps
    end = total if stop_at is None else min(total, int(stop_at))
    loop = _Loop(run, controller, tuple(observers) + ((profiler,) if profiler else ()), total, int(state.step))
    summary = {'start_step': loop.step}
    try:
        while loop.step < end:
            if preemption is not None and preemption.requested(loop.clock):
                loop.preempt(state)
            state, plan = loop.run_step(state)
            if loop.log_eval_save(state, plan, end):
                break
    finally:
        if profiler is not None:
            profiler.close()
        loop.close()
    summary.update(final_step=loop.step, executed_steps=loop.clock,
                   final_loss=loop.row.get('loss'), final_val_loss=loop.row.get('val_loss'),
                   final_val_ppl=loop.row.get('val_ppl'))
    summary.update(controller.summary())
    for observer in observers:
        summary.update(observer.summary(dict(summary)))
    summary['state'] = state
    return summary


class _Loop:
    """The loop's running position: step and clock, steps in flight, throughput window."""

    def __init__(self, run: Run, controller, observers: tuple, total: int, step: int):
        self.run, self.controller, self.observers = run, controller, observers
        self.total, self.step = total, step
        self.clock = step  # executed steps, redone ones included: the failure timeline
        cfg = run.cfg
        self.log_every, self.every_eval = cfg.train.log_every, cfg.train.eval_every
        self.bar = _progress(total, step)
        self.window_start, self.window_tokens = time.perf_counter(), 0
        self.schedule = jax.jit(learning_rate_schedule(cfg.train))  # one small program, not one per op
        self.in_flight: list[_InFlight] = []
        self.row = {}

    def run_step(self, state):
        """Plan, draw, dispatch one step and tell the observers; (state, plan)."""
        run, step = self.run, self.step
        state, plan = self.controller.prepare(self.clock, step, state)
        if plan.data_state is not None:
            self.in_flight.clear()  # rolled back: those steps are redone
            run.train_data.set_state(plan.data_state)
            step = self.step = int(state.step)
            self.bar.n = step
            run.metrics.rolled_back(step)
        position = run.train_data.get_state()
        tokens_nbt = next(run.train_data)
        for observer in self.observers:
            observer.on_plan(PlannedStep(self.clock, step, state, plan, tokens_nbt))
        host_batch = plan.step_layout.assemble(tokens_nbt)
        host_batch['step'] = np.int32(step)
        batch = plan.topology.put_batch(host_batch)
        step_fn, compile_sec = plan.topology.compiled_step(state, batch, plan.step_layout)
        dispatched = time.perf_counter()
        state, metrics = step_fn(state, batch)
        self.in_flight.append(_InFlight(step, len(plan.layout.replicas), plan.layout.neighbour_mode_rows(),
                                        metrics, position))
        events = self.controller.after_dispatch(self.clock, step, state, dispatched)
        done = StepDone(self.clock, step, state, plan, tokens_nbt, run.train_data.get_state(),
                        metrics, dispatched, compile_sec)
        scalars = {}
        for observer in self.observers:
            for event in events:
                observer.on_event(event)
            observer.on_step(done)
            scalars.update(observer.step_scalars())
        if scalars:
            run.metrics.scalars(step + 1, scalars)
        self.step, self.clock = step + 1, self.clock + 1
        self.window_tokens += run.tokens_per_step
        self.bar.update(1)
        return state, plan

    def log_eval_save(self, state, plan: Plan, end: int) -> bool:
        """After a step: metrics on the log cadence, evals, checkpoints; True to stop here."""
        run, step = self.run, self.step
        # The run's last step always evaluates; an early stop (stop_at: a
        # preemption, or a launcher's planned rejoin) only on the cadence.
        evaluate_now = (self.every_eval and step % self.every_eval == 0) or step == self.total
        if any(observer.stop_requested() for observer in self.observers):
            end = step
        save_now = run.checkpointer is not None and (
            step % run.checkpointer.save_every == 0 or step == end)
        if step % self.log_every == 0 or evaluate_now or save_now:
            self.row = _read_metrics(run, state, self.in_flight)
            if step % self.log_every == 0 or step == end:
                elapsed = time.perf_counter() - self.window_start
                self.row['tokens_per_sec'] = self.window_tokens / max(elapsed, 1e-9)
                self.row['step_sec'] = elapsed / max(self.window_tokens // run.tokens_per_step, 1)
                self.row['learning_rate'] = float(self.schedule(step - 1))  # the one its update used
                self.window_start, self.window_tokens = time.perf_counter(), 0
                self.bar.set_postfix(loss=f"{self.row['loss']:.3f}",
                                     tok_s=f"{self.row['tokens_per_sec']:.0f}")
                run.metrics.write(self.row)
        if evaluate_now:
            self.row.update(evaluate(run, plan.topology, state.params))
            run.metrics.write({'step': step, 'val_loss': self.row['val_loss'],
                               'val_ppl': self.row['val_ppl']})
            self.window_start = time.perf_counter()  # keep eval out of tokens/s
        if save_now:
            seconds = run.checkpointer.maybe_save(step, state, run.train_data.get_state(), force=step == end)
            run.metrics.scalars(step, {'checkpoint_sec': seconds})
        return step == end

    def preempt(self, state) -> None:
        """Asked to stop (SIGTERM, Ctrl-C): save the state entering `self.step` synchronously,
        then raise Preempted."""
        run, step = self.run, self.step
        if self.in_flight:  # a non-finite step among them stops as it always does
            self.row = _read_metrics(run, state, self.in_flight)
        where = 'nothing saved: train.checkpoint_every=0'
        if run.checkpointer is not None:
            run.checkpointer.maybe_save(step, state, run.train_data.get_state(), force=True)
            run.checkpointer.wait()
            where = f'checkpoint in {run.checkpointer.directory}'
        run.metrics.write(preempted_row(step))
        raise Preempted(step, where)

    def close(self) -> None:
        self.bar.close()
        if self.run.checkpointer is not None:
            self.run.checkpointer.wait()


def _read_metrics(run: Run, state, in_flight: list) -> dict:
    """The newest step's metrics row, emptying `in_flight`; stops at the first non-finite one."""
    fetched = jax.device_get([f.metrics for f in in_flight])
    for flight, metrics in zip(in_flight, fetched):
        if not bool(metrics['finite']):
            _stop_non_finite(run, state, flight.step, metrics, flight.position)
    newest, metrics = in_flight[-1], fetched[-1]
    in_flight.clear()
    return {'step': newest.step + 1, 'loss': float(metrics['loss']),
            'grad_norm': float(metrics['grad_norm']), 'replicas': newest.replicas,
            'neighbour_rows': newest.neighbour_rows}


def _stop_non_finite(run: Run, state, step: int, metrics, position: dict) -> None:
    """Checkpoint the state entering `step` (the step guard froze it) with the data position
    before its batch, so a resumed run sees the failed batch again, and stop."""
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


class ProfileSteps(Observer):
    """Traces steps `start` to `stop - 1` (`train.profile_steps='START:STOP'`) once per process.

    Under TensorBoard's run `train` (`<workdir>/tensorboard/train/plugins/profile/<session>/`:
    `<host>.xplane.pb` for the profile plugin, `perfetto_trace.json.gz` for ui.perfetto.dev).
    Process 0 traces (one trace file per host name; processes of one host would share it).
    The trace starts before the first chosen step is dispatched and stops once the last one
    has finished on the device, so it holds their device time, not only their dispatch.
    """

    def __init__(self, workdir: str, start: int, stop: int, *, process_index: int | None = None):
        self.logdir = run_dir(workdir, TRAIN_RUN)
        self.start, self.stop = start, stop
        self.active = (jax.process_index() if process_index is None else process_index) == 0
        self.tracing = self.traced = False

    def on_plan(self, planned) -> None:
        if self.active and not (self.tracing or self.traced) and self.start <= planned.step < self.stop:
            jax.profiler.start_trace(self.logdir, create_perfetto_trace=True)
            self.tracing = True

    def on_step(self, done) -> None:
        if self.tracing and done.step >= self.stop - 1:
            jax.block_until_ready(done.state)
            self.close()

    def close(self) -> None:
        """Stop a trace still open (a run that ended or stopped inside the window)."""
        if self.tracing:
            jax.profiler.stop_trace()
            self.tracing, self.traced = False, True


# ------------------------------------------------------------------ evaluation
# The exact validation loss, on the same fixed batches at every evaluation.

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
