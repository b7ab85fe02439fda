"""Project the fault-tolerance strategies to a cluster: see mecefo_jax/experiments/cluster/sim.py.

  python scripts/simulate_cluster.py --out /tmp/simc
  python scripts/simulate_cluster.py --out DIR --cost bench --bench_json bench_step.json \
      --recovery_json crash_drill.json --assumption real_crash --seeds 200

Writes simulate_cluster.json (rows: one per reading x assumption x model x
regime x strategy), simulate_cluster.md (the paper's Table-2 layout with the
paper's figures beside ours, and the computed explanation) and
simulate_cluster.png (drop % against cluster size). Pure numpy: no jax.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mecefo_jax.experiments.cluster import sim as cluster_sim  # noqa: E402

_DEFAULT = cluster_sim.SimConfig()


def _list(kind=str):
    return lambda text: tuple(kind(x.strip()) for x in text.split(',') if x.strip())


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--out', default='', help='Output directory ("" prints only).')
    g = p.add_argument_group('Monte Carlo')
    g.add_argument('--seeds', type=int, default=_DEFAULT.seeds, help='Traces per setting.')
    g.add_argument('--hours', type=float, default=_DEFAULT.hours, help='Horizon of each trace.')
    g.add_argument('--models', type=_list(), default=_DEFAULT.models)
    g.add_argument('--regimes', type=_list(), default=_DEFAULT.regimes,
                   help="none, low, mid, high, custom (with --mtbf_hours/--mttr_hours).")
    g.add_argument('--readings', type=_list(), default=_DEFAULT.readings,
                   help='A: per cluster, one replica per failure; B: per node of 8.')
    g.add_argument('--assumption', choices=('both',) + cluster_sim.ASSUMPTIONS, default='both',
                   help='in_process: failures masked, no relaunch; real_crash: relaunch on '
                        'every failure and return.')
    g.add_argument('--strategies', type=_list(), default=_DEFAULT.strategies)
    g.add_argument('--mtbf_hours', type=float, default=0.0, help="The 'custom' regime's MTBF.")
    g.add_argument('--mttr_hours', type=float, default=0.0, help="The 'custom' regime's MTTR.")
    g.add_argument('--rate_scaling', choices=('per_replica', 'cluster'),
                   default=_DEFAULT.rate_scaling,
                   help='Reading A away from 32 replicas: keep the per-replica rate or the '
                        'cluster rate.')
    g.add_argument('--replicas', type=int, default=_DEFAULT.replicas, help='Table-2 cluster.')
    g.add_argument('--node_size', type=int, default=_DEFAULT.node_size)
    g.add_argument('--sizes', type=_list(int), default=_DEFAULT.sizes,
                   help='Cluster sizes of the sweep ("" skips it).')
    g.add_argument('--sweep_model', default=_DEFAULT.sweep_model)
    g.add_argument('--sweep_regimes', type=_list(), default=_DEFAULT.sweep_regimes)
    g.add_argument('--sweep_seeds', type=int, default=_DEFAULT.sweep_seeds,
                   help='Seeds per sweep size; 0: min(seeds, max(4, seeds * replicas / n)).')
    g = p.add_argument_group('workload and costs')
    g.add_argument('--cost', choices=('analytic', 'bench', 'roles'), default='analytic')
    g.add_argument('--bench_json', default='', help='bench_step.json (for --cost bench).')
    g.add_argument('--bench_metric', choices=('step_ms', 'flops'), default='step_ms')
    g.add_argument('--roles_json', default='',
                   help='compare_faults.json (its programs table, for --cost roles).')
    g.add_argument('--global_batch', type=int, default=_DEFAULT.global_batch)
    g.add_argument('--seq_len', type=int, default=_DEFAULT.seq_len)
    g.add_argument('--rank', type=int, default=_DEFAULT.rank)
    g.add_argument('--recompute_ffn', action=argparse.BooleanOptionalAction,
                   default=_DEFAULT.recompute_ffn, help='Neighbour re-runs the FFN forward.')
    g.add_argument('--causal_scores', action=argparse.BooleanOptionalAction,
                   default=_DEFAULT.causal_scores, help='Count only the causal half of QK^T/PV.')
    g.add_argument('--mfu', type=float, default=_DEFAULT.mfu)
    g.add_argument('--peak_tflops', type=float, default=_DEFAULT.peak_tflops,
                   help='A100 bf16 dense peak.')
    g.add_argument('--spread_k', type=int, default=_DEFAULT.spread_k)
    g.add_argument('--tau', type=int, default=_DEFAULT.tau,
                   help='Steps between projection refreshes while a neighbour is active.')
    g.add_argument('--refresh_sec', type=float, default=_DEFAULT.refresh_sec,
                   help='Seconds per projection refresh; < 0: SVD FLOPs at --svd_tflops.')
    g.add_argument('--svd_tflops', type=float, default=_DEFAULT.svd_tflops,
                   help='Assumed effective TFLOP/s of the GPU SVD (not measured).')
    g.add_argument('--granularity', choices=('sequence', 'continuous'),
                   default=_DEFAULT.granularity)
    g = p.add_argument_group('recovery')
    g.add_argument('--recovery_json', default='', help='crash_drill.json (memory / disk).')
    g.add_argument('--events_json', default='',
                   help='compare_faults.json: measured in-process overheads.')
    g.add_argument('--checkpoint_every', type=int, default=_DEFAULT.checkpoint_every,
                   help='checkpoint_restart: Orbax save period in steps.')
    for entry in ('in_process', 'memory', 'disk'):
        for field in ('recovery_sec', 'restore_sec', 'lost_steps'):
            g.add_argument(f'--{entry}_{field}', type=float, default=None)
    return p.parse_args(argv)


def main(argv=None):
    a = parse(argv)
    config = cluster_sim.SimConfig(
        models=a.models, regimes=a.regimes, readings=a.readings,
        assumptions=cluster_sim.ASSUMPTIONS if a.assumption == 'both' else (a.assumption,),
        strategies=a.strategies, replicas=a.replicas, node_size=a.node_size, seeds=a.seeds,
        hours=a.hours, sizes=a.sizes, sweep_model=a.sweep_model, sweep_regimes=a.sweep_regimes,
        sweep_seeds=a.sweep_seeds, mtbf_hours=a.mtbf_hours, mttr_hours=a.mttr_hours,
        rate_scaling=a.rate_scaling, global_batch=a.global_batch, seq_len=a.seq_len,
        rank=a.rank, spread_k=a.spread_k, granularity=a.granularity, tau=a.tau,
        refresh_sec=a.refresh_sec, svd_tflops=a.svd_tflops,
        checkpoint_every=a.checkpoint_every, recompute_ffn=a.recompute_ffn,
        causal_scores=a.causal_scores, mfu=a.mfu, peak_tflops=a.peak_tflops)
    overrides = {}
    for entry in ('in_process', 'memory', 'disk'):
        for field in ('recovery_sec', 'restore_sec', 'lost_steps'):
            value = getattr(a, f'{entry}_{field}')
            if value is not None:
                overrides.setdefault(entry, {})[field] = value
    try:
        cluster_sim.run(config, out_dir=a.out, cost=a.cost, bench_json=a.bench_json,
                        roles_json=a.roles_json, bench_metric=a.bench_metric,
                        recovery_json=a.recovery_json, events_json=a.events_json,
                        recovery_overrides=overrides,
                        log=lambda msg: print(msg, flush=True))
    except ValueError as err:
        sys.exit(f'simulate_cluster: {err}')


if __name__ == '__main__':
    main()
