"""After a generation ends: the next one planned, once, and the recovery's row.

The plan: members (the survivors, or everyone on a rejoin or where the survivors hold
no whole replica), their nodes (a lost node's workers go to the least loaded live one),
their keepers (a lost one replaced, rebuilt from parity where configured), and the tier
and step every member restores (the newest step the keepers hold, after the snapshot
of the newest completed step has landed; the disk where none is left, or where the
checkpoint is newer). The row is opened when a generation ends and completed from the
next one's start records, split into ml-goodput-measurement's badput kinds; held open
in `pending_recovery.json`, a killed launcher's rerun finds it.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import time
from collections.abc import Callable

from mecefo_jax.host import files
from mecefo_jax.launch import generation
from mecefo_jax.launch.chaos import Injector
from mecefo_jax.launch.cluster import alive_nodes
from mecefo_jax.launch.generation import NODE_DIED, Generation
from mecefo_jax.launch.keepers import JobKeepers
from mecefo_jax.launch.placement import Placement, assign_nodes, parity_group
from mecefo_jax.snapshot import shm
from mecefo_jax.training.metrics import METRICS_FILENAME, newest_loss_step
from mecefo_jax.training.resume import Tier

_POLL_SEC = 0.05
PENDING_FILENAME = 'pending_recovery.json'


@dataclasses.dataclass
class JobState:
    """What the launcher and this planner share about one job; the launcher owns it, and
    between generations the planner reads and changes it (where workers run, their
    keepers, lost nodes) and nothing else of the launcher."""
    cfg: object  # the resolved Config
    placement: Placement
    keepers: JobKeepers
    nodes: dict[int, str]  # worker -> Ray node id; the injector holds this same dict
    injector: Injector
    ahead: object  # compile_ahead.CompileAhead
    log: Callable[[str], None]
    lost_nodes: list[str] = dataclasses.field(default_factory=list)
    workdir: str = ''  # the job's real path: its Orbax checkpoints are under it

    @property
    def uses_keepers(self) -> bool:
        return self.cfg.launch.recovery == 'memory' and self.cfg.snapshot.every != 0


def plan_next(job: JobState, gen: Generation, outcome) -> tuple[dict, Generation]:
    """Tear `gen` down and plan the next generation; (pending recovery row, generation)."""
    start = time.time()
    job.ahead.stop()  # it competes with the way back; its sets are moot after a loss
    row = _opened_row(job, gen, outcome)
    row['completed_steps'] = _end(job, gen, outcome, row)
    job.keepers.end_sessions()
    row['teardown_sec'] = time.time() - start
    workers = list(range(job.placement.workers))
    survivors = [w for w in gen.members if w not in outcome.failed]
    returns = 0
    if job.cfg.launch.recovery == 'disk':
        members, resume = workers, Tier.DISK
    elif outcome.kind == 'stopped' or not job.placement.survives(survivors):
        members, resume = workers, Tier.MEMORY  # everyone back (rejoin or replacement)
    else:
        members, resume = survivors, Tier.MEMORY
        returns = job.cfg.launch.return_after_steps
    if resume is Tier.MEMORY and not job.uses_keepers:
        resume = Tier.DISK  # snapshots are off: the checkpoint is the newest copy
    _place_and_record(job, members, resume, row)
    resume_step = 0
    if resume is Tier.MEMORY:
        # A sharded snapshot needs every writer's part: a lost keeper of a writer that is
        # no member now (its node died with it) is rebuilt too, on a live node.
        writers = [w for w in gen.members if w not in members] if job.cfg.snapshot.shard else []
        if writers:
            _place(job, [w for w in writers if not job.keepers.alive(w)])
        fresh, row['parity_rebuild_sec'] = _replace_lost_keepers(job, list(members) + writers,
                                                                 row)
        # Every worker restores the same step, chosen here from the keepers
        # that were written to until the end (and any rebuilt from parity):
        # no collective on the way back. A rejoining worker's own keeper may
        # be empty or stale; it heals that step from its peers. With no
        # survivor (every worker died at once), every keeper that lived.
        holders = _holders(job, gen, survivors, members, fresh, row)
        resume_step = job.keepers.common_step(holders) if holders is not None else 0
        row['newest_checkpoint'] = newest_checkpoint(job.workdir)
        if resume_step == 0 and row['completed_steps'] > 0:
            members, resume, returns = workers, Tier.DISK, 0
            _fall_back_to_disk(job, members, holders or [], row)
        elif resume_step == 0:
            resume = row['resume'] = Tier.FRESH  # the job saved nothing yet: it starts over
        elif (row['newest_checkpoint'] or 0) > resume_step:
            resume, resume_step = _restore_newer_checkpoint(job, resume_step, row)
    stop_at = resume_step + returns if returns > 0 else 0
    return row, Generation(gen.number + 1, members, resume, stop_at, resume_step)


def rerun_step(keepers, adopted, out_dir: str) -> int:
    """The newest step every keeper of its writers holds (0: none), for a rerun: a worker down
    when the launcher died left a keeper of older steps, and the survivors' are whole without
    it. A step whose writers are not on record needs every adopted keeper."""
    held = {w: keepers.steps(w) for w in adopted}
    writers = snapshot_writers(out_dir)
    for step in sorted(set().union(*held.values()), reverse=True):
        if all(step in held.get(w, ()) for w in writers.get(step, held)):
            return step
    return 0


def _holders(job: JobState, gen: Generation, survivors, members, fresh, row: dict):
    """The keepers whose common step the members restore; None where none can serve.

    A whole-state snapshot: the survivors' keepers (and any rebuilt from parity; with
    no survivor, every keeper that lived). A sharded one (`snapshot.shard`): every
    keeper the ended generation wrote its parts to, the failed worker's too; one of
    them lost and not rebuilt leaves no step whole in memory.
    """
    if job.cfg.snapshot.shard:
        writers = list(gen.members)
        whole = all(w not in fresh and job.keepers.alive(w) for w in writers)
        row['shard_writers'] = writers
        return writers if whole else None
    if survivors and job.placement.survives(survivors):
        # Every survivor's keeper holds its whole replica of the state: they need no other.
        return [w for w in survivors if w not in fresh and job.keepers.alive(w)]
    rebuilt = row.get('parity_rebuilt_workers', [])
    return [w for w in (survivors + rebuilt or members)
            if w not in fresh and job.keepers.alive(w)]


def _restore_newer_checkpoint(job: JobState, held: int, row: dict) -> tuple[str, int]:
    """The tiers' steps need not line up (snapshots every k steps, checkpoints every
    `train.checkpoint_every`): where the disk's is newer, the members restore it."""
    step = row['newest_checkpoint']
    row['newer_on_disk'] = (f'the newest Orbax checkpoint, step {step}, is newer than the '
                            f'step every keeper holds, {held}')
    row['resume'] = Tier.DISK
    job.log(f"[launch] {row['newer_on_disk']}: the members restore it")
    return Tier.DISK, step


