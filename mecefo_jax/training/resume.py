"""Where a run starts: restored from memory or disk, or fresh, and recorded only once checked.

A resume must never lose the user's run or its record: the newest intact checkpoint
wins (a damaged one is moved aside, checkpoint_damage.py), a config that does not fit
the checkpoint names the fields and the overrides that do (config_record.py), a
workdir that holds a run with nothing left to resume from is refused rather than
silently restarted from step 0 (a launcher's own job that saved nothing starts over,
said and recorded), and config.json and the metrics are written only after the state
is restored and checked, cut back to the resumed step so no step has two values.

`Tier` names where a run's state comes from. The machinery is imported on use, so a
launcher and a worker's actor read `Tier` before any jax starts.
"""
from __future__ import annotations

import enum
import os


class Tier(enum.StrEnum):
    """Where a run's state comes from at its start (its value is what records say).

    A new tier is a member here, a restore in `launch/worker_state.restore_fn`, and the
    launcher's choice of it in `launch/recovery.plan_next`.
    """
    FRESH = 'fresh'  # nothing restored by the caller: the workdir's newest checkpoint, else a new run
    MEMORY = 'memory'  # the keepers' in-memory snapshots of the launcher's step (healed from peers)
    DISK = 'disk'  # the newest intact Orbax checkpoint


def restore_onto(run, checkpointer, topology):
    """The newest intact checkpoint's (state, data state), placed on `topology`'s mesh.

    A damaged newest step is moved aside with a warning and the one before it
    restored; a config that does not fit the checkpoint is an error naming
    the fields that differ from the run's config.json and the overrides that fit.
    """
    from mecefo_jax.checkpointing import checkpoint as ckpt_lib
    from mecefo_jax.checkpointing.damage import restore_newest_intact
    from mecefo_jax.config import record as config_record
    abstract = ckpt_lib.abstract_like(run.abstract_state, topology.state_shardings)
    try:
        state, data_state, _ = restore_newest_intact(checkpointer, abstract)
    except ckpt_lib.CheckpointMismatchError as error:
        raise config_record.explain_mismatch(error, run.workdir, run.cfg) from error
    return state, data_state


class WorkdirHoldsRunError(RuntimeError):
    """A fresh start was asked of a workdir whose run has nothing left to resume from."""


START_OVER = 'start_over'  # restore holds nothing, the run is the caller's: no checkpoint, step 0


def init_or_restore(run, restore=None):
    """The state to start from, placed on the mesh of the present replicas.

    `restore(run, topology) -> (state, data_state, Tier)` (a launcher relaunch's
    keepers) wins; otherwise the newest intact Orbax checkpoint and its data state;
    otherwise a fresh initialisation, unless the workdir already holds a run (never a
    silent restart from step 0) that `restore` did not claim by returning `START_OVER`.
    """
    from mecefo_jax.parallel import state as state_lib
    from mecefo_jax.training.metrics import read_metrics
    topo = run.topologies.get(run.present_rows)
    cfg = run.cfg
    restored = restore(run, topo) if restore is not None else None
    own_run = restored is START_OVER
    if (restored is None or own_run) and run.checkpointer is not None \
            and run.checkpointer.latest_step() is not None:
        restored = (*restore_onto(run, run.checkpointer, topo), Tier.DISK)
    if restored is None or restored is START_OVER:
        path = run.metrics.path
        held = os.path.exists(path) and any('loss' in row for row in read_metrics(path))
        if held and not own_run:
            raise WorkdirHoldsRunError(
                f'--workdir={run.workdir} holds a run (metrics.jsonl) but no checkpoint or snapshot '
                'to resume it from. Pass a new --workdir for a new run, or delete that directory '
                'to start over on purpose.')
        state, _ = state_lib.create_train_state(run.model, run.optimizer, topo.mesh,
                                                seed=cfg.train.seed, rank=cfg.mecefo.rank,
                                                shardings=topo.state_shardings)
        _record_start(run, 0, START_OVER if held else None)
        return state
    state, data_state, source = restored
    run.train_data.set_state(data_state)
    _record_start(run, int(state.step), source)
    return state


def _record_start(run, step: int, source: str | None) -> None:
    """Once the state is restored (or built) and checked: the config record, then the
    metrics cut back to `step` (a curve never has two values for one step), saying in
    the resumed row how far the cut rows went."""
    import jax

    from mecefo_jax.config import record as config_record
    from mecefo_jax.training.metrics import newest_loss_step, resumed_row
    dropped_through = None
    if jax.process_index() == 0:
        config_record.write_config_record(run.workdir, run.cfg)
        newest = newest_loss_step(run.metrics.path)
        run.metrics.truncate_after(step)
        if newest is not None and newest > step:
            dropped_through = newest
    if source is not None:
        if jax.process_index() == 0:
            print(f'resumed from step {step} ({source})', flush=True)
        run.metrics.write(resumed_row(step, source, dropped_through))
