"""The crash drill's report: `crash_drill.md`, tables of the figures `crash_drill.run_drill` gathers.

The JSON holds every figure; the markdown holds tables of them (the run,
the recoveries' components with a column per job that recovered, the other
figures, the random kills) and what this run found (`drill_findings`).
What the figures mean is written once, in docs/crash_drill.md.
"""
from __future__ import annotations

from studies.report import fmt, markdown_table
from tests.drills import findings
from tests.drills.crash_drill_jobs import COMPONENTS


def drill_findings(r: dict) -> list[dict]:
    """What this drill met: each recovery over its bound or with more steps redone than
    its kill allows (none for a kill right after a snapshot every keeper holds), more
    failures than the one injected, parameters off the simulated failure, a parity
    rebuild that is not the lost snapshot bit for bit."""
    every = r['config_checkpoint_every']
    jobs = [('memory job', r['memory'], 'worker', 0), ('disk job', r['disk'], 'worker', r['checkpoint_every']),
            ('parity job', r['parity'], 'keeper', every),
            ('launcher restart job', r['launcher_restart'], 'launcher', 0)]
    if r.get('node_loss'):
        jobs.append(('node loss job', r['node_loss'], 'node', 0))
    rk = r.get('random_kill') or {}
    jobs += [(f"random kill at step {k['kill_step']}", k, 'worker', rk['checkpoint_every'])
             for k in rk.get('kills', [])]
    found = []
    for where, row, kind, redone_bound in jobs:
        found += findings.recovery(where, row, bound_sec=findings.recovery_bound_sec(kind),
                                   redone_bound=redone_bound)
        found += findings.over(findings.EXTRA_FAILURES, where, row.get('failures'), 1)
    for where, row in (('memory job', r), ('node loss job', r.get('node_loss') or {})):
        found += findings.over(findings.PARAMS, where, row.get('max_rel_param_diff_vs_simulated'),
                               findings.REL_TOL)
    if not r['parity_rebuild_bitwise']:
        found.append(findings.finding(
            findings.MISMATCH, "parity job: the rebuilt snapshot against the lost keeper's",
            str(r['parity_rebuild_mismatch'] or 'not bitwise')[:200]))
    return found


def _rounded(by_worker: dict | None) -> dict | None:
    return None if by_worker is None else {w: round(v, 2) for w, v in by_worker.items()}


def _run_table(r: dict) -> str:
    kill = f"worker 1 after its first snapshot at or after step {r['kill_step']} (disk: at it)"
    rows = [('command', f"`{r.get('command') or '(called from Python)'}`"),
            ('config', f"`{r['config']}`"),
            ('workers x CPU devices (replicas)', f"{r['workers']} x {r['local_devices']} ({r['replicas']})"),
            ('simulated Ray nodes', r.get('nodes', 1)), ('steps', r['steps']), ('kill', kill),
            ('rejoins after (steps)', r['return_after_steps']),
            ('Orbax every (disk job, random kills)', r['checkpoint_every']),
            ("Ray's start-up, in no recovery (s)", fmt(r.get('ray_start_sec')))]
    return markdown_table(['', 'value'], rows)


def _recovery_table(r: dict) -> str:
    """One column per job that recovered (node loss only on 2+ nodes)."""
    columns = [('memory (keepers)', r['memory']), ('disk (Orbax)', r['disk']),
               ('launcher restart (keepers)', r['launcher_restart'])]
    if r.get('node_loss'):
        columns.append(('node loss (keepers)', r['node_loss']))
    jobs = [c for _, c in columns]
    rows = [[key] + [fmt(c.get(key)) for c in jobs] for key in COMPONENTS + ('recovery_sec',)]
    rows += [['cold compile of the same program'] + [fmt(c.get('cold_compile_sec')) for c in jobs],
             ['lost (redone) steps'] + [str(c.get('lost_steps')) for c in jobs],
             ['failures (causes)'] + [f"{c.get('failures')} ({', '.join(c.get('causes') or [])})"
                                      for c in jobs],
             ['normal step (median, s)'] + [fmt(c.get('step_sec')) for c in jobs],
             ['restored bytes (healed from peers)'] + [f"{c.get('restore_bytes')} ({c.get('healed_bytes') or 0})"
                                                       for c in jobs]]
    return markdown_table(['component (s)'] + [name for name, _ in columns], rows)