def newest_checkpoint(workdir: str) -> int | None:
    """The newest step of the job's Orbax checkpoints (a finished one: Orbax names a step's
    directory by its number only once it is complete), or None."""
    try:
        names = os.listdir(os.path.join(workdir, 'checkpoints'))
    except OSError:
        return None
    return max((int(n) for n in names if n.isdigit()), default=None)


def _fall_back_to_disk(job: JobState, workers, holders, row: dict) -> None:
    """No keeper left holds a step every member can restore: every worker restarts from
    the disk tier, each with a keeper for the snapshots to come; said, and recorded."""
    _place_and_record(job, workers, Tier.DISK, row)
    _replace_lost_keepers(job, workers, row, rebuild=False)  # disk restores: nothing to rebuild
    every = job.cfg.train.checkpoint_every
    row['fallback'] = (
        f"no copy of the job's state is left in memory (the keepers of workers "
        f"{sorted(holders) or 'none'} live, sharing no step after {row['completed_steps']} "
        f'completed): every worker restarts from the newest Orbax checkpoint in the workdir '
        f'(train.checkpoint_every={every}); if none was written yet, the job starts over at '
        f'step 0 (nothing saved is lost)')
    job.log(f"[launch] {row['fallback']}")


def _opened_row(job: JobState, gen: Generation, outcome) -> dict:
    """What is known when the generation ends: the failure and its detection."""
    row = {'kind': 'rejoin' if outcome.kind == 'stopped' else 'failure',
           'ended_generation': gen.number, 'failed_workers': outcome.failed,
           'cause': outcome.cause or 'planned rejoin', 'failed_at': outcome.failed_at,
           'deaths': {str(d.worker): d.cause for d in outcome.deaths},
           'completed_steps': outcome.completed_steps}
    if outcome.echoes:
        row['echo_errors'] = outcome.echoes
    lost = sorted({job.nodes[d.worker] for d in outcome.deaths if d.cause == NODE_DIED})
    if lost:
        row['lost_nodes'] = lost
        job.lost_nodes.extend(lost)
        shm.remove_stale(job.keepers.namespace)  # a simulated node's keeper leaves them here
    if job.injector.where is not None:
        row['injected_at'], job.injector.where = job.injector.where, None
    if outcome.kind == 'failed':
        row['detect_sec'] = outcome.detected_at - outcome.failed_at
    return row


