r"""Project the fault-tolerance strategies to a cluster (studies/cluster/, docs/cluster.md).

  python scripts/simulate_cluster.py --out /tmp/simc
  python scripts/simulate_cluster.py --out DIR --cost bench --bench_json bench_step.json \
      --recovery_json crash_drill.json --assumption real_crash --seeds 200

Writes simulate_cluster.json (rows: one per assumption x model x regime x
strategy, the size sweep's, the cost and recovery tables and the explanation),
simulate_cluster.md (the paper's Table-2 layout with the paper's figures beside
ours, and the size sweep) and simulate_cluster.png (drop % against cluster
size). Pure numpy: no jax.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from studies import bench_costs  # noqa: E402
from studies.cluster import recovery as recovery_lib  # noqa: E402
from studies.cluster import report as cluster_report  # noqa: E402
from studies.cluster import sim as cluster_sim  # noqa: E402

_DEFAULT = cluster_sim.SimConfig()

flags.DEFINE_string('out', '', 'Output directory ("" prints only).')
# Monte Carlo
flags.DEFINE_integer('seeds', _DEFAULT.seeds, 'Traces per setting.')
flags.DEFINE_float('hours', _DEFAULT.hours, 'Horizon of each trace.')
flags.DEFINE_list('models', list(_DEFAULT.models), 'Paper model sizes.')
flags.DEFINE_list('regimes', list(_DEFAULT.regimes),
                  'none, low, mid, high, custom (with --mtbf_hours/--mttr_hours).')
flags.DEFINE_enum('assumption', 'both', ('both',) + cluster_sim.ASSUMPTIONS,
                  'in_process: failures masked, no relaunch; real_crash: relaunch on every '
                  'failure and return.')
flags.DEFINE_list('strategies', list(_DEFAULT.strategies), 'Strategies to project.')
flags.DEFINE_float('mtbf_hours', 0.0, "The 'custom' regime's MTBF.")
flags.DEFINE_float('mttr_hours', 0.0, "The 'custom' regime's MTTR.")
flags.DEFINE_enum('rate_scaling', _DEFAULT.rate_scaling, ('per_replica', 'cluster'),
                  'Away from 32 replicas: keep the per-replica rate or the cluster rate.')
flags.DEFINE_integer('replicas', _DEFAULT.replicas, 'Table-2 cluster.')
flags.DEFINE_list('sizes', [str(s) for s in _DEFAULT.sizes],
                  'Cluster sizes of the sweep ("" skips it).')
flags.DEFINE_string('sweep_model', _DEFAULT.sweep_model, 'Model of the size sweep.')
flags.DEFINE_list('sweep_regimes', list(_DEFAULT.sweep_regimes), 'Regimes of the size sweep.')
flags.DEFINE_integer('sweep_seeds', _DEFAULT.sweep_seeds,
                     'Seeds per sweep size; 0: min(seeds, max(4, seeds * replicas / n)).')
# Workload and costs
flags.DEFINE_enum('cost', 'analytic', ('analytic', 'bench'), 'Where step costs come from.')
flags.DEFINE_string('bench_json', '', 'bench_step.json (for --cost bench; its step_ms).')
flags.DEFINE_integer('global_batch', _DEFAULT.global_batch, 'Sequences per step.')
flags.DEFINE_integer('seq_len', _DEFAULT.seq_len, 'Tokens per sequence.')
flags.DEFINE_integer('rank', _DEFAULT.rank, 'MeCeFO low-rank r.')
flags.DEFINE_boolean('recompute_ffn', _DEFAULT.recompute_ffn,
                     'Neighbour re-runs the FFN forward (--norecompute_ffn: not).')
flags.DEFINE_boolean('causal_scores', _DEFAULT.causal_scores,
                     'Count only the causal half of QK^T/PV.')
flags.DEFINE_float('mfu', _DEFAULT.mfu, 'Model-FLOPs utilisation assumed.')
flags.DEFINE_float('peak_tflops', _DEFAULT.peak_tflops, 'A100 bf16 dense peak.')
flags.DEFINE_integer('tau', _DEFAULT.tau,
                     'Steps between projection refreshes while a neighbour is active.')
flags.DEFINE_float('refresh_sec', _DEFAULT.refresh_sec,
                   'Seconds per projection refresh; < 0: its FLOPs at --svd_tflops and its '
                   'collective bytes at --link_gbps (studies/refresh_costs.py).')
flags.DEFINE_float('svd_tflops', _DEFAULT.svd_tflops,
                   'Assumed effective TFLOP/s of the refresh on the GPU (not measured).')
flags.DEFINE_float('link_gbps', _DEFAULT.link_gbps,
                   'GB/s between replicas for the refresh collectives (DGX A100: 200 Gb/s '
                   'HDR InfiniBand per GPU).')
flags.DEFINE_enum('refresh_method', _DEFAULT.refresh_method, ('subspace', 'svd'),
                  'The refresh charged, as mecefo.refresh (subspace: the library default).')
flags.DEFINE_integer('refresh_iters', _DEFAULT.refresh_iters, 'As mecefo.refresh_iters.')
flags.DEFINE_integer('refresh_split_min_elements', _DEFAULT.refresh_split_min_elements,
                     'As mecefo.refresh_split_min_elements.')
flags.DEFINE_enum('granularity', _DEFAULT.granularity, ('sequence', 'continuous'),
                  'How a failed shard is split over neighbours.')
# Recovery
flags.DEFINE_string('recovery_json', '', 'crash_drill.json (memory / disk).')
flags.DEFINE_integer('checkpoint_every', _DEFAULT.checkpoint_every,
                     'checkpoint_restart: Orbax save period in steps.')
for _entry in recovery_lib.ENTRIES:
    for _field in recovery_lib.FIELDS:
        flags.DEFINE_float(f'{_entry}_{_field}', None, f'Override the {_entry} {_field}.')
FLAGS = flags.FLAGS


def _ints(name: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in FLAGS[name].value if x.strip())
    except ValueError:
        sys.exit(f'simulate_cluster: --{name}={",".join(FLAGS[name].value)}: use integers.')


def sim_config() -> cluster_sim.SimConfig:
    """The SimConfig the flags describe."""
    f = FLAGS
    names = ('models', 'regimes', 'strategies', 'sweep_regimes')
    lists = {n: tuple(x.strip() for x in f[n].value if x.strip()) for n in names}
    scalars = ('replicas', 'seeds', 'hours', 'sweep_model',
               'sweep_seeds', 'mtbf_hours', 'mttr_hours', 'rate_scaling', 'global_batch',
               'seq_len', 'rank', 'tau', 'refresh_sec', 'svd_tflops', 'link_gbps',
               'refresh_method', 'refresh_iters', 'refresh_split_min_elements',
               'granularity', 'checkpoint_every',
               'recompute_ffn', 'causal_scores', 'mfu', 'peak_tflops')
    assumptions = (cluster_sim.ASSUMPTIONS if f.assumption == 'both' else (f.assumption,))
    return cluster_sim.SimConfig(**lists, **{n: f[n].value for n in scalars},
                                 assumptions=assumptions, sizes=_ints('sizes'))


def log(msg: str) -> None:
    print(msg, flush=True)


def main(argv):
    del argv
    config = sim_config()
    overrides = {}
    for entry in recovery_lib.ENTRIES:
        for field in recovery_lib.FIELDS:
            value = FLAGS[f'{entry}_{field}'].value
            if value is not None:
                overrides.setdefault(entry, {})[field] = value
    try:
        if FLAGS.cost == 'bench' and not FLAGS.bench_json:
            raise ValueError('--cost=bench needs --bench_json PATH (bench_step.json).')
        config.validate()
        bench = bench_costs.load_json(FLAGS.bench_json, '--bench_json') if FLAGS.cost == 'bench' else None
        tables = cluster_sim.cost_tables(config, bench=bench, bench_path=FLAGS.bench_json)
        drill = (bench_costs.load_json(FLAGS.recovery_json, '--recovery_json') if FLAGS.recovery_json
                 else None)
        recovery = recovery_lib.recovery_table(drill=drill, overrides=overrides,
                                               drill_path=FLAGS.recovery_json or '--recovery_json')
        for name, t in tables.items():
            log(f'[simulate] {name}: {t.source} costs, mecefo x{t.ratio("mecefo"):.3f}, '
                f'ndb_naive x{t.ratio("ndb_naive"):.3f}, fault-free step {t.step_sec * 1e3:.1f} ms '
                f'({t.step_sec_source}), refresh {t.refresh_sec:.3f} s + '
                f'{t.refresh_split_sec:.3f} s / live ({t.refresh_source})')
        result = cluster_sim.monte_carlo(config, tables, recovery, log=log)
        if FLAGS.out:
            log('[simulate] wrote ' + ', '.join(cluster_report.write(result, FLAGS.out)))
    except ValueError as err:
        sys.exit(f'simulate_cluster: {err}')


if __name__ == '__main__':
    app.run(main)
