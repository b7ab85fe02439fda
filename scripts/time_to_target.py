"""Time to target: which fault-tolerance setting reaches the fault-free model's loss soonest.

python scripts/time_to_target.py --config configs/small.py --seeds 8 --out DIR

Per seed s (0 .. --seeds - 1; train.seed = fault.seed = s): trains fault_free
for train.steps steps (its final validation loss is the seed's target), then
every other run until it reaches that loss (at most --limit_factor x
train.steps), and reports per run the goodput (fault-free time to target over
the run's, in modelled cluster time), the perplexity increase at equal steps
and the paired goodput difference to --default, with 95% Student-t intervals
over seeds. Writes DIR/time_to_target.{json,md,png}; each finished (seed, run)
is kept in DIR/seed<s>/<run>.json, so rerunning an interrupted command goes on
where it stopped. --smoke runs a tiny version (configs/tiny.py, 8 steps, 2
seeds) in under a minute.
"""
import os
import sys

# This checkout's package, whatever else is installed.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a configs/*.py file.',
                                          lock_config=True)
_OUT = flags.DEFINE_string('out', None, 'Output directory (also where finished runs are kept).')
_SEEDS = flags.DEFINE_integer('seeds', 8, 'Seeds 0 .. N-1 (initialisation and failure trace).',
                              lower_bound=1)
_RUNS = flags.DEFINE_string(
    'runs', '', "Comma-separated strategy:regime[:cap=N] runs (fault_free has no regime), e.g. "
    "'fault_free,mecefo:high,drop:high'; '' runs fault_free, mecefo, mecefo_planned (uncapped "
    'and --cap), drop, elastic and checkpoint_restart under high, and the default strategy '
    'under low and mid.')
_CAP = flags.DEFINE_integer('cap', 8, "mecefo_planned's neighbour-row cap in the default runs "
                            '(fault.max_neighbour_rows).', lower_bound=1)
_DEFAULT = flags.DEFINE_string('default', '', 'The run the paired differences are taken against; '
                               "'' is fault.strategy (and its cap) under high, e.g. mecefo_high.")
_LIMIT = flags.DEFINE_float('limit_factor', 1.5, 'A run that has not reached the target by this '
                            'many times train.steps counts as not reached.')
_EVAL_EVERY = flags.DEFINE_integer('eval_every', 50, 'Steps between evaluations before '
                                   '--dense_from.', lower_bound=1)
_DENSE_EVERY = flags.DEFINE_integer('dense_eval_every', 10, 'Steps between evaluations from '
                                    '--dense_from on.', lower_bound=1)
_DENSE_FROM = flags.DEFINE_float('dense_from', 0.8, 'Where dense evaluation starts, as a fraction '
                                 'of train.steps.')
_EVAL_BATCHES = flags.DEFINE_integer('eval_batches', 0, 'Validation batches per evaluation '
                                     '(train.eval_batches); 0: the whole validation split once.',
                                     lower_bound=0)
_REGIME_REPLICAS = flags.DEFINE_integer('regime_replicas', 32, 'fault.regime_replicas: the '
                                        "regimes' MTBF is per replica of a cluster this size.",
                                        lower_bound=0)
_COST = flags.DEFINE_enum('cost', 'analytic', ['analytic', 'bench'], "Per-step costs: 'analytic' "
                          "(the FLOP model of the config's shape) or 'bench' (the measured "
                          'wall-time ratios of --bench_json; writes time_to_target_bench.*).')
_BENCH_JSON = flags.DEFINE_string('bench_json', '', 'A bench_step.json (scripts/gpu_report.py) '
                                  'for --cost=bench.')
_COSTS = flags.DEFINE_string('costs', '', 'Cost constants to change, e.g. '
                             "'compile_sec=10,checkpoint_save_sec=1' (goodput.TimeCosts).")
_SMOKE = flags.DEFINE_bool('smoke', False, 'A tiny run (configs/tiny.py, 8 steps, 2 seeds, '
                           'fault_free, mecefo, elastic and checkpoint_restart under high).')
flags.mark_flags_as_required(['out'])


def _bench() -> dict | None:
    """The --bench_json dict under --cost=bench; None under 'analytic'."""
    from studies.bench_costs import load_json
    if _COST.value == 'analytic':
        if _BENCH_JSON.value:
            raise ValueError('--bench_json is read only with --cost=bench.')
        return None
    if not _BENCH_JSON.value:
        raise ValueError('--cost=bench needs --bench_json PATH, e.g. '
                         'docs/results/gpu/bench_step.json.')
    return load_json(_BENCH_JSON.value, '--bench_json')


def _setup():
    """(cfg, seeds, runs, default, settings, config name) from the flags."""
    from mecefo_jax.config.resolve import start
    from studies import time_to_target_settings as setup
    if _SMOKE.value:
        from configs.tiny import get_config
        return (*setup.smoke(start(get_config())), 'configs/tiny.py (smoke)')
    if _CONFIG.value is None:
        sys.exit('--config is required (or --smoke).')
    cfg = start(_CONFIG.value)
    try:
        runs = setup.parse_runs(_RUNS.value) if _RUNS.value else setup.default_runs(cfg, _CAP.value)
        settings = setup.Settings(limit_factor=_LIMIT.value, eval_every=_EVAL_EVERY.value,
                                  dense_eval_every=_DENSE_EVERY.value, dense_from=_DENSE_FROM.value,
                                  regime_replicas=_REGIME_REPLICAS.value,
                                  eval_batches=_EVAL_BATCHES.value,
                                  costs=setup.parse_costs(_COSTS.value), bench=_bench())
        default = _DEFAULT.value or setup.default_name(cfg)
        runs = setup.check_runs(runs, default)
    except ValueError as error:
        sys.exit(f'error: {error}')
    return (cfg, range(_SEEDS.value), runs, default, settings,
            config_flags.get_config_filename(flags.FLAGS['config']))


def main(argv):
    del argv
    cfg, seeds, runs, default, settings, name = _setup()  # fake CPU devices set, jax not started
    import jax
    if not os.environ.get('JAX_COMPILATION_CACHE_DIR'):  # runs share their programs
        jax.config.update('jax_compilation_cache_dir', os.path.join(_OUT.value, 'xla_cache'))
    from studies import time_to_target as ttt
    ttt.time_to_target(cfg, _OUT.value, seeds=seeds, runs=runs, default=default,
                       settings=settings, config_name=name)
    from studies.time_to_target_report import output_name
    print(open(os.path.join(_OUT.value, f'{output_name(settings)}.md')).read())


if __name__ == '__main__':
    app.run(main)
