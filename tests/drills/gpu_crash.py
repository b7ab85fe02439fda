"""A real crash on one accelerator: its worker SIGKILLed at random steps, back from memory, then disk.

`run_study` runs two launcher jobs on the connected Ray cluster, one worker
holding the node's one accelerator (a GPU; the CPU for the smoke):

1. `reference`: the job uninterrupted;
2. `crashed`: the same job, its worker SIGKILLed at `kills` random steps of
   its first half, the keeper alive (the relaunched worker restores the
   keeper's host memory onto the device; with `snapshot.every=1` it redoes at
   most the step in flight), then at `kills` random steps of its second half
   with the keeper killed too, as in a host's crash (the restore comes from
   the newest Orbax checkpoint on local disk, every `checkpoint_every` steps).

Each kill's row holds its way back in consecutive parts (the launcher's
`way_back_sec`: detection, replanning, the process, imports, jax.distributed,
the backend's start, setup, the restore, the program, the first step), the
bytes restored and their rate, the program loaded from the compilation cache
or compiled, and the steps redone. The check after the crash compares the
crashed job's final parameters with the reference's (bit for bit where the
run is deterministic, as on a CPU) and its loss at every step; where they
differ, a third job (`reference_seed1`, another init seed) measures the seed
noise the crashed curve is held to. It writes `crash.json` and `crash.md`.
"""
from __future__ import annotations

import json
import os
import random
import time

from mecefo_jax.config.resolve import updated
from mecefo_jax.launch.launcher import Launcher
from studies.report import fmt, markdown_table, write_json
from tests.drills import findings

PARTS = ('detect', 'replan', 'process_start', 'imports', 'distributed_init', 'backend_init',
         'setup', 'restore', 'program', 'refresh', 'first_step')
WORKER = 0  # the job's one worker
OFF_REFERENCE = 'parameters differ from the uninterrupted run'


def study_values(out_dir: str) -> dict:
    """What both jobs set: one worker on one device, a snapshot every step and no
    compile-ahead (there is no survivor to compile for)."""
    return {'train.eval_every': 0, 'train.log_every': 1, 'snapshot.every': 1,
            'mesh.data': 1, 'mesh.model': 1,
            'launch.local_devices': 1,
            'launch.compile_ahead': False,
            'launch.compilation_cache': os.path.join(out_dir, 'xla_cache')}


def kill_plan(seed: int, kills: int, steps: int, checkpoint_every: int) -> list[tuple[int, str]]:
    """[(step, tier)]: `kills` memory kills spread over the first half (one drawn uniformly
    in each of `kills` equal windows), then `kills` disk kills over the second half, past
    the first checkpoint; the same for the same seed."""
    rng = random.Random(seed)
    half = steps // 2
    memory = _spread(rng, 2, half - 1, kills, 'the first half')
    disk = _spread(rng, max(half, checkpoint_every + 1), steps - 2, kills,
                   f'the second half past the first checkpoint (step {checkpoint_every})')
    return [(s, 'memory') for s in memory] + [(s, 'disk') for s in disk]


def _spread(rng, first: int, last: int, n: int, where: str) -> list[int]:
    width = (last - first + 1) // n
    if width < 2:
        raise ValueError(f'--steps leaves {last - first + 1} step(s) in {where} for {n} kill(s); '
                         f'each needs 2: raise --steps or lower --kills.')
    return [rng.randint(first + i * width, first + (i + 1) * width - 1) for i in range(n)]


def launch_kill(plan) -> str:
    """`launch.kill` for the plan: a memory kill SIGKILLs the worker, a disk kill its keeper too."""
    return ','.join(f'{s}:{WORKER}' if tier == 'memory' else f'{s}:{WORKER}:KILL:keeper'
                    for s, tier in plan)


def run_job(cfg, values: dict, workdir: str, log) -> dict:
    log(f'[crash] {os.path.basename(workdir)}: ' + ', '.join(f'{k}={v}' for k, v in values.items()))
    start = time.perf_counter()
    summary = Launcher(updated(cfg, values), workdir, 1, log=log).run()
    summary['wall_sec'] = time.perf_counter() - start
    return summary


