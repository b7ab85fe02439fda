"""A chaos soak from start to report: the job, its checks, chaos_soak.{json,md}.

`run(...)` runs `chaos_soak.Soak`, checks what the job left
(`chaos_verify`) and writes `chaos_soak.json` (`command`, `kills`, `steps`,
`final_step`, `max_rel_param_diff`, `leaked`, `by_kind`, `goodput`,
`findings`) and `chaos_soak.md`, its tables. `findings` lists what this run
met and nothing else (`soak_findings`): a recovery over its bound, steps
redone over theirs, steps lost, a mismatch, something left behind.
"""
from __future__ import annotations

import json
import os
import statistics
import time

from mecefo_jax.host import processes
from studies.report import fmt, markdown_table, write_json
from tests.drills import chaos_soak, chaos_verify, findings

# What breaks the soak's promise (nothing lost, the right model, nothing
# leaked): the script exits 1. The rest it reports and exits 0.
BROKEN = (findings.LOST, findings.MISMATCH, findings.PARAMS, findings.LEFT, findings.EXIT)


def _quantile(values, q: float):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def by_kind(kills: list[dict]) -> dict:
    out = {}
    for kind in chaos_soak.KINDS:
        mine = [k for k in kills if k['kind'] == kind and 'skipped' not in k]
        lost = [k['lost_steps'] for k in mine if k['lost_steps'] is not None]
        out[kind] = {'count': len(mine),
                     'recover_sec_p50': _quantile([k['recover_sec'] for k in mine], 0.5),
                     'recover_sec_p95': _quantile([k['recover_sec'] for k in mine], 0.95),
                     'lost_steps_total': sum(lost), 'lost_steps_max': max(lost, default=None)}
    return out


def soak_findings(report: dict, *, heartbeat_timeout_sec: float, checkpoint_every: int,
                  problems: list[str]) -> list[dict]:
    """What this soak met: each kill's recovery against its kind's bound (and its redone
    steps against `checkpoint_every`, the longest snapshot interval auto chooses), steps
    lost, the provenance's `problems`, the parameters against the simulation, leaks."""
    found = []
    for kill in report['kills']:
        if 'skipped' not in kill:
            found += findings.recovery(
                f"kill {kill['index']} ({kill['kind']})", kill,
                bound_sec=findings.recovery_bound_sec(kill['kind'], heartbeat_timeout_sec),
                redone_bound=checkpoint_every, time_key='recover_sec')
    if report['launcher_exit_code'] != 0:
        found.append(findings.finding(findings.EXIT, 'the last launcher run',
                                      report['launcher_exit_code'], 0))
    if report['final_step'] < report['steps']:
        found.append(findings.finding(findings.LOST, 'the job', report['final_step'],
                                      report['steps']))
    found += [findings.finding(findings.MISMATCH, problem) for problem in problems]
    diff = report['max_rel_param_diff']
    if diff is None:
        found.append(findings.finding(findings.PARAMS, 'not compared: steps without a record'))
    found += findings.over(findings.PARAMS, 'the final parameters', diff, findings.REL_TOL)
    found += [findings.finding(findings.LEFT, what) for what in report['leaked']]
    return found


def broken(report: dict) -> bool:
    """Whether the soak lost something, trained the wrong model or left something behind."""
    return any(f['what'] in BROKEN for f in report['findings'])


def _end_records(workdir: str) -> list[dict]:
    out = []
    for name in sorted(os.listdir(os.path.join(workdir, 'launch'))):
        if name.endswith('_end.json'):
            with open(os.path.join(workdir, 'launch', name)) as f:
                out.append(json.load(f))
    return out


def _soak(config_path, workdir, out_dir, *, kills, seed, nodes, values, max_gap, workers, log):
    """The job and its kills: (kill records, wall seconds, the finished Soak, cluster pids)."""
    soak = chaos_soak.Soak(config_path, workdir, out_dir, kills=kills, seed=seed, nodes=nodes,
                           values=values, max_gap=max_gap, workers=workers, log=log)
    start = time.time()
    try:
        records = soak.run()
        wall = time.time() - start
        cluster_procs = [(p.process.pid, processes.start_ticks(p.process.pid))
                         for node in soak.cluster.nodes.values()
                         for procs in node.all_processes.values() for p in procs]
    finally:
        soak.shutdown()
    return records, wall, soak, cluster_procs


