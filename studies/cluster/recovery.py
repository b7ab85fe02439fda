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
by component in `DEFAULT_BREAKDOWN`), the measured events of a strategy
comparison (`compare_faults.json`), a crash drill (`crash_drill.json`) and
command-line flags.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
from typing import Any

from mecefo_jax.faults.strategies import SPECS

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


def compare_reports(path: str, load) -> list[dict]:
    """The per-seed reports behind a `compare_faults.json`.

    One seed's report holds its events; the multi-seed one holds only their
    count per strategy, so its seeds' own reports (`seed<S>/` beside it) are
    read instead. `load(path, flag)` reads a JSON file.
    """
    report = load(path, '--events_json')
    if not isinstance(report.get('seeds'), list):
        return [report]
    base = os.path.dirname(path)
    return [load(os.path.join(base, f"seed{s['fault_seed']}", 'compare_faults.json'),
                 '--events_json (its per-seed report)') for s in report['seeds']]


def measured_in_process(compare_report, origin: str = '--events_json') -> dict[str, float]:
    """In-process overheads from a strategy comparison's measured events.

    The median over the failure and recovery events of the strategies that
    keep running in place (not fault_free, nor one that restores at a failure:
    checkpoint_restart) of detect + rebuild +
    compile + restore seconds, and of their lost steps. These are measured on
    this machine for the comparison's config (CPU, small model). Takes one
    report or a list of per-seed reports (`compare_reports`). The projection
    refresh is charged apart (`cluster.sim`), so it is left out here.
    """
    reports = compare_report if isinstance(compare_report, list) else [compare_report]
    seconds, lost = [], []
    results = [(name, result) for report in reports
               for name, result in report.get('strategies', {}).items()]
    for name, result in results:
        spec = SPECS.get(name)
        if name == 'fault_free' or (spec is not None and spec.restores_at_failure):
            continue
        events = result.get('events', [])
        if not isinstance(events, list):
            raise ValueError(f'{origin}: strategies.{name}.events is a summary, not a list of '
                             f'events; pass a per-seed compare_faults.json (seed<S>/).')
        for e in events:
            seconds.append(sum(float(e.get(k) or 0.0) for k in
                               ('detect_sec', 'rebuild_sec', 'compile_sec', 'restore_sec')))
            lost.append(float(e.get('lost_steps') or 0.0))
    if not seconds:
        raise ValueError(f'{origin}: no failure or recovery events in strategies[*].events; '
                         f'pass a compare_faults.json from a run with failures.')
    return {'recovery_sec': statistics.median(seconds), 'restore_sec': 0.0,
            'lost_steps': statistics.median(lost)}


def recovery_table(*, drill: dict | None = None, measured: dict | None = None,
                   overrides: dict[str, dict[str, Any]] | None = None,
                   drill_path: str = '--recovery_json') -> RecoveryTable:
    """Defaults <- measured in-process events <- crash drill <- flags.

    `drill` is a crash_drill.json dict (`memory` / `disk` / optionally
    `in_process` objects with `recovery_sec`, `restore_sec`, `lost_steps`);
    `measured` replaces `in_process`; `overrides[entry][field]` wins over all.
    """
    entries = {name: dict(DEFAULTS[name], source='default') for name in ENTRIES}
    layers = []
    if measured is not None:
        layers.append(({'in_process': measured}, 'measured events'))
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