def run_study(cfg, out_dir: str, *, kills: int, seed: int = 0, command: str = '',
              config_path: str = '', log=print) -> dict:
    """Both jobs (a third where the crash changed the run) and the report; written to out_dir."""
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        raise ValueError(f'--out {out_dir} is not empty: its jobs would resume from what a '
                         'previous run left there. Choose a new directory or remove this one.')
    os.makedirs(out_dir, exist_ok=True)
    plan = kill_plan(seed, kills, cfg.train.steps, cfg.train.checkpoint_every)
    base = study_values(out_dir)
    if cfg.launch.compilation_cache != 'auto':  # the caller's (the suite's) over the study's
        base.pop('launch.compilation_cache')
    jobs = {'reference': run_job(cfg, base, os.path.join(out_dir, 'reference'), log)}
    jobs['crashed'] = run_job(cfg, dict(base, **{'launch.kill': launch_kill(plan)}),
                              os.path.join(out_dir, 'crashed'), log)
    check = versus(out_dir, 'crashed', 'reference', after=plan[0][0])
    if not check['param_bitwise_equal']:  # the seed noise the curve is held to
        jobs['reference_seed1'] = run_job(cfg, dict(base, **{'train.seed': cfg.train.seed + 1}),
                                          os.path.join(out_dir, 'reference_seed1'), log)
        noise = versus(out_dir, 'reference_seed1', 'reference', after=plan[0][0])
        check['seed_noise_max_abs_loss_diff'] = noise['max_abs_loss_diff_after_first_kill']
    rows = kill_rows(jobs['crashed'], os.path.join(out_dir, 'crashed', 'launch'), plan)
    report = {'command': command, 'config': config_path, 'steps': cfg.train.steps,
              'checkpoint_every': cfg.train.checkpoint_every, 'seed': seed,
              'device_kind': rows[0]['device_kind'] if rows else None,
              'kills': rows, 'other_failures': other_failures(jobs['crashed']),
              'by_tier': by_tier(rows), 'check': check,
              'step_sec': {name: _median_step(os.path.join(out_dir, name, 'launch'))
                           for name in jobs},
              'job_wall_sec': {name: job['wall_sec'] for name, job in jobs.items()}}
    report['findings'] = study_findings(report)
    write_json(os.path.join(out_dir, 'crash.json'), report)
    with open(os.path.join(out_dir, 'crash.md'), 'w') as f:
        f.write(markdown(report))
    return report


