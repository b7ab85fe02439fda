"""What each config field may hold, checked once when the config is resolved.

Every rule names the field, what it must be, and a value that fixes it, so a
bad command line fails before any process, device or file is touched. Rules
that need the run's devices or workers (the mesh against the devices found,
`launch.kill` against the worker count) stay where those are known, and so
do the data source's own needs (`data.data_dir` for TFDS, `data.text_files`):
the LLaMA configs name C4 yet their benchmarks read no data.
"""
from __future__ import annotations

from typing import Any

from mecefo_jax.config.schema import PROJECTION_RULES, Config, ConfigError

ATTENTION_IMPLEMENTATIONS = ('auto', 'xla', 'cudnn')
DTYPES = ('float32', 'bfloat16')
DATA_SOURCES = ('embedded', 'python_docs', 'tfds', 'text')
PARITY_CODES = ('', 'xor')
RECOVERIES = ('memory', 'disk')
TIME_MODELS = ('steps', 'wall_clock')


def _require(ok: bool, dotted: str, value: Any, rule: str, fix: Any) -> None:
    if not ok:
        raise ConfigError(f'{dotted}={value!r}: {rule}; set --config.{dotted}={fix}.')


def _at_least(section: Any, prefix: str, bound: int | float, fixes: dict[str, Any]) -> None:
    for name, fix in fixes.items():
        value = getattr(section, name)
        _require(value >= bound, f'{prefix}.{name}', value, f'must be >= {bound}', fix)


def _one_of(dotted: str, value: str, allowed, fix: str | None = None) -> None:
    allowed = tuple(allowed)
    shown = ', '.join(repr(a) for a in allowed)
    _require(value in allowed, dotted, value, f'must be one of {shown}', fix or allowed[0])


def _check_model(cfg: Config) -> None:
    from mecefo_jax.model.llama import REMAT_POLICIES
    m = cfg.model
    _at_least(m, 'model', 1, {'vocab_size': 512, 'd_model': 64, 'num_layers': 2,
                              'num_heads': 4, 'num_kv_heads': 4, 'ffn_hidden': 172})
    _require(m.rope_theta > 0, 'model.rope_theta', m.rope_theta, 'must be > 0', 10000.0)
    _require(m.norm_eps > 0, 'model.norm_eps', m.norm_eps, 'must be > 0', 1e-6)
    _one_of('model.dtype', m.dtype, DTYPES)
    _one_of('model.attention', m.attention, ATTENTION_IMPLEMENTATIONS)
    _one_of('model.remat_policy', m.remat_policy, REMAT_POLICIES)
    _require(m.d_model % m.num_heads == 0, 'model.num_heads', m.num_heads,
             f'must divide model.d_model={m.d_model}', 'a divisor of d_model')
    _require(m.num_heads % m.num_kv_heads == 0, 'model.num_kv_heads', m.num_kv_heads,
             f'must divide model.num_heads={m.num_heads}', m.num_heads)


