"""Injected failures (`launch.kill`), and the one seam through which they reach a worker.

Chaos tests, crash drills and users probing a setup inject real failures at known
points: a signal into a worker, its keeper or its whole node, or the launcher's own
death. The launcher's `Injector` fires them; a worker learns where to hold from one
`FaultPoints` object in its arguments, which wraps its keeper client and adds one
observer to its loop: no other production code knows of drills.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
import zlib

from mecefo_jax.training.observers import Observer

LAUNCHER = -1  # Kill.worker of a launcher kill
# What the launcher's own node kill is named: it knows the node is gone, whichever of Ray's
# reports (the actor's or the node's) comes first.
NODE_LOSS_INJECTED = 'the loss of its node'


@dataclasses.dataclass(frozen=True)
class Kill:
    """One injected failure at `step`, into `worker` (LAUNCHER: the launcher signals itself).

    `keeper`: its keeper dies with it (a host's crash: SIGKILL); `keeper_only`: its keeper
    alone, met at the next snapshot; `node`: its whole node, removed by the caller's hook.
    `in_publish` lands it inside the snapshot publish of `step`, `after_snapshot` once the
    first snapshot at or after `step` is in every keeper (so it redoes no step whatever
    `snapshot.every=auto` chose; a launcher kill holds worker 0 so): known points, not
    wherever a progress report happens to find the worker.
    """
    step: int
    worker: int
    signal: int = signal.SIGKILL
    keeper: bool = False
    in_publish: bool = False
    after_snapshot: bool = False
    node: bool = False
    keeper_only: bool = False

    @property
    def launcher(self) -> bool:
        return self.worker == LAUNCHER

    @property
    def held_worker(self) -> int:
        """The worker a drill holds for this kill."""
        return 0 if self.launcher else self.worker

    def describe(self) -> str:
        what = ('the launcher' if self.launcher else f'the node of worker {self.worker}'
                if self.node else f'the keeper of worker {self.worker}' if self.keeper_only
                else f'worker {self.worker}')
        how = 'lost' if self.node else signal.Signals(self.signal).name
        return f'{how}: {what}'


_KILL_FORMAT = ("'STEP:WORKER[:SIGNAL[:keeper|publish|snapshot]]', 'STEP:WORKER:node[:snapshot]', "
                "'STEP:WORKER:keeper' (its keeper alone) or 'STEP:launcher[:SIGNAL[:snapshot]]', "
                "e.g. '12:1', '8:0:STOP', '9:2:KILL:keeper', '9:2:keeper', '15:1:node:snapshot', "
                "'15:launcher:KILL:snapshot'")


def _signal(name: str) -> int:
    name = name.upper()
    return getattr(signal, name if name.startswith('SIG') else f'SIG{name}')


def parse_kills(text: str, workers: int) -> list[Kill]:
    """`launch.kill`: comma-separated items in `_KILL_FORMAT`."""
    kills = []
    for item in filter(None, (t.strip() for t in str(text).split(','))):
        parts = item.split(':')
        try:
            step = int(parts[0])
            worker = LAUNCHER if parts[1] == 'launcher' else int(parts[1])
            node = len(parts) > 2 and parts[2] == 'node'
            keeper_only = len(parts) > 2 and parts[2] == 'keeper'
            sig = (_signal(parts[2]) if len(parts) > 2 and parts[2] and not (node or keeper_only)
                   else signal.SIGKILL)
            where = parts[3] if len(parts) > 3 else ''
            allowed = (('',) if keeper_only else ('', 'snapshot') if worker == LAUNCHER or node
                       else ('', 'keeper', 'publish', 'snapshot'))
            if (len(parts) > 4 or where not in allowed
                    or ((node or keeper_only) and worker == LAUNCHER)):
                raise ValueError
        except (ValueError, IndexError, AttributeError):
            raise ValueError(f'launch.kill: cannot read {item!r}; use {_KILL_FORMAT}.') from None
        if where == 'keeper' and sig != signal.SIGKILL:
            raise ValueError(f"launch.kill: {item!r}: a worker lost with its keeper is a host's "
                             f"crash, so its signal is KILL ('{step}:{worker}:KILL:keeper').")
        if not (worker == LAUNCHER or 0 <= worker < workers) or step < 0:
            raise ValueError(f'launch.kill: {item!r} names worker {worker} of {workers} workers '
                             f'(0..{workers - 1}, or launcher) at step {step} (>= 0).')
        kills.append(Kill(step, worker, sig, where == 'keeper', where == 'publish',
                          where == 'snapshot', node, keeper_only))
    return kills


class Injector:
    """Fires the kills of `launch.kill` into a running generation, each at its known point.

    `node_killer(node_id)` removes a node (a simulated cluster's owner passes
    it); `keepers` is the job's `JobKeepers`; `nodes[w]` is worker w's node.
    """

    def __init__(self, kills: list[Kill], *, keepers, nodes: dict, out_dir: str, log,
                 node_killer=None):
        if any(k.node for k in kills) and node_killer is None:
            raise ValueError("launch.kill: a node loss ('STEP:WORKER:node') needs the cluster's "
                             'owner to remove the node: run it from a test or '
                             '`scripts/crash_drill.py --nodes K`, which simulate the nodes.')
        self.kills, self.keepers, self.nodes = kills, keepers, nodes
        self.out_dir, self.log, self.node_killer = out_dir, log, node_killer
        self.fired: set = set()
        self.kill_time: float | None = None  # time.time() of the last failure fired
        self.where: str | None = None  # where the last one landed
        self.injected: dict = {}  # worker -> what was injected into it (for the death's cause)
        self.lost_snapshots: dict = {}  # worker -> {step: bytes} of a keeper killed on purpose

    def fault_points(self, worker: int) -> FaultPoints | None:
        """Where `worker` holds in its next generation for a kill still to land, or None."""
        due = [k for k in self.kills if k not in self.fired and k.held_worker == worker]
        publish = max((k.step for k in due if k.in_publish), default=0)
        after = max((k.step for k in due if k.after_snapshot), default=0)
        return FaultPoints(publish, after) if publish or after else None

    def inject(self, gen) -> None:
        """Fire the kills that are due; kills at one step fire together, once all are due."""
        pending = [k for k in self.kills if k not in self.fired
                   and (k.launcher or k.worker in gen.actors)]
        due = {k: self._due(gen, k) for k in pending}
        for kill in pending:
            if due[kill] is None or any(due[k] is None for k in pending if k.step == kill.step):
                continue
            self._fire(gen, kill, due[kill])
        for kill in pending:  # a killed worker is dead before the next look at exits
            if (kill in self.fired and kill.signal == signal.SIGKILL
                    and not (kill.node or kill.keeper_only)):
                gen.wait_dead(kill.worker)
        for kill in pending:  # then the keepers lost with them (`Kill.keeper`: SIGKILL only)
            if kill in self.fired and kill.keeper:
                self._lose_keeper(kill.worker)

    def _due(self, gen, kill: Kill) -> str | None:
        """Where the held worker of `kill` is if the kill is due now, else None."""
        held = gen.held(kill.held_worker)
        if kill.after_snapshot:
            if (held is None or held['kind'] != 'snapshot'
                    or not all(held['step'] in self.keepers.steps(w) for w in gen.members)):
                return None
            return f"held after its snapshot of step {held['step']}, which every keeper holds"
        if kill.in_publish:
            if held is None or held['kind'] != 'publish':
                return None
            return f'inside its publish of step {kill.step}'
        completed = (gen.completed() if kill.launcher
                     else (gen.progress.get(kill.worker) or {}).get('completed', 0))
        return None if completed < kill.step else f'at step {completed}'

    def _fire(self, gen, kill: Kill, where: str) -> None:
        self.fired.add(kill)
        self.kill_time, self.where = time.time(), where
        self.log(f'[launch] injecting {kill.describe()} {where}'
                 f'{" and killing its keeper" if kill.keeper else ""}')
        if kill.launcher:
            with open(os.path.join(self.out_dir, 'launcher_killed.json'), 'w') as f:
                json.dump({'time': self.kill_time, 'where': where, 'completed': gen.completed(),
                           'signal': signal.Signals(kill.signal).name}, f)
            os.kill(os.getpid(), kill.signal)
            return
        if kill.node:
            self.injected[kill.worker] = NODE_LOSS_INJECTED
            self.node_killer(self.nodes[kill.worker])
            return
        if kill.keeper_only:  # the worker goes on, and meets the loss at its next snapshot
            self.keepers.kill(kill.worker)
            return
        self.injected[kill.worker] = signal.Signals(kill.signal).name
        gen.signal(kill.worker, kill.signal)

    def _lose_keeper(self, worker: int) -> None:
        """Kill the keeper of a worker SIGKILLed with it, once `inject` has seen the worker
        dead. What it held is kept, only to check a parity rebuild bit for bit: copied after
        the worker's death, so that nothing is published or evicted meanwhile."""
        self.lost_snapshots[worker] = self.keepers.held_bytes(worker)
        self.keepers.kill(worker)

    def check_rebuild(self, worker: int, step: int, rebuilt: bytes) -> dict:
        """A parity rebuild of a keeper this injector killed, against what it held: the recovery
        row's fields ({} where it killed none)."""
        original = self.lost_snapshots.get(worker, {}).get(step)
        if original is None:
            return {}
        out = {'parity_rebuild_bitwise': rebuilt == original}
        if rebuilt != original:
            out['parity_rebuild_mismatch'] = first_difference(rebuilt, original)
        return out


def first_difference(rebuilt: bytes, original: bytes) -> dict:
    """Where a parity rebuild and the killed keeper's copy part: sizes, crc32s, first offset."""
    import numpy as np
    n = min(len(rebuilt), len(original))
    differs = np.flatnonzero(np.frombuffer(rebuilt, np.uint8, n) != np.frombuffer(original, np.uint8, n))
    diff = int(differs[0]) if differs.size else n
    return {'nbytes': [len(rebuilt), len(original)],
            'crc32': [zlib.crc32(rebuilt), zlib.crc32(original)], 'first_diff_offset': diff}


@dataclasses.dataclass
class FaultPoints:
    """Where one worker of one generation holds, so that a failure lands at a known point:
    inside its snapshot publish of `publish_step` (bytes copied, not yet published), or in
    its training loop after its first snapshot at or after `after_snapshot_step` is
    published. While held it says so (`held`, in its progress report) and waits for the
    launcher's signal."""
    publish_step: int = 0
    after_snapshot_step: int = 0
    held: dict | None = None  # {'kind': 'publish'|'snapshot', 'step': s} once held

    def hold(self, kind: str, step: int, tag: str = '') -> None:
        """Report the hold and wait there for the launcher's signal (it never returns)."""
        self.held = {'kind': kind, 'step': int(step)}
        print(f'[{tag}] held ({kind}) at step {step}', flush=True)
        threading.Event().wait()

    def client(self, client, tag: str = ''):
        """`client` (a snapshot.client.KeeperClient), holding before the chosen publish."""
        return _HeldPublish(client, self, tag) if self.publish_step else client

    def observers(self, hook, tag: str = '') -> list:
        """The loop's hold after a snapshot of `hook` (a SnapshotHook), if one is asked for."""
        return [_HoldAfterSnapshot(hook, self, tag)] if self.after_snapshot_step else []


class _HeldPublish:
    """A keeper client whose `publish` of one step holds first (`FaultPoints`)."""

    def __init__(self, client, points: FaultPoints, tag: str):
        self._client, self._points, self._tag = client, points, tag

    def publish(self, slot: int, token: int, *, step: int, **record):
        if step == self._points.publish_step:
            self._points.hold('publish', step, self._tag)
        return self._client.publish(slot, token, step=step, **record)

    def __getattr__(self, name):
        return getattr(self._client, name)


class _HoldAfterSnapshot(Observer):
    """Holds the loop, at the next step's plan, once a snapshot at or after the step is
    published (that step's metrics row is written by then)."""

    def __init__(self, hook, points: FaultPoints, tag: str):
        self._hook, self._points, self._tag = hook, points, tag
        self._held_at: int | None = None

    def on_step(self, done) -> None:
        step = self._hook.last_submitted
        if self._held_at is None and step is not None and step >= self._points.after_snapshot_step:
            self._hook.flush()  # published, so its keeper holds it
            self._held_at = step

    def on_plan(self, planned) -> None:
        if self._held_at is not None:
            self._points.hold('snapshot', self._held_at, self._tag)
