"""The record of a run's config, `<workdir>/config.json`, and what a mismatch means.

The record is the only place that says which config wrote a workdir's
checkpoints. It is written only after the state has been restored and
checked against it, and atomically (temporary file, then rename), so a rejected
resume or a crash mid-write never replaces it. When a resume does not fit
the checkpoint, comparing the record with the new config names the fields
that differ and the `--config.x.y=...` overrides that resume the run as it was.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
from collections.abc import Mapping
from typing import Any

from mecefo_jax.host import atomic_file

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
    """Write `<workdir>/config.json` atomically; return its path. Process 0 only.

    Call it after the state has been restored (or freshly initialised) and
    checked, never before: the record must keep describing the checkpoints.
    """
    path = os.path.join(os.fspath(workdir), CONFIG_FILENAME)
    text = json.dumps(config_to_dict(cfg), indent=2, sort_keys=True) + '\n'
    atomic_file.write_text(path, text)
    return path


def read_config_record(workdir: str) -> dict | None:
    """The recorded config of the run in `workdir`, or None if there is no readable one."""
    try:
        with open(os.path.join(os.fspath(workdir), CONFIG_FILENAME), encoding='utf-8') as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
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


def config_differences(recorded: Mapping, current: Mapping) -> list[tuple[str, Any, Any]]:
    """(field, recorded value, current value) for every field that differs, sorted.

    A field present on one side only has `ABSENT` in place of the other value.
    """
    old, new = flatten(recorded), flatten(config_to_dict(current))
    return [(k, old.get(k, ABSENT), new.get(k, ABSENT))
            for k in sorted(old.keys() | new.keys())
            if old.get(k, ABSENT) != new.get(k, ABSENT)]


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


def explain_mismatch(error: Exception, workdir: str, cfg: Any) -> Exception:
    """`error` (a checkpoint's or a snapshot's mismatch) with the config fields that differ
    from the run's record, and the fix: an error of the same type."""
    kind = type(error)
    record = read_config_record(workdir)
    path = os.path.join(os.fspath(workdir), CONFIG_FILENAME)
    if record is None:
        note = (f'There is no readable {path} to compare with, so the differing fields are '
                'unknown; use the config the run was started with, or another --workdir.')
        return kind(f'{error}\n{note}')
    diffs = config_differences(record, cfg)
    if not diffs:
        note = (f"The config equals the run's record {path}; the checkpoint was written by "
                'other code or another config. Use another --workdir for a new run.')
        return kind(f'{error}\n{note}')
    lines = [f'  {k}: {_show(old)} in the run, {_show(new)} now' for k, old, new in diffs]
    flags = [override_flag(k, old) for k, old, _ in diffs if old is not ABSENT]
    note = (f"The config differs from the run's record {path} in:\n" + '\n'.join(lines)
            + '\nTo resume that run, add: ' + ' '.join(flags)
            + '\nTo start a new run with this config, pass another --workdir.')
    return kind(f'{error}\n{note}')
