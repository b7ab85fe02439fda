"""Per-event recovery overheads for the cluster simulator.

This module owns the *recovery table*: what one live-set change (a failure,
a return, or both at once) costs a strategy in seconds of no progress
(`recovery_sec`, of which `restore_sec` loads the state) and in redone steps
(`lost_steps`; None: the steps since the last checkpoint), per entry:
`in_process` (a failure masked in a healthy process, the paper's
assumption), `memory` (a real crash recovered from in-memory snapshots) and
`disk` (`checkpoint_restart`'s Orbax restore). Which strategy pays which
entry under each assumption is in docs/cluster.md. Sources, later ones
overriding earlier ones field by field: the stated defaults (`DEFAULTS`,
by component in `DEFAULT_BREAKDOWN`), a crash drill (`crash_drill.json`) and
command-line flags.
"""
from __future__ import annotations

import dataclasses
from typing import Any

ENTRIES = ('in_process', 'memory', 'disk')
FIELDS = ('recovery_sec', 'restore_sec', 'lost_steps')

# The defaults, by component (seconds). Not measurements: round figures for
# a GPU job of this size, stated so that they can be argued with and
# replaced (--recovery_json, or --memory_recovery_sec and friends).
DEFAULT_BREAKDOWN: dict[str, dict[str, float]] = {
    'in_process': {},  # masked failure, precompiled topology: nothing to pay
    'memory': {
        'detect_sec': 10.0,  # heartbeat / collective timeout notices the dead process
        'teardown_and_start_sec': 15.0,  # kill survivors, start fresh processes
        'distributed_init_sec': 5.0,  # jax.distributed.initialize on the new set
        'restore_sec': 5.0,  # state from host-RAM snapshots (peer or local keeper)
        'compile_sec': 30.0,  # the new topology's step, incl. the slow first step
    },
    'disk': {
        'detect_sec': 10.0,
        'teardown_and_start_sec': 15.0,
        'distributed_init_sec': 5.0,
        'restore_sec': 60.0,  # Orbax restore from shared storage
        'compile_sec': 30.0,
    },
}
DEFAULTS: dict[str, dict[str, Any]] = {
    'in_process': {'recovery_sec': 0.0, 'restore_sec': 0.0, 'lost_steps': 0.0},
    'memory': {'recovery_sec': sum(DEFAULT_BREAKDOWN['memory'].values()),
               'restore_sec': DEFAULT_BREAKDOWN['memory']['restore_sec'],
               'lost_steps': 1.0},  # the step in flight when the process died
    'disk': {'recovery_sec': sum(DEFAULT_BREAKDOWN['disk'].values()),
             'restore_sec': DEFAULT_BREAKDOWN['disk']['restore_sec'],
             'lost_steps': None},  # steps since the last checkpoint
}


@dataclasses.dataclass(frozen=True)
class Recovery:
    """One way of recovering, per live-set change."""
    recovery_sec: float
    restore_sec: float
    lost_steps: float | None
    source: str = 'default'


@dataclasses.dataclass(frozen=True)
class RecoveryTable:
    in_process: Recovery
    memory: Recovery
    disk: Recovery

    def to_json(self) -> dict[str, Any]:
        return {name: dataclasses.asdict(getattr(self, name)) for name in ENTRIES}


def _check(entry: str, field: str, value: Any, origin: str) -> float | None:
    if value is None and field == 'lost_steps':
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f'{origin}: {entry}.{field}={value!r} is not a number.') from None
    if value < 0:
        raise ValueError(f'{origin}: {entry}.{field}={value!r} must be >= 0.')
    return value


def recovery_table(*, drill: dict | None = None,
                   overrides: dict[str, dict[str, Any]] | None = None,
                   drill_path: str = '--recovery_json') -> RecoveryTable:
    """Defaults <- crash drill <- flags.

    `drill` is a crash_drill.json dict (`memory` / `disk` / optionally
    `in_process` objects with `recovery_sec`, `restore_sec`, `lost_steps`);
    `overrides[entry][field]` wins over both.
    """
    entries = {name: dict(DEFAULTS[name], source='default') for name in ENTRIES}
    layers = []
    if drill is not None:
        if not any(k in drill for k in ENTRIES):  # other keys (timings, logs) are fine
            raise ValueError(f'{drill_path}: expected objects {", ".join(ENTRIES)} (at least '
                             f'one) with {", ".join(FIELDS)}; got keys {sorted(drill)}.')
        layers.append(({k: v for k, v in drill.items() if k in ENTRIES}, 'crash drill'))
    if overrides:
        layers.append((overrides, 'flag'))
    for layer, origin in layers:
        for entry, values in layer.items():
            if entry not in ENTRIES:
                raise ValueError(f'recovery entry {entry!r} is unknown; use {ENTRIES}.')
            if not isinstance(values, dict):
                raise ValueError(f'{origin}: {entry} must be an object with {FIELDS}.')
            changed = False
            for field, value in values.items():
                if field in FIELDS:
                    entries[entry][field] = _check(entry, field, value, origin)
                    changed = True
            if changed:
                prev = entries[entry]['source']
                entries[entry]['source'] = origin if prev == 'default' else f'{prev} + {origin}'
    return RecoveryTable(**{name: Recovery(**entries[name]) for name in ENTRIES})
