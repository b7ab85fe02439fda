"""The crash drill's report: `crash_drill.md` from the figures `crash_drill.run_drill` gathers.

One table of the recoveries' components (a column per job that recovered),
then a sentence each on the restores, the snapshot interval and overhead,
the parameters against the simulated failure, compiling ahead, parity, the
launcher restart and, on 2 nodes or more, the lost node; last, a table of
the random kills.
"""
from __future__ import annotations

from mecefo_jax.snapshot.cadence import PROBE_STEPS, SETTLE_STEPS
from studies.crash_drill_jobs import COMPONENTS
from studies.report import fmt


def _rounded(by_worker: dict | None) -> dict | None:
    return None if by_worker is None else {w: round(v, 2) for w, v in by_worker.items()}


def _table(r: dict) -> list[str]:
    """The recovery table: one column per job that recovered (node loss only on 2+ nodes)."""
    columns = [('memory (keepers)', r['memory']), ('disk (Orbax)', r['disk']),
               ('launcher restart (keepers)', r['launcher_restart'])]
    if r.get('node_loss'):
        columns.append(('node loss (keepers)', r['node_loss']))

    def row(label, cells) -> str:
        return f"| {label} | {' | '.join(cells)} |"

    lines = [row('component (s)', [name for name, _ in columns]),
             row('---', ['---'] * len(columns))]
    for key in COMPONENTS + ('recovery_sec',):
        lines.append(row(key, [fmt(c.get(key)) for _, c in columns]))
    lines.append(row('cold compile of the same program',
                     [fmt(c.get('cold_compile_sec')) for _, c in columns]))
    lines.append(row('lost (redone) steps', [str(c.get('lost_steps')) for _, c in columns]))
    lines.append(row('failures (causes)', [f"{c.get('failures')} ({', '.join(c.get('causes') or [])})"
                                           for _, c in columns]))
    lines.append(row('normal step (median, s)', [fmt(c.get('step_sec')) for _, c in columns]))
    lines.append(row('restored bytes (healed from peers)',
                     [f"{c.get('restore_bytes')} ({c.get('healed_bytes') or 0})" for _, c in columns]))
    return lines


def markdown(r: dict) -> str:
    lines = [f"Crash drill: `{r['config']}`, {r['workers']} workers x {r['local_devices']} CPU "
             f"devices ({r['replicas']} replicas) on {r.get('nodes', 1)} simulated Ray node(s), "
             f"{r['steps']} steps; worker 1 SIGKILLed right after its first snapshot at or after "
             f"step {r['kill_step']} (memory) or at step {r['kill_step']} (disk), back "
             f"{r['return_after_steps']} steps later (memory); Orbax every "
             f"{r['checkpoint_every']} steps (disk); the launcher killed the same way (launcher "
             'restart)' + (f", and worker {r['node_loss']['victim']}'s node lost (node loss)"
                           if r.get('node_loss') else '') +
             f". Ray's start-up, {fmt(r.get('ray_start_sec'))} s, is in no recovery.", '']
    lines += _table(r)
    o = r['snapshot_overhead']
    speedup = r['restore_speedup_memory_vs_disk']
    a = r['restore_alone']
    mem = r['memory']
    lines += ['', f"Restore from keepers is {fmt(speedup, '.1f')}x faster than from disk in "
              "the jobs (slowest worker each).",
              f"The restores alone (one process, the same {a['bytes'] / 2**20:.1f} MiB state, "
              f"{a['repeats']} interleaved repeats, medians): keeper "
              f"{a['memory_restore_sec'] * 1e3:.1f} ms, Orbax {a['disk_restore_sec'] * 1e3:.1f} ms, "
              f"{a['speedup']:.1f}x.",
              f"Snapshot interval: `snapshot.every={r['snapshot_every_setting']}` chose "
              + (f"{r['snapshot_every_memory_job']} step(s) in the memory job (at its full size)"
                 if r['snapshot_every_memory_job'] is not None else
                 f'none in the memory job (its last generation ended before the '
                 f'{SETTLE_STEPS + PROBE_STEPS} steps it measures)')
              + f" and {r['snapshot_every']} in the overhead measurement below: a failure redoes the "
              f"steps since the last snapshot, {r['expected_lost_steps_per_failure']:g} on "
              "average at the latter (disk: "
              f"{r.get('expected_lost_steps_per_failure_disk', r['checkpoint_every'] / 2):g} "
              f"at Orbax every {r['checkpoint_every']}); the memory job's kill lands right "
              "after a snapshot every keeper holds, so its lost steps measure only what a "
              "surviving copy failed to give back.",
              f"Snapshot overhead: {r['snapshot_overhead_pct']:+.2f}% of step time, the median "
              f"over {o['blocks_each']} pairs of interleaved blocks of {o['steps_per_block']} "
              f"steps with and without snapshots (quartiles "
              f"{o['overhead_pct_quartiles'][0]:+.2f}% to {o['overhead_pct_quartiles'][1]:+.2f}%; "
              f"medians {o['step_sec_with_snapshots'] * 1e3:.1f} vs "
              f"{o['step_sec_without'] * 1e3:.1f} ms/step; {o['snapshot_bytes'] / 2**20:.1f} MiB "
              f"per snapshot, published {o['write_sec_per_snapshot'] * 1e3:.1f} ms after submit "
              f"in the background, of which "
              f"{o['wait_for_output_sec_per_snapshot'] * 1e3:.1f} ms waiting for the step's "
              f"output and the rest copying and checksumming).",
              f"Final parameters vs the same failure simulated in one process "
              f"(`{r['simulated_events']}`): max |diff| {r['max_abs_param_diff_vs_simulated']:.3g} "
              f"({r['max_rel_param_diff_vs_simulated']:.3g} of the leaf's scale; bitwise: "
              f"{r['param_bitwise_equal_to_simulated']}).",
              f"Compiled ahead for every single-worker loss ({len(r['compile_ahead']['sets'])} "
              f"survivor sets, before the memory job): {r['compile_ahead']['cpu_sec']:.1f} CPU s, "
              f"{r['compile_ahead']['wall_sec']:.1f} s wall; the relaunch's compile_sec per "
              f"worker {_rounded(mem.get('compile_sec_by_worker'))}, programs compiled per worker "
              f"{mem.get('programs_compiled_by_worker')} (cold, by process id: "
              f"{_rounded(mem.get('cold_compile_sec_by_process'))}).",
              f"Parity (`mesh.data=1`, worker 2 and its keeper killed): rebuilt in "
              f"{fmt(r['parity']['parity_rebuild_sec'], '.3f')} s, bitwise: "
              f"{r['parity_rebuild_bitwise']}; resumed at step {r['parity']['resume_step']}, "
              f"{r['parity']['lost_steps']} step(s) redone."]
    lines += _restart_and_node_loss_lines(r)
    lines += _random_kill_lines(r.get('random_kill'))
    return '\n'.join(lines) + '\n'


