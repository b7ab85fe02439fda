"""What a worker records: progress and provenance per step, its start and end records.

Apart from the actor (`worker`) so that what is written, and when, reads
alone: `StepLog` (an observer of the training loop) writes
`g<G>_w<W>_start.json` once the first step has run and (process 0)
`provenance.jsonl`; `end_record` is what `g<G>_w<W>_end.json` holds, and for
a complete run it writes `final_params.npz`.
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import time

from mecefo_jax.host import files
from mecefo_jax.launch.progress import Progress
from mecefo_jax.launch.worker_args import WorkerArgs
from mecefo_jax.training.observers import Observer  # pure Python: no jax before the actor is up


def end_record(cfg, args: WorkerArgs, summary: dict, snapshot_hook, *,
               median_step_sec: float | None) -> dict:
    """The end record (and, for a complete run, the final parameters from process 0)."""
    import jax
    import numpy as np

    from mecefo_jax.parallel import program_cache
    state = summary.pop('state')
    end = {'worker': args.worker, 'generation': args.generation,
           'params_sha256': _local_params_sha256(state.params),
           'final_step': summary['final_step'], 'finished': summary['final_step'] >= cfg.train.steps,
           'final_loss': summary['final_loss'], 'final_val_loss': summary['final_val_loss'],
           'snapshot_blocked_sec': snapshot_hook.blocked_sec if snapshot_hook else 0.0,
           'snapshots': snapshot_hook.submitted if snapshot_hook else 0,
           'snapshots_dropped': snapshot_hook.stats.dropped if snapshot_hook else 0,
           # What this worker wrote per snapshot against its whole state: about 1/n of it
           # where snapshots are sharded over n workers (snapshot.shard).
           'snapshot_bytes': snapshot_hook.stats.bytes if snapshot_hook else 0,
           'snapshot_parity_bytes': snapshot_hook.stats.parity_bytes if snapshot_hook else 0,
           'snapshots_published': snapshot_hook.stats.published if snapshot_hook else 0,
           'state_bytes': int(sum(x.nbytes for x in jax.tree.leaves(state))),
           'programs_compiled': program_cache.stats.misses,
           'programs_cached': program_cache.stats.hits,
           'median_step_sec': median_step_sec,
           'snapshot_cadence': (snapshot_hook.cadence.history
                                if snapshot_hook and snapshot_hook.cadence else None)}
    if end['finished']:
        from jax.experimental import multihost_utils
        params = multihost_utils.process_allgather(state.params, tiled=True)
        if jax.process_index() == 0:
            flat = {jax.tree_util.keystr(p): np.asarray(v)
                    for p, v in jax.tree_util.tree_leaves_with_path(params)}
            np.savez(os.path.join(args.out_dir, 'final_params.npz'), **flat)
    return end


class StepLog(Observer):
    """The worker's observer: progress and provenance per step, the start record once.

    The start record times the way back: everything up to the end of the
    first step, with the compile and refresh seconds of the events (a
    relaunch's failure) reported before it.
    """

    def __init__(self, progress: Progress, provenance_path, start_path: str, record: dict,
                 info: dict):
        self.progress, self.provenance_path = progress, provenance_path
        self.provenance = None  # opened at the first step, once the resumed step is known
        self.start_path, self.record, self.info = start_path, record, info
        self.events = []
        self.train_start = time.perf_counter()
        self.first_done = False
        self.dispatched: list[float] = []  # each step's dispatch time (perf_counter)

    def median_step_sec(self, settle: int = 2) -> float | None:
        """This generation's median step, dispatch to dispatch, past its first `settle` steps.

        The loop dispatches a step once the previous one's outputs can be
        read, so the interval is a step's wall time, snapshot blocking included.
        """
        times = self.dispatched[settle:]
        gaps = [b - a for a, b in zip(times, times[1:])]
        return statistics.median(gaps) if gaps else None

    def on_event(self, event) -> None:
        self.events.append(event)

    def on_step(self, done) -> None:
        import jax
        import numpy as np

        from mecefo_jax.training.metrics import truncate_rows_after
        self.progress.dispatched_step(done.step + 1, done.loss)
        self.dispatched.append(done.dispatched)
        if self.provenance is None and self.provenance_path is not None:
            # Steps past the resumed one were recorded by a run that did not
            # keep them: this run records them again, once.
            if os.path.exists(self.provenance_path):
                truncate_rows_after(self.provenance_path, done.step - 1)
            self.provenance = open(self.provenance_path, 'a')
        if self.provenance is not None:
            self.provenance.write(json.dumps({
                'generation': self.record['generation'], 'step': done.step,
                'batch_sha256': hashlib.sha256(np.ascontiguousarray(done.tokens_nbt)).hexdigest(),
                'covered': {str(k): v for k, v in sorted(done.layout.shards_covered().items())},
                'replicas': list(done.layout.replicas)}) + '\n')
            self.provenance.flush()
        if not self.first_done:
            self.first_done = True
            jax.block_until_ready(done.loss)
            self._write_start(done)

    def _write_start(self, done) -> None:
        from mecefo_jax.parallel import program_cache
        events = [e for e in self.events if e.step == done.step]
        restored = self.info.get('restore')
        files.write_json(self.start_path, dict(
            resume_step=done.step, first_step_done=time.time(),
            compile_sec=done.compile_sec + sum(e.compile_sec for e in events),
            programs_compiled=program_cache.stats.misses,
            programs_cached=program_cache.stats.hits,
            programs_load_sec=program_cache.stats.load_sec,
            programs_found_untraced=program_cache.stats.untraced_hits,
            refresh_sec=sum(e.refresh_sec for e in events),
            train_start_to_first_step_sec=time.perf_counter() - self.train_start,
            **self.record, restore_sec=restored.seconds if restored else None,
            restore_bytes=restored.bytes_by_source if restored else None,
            restore_phases=restored.phases if restored else None,
            healed_bytes=restored.healed_bytes if restored else None), default=str)


def _local_params_sha256(params) -> str:
    """Hash of this process's parameter shards, after checking its copies of each agree.

    Replicas of one shard index must be bit-identical on every device; the
    hash then lets the launcher's caller compare processes.
    """
    import jax
    import numpy as np
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        copies = {}
        for shard in leaf.addressable_shards:
            key = tuple((s.start, s.stop) for s in shard.index)
            data = np.asarray(shard.data).tobytes()
            if copies.setdefault(key, data) != data:
                raise AssertionError(f'{jax.tree_util.keystr(path)}: local replicas differ')
        for key in sorted(copies, key=str):
            digest.update(repr((jax.tree_util.keystr(path), key)).encode())
            digest.update(copies[key])
    return digest.hexdigest()
