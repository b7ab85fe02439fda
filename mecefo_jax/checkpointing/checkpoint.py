"""Checkpoints of the train state together with the data-iterator state, with Orbax.

A step is one Orbax step directory with two items written together, so a restart never
pairs weights with another step's data position:

  <directory>/<step>/state   the sharded train-state pytree (StandardSave)
  <directory>/<step>/data    the JSON data-iterator state (JsonSave)

Damage raises `CheckpointDamagedError` (fallback: `damage`); a failed save an explained
`disk_space.CheckpointSaveError`.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from mecefo_jax.checkpointing.damage import CheckpointDamagedError, looks_damaged
from mecefo_jax.host import disk_space
from mecefo_jax.host.tree_paths import key_names

_STATE = 'state'
_DATA = 'data'
# Orbax's own mismatch messages embed whole trees / tensorstore specs.
_MAX_ORBAX_MESSAGE = 2000
# How long a failed save waits for its other writes before removing its files.
_WRITER_JOIN_SEC = 120.0

log = logging.getLogger(__name__)


class CheckpointNotFoundError(FileNotFoundError):
    """No (matching) checkpoint step exists in the checkpoint directory."""


class CheckpointMismatchError(ValueError):
    """The requested abstract state does not match what was saved."""


def abstract_like(state: Any, shardings: Any) -> Any:
    """`state` as ShapeDtypeStructs carrying target shardings, with no second copy made.

    `shardings` is one `Sharding` for every leaf, a callable `leaf -> Sharding`, or a
    pytree of shardings matching `state`.
    """
    if isinstance(shardings, jax.sharding.Mesh):
        raise TypeError('abstract_like needs shardings, not a Mesh; pass e.g. '
                        'NamedSharding(mesh, PartitionSpec()) or a function leaf -> sharding.')
    if isinstance(shardings, jax.sharding.Sharding):
        fixed = shardings
        return jax.tree.map(lambda x: _sds(x, fixed), state)
    if callable(shardings):
        return jax.tree.map(lambda x: _sds(x, shardings(x)), state)
    return jax.tree.map(_sds, state, shardings)


def _sds(x: Any, sharding: jax.sharding.Sharding) -> jax.ShapeDtypeStruct:
    if not hasattr(x, 'dtype'):  # Python scalars
        x = np.asarray(x)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def _join_orbax_writers(timeout: float) -> None:
    """Wait up to `timeout` s for the writes a failed save leaves running: Orbax raises on the
    first failed write while the others go on, still creating files in its temporary directory."""
    try:
        from orbax.checkpoint._src.futures.future import _SignalingThread
    except ImportError:  # another Orbax layout: nothing known to wait for
        return
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if isinstance(thread, _SignalingThread) and thread is not threading.current_thread():
            threading.Thread.join(thread, max(0.0, deadline - time.monotonic()))


class Checkpointer:
    """Saves/restores (train state, data-iterator state) pairs; asynchronously by default, so
    `maybe_save` blocks only for the device-to-host copy and any previous save in flight."""

    def __init__(self, directory: str, *, save_every: int, keep: int = 3, async_save: bool = True):
        if save_every < 1:
            raise ValueError(f'save_every must be >= 1, got {save_every}.')
        if keep < 1:
            raise ValueError(f'keep must be >= 1, got {keep}.')
        directory = os.fspath(directory)
        # Orbax wants absolute paths; leave URLs like gs://... untouched.
        self.directory = directory if '://' in directory else os.path.abspath(directory)
        self.save_every = int(save_every)
        self.keep = int(keep)
        self.async_save = bool(async_save)
        self._closed = False
        self._needed_bytes = None  # one save's room; measured at the first save
        options = ocp.CheckpointManagerOptions(
            max_to_keep=self.keep,
            # maybe_save decides the cadence and forces every save: Orbax's own policy would
            # also skip a step silently while the previous async save is in flight.
            save_interval_steps=1,
            enable_async_checkpointing=self.async_save,
            cleanup_tmp_directories=True,  # a killed save's uncommitted dirs, never a committed step
            create=True,
        )
        # Handlers up front, so a fresh manager (after a restart) reads item metadata at once.
        self._manager = ocp.CheckpointManager(
            self.directory, options=options,
            item_handlers={_STATE: ocp.StandardCheckpointHandler(), _DATA: ocp.JsonCheckpointHandler()})

    # ------------------------------------------------------------------ save

    def maybe_save(self, step: int, state: Any, data_state: dict, *, force: bool = False) -> float:
        """Save if `step` is on the cadence (or `force`); the seconds the loop lost (waiting for a
        previous save, the device-to-host copy). A step already saved is never overwritten."""
        self._check_open()
        step = int(step)
        if not force and step % self.save_every != 0:
            return 0.0
        start = time.perf_counter()
        if self._needed_bytes is None:
            self._needed_bytes = disk_space.bytes_needed(state)
            disk_space.warn_if_short(self.directory, state)
        if step in self._manager.all_steps():
            # Orbax would raise only after flagging a save as in progress, leaving the manager stale.
            log.warning('Checkpoint for step %d already exists in %s; not overwriting.', step, self.directory)
            return 0.0
        # A copy through JSON now: the caller may mutate its dict during the async write, and a
        # non-JSON value fails here, not in a background thread.
        try:
            data_snapshot = json.loads(json.dumps(data_state))
        except (TypeError, ValueError) as e:
            raise TypeError(f'data_state for step {step} is not JSON-serialisable ({e}); '
                            'convert numpy/jax values to Python numbers and keys to str.') from e
        if not isinstance(data_snapshot, dict):
            raise TypeError(f'data_state must be a dict, got {type(data_state).__name__}.')
        try:
            self._manager.save(step, force=True, args=ocp.args.Composite(
                **{_STATE: ocp.args.StandardSave(state), _DATA: ocp.args.JsonSave(data_snapshot)}))
        except BaseException as e:  # this save's or the previous async one's
            self._save_failed(e)
        return time.perf_counter() - start

    def wait(self) -> None:
        """Block until in-flight saves are committed; re-raise their errors."""
        if self._closed:
            return
        try:
            self._manager.wait_until_finished()
        except BaseException as e:
            self._save_failed(e)

    def close(self) -> None:
        """Wait for pending saves, then release Orbax's threads. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --------------------------------------------------------------- restore

    def reload(self) -> None:
        """Re-read the step list from disk (after steps were moved aside)."""
        self._manager.reload()

    def latest_step(self) -> int | None:
        """Newest step saved (including one still being written), or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict]:
        """(state, data_state) at `step` (default: latest), placed by `abstract_state`'s shardings,
        which may be another mesh's than the one saved from (Orbax reshards on read)."""
        self._check_open()
        # The newest step may still be in flight from this process.
        self.wait()
        steps = sorted(self._manager.all_steps())
        if not steps:
            raise CheckpointNotFoundError(
                f'No checkpoint found in {self.directory!r}. Fix: pass the directory that contains '
                'the numbered step subdirectories of a previous run, or start from scratch without '
                'restoring (check `latest_step() is not None` first).')
        if step is None:
            step = steps[-1]
        elif int(step) not in steps:
            raise CheckpointNotFoundError(f'No checkpoint for step {step} in {self.directory!r}; available '
                                          f'steps: {steps}. Fix: pick one of those or pass step=None for the latest.')
        step = int(step)
        abstract_state = self._validated_abstract(abstract_state)
        self._check_matches_saved(step, abstract_state)
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(
                **{_STATE: ocp.args.StandardRestore(abstract_state), _DATA: ocp.args.JsonRestore()}))
        except Exception as e:
            if looks_damaged(e):
                raise CheckpointDamagedError(self.directory, step, e) from e
            if not isinstance(e, ValueError):
                raise
            # Fallback for mismatches the metadata pre-check cannot see.
            msg = str(e)
            if len(msg) > _MAX_ORBAX_MESSAGE:
                msg = msg[:_MAX_ORBAX_MESSAGE] + ' ...[truncated]'
            raise CheckpointMismatchError(f'Could not restore step {step} from {self.directory!r} into the '
                                          f'requested state tree. Orbax said: {msg}') from e
        return restored[_STATE], dict(restored[_DATA])

    # -------------------------------------------------------------- helpers

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f'Checkpointer for {self.directory!r} is closed.')

    def _save_failed(self, error: BaseException) -> None:
        """Re-read the surviving steps and raise `error`, explained if the disk failed."""
        self._reload_quietly()
        if not isinstance(error, Exception):
            raise error
        _join_orbax_writers(_WRITER_JOIN_SEC)
        explained = disk_space.explain_failed_save(
            self.directory, error, self._needed_bytes, self._manager.latest_step(),
            clean=jax.process_index() == 0)
        if explained is error:
            raise error
        raise explained from error

    def _reload_quietly(self) -> None:
        try:
            self._manager.reload()
        except Exception:  # the original error is the one worth reporting
            log.exception('Reloading checkpoint steps from %s failed.', self.directory)

    def _validated_abstract(self, abstract_state: Any) -> Any:
        """Live arrays as SDSs, each naming a sharding: without one Orbax falls back to the saved
        sharding, whose devices may be gone after a topology change."""

        def convert(path, x):
            if isinstance(x, jax.ShapeDtypeStruct):
                sds = x
            elif isinstance(x, jax.Array):
                sds = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
            else:
                raise TypeError(f'abstract_state leaf {fmt_path(key_names(path))} is {type(x).__name__}; '
                                'expected jax.ShapeDtypeStruct (see checkpoint.abstract_like).')
            if sds.sharding is None:
                raise ValueError(f'abstract_state leaf {fmt_path(key_names(path))} has no sharding; '
                                 'give every leaf its target sharding (see checkpoint.abstract_like).')
            return sds

        return jax.tree_util.tree_map_with_path(convert, abstract_state)

    def _check_matches_saved(self, step: int, abstract_state: Any) -> None:
        """Paths, shapes and dtypes against the saved metadata (`tree_problems`)."""
        try:
            metadata = self._manager.item_metadata(step)[_STATE]
        except Exception as e:  # unreadable: leave it to Orbax (damage shows there)
            log.warning('Could not read checkpoint metadata for step %d (%s).', step, type(e).__name__)
            return
        if metadata is None:
            return
        problems = tree_problems(getattr(metadata, 'tree', metadata), abstract_state)
        if problems:
            raise CheckpointMismatchError(
                f'Checkpoint step {step} in {self.directory!r} does not match the requested state tree; '
                + '; '.join(problems) + '. Fix: build abstract_state from the same model/optimizer config '
                'as the run that wrote the checkpoint, or point at a different directory.')


