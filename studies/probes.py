"""What the experiments measure during a run, as observers of the training loop.

Each is handed to `run.run(observers=...)` (see mecefo_jax/training/observers.py);
none changes what is trained.

`GradientError` measures the neighbour's relative gradient error against the
exact gradient;
`TargetWatch` the layouts and validation losses of a time-to-target run, and
when it has reached its target.
"""

import jax

from mecefo_jax.neighbour.layout import ROLE_NEIGHBOUR, ROLE_NORMAL, Layout, assemble
from mecefo_jax.training.observers import Observer
from studies import fidelity


class GradientError(Observer):
    """The neighbour's relative gradient error, on the 1st, (k+1)-th, ... neighbour-mode step.

    Before such a step (`every` = k; 0 disables) it takes the batch the step
    is about to train on, and for every neighbour computes, on the
    parameters and projections the step will use, the neighbour-mode
    gradient of its rows (own shard + adopted ones) and the exact gradient of
    the same rows, and their relative error per parameter group
    (`fidelity.grad_rel_error`).
    """

    def __init__(self, model, every: int):
        if every < 0:
            raise ValueError(f'--grad_error_every={every} must be >= 0 (0 disables).')
        self.model, self.every = model, every
        self.grad_errors: list[dict] = []
        self._neighbour_steps = 0  # neighbour-mode steps planned so far
        self._grad = None

    def on_plan(self, planned) -> None:
        layout = planned.plan.layout
        if not layout.uses_neighbour_mode:
            return
        if (self.every > 0 and self._neighbour_steps % self.every == 0
                and planned.plan.data_state is None):
            self._measure(planned.step, planned.state, layout, planned.tokens_nbt)
        self._neighbour_steps += 1

    def summary(self, report: dict) -> dict:
        return {'grad_errors': list(self.grad_errors)}

    def _measure(self, step, state, layout, tokens_nbt) -> None:
        params, projections = jax.device_get((state.params, state.projections))
        for i, role in enumerate(layout.roles):
            if role == ROLE_NORMAL:
                continue
            # The rows it computes in neighbour mode: all (neighbour), or the adopted ones (mixed).
            rows = layout.pieces[i] if role == ROLE_NEIGHBOUR else layout.pieces[i][1:]
            alone = Layout(replicas=(0,), roles=(ROLE_NEIGHBOUR,), pieces=(rows,))
            batch = assemble(alone, tokens_nbt)
            approx = self._grads(params, projections, batch['tokens'], batch['weights'], True)
            exact = self._grads(params, projections, batch['tokens'], batch['weights'], False)
            self.grad_errors.append({'step': step, 'replica': layout.replicas[i],
                                     'rows': layout.neighbour_rows(i),
                                     **fidelity.grad_rel_error(approx, exact)})

    def _grads(self, params, projections, tokens, weights, neighbour: bool):
        """Gradient of the summed token loss (the same divisor cancels in the ratio)."""
        if self._grad is None:
            self._grad = fidelity.token_grad_fn(self.model)
        return jax.device_get(self._grad(params, projections, tokens, weights,
                                         neighbour=neighbour))


class TargetWatch(Observer):
    """The time-to-target experiment's view of a run (studies/time_to_target.py).

    Per executed step: its clock, step and layout (a `goodput.LayoutBook`
    entry, from which modelled time follows). The validation loss after every
    step `evaluate_at(steps done)` names, on the run's fixed validation
    batches (`training.loop.evaluate`), and after `steps` steps also per validation
    sequence (for the noise of a paired gap). It asks the loop to stop once
    the run has done `steps` steps and some evaluation has reached `target`
    (with no target, at `steps`). `fork_dirs` ({steps done: directory}) saves
    the state after those steps there, for runs that start from this one.
    A rollback (checkpoint/restart) drops the evaluations of the undone steps.
    """

    def __init__(self, run, *, steps: int, target: float | None, evaluate_at, fork_dirs=None):
        from studies.goodput import LayoutBook
        self.run, self.steps, self.target, self.evaluate_at = run, steps, target, evaluate_at
        self.fork_dirs = dict(fork_dirs or {})
        self.book = LayoutBook()
        self.executed: list[list[int]] = []
        self.val: dict[int, float] = {}
        self.row_losses: list[float] | None = None
        self._stop = False
        self._row_loss = None
        # Every evaluation runs on the full mesh: one program for every run and live set,
        # so two runs' losses differ only by their parameters (and no program compiles
        # for a degraded mesh's evaluation).
        self._full = run.topologies.get(run.full_rows)

    def on_step(self, done) -> None:
        from mecefo_jax.training.loop import evaluate
        self.executed.append([done.clock, done.step, self.book.index(done.live, done.layout)])
        n = done.step + 1
        self.val = {s: v for s, v in self.val.items() if s < n}  # a rollback undid the rest
        if n in self.fork_dirs:
            self._save(n, done)
        if self.evaluate_at(n) or n == self.steps:
            self.val[n] = evaluate(self.run, self._full, jax.device_put(
                done.state.params, self._full.state_shardings.params))['val_loss']
        if n == self.steps:
            self.row_losses = self._rows(done.state)
        reached = self.target is None or any(v <= self.target for v in self.val.values())
        self._stop = n >= self.steps and reached

    def stop_requested(self) -> bool:
        return self._stop

    def summary(self, report: dict) -> dict:
        return {'executed': self.executed, 'layouts': self.book.layouts,
                'val_curve': sorted(self.val.items()), 'row_losses': self.row_losses}

    def _save(self, n: int, done) -> None:
        from mecefo_jax.checkpointing.checkpoint import Checkpointer
        saver = Checkpointer(self.fork_dirs[n], save_every=1, keep=1)
        saver.maybe_save(n, done.state, done.data_position, force=True)
        saver.close()

    def _rows(self, state) -> list[float]:
        """Mean validation loss per sequence of the fixed validation batches."""
        import numpy as np

        from mecefo_jax.parallel import step as step_lib
        from mecefo_jax.training.loop import val_batches
        if self._row_loss is None:
            model = self.run.model
            self._row_loss = jax.jit(lambda p, v, t: step_lib.token_loss_sum(
                model, p, v, t[None], np.ones(1, np.float32), neighbour=False) / (t.shape[0] - 1))
        params, projections = jax.device_get((state.params, state.projections))
        return [float(self._row_loss(params, projections, row))
                for tokens_nt in val_batches(self.run) for row in tokens_nt]