def _read(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def other_failures(summary: dict) -> list[str]:
    """The causes of the failures no kill injected (a heartbeat missed on a loaded machine)."""
    return [r.get('cause') for r in summary['recoveries']
            if r['kind'] == 'failure' and not r.get('injected_at')]


def kill_rows(summary: dict, launch_dir: str, plan) -> list[dict]:
    """One row per kill, in order: its recovery's parts and what its worker's start record says."""
    injected = [r for r in summary['recoveries'] if r['kind'] == 'failure' and r.get('injected_at')]
    if len(injected) != len(plan):
        raise RuntimeError(f'{len(plan)} kills planned ({plan}), {len(injected)} injected: '
                           f"{[r.get('injected_at') for r in injected]}")
    rows = []
    for (step, tier), r in zip(plan, injected):
        start = _read(os.path.join(launch_dir, f"g{r['next_generation']}_w{WORKER}_start.json"))
        restored = r['restore_bytes'] or 0
        rows.append({
            'kill_step': step, 'planned_tier': tier, 'resume': r['resume'],
            'resume_step': r['resume_step'], 'completed_steps': r['completed_steps'],
            'newest_checkpoint': r.get('newest_checkpoint'), 'redone_steps': r['redone_steps'],
            'recovery_sec': r['recovery_sec'],
            'way_back_sec': r['way_back_sec'], 'restore_bytes': restored,
            'restore_gb_per_sec': restored / r['restore_sec'] / 1e9 if r['restore_sec'] else None,
            'programs_compiled': start['programs_compiled'],
            'programs_cached': start['programs_cached'],
            'programs_load_sec': start['programs_load_sec'],
            'device_kind': start['device_kind'], 'fallback': r.get('fallback')})
    return rows


def by_tier(rows: list[dict]) -> dict:
    """Per tier: each part's median over its kills, and the steps redone at most."""
    import statistics
    out = {}
    for tier in ('memory', 'disk'):
        mine = [r for r in rows if r['planned_tier'] == tier]
        if mine:
            out[tier] = {'kills': len(mine),
                         'median_recovery_sec': statistics.median(r['recovery_sec'] for r in mine),
                         'median_way_back_sec': {p: statistics.median(r['way_back_sec'][p] for r in mine)
                                                 for p in PARTS},
                         'max_redone_steps': max(r['redone_steps'] for r in mine)}
    return out


def _losses(workdir: str) -> dict[int, float]:
    """The loss at each step; a step the crash made the job redo keeps its last row."""
    from mecefo_jax.training.metrics import read_metrics
    return {int(r['step']): float(r['loss']) for r in read_metrics(workdir) if 'loss' in r}


def versus(out_dir: str, job: str, reference: str, *, after: int) -> dict:
    """`job`'s final parameters and losses against `reference`'s."""
    import numpy as np
    real = np.load(os.path.join(out_dir, job, 'launch', 'final_params.npz'))
    ref = np.load(os.path.join(out_dir, reference, 'launch', 'final_params.npz'))
    diffs = {k: float(np.max(np.abs(real[k] - ref[k]))) for k in ref.files}
    rel = max(diffs[k] / max(float(np.max(np.abs(ref[k]))), 1e-30) for k in ref.files)
    mine, theirs = _losses(os.path.join(out_dir, job)), _losses(os.path.join(out_dir, reference))
    later = [abs(mine[s] - theirs[s]) for s in sorted(set(mine) & set(theirs)) if s > after]
    return {'versus': reference, 'param_bitwise_equal': all(d == 0.0 for d in diffs.values()),
            'max_abs_param_diff': max(diffs.values()), 'max_rel_param_diff': rel,
            'loss_steps_compared': len(later),
            'max_abs_loss_diff_after_first_kill': max(later, default=None)}


def _median_step(launch_dir: str) -> float | None:
    """The job's last generation's median step (its end record)."""
    import glob
    ends = sorted(glob.glob(os.path.join(launch_dir, 'g*_w0_end.json')),
                  key=lambda p: int(os.path.basename(p)[1:].split('_')[0]))
    return _read(ends[-1]).get('median_step_sec') if ends else None


def study_findings(r: dict) -> list[dict]:
    """Each kill over the worker's recovery bound or redoing more than its tier allows (the
    step in flight from memory, a checkpoint period from disk), a kill the launcher met
    from another tier than planned, failures no kill injected, and parameters off the reference's beyond the
    launcher's tolerance unless the loss stayed within the seed noise."""
    found = []
    for k in r['kills']:
        where = f"{k['planned_tier']} kill at step {k['kill_step']}"
        bound = 1 if k['planned_tier'] == 'memory' else r['checkpoint_every']
        found += findings.recovery(where, k, bound_sec=findings.recovery_bound_sec('worker'),
                                   redone_bound=bound, redone_key='redone_steps')
        if k['resume'] != k['planned_tier']:
            found.append(findings.finding(findings.MISMATCH, where, f"restored from {k['resume']}",
                                          k['planned_tier']))
    found += findings.over(findings.EXTRA_FAILURES, 'crashed job',
                           len(r['kills']) + len(r['other_failures']), len(r['kills']))
    check = r['check']
    noise = check.get('seed_noise_max_abs_loss_diff')
    if check['max_rel_param_diff'] > findings.REL_TOL and (
            noise is None or (check['max_abs_loss_diff_after_first_kill'] or 0.0) > noise):
        found.append(findings.finding(OFF_REFERENCE, 'crashed job', check['max_rel_param_diff'],
                                      findings.REL_TOL))
    return found


def markdown(r: dict) -> str:
    """crash.md: the kills' ways back side by side, per tier, the check, and the findings."""
    kills = r['kills']
    headers = ['', *[f"{k['planned_tier']} @ {k['kill_step']}" for k in kills]]
    rows = [[f'{p} (s)', *[fmt(k['way_back_sec'][p], '.3f') for k in kills]] for p in PARTS]
    rows += [['recovery (s)', *[fmt(k['recovery_sec'], '.2f') for k in kills]],
             ['restored from', *[k['resume'] for k in kills]],
             ['restore (GB)', *[fmt(k['restore_bytes'] / 1e9, '.3g') for k in kills]],
             ['restore (GB/s)', *[fmt(k['restore_gb_per_sec'], '.3g') for k in kills]],
             ['programs compiled / cached', *[f"{k['programs_compiled']} / {k['programs_cached']}"
                                              for k in kills]],
             ['steps redone', *[str(k['redone_steps']) for k in kills]]]
    tiers = r['by_tier']
    tier_rows = [[p, *[fmt(t['median_way_back_sec'][p], '.3f') for t in tiers.values()]]
                 for p in PARTS]
    tier_rows += [['recovery', *[fmt(t['median_recovery_sec'], '.2f') for t in tiers.values()]],
                  ['steps redone (max)', *[str(t['max_redone_steps']) for t in tiers.values()]]]
    c = r['check']
    check = [['parameters bit for bit', str(c['param_bitwise_equal'])],
             ['largest parameter difference (relative)', fmt(c['max_rel_param_diff'], '.3g')],
             ['largest loss difference after the first kill', fmt(c['max_abs_loss_diff_after_first_kill'], '.3g')],
             ['steps compared', str(c['loss_steps_compared'])],
             ['seed noise (largest loss difference, init seed + 1)',
              fmt(c.get('seed_noise_max_abs_loss_diff'), '.3g')]]
    return '\n\n'.join([
        f"# A real crash on {r['device_kind']}\n\n`{r['command']}`\n\n"
        f"{r['steps']} steps, an Orbax checkpoint every {r['checkpoint_every']}, a snapshot "
        f"every step; the uninterrupted step {fmt(r['step_sec'].get('reference'), '.3f')} s.",
        '## Each kill, its way back in parts\n\n' + markdown_table(headers, rows),
        '## Memory against disk (medians)\n\n' + markdown_table(['part (s)', *tiers], tier_rows),
        '## After the crash, against the uninterrupted run\n\n' + markdown_table(['', ''], check),
        '## Found\n\n' + findings.table(r['findings'])]) + '\n'
