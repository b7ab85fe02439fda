"""What one live-set change costs in no-progress seconds and redone steps, per way of
recovering (docs/cluster.md says which strategy pays which)."""
from __future__ import annotations

from typing import Any

ENTRIES = ('in_process', 'memory', 'disk')  # masked failure; crash + snapshots; Orbax restore
FIELDS = ('recovery_sec', 'restore_sec', 'lost_steps')  # lost_steps None: since the last checkpoint

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


def _number(value: Any, where: str) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f'{where}={value!r} is not a number.') from None
    if value < 0:
        raise ValueError(f'{where}={value!r} must be >= 0.')
    return value


def recovery_table(*, drill: dict | None = None, overrides: dict[str, dict[str, Any]] | None = None,
                   drill_path: str = '--recovery_json') -> dict[str, dict[str, Any]]:
    """{entry: {recovery_sec, restore_sec, lost_steps, source}}: `DEFAULTS`, overridden field
    by field by `drill` (crash_drill.json: objects `memory`, `disk`, optionally `in_process`;
    other keys are ignored), then by `overrides[entry][field]` (the flags)."""
    if drill is not None and not any(k in drill for k in ENTRIES):
        raise ValueError(f'{drill_path}: expected objects {", ".join(ENTRIES)} (at least '
                         f'one) with {", ".join(FIELDS)}; got keys {sorted(drill)}.')
    table = {name: dict(DEFAULTS[name], source='default') for name in ENTRIES}
    drill = {k: v for k, v in (drill or {}).items() if k in ENTRIES}
    for layer, origin in ((drill, 'crash drill'), (overrides or {}, 'flag')):
        for entry, values in layer.items():
            if entry not in ENTRIES or not isinstance(values, dict):
                raise ValueError(f'{origin}: recovery entry {entry!r} must be one of {ENTRIES}, '
                                 f'an object with {FIELDS}.')
            changed = [f for f in values if f in FIELDS]
            for field in changed:
                value = values[field]
                table[entry][field] = (None if value is None and field == 'lost_steps'
                                       else _number(value, f'{origin}: {entry}.{field}'))
            if changed:
                prev = table[entry]['source']
                table[entry]['source'] = origin if prev == 'default' else f'{prev} + {origin}'
    return table