def _end(job: JobState, gen: Generation, outcome, row: dict) -> int:
    """Tear `gen` down once the survivors' newest step is safe in their keepers; the newest
    step the generation completed, every witness asked once it can no longer change.

    A report can lag the keepers, or lead them by a write in flight, and a survivor
    finishes a step whose collectives the dead worker joined before it died. So after a
    known death: the launcher's last look, the survivors (echoes too: an echo's actor
    still says which steps it completed before its collective failed) asked now, the
    keepers' newest snapshot (waited for), the survivors asked again; and once the
    processes are gone, the metrics' newest loss row (a step whose report the survivor
    had not sent when asked).
    """
    completed = outcome.completed_steps
    if outcome.kind == 'failed' and outcome.failed:  # a hang's workers may not answer
        unfailed = [w for w in gen.members if w not in outcome.failed]
        completed = max(completed, generation.final_progress(gen, unfailed))
        if job.uses_keepers:
            survivors = [w for w in unfailed if str(w) not in outcome.echoes]
            completed = _await_snapshots(job, survivors, completed)
            completed = max(completed, generation.final_progress(gen, unfailed))
    if outcome.kind == 'failed' and job.uses_keepers:
        row['newest_held_by_worker'] = {str(w): job.keepers.newest(w)
                                        for w in range(job.placement.workers)}
    generation.stop(gen)
    return max(completed, newest_loss_step(os.path.join(job.workdir, METRICS_FILENAME)) or 0)


def _place_and_record(job: JobState, members, resume: Tier, row: dict) -> None:
    """Place `members` (`_place`) and record them, their nodes and the resume tier in `row`."""
    _place(job, members)
    row.update(members=list(members), resume=resume,
               nodes={str(w): job.nodes[w] for w in members})


def _place(job: JobState, members) -> None:
    """Each member on a live node: where its keeper lives, else its old node, else another."""
    nodes = [n.node_id for n in alive_nodes()]
    keep = {}
    for w in members:
        node = job.keepers.node_of(w) if job.uses_keepers else None
        if node is None and job.nodes.get(w) in nodes:
            node = job.nodes[w]
        if node is not None:
            keep[w] = node
    job.nodes.update(assign_nodes(members, nodes, keep))


