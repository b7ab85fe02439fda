"""Runs whose gradients equal the fault-free run's, replayed on the failure trace.

`elastic` re-splits the failed replicas' samples over the survivors, exactly;
`checkpoint_restart` restores its last checkpoint and redoes the lost steps on
the same samples, running the elastic layout while a replica is down
(`faults/restart.py`). Both train on the fault-free run's samples with exact
gradients, so after k steps their parameters are the fault-free run's up to
float32 summation order (over fewer, larger shards), and their validation
loss at equal steps is the fault-free one (`tests/time_to_target_test.py`
trains both for real on `configs/tiny.py` and checks it). They need no
training run of their own: their validation curve is the fault-free curve,
warped in modelled time. This module replays what their controllers do on
the trace (which layout each executed step runs, each live-set change, each
checkpoint saved, each rollback) and writes the record that
`goodput.TimeModel` turns into time; the test checks the replay against the
trained controllers step for step.
"""
from mecefo_jax.failure_schedule import FailureSchedule
from mecefo_jax.faults.strategies import layout_for
from studies.goodput import LayoutBook

DERIVED = ('elastic', 'checkpoint_restart')


def replay(strategy: str, events, *, num_replicas: int, shard_batch: int, steps: int,
           checkpoint_every: int) -> dict:
    """The record of `strategy` (one of DERIVED) on `events` until it has done `steps` steps.

    As the controllers run it, the trace is indexed by executed steps
    (`clock`), which keep advancing while checkpoint/restart redoes steps.
    checkpoint/restart saves before its first step, every `checkpoint_every`
    steps (a step already saved is not saved again) and at every return; a
    failure restores the newest save and redoes the steps since.
    """
    if strategy not in DERIVED:
        raise ValueError(f'replay: {strategy!r} has its own gradients; only {DERIVED} are '
                         'derived from the fault-free run.')
    schedule = FailureSchedule(events, num_replicas)
    restart = strategy == 'checkpoint_restart'
    book, executed, changes, numbered = LayoutBook(), [], [], {}
    saves = [0] if restart else []
    live = (True,) * num_replicas
    clock = step = 0
    while step < steps:
        desired = schedule.live_mask(clock)
        if desired != live:
            failing = any(up and not now for up, now in zip(live, desired))
            restored = max(saves) if restart and failing else step
            if restart and not failing and step not in saves:
                saves.append(step)  # growing back: save first, nothing is lost
            changes.append({'kind': 'failure' if failing else 'recovery', 'clock': clock,
                            'step': step, 'lost_steps': step - restored})
            live, step = desired, restored
        if live not in numbered:  # a live set's layout is the same at every step
            numbered[live] = book.index(live, layout_for(strategy, live, shard_batch))
        executed.append([clock, step, numbered[live]])
        if restart and (step + 1) % checkpoint_every == 0 and step + 1 not in saves:
            saves.append(step + 1)
        step, clock = step + 1, clock + 1
    return {'executed': executed, 'layouts': book.layouts, 'events': changes,
            'refresh_steps': [], 'saves': saves, 'relaunch': restart}
