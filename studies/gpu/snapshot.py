"""Report section `snapshot`: what in-memory snapshots cost one training process on a GPU.

At the `step` section's shape, a keeper in this process (the device image has
no Ray): the state's device-to-host copy, the step with the worker's
`SnapshotHook` at every=1 (waiting for writes, or not) against none, and at
every=auto with then its chosen interval alone. The snapshot path's own
costs are `python -m studies.snapshot_bench`'s.
"""
import statistics
import timeit
import types

import jax
import numpy as np

from studies.gpu import configs
from studies.gpu.programs import Setup, Stepper
from studies.gpu.step import SHAPES

# Steps per timed block (at 350M a snapshot waited for takes seconds); the chosen interval
# alone is timed over whole intervals within `max_chosen_steps`, twice (with and without).
RUNS = {'full': {'steps': 3, 'rounds': 2, 'max_auto_steps': 200, 'max_chosen_steps': 200, 'copies': 3},
        'smoke': {'steps': 3, 'rounds': 2, 'max_auto_steps': 12, 'max_chosen_steps': 120, 'copies': 2}}
KEEPER_SLOTS = 2  # one process: the snapshot being written and the last published
MODES = {'none': (None, None), 'every_1': (1, False), 'every_1_latest_wins': (1, True)}


def pinned_copy(state, repeats: int) -> dict:
    """The whole state to the host the worker's way (pinned copies, then read), best of a
    few: the device-to-host copy a snapshot starts with."""
    from mecefo_jax.snapshot import pinned_local_copies
    out = {'state_bytes': sum(x.nbytes for x in jax.tree.leaves(state))}
    try:
        sec = min(timeit.repeat(lambda: [np.asarray(s.data) for s in pinned_local_copies(state)],
                                number=1, repeat=repeats))
        out.update(pinned_copy_sec=sec, pinned_copy_gbps=out['state_bytes'] / sec / 1e9)
    except Exception as error:  # noqa: BLE001  (a backend without pinned_host memory)
        out['pinned_copy_error'] = f'{type(error).__name__}: {error}'
    return out


class Loop:
    """The normal step run back to back (`Stepper`), optionally with the worker's hook."""

    def __init__(self, stepper: Stepper, step, client):
        self.stepper, self.step, self.client, self.count = stepper, step, client, 0

    def per_step(self, steps: int, every, latest_wins: bool | None = None) -> dict:
        """Seconds per step with the hook at `every` (an int, 'auto', or None: off)."""
        from mecefo_jax.launch.worker_state import SnapshotHook
        hook = SnapshotHook(self.client, every, latest_wins=latest_wins) if every else None
        layout = types.SimpleNamespace(signature=('one device',))  # one topology throughout

        def after(state, metrics):
            if hook is not None:
                hook.on_step(types.SimpleNamespace(step=self.count, state=state, layout=layout,
                                                   data_position={'step': self.count},
                                                   loss=metrics['loss']))
            self.count += 1
        out = {'sec': self.stepper.seconds(self.step, steps, after)}
        if hook is not None:
            hook.close()  # the last write finishes outside the timed block
            s, n = hook.stats, max(1, hook.stats.published)
            out.update(blocked_sec=hook.blocked_sec / max(1, hook.submitted),
                       write_sec=s.write_sec / n, write_bytes=s.bytes / n, dropped=s.dropped,
                       published=s.published, interval=hook.interval)
        return out


def overhead(loop: Loop, runs: dict, ctx) -> dict:
    """every=1 (waiting for writes, and not) against no snapshot: medians over rotated blocks."""
    loop.per_step(KEEPER_SLOTS, 1)  # warm: the keeper allocates its segments
    blocks, order = {key: [] for key in MODES}, list(MODES)
    for r in range(runs['rounds']):
        for key in order[r % 3:] + order[:r % 3]:
            blocks[key].append(loop.per_step(runs['steps'], *MODES[key]))
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


def auto(loop: Loop, cfg, runs: dict) -> dict:
    """snapshot.every=auto as a worker runs it (measuring steps included), then the chosen
    interval alone over whole intervals, never waiting for a write, against plain steps."""
    from mecefo_jax.snapshot.cadence import PROBE_STEPS, SETTLE_STEPS
    steps = max(runs['max_auto_steps'], 2 * (SETTLE_STEPS + PROBE_STEPS))
    with_snap = loop.per_step(steps, 'auto')
    interval, most = with_snap['interval'], runs['max_chosen_steps']
    out = {'budget_pct': cfg.snapshot.overhead_budget_pct, 'interval': interval, 'steps': steps,
           'overhead_pct': 100 * (with_snap['sec'] / loop.per_step(steps, None)['sec'] - 1)}
    if interval and interval <= most:
        chosen = interval * (most // interval)
        snapshotting = loop.per_step(chosen, interval, latest_wins=True)
        out['chosen'] = {'steps': chosen, 'published': snapshotting['published'],
                         'dropped': snapshotting['dropped'], 'overhead_pct': 100 * (
                             snapshotting['sec'] / loop.per_step(chosen, None)['sec'] - 1)}
    elif interval:
        out['chosen'] = {'reason': f'interval {interval} is longer than the {most} steps timed'}
    return out


def run(ctx) -> dict:
    from mecefo_jax.snapshot import KeeperClient, LocalKeeper
    kind = 'smoke' if ctx.smoke else 'full'
    shape, runs = SHAPES['step'][kind], RUNS[kind]
    cfg = configs.load(shape['config'], shape['overrides'])
    setup, batch = Setup.build(cfg), shape['batch']
    stepper = Stepper(setup.timing_state())
    out = {'config_name': shape['config'], 'batch': batch,
           'bandwidth': pinned_copy(stepper.state, runs['copies'])}
    ctx.log(f'device to host: {out["bandwidth"]}')
    ctx.partial(out)
    step = stepper.call(setup.compile('normal', batch), setup.batch('normal', batch))
    with LocalKeeper('gpu_report', slots=KEEPER_SLOTS) as keeper, KeeperClient(keeper) as client:
        loop = Loop(stepper, step, client)
        out.update(overhead(loop, runs, ctx))
        ctx.partial(out)
        out['auto'] = auto(loop, cfg, runs)
    return out