# ------------------------------------------------ whether a requested tree fits a saved one
# Checked from the saved metadata before restoring, so a mismatch names the leaves that
# differ (Orbax's own messages bury them under tree dumps) and is never taken for damage.

_MAX_LISTED_PATHS = 10


def fmt_path(path: tuple[str, ...]) -> str:
    return '.'.join(path) if path else '<root>'


def _listing(paths: list, limit: int = _MAX_LISTED_PATHS) -> str:
    shown = ', '.join(paths[:limit])
    more = len(paths) - limit
    return shown + (f', ... (+{more} more)' if more > 0 else '')


def _stored_form(sds: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    """Shape/dtype Orbax writes for a leaf: typed PRNG keys go as key data."""
    if jax.dtypes.issubdtype(sds.dtype, jax.dtypes.prng_key):
        return jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(sds.shape, sds.dtype))
    return sds


def _by_path(tree: Any) -> dict:
    return {key_names(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def tree_problems(saved_tree: Any, abstract_state: Any) -> list[str]:
    """What keeps `abstract_state` from restoring `saved_tree`; empty if nothing."""
    saved, wanted = _by_path(saved_tree), _by_path(abstract_state)
    problems = []
    missing = sorted(fmt_path(p) for p in wanted.keys() - saved.keys())
    extra = sorted(fmt_path(p) for p in saved.keys() - wanted.keys())
    if missing:
        problems.append(f'not in checkpoint: {_listing(missing)}')
    if extra:
        problems.append(f'in checkpoint but not requested: {_listing(extra)}')
    diffs = []
    for p in sorted(wanted.keys() & saved.keys()):
        w, s = _stored_form(wanted[p]), saved[p]
        s_shape = getattr(s, 'shape', None)
        s_dtype = getattr(s, 'dtype', None)
        if s_shape is not None and tuple(s_shape) != tuple(w.shape):
            diffs.append(f'{fmt_path(p)} shape saved {tuple(s_shape)} vs requested '
                         f'{tuple(w.shape)}')
        elif s_dtype is not None and np.dtype(s_dtype) != np.dtype(w.dtype):
            diffs.append(f'{fmt_path(p)} dtype saved {np.dtype(s_dtype)} vs requested '
                         f'{np.dtype(w.dtype)}')
    if diffs:
        problems.append(f'mismatched leaves: {_listing(diffs)}')
    return problems
