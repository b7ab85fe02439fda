"""Report section `snapshot`: what in-memory snapshots cost one training process.

On the `step` section's model and batch (350M, one device), with a keeper
in the measuring process holding the snapshots in shared memory (a job's
keeper is a Ray actor; the device image has no Ray, and the actor call per
publish is about a millisecond):

  * device-to-host bandwidth of the whole train state: `jax.device_get`, and
    the worker's own path (`pinned_local_copies`, then reading the pinned
    copies), best of a few;
  * the snapshot path on the train state, each part against a plain host
    copy of the same bytes (`np.copyto`) in the same run: the one
    measurement of it, `studies.snapshot_bench.path_figures` (`paths`; its
    copy is `bandwidth.host_copy_*`, the yardstick of the snapshot's write).
    It runs last, so that a section cut short by its time limit keeps the
    per-step figures;
  * snapshot overhead per step: wall time per step of the normal train step
    run back to back, with the worker's `SnapshotHook` at `snapshot.every=1`
    against none, blocks of steps alternated over rounds (medians): waiting
    for each write (`every_1`), and never waiting, the newest snapshot
    replacing one still waiting its turn (`every_1_latest_wins`, what
    `snapshot.every=auto` does at its chosen interval): there the step is
    blocked only while the device-to-host copies are handed over;
  * at `snapshot.every=auto`, where the config has it
    (`snapshot.overhead_budget_pct`): the smallest interval whose overhead,
    from the every=1 figure, stays within the budget, then measured at that
    interval (estimated when it is longer than the section can run), its
    measuring steps included, then at the chosen interval alone: what the
    rest of a run pays.
"""
from __future__ import annotations

import statistics
import time
import types

import jax
import numpy as np

from studies.gpu import configs
from studies.gpu.step import SHAPES as STEP_SHAPES
from studies.gpu.step import Setup

# Steps per timed block: at 350M one snapshot (4.4 GB copied and checksummed)
# takes seconds, so every=1 blocks are kept short to fit the section's time.
# The chosen interval alone is timed over whole intervals within `max_chosen_steps` (twice:
# snapshotting and plain); a longer interval is left untimed. The snapshot path's figures
# are medians of `path_repeats` (each repeat moves the whole train state several times).
RUNS = {'full': {'steps': 3, 'rounds': 2, 'max_auto_steps': 200, 'max_chosen_steps': 200,
                 'copies': 3, 'path_repeats': 2},
        'smoke': {'steps': 3, 'rounds': 2, 'max_auto_steps': 12, 'max_chosen_steps': 1000,
                  'copies': 2, 'path_repeats': 1}}
KEEPER_SLOTS = 2  # one process: the snapshot being written and the last published


def best_sec(fn, repeats: int) -> float:
    best = float('inf')
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bandwidth(state, repeats: int) -> dict:
    from mecefo_jax.snapshot import pinned_local_copies
    nbytes = sum(x.nbytes for x in jax.tree.leaves(state))
    out = {'state_bytes': nbytes}
    out['device_get_sec'] = best_sec(lambda: jax.device_get(state), repeats)

    def pinned():
        for shard in pinned_local_copies(state):
            np.asarray(shard.data)
    try:
        out['pinned_copy_sec'] = best_sec(pinned, repeats)
    except Exception as error:  # noqa: BLE001  (a backend without pinned_host memory)
        out['pinned_copy_error'] = f'{type(error).__name__}: {error}'
    for key in ('device_get', 'pinned_copy'):
        if f'{key}_sec' in out:
            out[f'{key}_gbps'] = nbytes / out[f'{key}_sec'] / 1e9
    return out


class Loop:
    """The normal train step run back to back, optionally with the worker's snapshot hook."""

    def __init__(self, compiled, state, batch, keeper):
        self.compiled, self.state, self.batch = compiled, state, batch
        self.keeper = keeper
        self.step = 0

    def per_step_sec(self, steps: int, every, latest_wins: bool | None = None) -> dict:
        """Seconds per step with the worker's hook at `every` (an int, 'auto', or None: off)."""
        from mecefo_jax.launch.worker_state import SnapshotHook
        hook = SnapshotHook(self.keeper, every, latest_wins=latest_wins) if every else None
        layout = types.SimpleNamespace(signature=('one device',))  # one topology throughout
        start = time.perf_counter()
        for _ in range(steps):
            self.state, metrics = self.compiled(self.state, self.batch)
            if hook is not None:
                hook.on_step(types.SimpleNamespace(
                    step=self.step, state=self.state, data_position={'step': self.step},
                    loss=metrics['loss'], layout=layout))
            self.step += 1
        jax.block_until_ready((self.state, metrics))
        out = {'sec': (time.perf_counter() - start) / steps}
        if hook is not None:
            hook.close()  # the last write finishes outside the timed block
            out.update(blocked_sec=hook.blocked_sec / max(1, hook.submitted),
                       write_sec=hook.stats.write_sec / max(1, hook.stats.published),
                       write_bytes=hook.stats.bytes / max(1, hook.stats.published),
                       dropped=hook.stats.dropped, published=hook.stats.published,
                       interval=hook.interval)
        return out


MODES = {'none': (None, None), 'every_1': (1, False), 'every_1_latest_wins': (1, True)}