def _random_kill_lines(rk: dict | None) -> list[str]:
    """A row per random kill, beside the snapshot-aligned kill of the memory job."""
    if not rk:
        return []
    aligned = rk['snapshot_aligned']
    lines = ['', f"Random kills (seed {rk['seed']}, {rk['steps']} steps, Orbax every "
             f"{rk['checkpoint_every']}): worker 1 SIGKILLed at a uniformly random step under "
             f"the default cadence. Lost {fmt(rk['mean_lost_steps'], '.2f')} steps on average "
             f"(at most {rk['max_lost_steps']}); the disk tier would have lost "
             f"{fmt(rk['disk_mean_would_lose'], '.2f')} at the same points. The "
             f"snapshot-aligned kill above: {aligned['lost_steps']} lost, "
             f"{fmt(aligned['recovery_sec'])} s.", '',
             '| kill step | interval at the kill | lost steps | disk would lose | recovery (s) '
             '| resumed from |', '| --- | --- | --- | --- | --- | --- |']
    for k in rk['kills']:
        lines.append(f"| {k['kill_step']} | {k['snapshot_every']} | {k['lost_steps']} | "
                     f"{k['disk_would_lose']} | {fmt(k['recovery_sec'])} | {k['resume']} |")
    return lines


def _restart_and_node_loss_lines(r: dict) -> list[str]:
    rs = r['launcher_restart']
    lines = [f"Launcher restart: the rerun found the keepers of workers {rs['adopted_keepers']} "
             f"and resumed at step {rs['resume_step']}, {rs['lost_steps']} step(s) redone; "
             f"{fmt(rs.get('since_launcher_died_sec'))} s from the launcher's death to the rerun's "
             f"first step, of which {fmt(rs.get('recovery_sec'))} s from the rerun's start "
             f"(joining Ray took {fmt(rs.get('ray_connect_sec'), '.3f')} s more)."]
    nl = r.get('node_loss')
    if nl:
        lines.append(
            f"Node loss: worker {nl['victim']}'s node lost, detected in {fmt(nl['detect_sec'])} s; "
            f"resumed at step {nl['resume_step']}, {nl['lost_steps']} step(s) redone; the worker "
            f"rejoined on node {str(nl['rejoined_on'])[:12]} and healed {nl['rejoin_healed_bytes']} bytes from "
            f"its peers; final "
            f"parameters vs the same failure simulated in one process: "
            f"{nl['max_rel_param_diff_vs_simulated']:.3g} of the leaf's scale.")
    return lines
