"""The verdict study: does `drop` beat MeCeFO, at points moved towards the paper's regime?
See studies/verdict_points.py for the points, docs/verdict.md for the results.

  python scripts/verdict.py --work DIR                      # every point, then the report
  python scripts/verdict.py --work DIR --points paper_like --seeds 1
  python scripts/verdict.py --work DIR --points small,paper_like --seeds 4
  python scripts/verdict.py --work docs/results/verdict_runs --report_only  # the committed report

Each point runs `scripts/time_to_target.py`'s experiment in a process of its
own (a point of 32 replicas needs 32 fake devices from the start) under
DIR/<point>/; every finished (seed, run) is kept there, so rerunning the
same command after an interruption goes on where it stopped, and adding a
run or a seed later trains only what is new (a stored record of another data
seed or failure clock is trained again: new runs meet their failures on the
wall clock, `verdict_points.wall_clock`; a derived run's is replayed again,
its pauses on that clock, which trains nothing). The report
(verdict.{json,md,png}) goes to --report_dir and covers what has finished.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import app, flags  # noqa: E402

_WORK = flags.DEFINE_string('work', None, 'Where every point keeps its runs (resumable).',
                            required=True)
_POINTS = flags.DEFINE_list('points', [], 'Points to run, a comma list in order (e.g. '
                            'small,paper_like); default: every point.')
_SEEDS = flags.DEFINE_integer('seeds', 0, "Seeds per point; 0: each point's minimum "
                              '(verdict_points.Point.min_seeds).', lower_bound=0)
_RUNS = flags.DEFINE_string('runs', '', "time_to_target's --runs for every point; '': "
                            "verdict_points.CORE_RUNS plus the point's extra runs.")
_REPORT_DIR = flags.DEFINE_string('report_dir', os.path.join(ROOT, 'docs', 'results'),
                                  'Where verdict.{json,md,png} are written.')
_REPORT_ONLY = flags.DEFINE_bool('report_only', False, 'Train nothing: report what DIR holds.')
_POINT = flags.DEFINE_string('point', '', 'Internal: run this one point in this process.')
_DEVICE_PER_REPLICA = flags.DEFINE_bool(
    'device_per_replica', False, 'Give a point of replicas as rows (mesh.replicas) one fake '
    'device per replica instead: the same run, for timing the rows against it.')


def _run_point(name: str) -> None:
    """One point's time-to-target experiment, in this process."""
    from configs.small import get_config
    from mecefo_jax.config.resolve import start, updated
    from studies import verdict_points as vp
    from studies.replicas import num_replicas
    point = vp.POINTS[name]
    base = vp.point_config(get_config(), point)
    if _DEVICE_PER_REPLICA.value and base.mesh.replicas:
        base.mesh.num_cpu_devices, base.mesh.replicas = base.mesh.replicas, 0
    cfg = start(base)  # fake devices: the point's count
    cfg = updated(cfg, vp.wall_clock(cfg, num_replicas(cfg)))
    import jax
    jax.config.update('jax_compilation_cache_dir', os.path.join(_WORK.value, 'xla_cache'))
    from studies import time_to_target as ttt
    from studies import time_to_target_settings as setup
    runs = setup.parse_runs(_RUNS.value) if _RUNS.value else vp.runs_of(point)
    settings = setup.Settings(**point.settings)
    seeds = range(_SEEDS.value or point.min_seeds)
    ttt.time_to_target(cfg, os.path.join(_WORK.value, name), seeds=seeds, runs=runs,
                       default=vp.DEFAULT, settings=settings,
                       config_name=f'configs/small.py, point {name}',
                       log=lambda line: print(f'[{name}] {line}', flush=True))


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'unexpected arguments: {argv[1:]}')
    from studies import verdict_points as vp
    if _POINT.value:
        return _run_point(_POINT.value)
    names = _POINTS.value or list(vp.POINTS)
    unknown = [n for n in names if n not in vp.POINTS]
    if unknown:
        sys.exit(f'--points: unknown {unknown}; use some of {", ".join(vp.POINTS)}.')
    if not _REPORT_ONLY.value:
        for name in names:
            flags_here = [f'--work={_WORK.value}', f'--point={name}', f'--seeds={_SEEDS.value}',
                          f'--runs={_RUNS.value}',
                          f'--device_per_replica={_DEVICE_PER_REPLICA.value}']
            code = subprocess.call([sys.executable, os.path.abspath(__file__), *flags_here])
            if code:
                sys.exit(f'point {name} failed (exit {code}); rerun to go on where it stopped.')
    from studies import verdict_report
    verdict_report.write(_WORK.value, _REPORT_DIR.value)


if __name__ == '__main__':
    app.run(main)
