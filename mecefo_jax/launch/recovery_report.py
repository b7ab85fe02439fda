"""The recovery report: one row per recovery in `<workdir>/launch/recoveries.jsonl`.

A row is opened when a generation ends (what failed, when, how long the
teardown took) and completed from the next generation's start records (how
long relaunching, joining, restoring, compiling and the first step took),
split into the badput kinds of ml-goodput-measurement. An open row is held
in `pending_recovery.json`, where a killed launcher's rerun finds it.
"""
from __future__ import annotations

import glob
import json
import os
import re
import zlib

from mecefo_jax.host import files

PENDING_FILENAME = 'pending_recovery.json'


def read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def append(out_dir: str, row: dict) -> dict:
    with open(os.path.join(out_dir, 'recoveries.jsonl'), 'a') as f:
        f.write(json.dumps(row) + '\n')
    return row


def hold(out_dir: str, row: dict | None) -> None:
    """Keep the open row on disk until it is recorded (a killed launcher's rerun records it)."""
    if row is not None:
        files.write_json(os.path.join(out_dir, PENDING_FILENAME), row)


def record(out_dir: str, row: dict) -> dict:
    """Complete the open row from its generation's start records, append it, drop the held copy."""
    row = append(out_dir, complete(row, out_dir))
    if os.path.exists(path := os.path.join(out_dir, PENDING_FILENAME)):
        os.remove(path)
    return row


def record_left(out_dir: str) -> list[dict]:
    """The row a killed launcher held open, recorded now; [] where it left none."""
    row = read_json(os.path.join(out_dir, PENDING_FILENAME))
    if row is not None and not started(row, out_dir):
        row['unfinished'] = 'the launcher died before every member of the next generation started'
    return [] if row is None else [record(out_dir, row)]


def started(row: dict, out_dir: str) -> bool:
    """Whether every member of the row's `next_generation` has written its start record."""
    return all(os.path.exists(os.path.join(out_dir, f"g{row['next_generation']}_w{w}_start.json"))
               for w in row['members'])


def complete(row: dict, out_dir: str) -> dict:
    """Fill `row` from the start records of its `next_generation`'s `members`."""
    starts = [read_json(os.path.join(out_dir, f"g{row['next_generation']}_w{w}_start.json"))
              for w in row['members']]
    starts = [s for s in starts if s]
    if not starts:
        return row
    first_step_done = max(s['first_step_done'] for s in starts)
    row.update(
        relaunch_sec=max(s['process_start'] for s in starts) - row['relaunched_at'],
        distributed_init_sec=max(s['distributed_init_sec'] for s in starts),
        restore_sec=max((s['restore_sec'] or 0.0) for s in starts),
        restore_bytes=max((sum((s['restore_bytes'] or {}).values())) for s in starts),
        healed_bytes=sum((s['healed_bytes'] or 0) for s in starts),
        compile_sec=max(s['compile_sec'] for s in starts),
        compile_sec_by_worker={str(s['worker']): s['compile_sec'] for s in starts},
        programs_compiled_by_worker={str(s['worker']): s.get('programs_compiled') for s in starts},
        refresh_sec=max(s['refresh_sec'] for s in starts),
        start_to_first_step_sec=max(s['train_start_to_first_step_sec'] for s in starts),
        resume_step=min(s['resume_step'] for s in starts),
        recovery_sec=first_step_done - row['failed_at'])
    row['redone_steps'] = max(0, row['completed_steps'] - row['resume_step'])
    if row.get('launcher_died_at'):  # a launcher restart: the whole way back, rerun included
        row['since_launcher_died_sec'] = first_step_done - row['launcher_died_at']
    row['badput_sec'] = {
        'infrastructure_recovery_from_disruption': row.get('detect_sec', 0.0) + row['teardown_sec'],
        'program_startup': row['relaunch_sec'],
        'accelerator_initialization': row['distributed_init_sec'],
        'unproductive_checkpoint_restore': row['restore_sec'] + (row.get('parity_rebuild_sec') or 0.0),
        'training_prep': row['compile_sec'] + row['refresh_sec'],
        'first_step': row['start_to_first_step_sec'] - row['compile_sec'] - row['refresh_sec'],
    }
    return row


def _provenance_rows(out_dir: str) -> list[dict]:
    """The whole rows of `provenance.jsonl` (process 0 writes one per step), in order."""
    try:
        with open(os.path.join(out_dir, 'provenance.jsonl'), 'rb') as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
            rows.append({**row, 'step': int(row['step'])})
        except (ValueError, KeyError):
            continue  # a row cut short by the crash
    return rows


def completed_steps_recorded(out_dir: str) -> int:
    """Steps the job recorded in `provenance.jsonl`."""
    rows = _provenance_rows(out_dir)
    return rows[-1]['step'] + 1 if rows else 0


def first_difference(rebuilt: bytes, original: bytes) -> dict:
    """Where a parity rebuild and the killed keeper's copy part: sizes, crc32s, first offset."""
    import numpy as np
    n = min(len(rebuilt), len(original))
    differs = np.flatnonzero(np.frombuffer(rebuilt, np.uint8, n) != np.frombuffer(original, np.uint8, n))
    diff = int(differs[0]) if differs.size else n
    return {'nbytes': [len(rebuilt), len(original)],
            'crc32': [zlib.crc32(rebuilt), zlib.crc32(original)], 'first_diff_offset': diff}


def next_generation_number(out_dir: str) -> int:
    """The number after every generation an earlier launcher of this workdir ran (0 if none).

    A rerun goes on counting: parity stripes and records carry the generation,
    and a newer one must replace what an older timeline left.
    """
    numbers = [int(m.group(1)) for p in glob.glob(os.path.join(out_dir, 'g*_w*.log'))
               if (m := re.match(r'g(\d+)_w\d+\.log$', os.path.basename(p)))]
    return max(numbers, default=-1) + 1


def snapshot_writers(out_dir: str) -> dict[int, list[int]]:
    """Per snapshot step (the state after that many steps), the members of the generation
    that computed it last (`provenance.jsonl`'s newest row, the start records)."""
    generation_of = {row['step'] + 1: int(row['generation'])
                     for row in _provenance_rows(out_dir) if 'generation' in row}
    members: dict[int, list[int]] = {}
    for path in glob.glob(os.path.join(out_dir, 'g*_w*_start.json')):
        if m := re.match(r'g(\d+)_w(\d+)_start\.json$', os.path.basename(path)):
            members.setdefault(int(m.group(1)), []).append(int(m.group(2)))
    return {step: sorted(members[g]) for step, g in generation_of.items() if g in members}