def _check_data(cfg: Config) -> None:
    d = cfg.data
    _one_of('data.source', d.source, DATA_SOURCES)
    _at_least(d, 'data', 1, {'seq_len': 64, 'global_batch_size': 16})
    _require(bool(d.cache_dir), 'data.cache_dir', d.cache_dir, 'must name a directory',
             '~/.cache/mecefo_jax')
    _require(0.0 <= d.val_fraction < 1.0, 'data.val_fraction', d.val_fraction,
             'must be in [0, 1): the fraction of documents held out for validation', 0.05)
    field = 'mesh.replicas' if cfg.mesh.replicas else 'mesh.data'
    replicas = cfg.mesh.replicas or cfg.mesh.data
    _require(replicas < 1 or d.global_batch_size % replicas == 0, 'data.global_batch_size',
             d.global_batch_size, f'must be a multiple of {field}={replicas}',
             max(replicas, d.global_batch_size // max(replicas, 1) * replicas))


def _check_mesh(cfg: Config) -> None:
    m = cfg.mesh
    _require(m.data == -1 or m.data >= 1, 'mesh.data', m.data,
             'must be -1 (every device left over by mesh.model) or >= 1', -1)
    _at_least(m, 'mesh', 1, {'model': 1, 'num_cpu_devices': 8})
    _require(m.replicas >= 0, 'mesh.replicas', m.replicas,
             'must be >= 0 (0: one replica per data row of the mesh)', 0)


def _check_train(cfg: Config) -> None:
    t = cfg.train
    _at_least(t, 'train', 1, {'steps': 200, 'log_every': 10, 'eval_batches': 4,
                              'keep_checkpoints': 2})
    _at_least(t, 'train', 0, {'lr_schedule_steps': 0, 'eval_every': 0, 'checkpoint_every': 0,
                              'weight_decay': 0.01, 'grad_clip': 1.0, 'final_lr_fraction': 0.1})
    _require(t.learning_rate > 0, 'train.learning_rate', t.learning_rate, 'must be > 0', 3e-3)
    _require(0.0 <= t.warmup_fraction <= 1.0, 'train.warmup_fraction', t.warmup_fraction,
             'must be in [0, 1]', 0.1)
    for name, fix in (('b1', 0.9), ('b2', 0.999)):
        value = getattr(t, name)
        _require(0.0 <= value < 1.0, f'train.{name}', value, 'must be in [0, 1)', fix)
    _require(t.eps > 0, 'train.eps', t.eps, 'must be > 0', 1e-8)
    _one_of('train.flat_optimizer', t.flat_optimizer, (False, True))
    _require(not t.flat_optimizer or cfg.mesh.model == 1, 'train.flat_optimizer', t.flat_optimizer,
             f'needs mesh.model=1 (one flat vector cannot follow the tensor-parallel split of '
             f'mesh.model={cfg.mesh.model})', False)


def _check_mecefo(cfg: Config) -> None:
    m = cfg.mecefo
    _require(m.tau >= 1, 'mecefo.tau', m.tau,
             'must be >= 1 (steps between SVD refreshes)', 100)
    _require(m.rank > 0 and (m.rank <= 1.0 or m.rank.is_integer()), 'mecefo.rank', m.rank,
             'must be a fraction in (0, 1] or a whole rank >= 1', 0.25)
    _one_of('mecefo.projection', m.projection, PROJECTION_RULES)
    _one_of('mecefo.skip_attention', m.skip_attention, (True, False))
    _one_of('train.ordered_reduction', cfg.train.ordered_reduction, (True, False))
    _require(0.0 <= m.neighbour_weight <= 1.0, 'mecefo.neighbour_weight', m.neighbour_weight,
             "must be in [0, 1] (1: the paper's rule, 0: the row counts as dropped)", 1.0)
    _require(0 <= m.attention_top_blocks <= cfg.model.num_layers, 'mecefo.attention_top_blocks',
             m.attention_top_blocks, f'must be in [0, model.num_layers={cfg.model.num_layers}] '
             '(0: every block skips it)', 0)
    _require(0 <= m.trust_top_blocks <= cfg.model.num_layers, 'mecefo.trust_top_blocks',
             m.trust_top_blocks, f'must be in [0, model.num_layers={cfg.model.num_layers}] '
             '(0: every block)', 0)
    _one_of('mecefo.refresh', m.refresh, ('subspace', 'svd'))
    _require(m.refresh_iters >= 1, 'mecefo.refresh_iters', m.refresh_iters, 'must be >= 1', 3)
    _require(m.refresh_split_min_elements >= 0, 'mecefo.refresh_split_min_elements',
             m.refresh_split_min_elements, 'must be >= 0 (0 splits every kernel)', 262144)


def _check_events(cfg: Config) -> None:
    """`fault.events` syntax, steps inside the run, no overlaps; replicas too once known."""
    from mecefo_jax.faults.schedule import parse_events, validate_events
    try:
        events = parse_events(cfg.fault.events)
        if events:
            # With mesh.data=-1 the replica count waits for the devices (the controller).
            replicas = (cfg.mesh.replicas or (cfg.mesh.data if cfg.mesh.data >= 1
                        else max(1, max(e.replica for e in events) + 1)))
            validate_events(events, num_replicas=replicas, total_steps=cfg.train.steps)
    except ValueError as error:
        raise ConfigError(f'{error} Set --config.fault.events=STEP:REPLICA:STEPS,...') from None


def _check_fault(cfg: Config) -> None:
    from mecefo_jax.faults.strategies import CONTROLS, STRATEGIES
    f = cfg.fault
    _require(f.strategy != 'mecefo_spread', 'fault.strategy', f.strategy,
             'was retired: mecefo_planned splits each failed shard over the helpers a fixed '
             'k would pick, or better ones', 'mecefo_planned')
    _one_of('fault.strategy', f.strategy, STRATEGIES + CONTROLS)
    _check_events(cfg)
    from mecefo_jax.faults.schedule import REGIMES
    _one_of('fault.regime', f.regime.strip().lower(), ('',) + tuple(sorted(REGIMES)), "''")
    _at_least(f, 'fault', 0, {'regime_replicas': 0, 'max_concurrent': 0,
                              'max_neighbour_rows': 0, 'mtbf_hours': 0.0,
                              'mttr_hours': 0.0, 'relaunch_delay_sec': 120.0})
    _require((f.mtbf_hours > 0) == (f.mttr_hours > 0), 'fault.mttr_hours', f.mttr_hours,
             f'must be > 0 exactly when fault.mtbf_hours={f.mtbf_hours} is (a custom failure '
             'process needs both; both 0 means none)', 'HOURS (or mtbf_hours=0)')
    _require(f.step_time_sec > 0, 'fault.step_time_sec', f.step_time_sec,
             'must be > 0 (cluster seconds per step)', 60.0)
    _at_least(f, 'fault', 1, {'checkpoint_every': 10})
    _one_of('fault.time_model', f.time_model, TIME_MODELS)
    _require(0.0 <= f.allreduce_exposed < 1.0, 'fault.allreduce_exposed', f.allreduce_exposed,
             'must be in [0, 1): the exposed share of the all-reduce in a fault-free step', 0.0)
    _require(f.time_model == 'wall_clock' or f.allreduce_exposed == 0.0, 'fault.allreduce_exposed',
             f.allreduce_exposed, "prices steps on the wall clock only: set fault.time_model='wall_clock'",
             0.0)
    _require(f.max_neighbour_rows == 0 or f.strategy == 'mecefo_planned',
             'fault.max_neighbour_rows', f.max_neighbour_rows,
             f'caps the plans of fault.strategy=mecefo_planned only, not {f.strategy!r}', 0)


def _check_snapshot(cfg: Config) -> None:
    s = cfg.snapshot
    if s.every != 'auto':
        _require(s.every >= 0, 'snapshot.every', s.every,
                 "must be 'auto', 0 (off) or a number of steps >= 1", "'auto'")
    _require(s.overhead_budget_pct > 0, 'snapshot.overhead_budget_pct', s.overhead_budget_pct,
             'must be a percentage > 0', 2)
    _at_least(s, 'snapshot', 2, {'slots': 3, 'parity_group': 4})
    _one_of('snapshot.parity', s.parity, PARITY_CODES, "''")
    _one_of('snapshot.shard', s.shard, (True, False))


def _check_launch(cfg: Config) -> None:
    la = cfg.launch
    _at_least(la, 'launch', 1, {'local_devices': 2})
    _at_least(la, 'launch', 0, {'return_after_steps': 0, 'max_relaunches': 8})
    for name, fix in (('heartbeat_timeout_sec', 20.0), ('start_timeout_sec', 1800.0),
                      ('stall_timeout_sec', 600.0), ('stop_timeout_sec', 300.0)):
        value = getattr(la, name)
        _require(value > 0, f'launch.{name}', value, 'must be > 0 seconds', fix)
    _one_of('launch.recovery', la.recovery, RECOVERIES)
    _at_least(la, 'launch', 32, {'object_store_mb': 256})


def check(cfg: Config) -> None:
    """Raises ConfigError naming the first bad field of `cfg` and how to fix it."""
    for rules in (_check_model, _check_mesh, _check_data, _check_train, _check_mecefo,
                  _check_fault, _check_snapshot, _check_launch):
        rules(cfg)
