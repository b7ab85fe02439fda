"""The job's config record, `<workdir>/launch/config.json`, and what a rerun that differs is told.

The record says which config wrote the keepers' snapshots and the job's
checkpoints. A new job's launcher writes it at its start; a rerun only once
a generation of it completed a step: a rerun that fails before that (its config does not fit the
snapshots) leaves the record, and the keepers, as it found them, and is
told which fields differ and the `--config.x.y=...` flags that resume the
run as it was. The launcher's own fields (`launch.*`) never change what a
snapshot holds, so they are never named.
"""
from __future__ import annotations

import json
import os

from mecefo_jax.config.record import ABSENT, config_differences, override_flag
from mecefo_jax.host import files

RECORD = 'config.json'


def write(launch_dir: str, cfg) -> None:
    files.write_text(os.path.join(launch_dir, RECORD), cfg.to_json())


def read(launch_dir: str) -> dict | None:
    try:
        with open(os.path.join(launch_dir, RECORD)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def differences(launch_dir: str, cfg) -> list[tuple[str, object, object]] | None:
    """(field, recorded, now) outside `launch.*`; None without a readable record."""
    record = read(launch_dir)
    if record is None:
        return None
    return [d for d in config_differences(record, cfg) if not d[0].startswith('launch.')]


def refusal_note(launch_dir: str, cfg) -> str:
    """What a rerun that failed before its first step is told: the fields, the fix."""
    kept = ('The keepers, their snapshots and launch/config.json were left as they were: '
            'rerun with the fix to resume from their memory.')
    diffs = differences(launch_dir, cfg)
    if not diffs:
        return kept
    lines = [f'  {field}: {json.dumps(old)} in the run, {json.dumps(new)} now'
             for field, old, new in diffs if old is not ABSENT]
    flags = ' '.join(override_flag(field, old) for field, old, _ in diffs if old is not ABSENT)
    return (f"The config differs from the job's record {os.path.join(launch_dir, RECORD)} in:\n"
            + '\n'.join(lines) + f'\nTo resume that run, add: {flags}\n{kept}')