def overhead(loop: Loop, runs: dict, ctx) -> dict:
    """every=1 (waiting for writes, and not) against no snapshot: medians over rotated blocks."""
    loop.per_step_sec(KEEPER_SLOTS, 1)  # warm: the keeper allocates its segments
    blocks = {key: [] for key in MODES}
    order = list(MODES)
    for r in range(runs['rounds']):
        for key in order[r % 3:] + order[:r % 3]:
            blocks[key].append(loop.per_step_sec(runs['steps'], *MODES[key]))
        ctx.log(f'round {r}: ms/step ' + ', '.join(
            f'{key} {blocks[key][-1]["sec"] * 1e3:.2f}' for key in MODES))
    none = statistics.median(b['sec'] for b in blocks['none'])
    out = {'step_sec': none}
    for key in order[1:]:
        every = statistics.median(b['sec'] for b in blocks[key])
        out[key] = {'step_sec': every, 'overhead_pct': 100 * (every / none - 1), **{
            f'{name}_per_snapshot': statistics.median(b[name] for b in blocks[key])
            for name in ('blocked_sec', 'write_sec', 'write_bytes')},
            'dropped': sum(b['dropped'] for b in blocks[key]),
            'published': sum(b['published'] for b in blocks[key])}
    return out


def auto(loop: Loop, cfg, measured: dict, runs: dict) -> dict:
    """snapshot.every=auto as a worker runs it: the hook measures, chooses, then snapshots;
    then the chosen interval alone, as the rest of a run sees it (`chosen`)."""
    from mecefo_jax.snapshot.cadence import PROBE_STEPS, SETTLE_STEPS
    steps = max(runs['max_auto_steps'], 2 * (SETTLE_STEPS + PROBE_STEPS))
    with_snap = loop.per_step_sec(steps, 'auto')
    without = loop.per_step_sec(steps, None)['sec']
    out = {'status': 'ok', 'budget_pct': cfg.snapshot.overhead_budget_pct,
           'interval': with_snap['interval'], 'steps': steps,
           'overhead_pct': 100 * (with_snap['sec'] / without - 1),
           'note': 'includes the measuring steps (settling snapshots every step, then one '
                   'snapshot per pair of measured windows) before the choice'}
    interval, most = with_snap['interval'], runs['max_chosen_steps']
    if interval and interval <= most:
        out['chosen'] = at_interval(loop, interval, most)
    elif interval:
        out['chosen'] = {'reason': f'interval {interval} is longer than the {most} steps '
                                   'the section times'}
    return out


def at_interval(loop: Loop, interval: int, max_steps: int) -> dict:
    """Overhead at a fixed `interval`, never waiting for a write, over as many whole
    intervals as fit `max_steps`, against as many plain steps."""
    steps = interval * (max_steps // interval)
    snapshotting = loop.per_step_sec(steps, interval, latest_wins=True)
    plain = loop.per_step_sec(steps, None)['sec']
    return {'steps': steps, 'overhead_pct': 100 * (snapshotting['sec'] / plain - 1),
            'published': snapshotting['published'], 'dropped': snapshotting['dropped']}


def run(ctx) -> dict:
    from mecefo_jax.model.llama import build_model
    from mecefo_jax.neighbour.layout import assemble
    from mecefo_jax.parallel import sharding
    from mecefo_jax.parallel.state import create_train_state
    from mecefo_jax.snapshot import LocalKeeper
    from studies import step_modes
    kind = 'smoke' if ctx.smoke else 'full'
    shape, runs = STEP_SHAPES['step'][kind], RUNS[kind]
    cfg = configs.load(shape['config'], shape['overrides'])
    setup = Setup.build(cfg, build_model(cfg), jax.devices()[0])
    batch = shape['batch']
    compiled = setup.compile('normal', batch)
    state, _ = create_train_state(setup.model, setup.optimizer, setup.mesh, seed=0,
                                  rank=cfg.mecefo.rank)
    out = {'config_name': shape['config'], 'batch': batch}
    out['bandwidth'] = bandwidth(state, runs['copies'])
    ctx.log(f'state {out["bandwidth"]["state_bytes"] / 2**20:.1f} MiB: device_get '
            f'{out["bandwidth"]["device_get_gbps"]:.2f} GB/s')
    ctx.partial(out)
    tokens = step_modes.random_tokens(cfg, batch, seed=0)
    host = dict(assemble(step_modes.mode_layout('normal', batch), tokens), step=np.int32(0))
    device_batch = jax.device_put(host, sharding.batch_shardings(setup.mesh))
    # In this process: the device image has no Ray, and what is measured is the
    # write path (device to pinned host, copy and crc into shared memory), not
    # the keeper's actor call per publish (about a millisecond).
    with LocalKeeper('gpu_report', slots=KEEPER_SLOTS) as keeper:
        loop = Loop(compiled, state, device_batch, keeper)
        del state
        out.update(overhead(loop, runs, ctx))
        ctx.partial(out)
        out['auto'] = auto(loop, cfg, out, runs)
    ctx.partial(out)
    out['paths'] = paths(loop.state, runs['path_repeats'])
    out['bandwidth'].update(host_copy_sec=out['paths']['copy_sec'],
                            host_copy_gbps=out['paths']['bytes'] / out['paths']['copy_sec'] / 1e9)
    out['keeper'] = (f'one keeper in the measuring process (no actor call per publish), '
                     f'{KEEPER_SLOTS} slots in shared memory')
    return out


def paths(state, repeats: int) -> dict:
    """The snapshot path on `state` (`snapshot_bench.path_figures`), in a keeper of its own
    (the loop's is gone, and its shared memory with it)."""
    from mecefo_jax.snapshot import LocalKeeper
    from studies import snapshot_bench
    with LocalKeeper('gpu_report_paths', slots=KEEPER_SLOTS) as keeper:
        return snapshot_bench.with_ratios(snapshot_bench.path_figures(state, keeper, repeats=repeats))