def _await_snapshots(job: JobState, survivors, completed: int, *, limit_sec: float = 60.0) -> int:
    """Wait until every survivor's keeper holds the newest step the job completed.

    The job's progress is the newest step any keeper published (the dead
    worker's too) or any worker reported complete, whichever is newer (a
    report can lag the keepers, or lead them by a write in flight).
    Data-parallel steps complete in lockstep, so every survivor finished that
    step too, and its snapshot writer will publish it: wait for that, rather
    than for a quiet moment, so the teardown never kills a write that would
    have saved the step. Returns the progress, in steps.
    """
    keepers = job.keepers
    every = job.cfg.snapshot.every
    held = max((keepers.newest(w) for w in range(job.placement.workers)), default=0)
    progress = max(held, completed)
    # A fixed cadence names the step a survivor is still writing; with
    # 'auto' only the steps some keeper already published are known.
    target = progress - progress % every if isinstance(every, int) and every > 0 else held
    deadline = time.monotonic() + limit_sec
    while time.monotonic() < deadline:
        behind = [w for w in survivors if keepers.newest(w) < target]
        if not behind:
            break
        time.sleep(_POLL_SEC)
    else:
        job.log(f'[launch] keepers of workers {behind} still lack step {target} after '
                f'{limit_sec:.0f} s: resuming from an older snapshot')
    return progress


def _replace_lost_keepers(job: JobState, members, row: dict, *,
                          rebuild: bool = True) -> tuple[set, float | None]:
    """Fresh keepers for members whose keeper is gone, rebuilt from parity where configured
    (and `rebuild`: not for a restart from disk, which reads no keeper).

    Returns (the members whose new keeper is empty, seconds spent).
    """
    keepers = job.keepers
    lost = [w for w in members if not keepers.alive(w)]
    if not lost:
        return set(), None
    start = time.time()
    old = keepers.as_list()
    keepers.start({w: job.nodes[w] for w in lost})
    fresh = set(lost)
    if job.cfg.snapshot.parity and rebuild:
        for w in lost:
            if _rebuild_from_parity(job, w, old, row):
                fresh.discard(w)
    return fresh, time.time() - start


def _rebuild_from_parity(job: JobState, worker: int, old: list, row: dict) -> bool:
    """Rebuild `worker`'s newest snapshot its parity group can give into its new keeper;
    False (said, and recorded) where the group lost more members than parity covers."""
    from mecefo_jax.snapshot import KeeperClient, SnapshotWriter, rebuild_member
    from mecefo_jax.snapshot.parity import ParityLossError, RebuildError
    group = parity_group(worker, job.placement.workers, job.cfg.snapshot.parity_group)
    if not group:
        return False
    try:
        rebuilt = rebuild_member(f'workers{group[0]}-{group[-1]}', [old[m] for m in group],
                                 lost=worker - group[0])
    except (ParityLossError, RebuildError) as error:
        row.setdefault('parity_unrecoverable', {})[str(worker)] = str(error)
        job.log(f"[launch] worker {worker}'s snapshot cannot be rebuilt from parity: {error}")
        return False
    with KeeperClient(job.keepers.handles[worker]) as client:
        SnapshotWriter(client).write_blob(rebuilt.raw)
    job.log(f"[launch] rebuilt worker {worker}'s snapshot of step {rebuilt.step} from parity")
    row.setdefault('parity_rebuilt_workers', []).append(worker)
    for name, value in job.injector.check_rebuild(worker, rebuilt.step, bytes(rebuilt.raw)).items():
        row.setdefault(name, {})[str(worker)] = value
    return True


