"""`<workdir>/config.json`: the record of the config that wrote a run's checkpoints and snapshots.

It is written only after the state has been restored and checked against it, and
atomically, so a rejected resume or a crash mid-write never replaces it; a launcher's
rerun reads the same record. When a resume does not fit, comparing the record with
the new config names the fields that differ and the `--config.x.y=...` overrides that
resume the run as it was.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
from collections.abc import Mapping
from typing import Any

from mecefo_jax.host import files

CONFIG_FILENAME = 'config.json'
ABSENT = object()  # a field the other config does not have


def config_to_dict(cfg: Any) -> dict:
    """A JSON-compatible nested dict of `cfg` (ConfigDict, dataclass or mapping)."""
    if hasattr(cfg, 'to_json_best_effort'):  # ml_collections.ConfigDict
        return json.loads(cfg.to_json_best_effort())
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        cfg = dataclasses.asdict(cfg)
    if not isinstance(cfg, Mapping):
        raise TypeError(f'Cannot record a config of type {type(cfg).__name__}; pass a '
                        'ConfigDict, a dataclass or a mapping.')
    return json.loads(json.dumps(cfg, default=str))


def write_config_record(workdir: str, cfg: Any) -> str:
    """Write `<workdir>/config.json` atomically; return its path. Process 0 only, and only
    once the state has been restored (or freshly initialised) and checked."""
    path = os.path.join(os.fspath(workdir), CONFIG_FILENAME)
    files.write_text(path, json.dumps(config_to_dict(cfg), indent=2, sort_keys=True) + '\n')
    return path


def read_config_record(workdir: str) -> dict | None:
    """The recorded config of the run in `workdir`, or None if there is no readable one."""
    record = files.read_json(os.path.join(os.fspath(workdir), CONFIG_FILENAME))
    return record if isinstance(record, dict) else None


def flatten(tree: Mapping, prefix: str = '') -> dict[str, Any]:
    """{'model.d_model': 32, ...} from nested dicts."""
    flat = {}
    for key, value in tree.items():
        name = f'{prefix}{key}'
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, name + '.'))
        else:
            flat[name] = value
    return flat


def config_differences(recorded: Mapping, current: Any, *,
                       ignore: tuple[str, ...] = ()) -> list[tuple[str, Any, Any]]:
    """(field, recorded value, current value) for every field that differs, sorted, outside
    the `ignore`d sections. A field on one side only has `ABSENT` in place of the other value."""
    old, new = flatten(recorded), flatten(config_to_dict(current))
    return [(k, old.get(k, ABSENT), new.get(k, ABSENT))
            for k in sorted(old.keys() | new.keys())
            if old.get(k, ABSENT) != new.get(k, ABSENT) and not k.startswith(ignore)]


# A launcher's own fields never change what a snapshot or checkpoint holds.
LAUNCHER_FIELDS = ('launch.',)


def fits_record(workdir: str, cfg: Any) -> bool:
    """Whether `cfg` is the config the workdir's record names, the launcher's fields aside."""
    record = read_config_record(workdir)
    return record is not None and not config_differences(record, cfg, ignore=LAUNCHER_FIELDS)


def _literal(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        inner = ', '.join(repr(v) for v in value)
        return f'({inner},)' if len(value) == 1 else f'({inner})'
    return repr(value)


def override_flag(field: str, value: Any) -> str:
    """The command-line override setting `field` to `value`, quoted for a shell."""
    return shlex.quote(f'--config.{field}={_literal(value)}')


def _show(value: Any) -> str:
    return 'absent' if value is ABSENT else json.dumps(value)


def differences_note(workdir: str, cfg: Any, *, ignore: tuple[str, ...] = ()) -> str | None:
    """The fields where `cfg` differs from the workdir's record and the flags that resume the
    recorded run; None without a readable record, '' where nothing differs."""
    record = read_config_record(workdir)
    if record is None:
        return None
    diffs = config_differences(record, cfg, ignore=ignore)
    if not diffs:
        return ''
    path = os.path.join(os.fspath(workdir), CONFIG_FILENAME)
    lines = [f'  {k}: {_show(old)} in the run, {_show(new)} now' for k, old, new in diffs]
    flags = [override_flag(k, old) for k, old, _ in diffs if old is not ABSENT]
    return (f"The config differs from the run's record {path} in:\n" + '\n'.join(lines)
            + '\nTo resume that run, add: ' + ' '.join(flags))


def explain_mismatch(error: Exception, workdir: str, cfg: Any) -> Exception:
    """`error` (a checkpoint's or a snapshot's mismatch) with the config fields that differ
    from the run's record, and the fix: an error of the same type."""
    note = differences_note(workdir, cfg)
    path = os.path.join(os.fspath(workdir), CONFIG_FILENAME)
    if note is None:
        note = (f'There is no readable {path} to compare with, so the differing fields are '
                'unknown; use the config the run was started with, or another --workdir.')
    elif not note:
        note = (f"The config equals the run's record {path}; the checkpoint was written by "
                'other code or another config. Use another --workdir for a new run.')
    else:
        note += '\nTo start a new run with this config, pass another --workdir.'
    return type(error)(f'{error}\n{note}')


def refusal_note(workdir: str, cfg: Any) -> str:
    """What a launcher's rerun that failed before its first step is told: the fields, the fix."""
    kept = (f'The keepers, their snapshots and {CONFIG_FILENAME} were left as they were: '
            'rerun with the fix to resume from their memory.')
    note = differences_note(workdir, cfg, ignore=LAUNCHER_FIELDS)
    return f'{note}\n{kept}' if note else kept