def _figures_table(r: dict) -> str:
    mem, parity, rs, ahead = r['memory'], r['parity'], r['launcher_restart'], r['compile_ahead']
    rows = [('restore, disk over keepers (slowest worker each)', fmt(r['restore_speedup_memory_vs_disk'], '.1f')),
            (f"interval `snapshot.every={r['snapshot_every_setting']}` chose in the memory job",
             r['snapshot_every_memory_job']),
            ('expected steps redone by a random kill: memory / disk',
             f"{fmt(r['expected_lost_steps_per_failure'], 'g')} / "
             f"{fmt(r['expected_lost_steps_per_failure_disk'], 'g')}"),
            (f"final parameters vs `{r['simulated_events']}` in one process: max abs / rel, bitwise",
             f"{r['max_abs_param_diff_vs_simulated']:.3g} / {r['max_rel_param_diff_vs_simulated']:.3g}, "
             f"{r['param_bitwise_equal_to_simulated']}"),
            (f"compiled ahead, {len(ahead['sets'])} survivor sets: CPU s / wall s",
             f"{ahead['cpu_sec']:.1f} / {ahead['wall_sec']:.1f}"),
            ('relaunch compile_sec per worker (cold, by process)',
             f"{_rounded(mem.get('compile_sec_by_worker'))} ({_rounded(mem.get('cold_compile_sec_by_process'))})"),
            ('programs compiled per worker in the relaunch', mem.get('programs_compiled_by_worker')),
            ('parity job (`mesh.data=1`, worker 2 and its keeper killed): rebuild s, bitwise',
             f"{fmt(parity['parity_rebuild_sec'], '.3f')}, {r['parity_rebuild_bitwise']}"),
            ('parity job: resumed at step (redone)', f"{parity['resume_step']} ({parity['lost_steps']})"),
            ('launcher restart: keepers adopted', rs['adopted_keepers']),
            ("launcher restart: from the death to the rerun's first step / joining Ray (s)",
             f"{fmt(rs.get('since_launcher_died_sec'))} / {fmt(rs.get('ray_connect_sec'), '.3f')}")]
    nl = r.get('node_loss')
    if nl:
        rows += [(f"node loss: worker {nl['victim']}'s node; rejoined on", str(nl['rejoined_on'])[:12]),
                 ('node loss: bytes healed from peers', nl['rejoin_healed_bytes']),
                 ('node loss: final parameters vs simulated (rel)', f"{nl['max_rel_param_diff_vs_simulated']:.3g}")]
    rk = r.get('random_kill')
    if rk:
        aligned = rk['snapshot_aligned']
        rows += [(f"random kills (seed {rk['seed']}, {rk['steps']} steps): redone, mean (max)",
                  f"{fmt(rk['mean_lost_steps'], '.2f')} ({rk['max_lost_steps']})"),
                 ('random kills: the disk tier would have redone, mean', fmt(rk['disk_mean_would_lose'], '.2f')),
                 ('the snapshot-aligned kill: redone, recovery s',
                  f"{aligned['lost_steps']}, {fmt(aligned['recovery_sec'])}")]
    return markdown_table(['figure', 'value'], rows)


def _random_kill_table(rk: dict) -> str:
    rows = [[k['kill_step'], k['snapshot_every'], k['lost_steps'], k['disk_would_lose'],
             fmt(k['recovery_sec']), k['resume']] for k in rk['kills']]
    return markdown_table(['kill step', 'interval at the kill', 'lost steps', 'disk would lose',
                           'recovery (s)', 'resumed from'], rows)


def markdown(r: dict) -> str:
    parts = ['# Crash drill', _run_table(r), _recovery_table(r), _figures_table(r)]
    if r.get('random_kill'):
        parts += ['## Random kills', _random_kill_table(r['random_kill'])]
    parts += ['## Found', findings.table(r['findings'])]
    return '\n\n'.join(parts) + '\n'
