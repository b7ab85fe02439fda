"""What each relaunch cache saves a recovery: the crash drill's memory job, once per layer left out.

A worker SIGKILLed right after a snapshot every keeper holds (the drill's memory job:
`crash_drill_jobs`), recovered from the keepers' memory, with every cache layer, with
each left out alone, with JAX's persistent cache alone, and with none:

* `compile_ahead`: the survivors' programs compiled before the failure;
* `untraced`: the program cache found before tracing (`MECEFO_CACHE_LAYERS`);
* `programs`: the program cache by lowered text, compile-ahead's store;
* `jax`: JAX's own persistent compilation cache.

Each variant runs on a simulated cluster of its own (the layers variable reaches the
workers through its nodes' environment), the variants interleaved per repeat so that
the machine's drift falls on all alike. A layer's saving is the recovery without it
less the recovery with every layer, and its share that saving over the recovery
without it.
"""
from __future__ import annotations

import os
import statistics

from tests.drills import crash_drill_jobs as jobs_lib

LAYERS = ('jax', 'programs', 'untraced')
# name -> (config values, the cache layers, compile ahead)
VARIANTS = {
    'all': ({}, LAYERS, True),
    'no_compile_ahead': ({}, LAYERS, False),
    'no_untraced': ({}, ('jax', 'programs'), True),
    'no_jax_cache': ({}, ('programs', 'untraced'), True),
    'jax_cache_alone': ({}, ('jax',), False),
    'none': ({'launch.compilation_cache': ''}, (), False),
}
# The layer each variant leaves out alone, to price it.
PRICED = {'no_compile_ahead': 'compile_ahead', 'no_untraced': 'untraced',
          'no_jax_cache': 'jax'}


def run_variant(cfg, name: str, out_dir: str, *, workers: int, nodes: int, kill_step: int,
                return_after: int, log) -> dict:
    """One memory job under variant `name`, on a cluster of its own: its recovery rows."""
    from mecefo_jax.launch.placement import Placement
    from mecefo_jax.parallel.program_cache import LAYERS_VARIABLE
    from tests.drills.sim_cluster import SimulatedCluster
    values, layers, ahead = VARIANTS[name]
    placement = Placement(workers, cfg.launch.local_devices, cfg.mesh.model)
    job = dict(jobs_lib.base_values(cfg, out_dir, placement.replicas), **{
        'launch.kill': f'{kill_step}:{jobs_lib.VICTIM}:KILL:snapshot',
        'launch.return_after_steps': return_after, 'launch.compile_ahead': False}, **values)
    saved = os.environ.get(LAYERS_VARIABLE)
    os.environ[LAYERS_VARIABLE] = ','.join(layers)
    try:
        with SimulatedCluster(nodes):
            workdir = os.path.join(out_dir, 'memory')
            if ahead:
                jobs_lib.compile_ahead(cfg, job, workdir, workers, log)
            summary = jobs_lib.run_job(cfg, job, workdir, workers, log)
    finally:
        if saved is None:
            os.environ.pop(LAYERS_VARIABLE, None)
        else:
            os.environ[LAYERS_VARIABLE] = saved
    return {'failure': jobs_lib.job_recovery(summary), 'rejoin': jobs_lib.job_recovery(summary, 'rejoin')}


def run(cfg, out_dir: str, *, repeats: int, workers: int, nodes: int, kill_step: int,
        return_after: int, variants=tuple(VARIANTS), log=print) -> dict:
    """The `variants` `repeats` times each, interleaved; the rows and the table's figures."""
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or 'all' not in variants:
        raise ValueError(f'--variants: {unknown or variants} must name variants of {list(VARIANTS)}, '
                         "'all' among them (every layer's saving is measured against it).")
    names = [name for name in VARIANTS if name in variants]
    rows = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            log(f'[cache layers] repeat {r}, {name}')
            rows[name].append(run_variant(cfg, name, os.path.join(out_dir, f'r{r}_{name}'),
                                          workers=workers, nodes=nodes, kill_step=kill_step,
                                          return_after=return_after, log=log))
    return {'variants': {name: {'values': VARIANTS[name][0], 'layers': list(VARIANTS[name][1]),
                                'compile_ahead': VARIANTS[name][2], 'runs': runs}
                         for name, runs in rows.items()},
            'table': table(rows)}


def table(rows: dict) -> dict:
    """Per variant, the failure's and the rejoin's median recovery; per layer whose variant ran,
    what leaving it out adds to each recovery and its share of the longer one."""
    kinds = ('failure', 'rejoin')
    med = {name: {kind: statistics.median(run[kind]['recovery_sec'] for run in runs) for kind in kinds}
           for name, runs in rows.items()}
    left_out = dict(PRICED, none='every_cache')
    layers = {}
    for name, layer in left_out.items():
        if name in med:
            layers[layer] = {kind: {'recovery_without_sec': med[name][kind],
                                    'saves_sec': med[name][kind] - med['all'][kind],
                                    'share': (med[name][kind] - med['all'][kind]) / med[name][kind]}
                             for kind in kinds}
    return {'median_recovery_sec': med, 'repeats': {name: len(runs) for name, runs in rows.items()},
            'layers': layers}