def launcher_restart_row(out_dir: str, gen: Generation, started: float, adopted: list, ray: dict) -> dict | None:
    """A rerun's recovery row: from the keepers a killed launcher left, else from disk or step
    0; None where no launcher ran here or the last one ended (it wrote `summary.json`)."""
    summarized = (files.read_json(os.path.join(out_dir, 'summary.json')) or {}).get('last_generation', -1)
    if not gen.resume_step and summarized >= gen.number - 1:  # generation 0: -1 >= -1, none ran
        return None
    killed = files.read_json(os.path.join(out_dir, 'launcher_killed.json')) or {}
    cause = 'its keepers were not' if gen.resume_step else 'no keeper held a step of the job'
    return {'kind': 'launcher_restart', 'ended_generation': gen.number - 1, 'failed_workers': [],
            'cause': f'the launcher was gone; {cause}', 'failed_at': started,
            'launcher_died_at': killed.get('time'), 'detect_sec': 0.0, 'teardown_sec': 0.0,
            'deaths': {}, 'completed_steps': completed_steps_recorded(out_dir),
            'adopted_keepers': adopted, 'members': list(gen.members), 'resume': gen.resume,
            **{k: v for k, v in ray.items() if k.startswith('ray_')}}


# ------------------------------------------------------------------ the recovery report

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
    row = files.read_json(os.path.join(out_dir, PENDING_FILENAME))
    if row is not None and not started(row, out_dir):
        row['unfinished'] = 'the launcher died before every member of the next generation started'
    return [] if row is None else [record(out_dir, row)]


def started(row: dict, out_dir: str) -> bool:
    """Whether every member of the row's `next_generation` has written its start record."""
    return all(os.path.exists(os.path.join(out_dir, f"g{row['next_generation']}_w{w}_start.json"))
               for w in row['members'])


def complete(row: dict, out_dir: str) -> dict:
    """Fill `row` from the start records of its `next_generation`'s `members`."""
    starts = [files.read_json(os.path.join(out_dir, f"g{row['next_generation']}_w{w}_start.json"))
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
    last = max(starts, key=lambda s: s['first_step_done'])  # the way back ends with its step
    row['way_back_sec'] = way_back(row, last)
    row['badput_sec'] = badput(row['way_back_sec'], row.get('parity_rebuild_sec') or 0.0)
    return row


def way_back(row: dict, start: dict) -> dict:
    """The seconds from the failure to the end of the first step of the worker that finished
    it last, in consecutive parts that add up to `recovery_sec`: the launcher's
    (detection; teardown, keepers and the step to resume), then the worker's (its
    process, its imports, jax.distributed, the backend, the
    run's setup, the restore, the program loaded or compiled, a refresh, and the rest
    of the first step: tracing the state's shapes and running it)."""
    detected = row['failed_at'] + row.get('detect_sec', 0.0)
    loop = start['first_step_done'] - start['train_start_at']
    restore, program, refresh = start['restore_sec'] or 0.0, start['compile_sec'], start['refresh_sec']
    return {'detect': detected - row['failed_at'], 'replan': row['relaunched_at'] - detected,
            'process_start': start['process_start'] - row['relaunched_at'],
            'imports': start['imported_at'] - start['process_start'],
            'distributed_init': start['joined_at'] - start['imported_at'],
            'backend_init': start['backend_up_at'] - start['joined_at'],
            'setup': start['train_start_at'] - start['backend_up_at'],
            'restore': restore, 'program': program, 'refresh': refresh,
            'first_step': loop - restore - program - refresh}


def badput(parts: dict, parity_rebuild_sec: float) -> dict:
    """`way_back`'s parts in ml-goodput-measurement's badput kinds (they add up the same)."""
    return {
        'infrastructure_recovery_from_disruption': parts['detect'] + parts['replan'] - parity_rebuild_sec,
        'program_startup': parts['process_start'] + parts['imports'],
        'accelerator_initialization': parts['distributed_init'] + parts['backend_init'],
        'unproductive_checkpoint_restore': parts['restore'] + parity_rebuild_sec,
        'training_prep': parts['setup'] + parts['program'] + parts['refresh'],
        'first_step': parts['first_step'],
    }


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