def run(config_path: str, cfg, out_dir: str, *, kills: int, seed: int, nodes: int = 3,
        values: dict | None = None, max_gap: int = chaos_soak.GAP_STEPS[1], command: str = '',
        workers: int = chaos_soak.WORKERS, log=print) -> dict:
    """The whole soak; `cfg` is the job's resolved config (the base plus `values`)."""
    from mecefo_jax.launch.cluster import namespace_of
    workdir = os.path.join(out_dir, 'job')
    records, wall, soak, cluster_procs = _soak(config_path, workdir, out_dir, kills=kills,
                                               seed=seed, nodes=nodes, values=values, max_gap=max_gap,
                                               workers=workers, log=log)
    replicas = workers * chaos_soak.LOCAL_DEVICES
    report = {'command': command, 'config': config_path, 'seed': seed, 'kills_asked': kills,
              'workers': workers, 'nodes': nodes, 'launcher_exit_code': soak.exit_code, 'launches': soak.launches,
              'steps': int(cfg.train.steps), 'wall_sec': wall,
              'kills': chaos_verify.kill_rows(records, workdir)}
    final, problems = chaos_verify.check_provenance(workdir, cfg, replicas)
    report['final_step'] = max(final, default=-1) + 1
    ends = _end_records(workdir)
    step_sec = statistics.median(e['median_step_sec'] for e in ends if e.get('median_step_sec'))
    report['goodput'] = report['steps'] * step_sec / wall
    report['median_step_sec'] = step_sec
    report['max_rel_param_diff'] = None
    if len(final) == report['steps']:  # the simulation replays every step's live replicas
        log('[soak] checking the model: the same live replica sets in one process')
        simulated = chaos_verify.simulate(cfg, chaos_verify.fault_events(final, replicas),
                                          os.path.join(out_dir, 'simulated'), replicas)
        report['max_rel_param_diff'] = chaos_verify.max_rel_param_diff(workdir, simulated)
    report['leaked'] = ([f'keeper actor {k} (after the job)' for k in soak.keepers_after_job]
                        + chaos_verify.leaks(workdir, namespace_of(workdir), cluster_procs))
    report['cleanup_output'] = soak.cleanup_output
    report['by_kind'] = by_kind(report['kills'])
    report['findings'] = soak_findings(
        report, heartbeat_timeout_sec=float(cfg.launch.heartbeat_timeout_sec),
        checkpoint_every=int(cfg.train.checkpoint_every), problems=problems)
    write(report, out_dir)
    return report


def markdown(report: dict) -> str:
    """The soak's tables: the run, each kind's recoveries, what it found."""
    left = ', '.join(report['leaked']) or 'nothing'
    run = [('command', f"`{report.get('command') or '(called from Python)'}`"),
           ('config', f"`{report['config']}`"), ('seed', report['seed']),
           ('kills', report['kills_asked']), ('workers', report.get('workers', chaos_soak.WORKERS)),
           ('simulated nodes', report['nodes']), ('steps', report['steps']),
           ('reached step', report['final_step']), ('wall (min)', fmt(report['wall_sec'] / 60, '.1f')),
           ('launcher runs', report['launches']),
           ("final parameters vs the simulation (of each leaf's scale)",
            fmt(report['max_rel_param_diff'], '.2e')),
           ('left behind', left), ('goodput (steps x median step / wall)', fmt(report['goodput'], '.3f'))]
    kinds = [[kind, k['count'], fmt(k['recover_sec_p50']), fmt(k['recover_sec_p95']),
              f"{k['lost_steps_total']} / {fmt(k['lost_steps_max'], 'd')}"]
             for kind, k in report['by_kind'].items()]
    return '\n\n'.join([
        f"# Chaos soak: {report['kills_asked']} kills, seed {report['seed']}",
        markdown_table(['', 'value'], run),
        markdown_table(['kind', 'kills', 'recover p50 (s)', 'recover p95 (s)',
                        'lost steps (total / max)'], kinds),
        '## Found', findings.table(report['findings'])]) + '\n'


def write(report: dict, out_dir: str) -> None:
    write_json(os.path.join(out_dir, 'chaos_soak.json'), report)
    with open(os.path.join(out_dir, 'chaos_soak.md'), 'w') as f:
        f.write(markdown(report))
