"""Where a run starts: restored from memory or disk, or fresh, and recorded only once checked.

A resume never loses the user's run or its record: the newest intact checkpoint wins (a
damaged one is moved aside, `checkpointing/damage.py`), a config that does not fit names
the fields and the overrides that do (`config/record.py`), a workdir holding a run with
nothing to resume from is refused, never restarted from step 0 (a launcher's own job that
saved nothing starts over, said and recorded), and config.json and the metrics are
written only once the state is restored and checked. A fresh run starts from
`train.init_from`'s Hugging Face LLaMA where it names one (`model/hf_llama.py`), with a
fresh optimizer. Imports are lazy, so a launcher reads `Tier` before any jax starts.
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
    """The newest intact checkpoint's (state, data state), on `topology`'s mesh (module docstring)."""
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
    """The state to start from, on the present replicas' mesh: `restore(run, topology) ->
    (state, data_state, Tier)` (a relaunch's keepers), else the newest intact checkpoint,
    else a fresh one, unless the workdir holds a run `restore` did not claim (`START_OVER`)."""
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
        if cfg.train.init_from:
            state = _imported(run, topo)
        else:
            state, _ = state_lib.create_train_state(run.model, run.optimizer, topo.mesh,
                                                    seed=cfg.train.seed, rank=cfg.mecefo.rank,
                                                    shardings=topo.state_shardings)
        _record_start(run, 0, START_OVER if held else None)
        return state
    state, data_state, source = restored
    run.train_data.set_state(data_state)
    _record_start(run, int(state.step), source)
    return state


def _imported(run, topology):
    """A new run's state from `train.init_from`, a Hugging Face LLaMA: its weights on the mesh,
    the optimizer fresh (continued pretraining)."""
    import jax

    from mecefo_jax.model import hf_llama
    from mecefo_jax.parallel import state as state_lib
    cfg = run.cfg
    params = hf_llama.load(cfg.train.init_from, cfg.model)
    if jax.process_index() == 0:
        print(f'initialized from {cfg.train.init_from} (train.init_from)', flush=True)
    return state_lib.train_state_from(params, run.optimizer, topology.state_shardings, rank=cfg.mecefo.rank)


def _record_start(run, step: int, source: str | None) -> None:
    """Once the state is checked: the config record, then the metrics cut back to `step`, the
    resumed row saying how far the cut rows went."""
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
