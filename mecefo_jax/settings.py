"""The config as typed, frozen sections, resolved and validated once per process.

`configs/*.py` build an `ml_collections.ConfigDict` on `mecefo_jax.config.base_config`
(the one place defaults live), and command lines override it with
`--config.section.field=value`. Every entry point then calls `resolve` once,
before any process, device or file is touched: each field gets its declared
type and is checked, and an error names the field and the fix. The code
reads only the result, with the same paths (`cfg.train.steps`,
`cfg.model.d_model`), and never re-supplies defaults or casts.

The field rules live in `mecefo_jax/config_rules.py`.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from typing import Any

from mecefo_jax.config_rules import ConfigError, check

# A field that is a count of steps or 'auto' (snapshot.every).
IntOrAuto = int | str


@dataclasses.dataclass(frozen=True)
class ModelSection:
    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden: int
    rope_theta: float
    norm_eps: float
    dtype: str
    attention: str
    scan_layers: bool
    remat_policy: str
    loss_chunk_tokens: int


@dataclasses.dataclass(frozen=True)
class DataSection:
    source: str
    tfds_name: str
    data_dir: str
    tfds_text_key: str
    text_files: str
    tokenizer_path: str
    cache_dir: str
    seq_len: int
    global_batch_size: int
    val_fraction: float
    seed: int


@dataclasses.dataclass(frozen=True)
class MeshSection:
    data: int
    model: int
    num_cpu_devices: int


@dataclasses.dataclass(frozen=True)
class TrainSection:
    steps: int
    lr_schedule_steps: int
    learning_rate: float
    warmup_fraction: float
    final_lr_fraction: float
    b1: float
    b2: float
    eps: float
    weight_decay: float
    grad_clip: float
    seed: int
    log_every: int
    eval_every: int
    eval_batches: int
    checkpoint_every: int
    keep_checkpoints: int


@dataclasses.dataclass(frozen=True)
class MecefoSection:
    rank: float  # an integral value > 1 is an absolute rank (see projections.resolve_rank)
    tau: int
    refresh: str
    refresh_iters: int
    refresh_split_min_elements: int
    remat_ffn: bool


@dataclasses.dataclass(frozen=True)
class FaultSection:
    strategy: str
    events: str
    regime: str
    regime_replicas: int
    mtbf_hours: float
    mttr_hours: float
    step_time_sec: float
    seed: int
    max_concurrent: int
    max_neighbour_rows: int
    checkpoint_every: int
    relaunch_delay_sec: float


@dataclasses.dataclass(frozen=True)
class SnapshotSection:
    every: IntOrAuto
    overhead_budget_pct: float
    slots: int
    parity: str
    parity_group: int


@dataclasses.dataclass(frozen=True)
class LaunchSection:
    local_devices: int
    heartbeat_timeout_sec: float
    start_timeout_sec: float
    stall_timeout_sec: float
    stop_timeout_sec: float
    kill: str
    return_after_steps: int
    recovery: str
    max_relaunches: int
    compilation_cache: str
    compile_ahead: bool
    standby_workers: bool
    object_store_mb: int
    accept_node_loss: bool


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole run's config: one frozen section per `base_config` section, same field order.

    What each field means is commented once, in mecefo_jax/config.py.
    """
    model: ModelSection
    data: DataSection
    mesh: MeshSection
    train: TrainSection
    mecefo: MecefoSection
    fault: FaultSection
    snapshot: SnapshotSection
    launch: LaunchSection

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """What `ConfigDict.to_json_best_effort(indent=2)` gives: the workdir's config.json."""
        return json.dumps(self.to_dict(), indent=2)

    def updated(self, changes: Mapping[str, Any]) -> Config:
        """A validated copy with `{'section.field': value}` changed (experiments' variants)."""
        values = self.to_dict()
        for dotted, value in changes.items():
            section, _, name = dotted.partition('.')
            if section not in values or name not in values[section]:
                raise ConfigError(f'{dotted}: no such config field; the fields are those of '
                                  'mecefo_jax/config.py.')
            values[section][name] = value
        return resolve(values)


SECTIONS: dict[str, type] = {'model': ModelSection, 'data': DataSection, 'mesh': MeshSection,
                             'train': TrainSection, 'mecefo': MecefoSection, 'fault': FaultSection,
                             'snapshot': SnapshotSection, 'launch': LaunchSection}
_KINDS = {'int': int, 'float': float, 'bool': bool, 'str': str}
_KIND_NAMES = {int: 'an int', float: 'a number', bool: 'true or false', str: 'a string'}


def _typed(dotted: str, annotation: str, value: Any) -> Any:
    """`value` as the field's declared type; ConfigError naming the field otherwise.

    An int is a valid float (ml_collections widens it too); a bool is not an
    int; numpy integers (experiments' seed loops) become ints.
    """
    if annotation == 'IntOrAuto':
        if value == 'auto':
            return value
        if isinstance(value, str) and value.strip().lstrip('-').isdigit():
            value = int(value)
        annotation = 'int'
    kind = _KINDS[annotation]
    is_bool = isinstance(value, bool)
    if kind is bool:
        ok = is_bool
    elif kind is float:
        ok = isinstance(value, (int, float)) and not is_bool
        value = float(value) if ok else value
    elif kind is int:
        ok = hasattr(value, '__index__') and not is_bool
        value = int(value.__index__()) if ok else value
    else:
        ok = isinstance(value, str)
    if not ok:
        raise ConfigError(f'{dotted}={value!r}: must be {_KIND_NAMES[kind]}; '
                          f'set --config.{dotted}=VALUE.')
    return value


def _section(name: str, values: Any) -> Any:
    cls = SECTIONS[name]
    declared = {f.name: f.type for f in dataclasses.fields(cls)}
    given = set(values.keys())
    missing, unknown = sorted(set(declared) - given), sorted(given - set(declared))
    if unknown:
        raise ConfigError(f'{name}.{unknown[0]}: no such config field; every field is '
                          'defined (and commented) in mecefo_jax/config.py base_config.')
    if missing:
        raise ConfigError(f'{name}.{missing[0]}: missing; build configs on '
                          'mecefo_jax.config.base_config(), which defines every field.')
    return cls(**{field: _typed(f'{name}.{field}', kind, values[field])
                  for field, kind in declared.items()})


def resolve(config: Any) -> Config:
    """The typed, validated Config of a ConfigDict (or a nested dict of sections)."""
    given = set(config.keys())
    unknown = sorted(given - set(SECTIONS))
    if unknown:
        raise ConfigError(f'{unknown[0]}: no such config section; sections are '
                          f'{", ".join(SECTIONS)} (mecefo_jax/config.py).')
    missing = sorted(set(SECTIONS) - given)
    if missing:
        raise ConfigError(f'{missing[0]}: section missing; build configs on '
                          'mecefo_jax.config.base_config().')
    cfg = Config(**{name: _section(name, config[name]) for name in SECTIONS})
    check(cfg)
    return cfg


def load_json(path: str) -> Config:
    """The Config written by `Config.to_json` to a file (a workdir's config.json)."""
    with open(path) as f:
        return loads_json(f.read())


def loads_json(text: str) -> Config:
    """The Config of `Config.to_json`'s text (what the launcher hands its workers)."""
    return resolve(json.loads(text))


def resolve_or_exit(config: Any) -> Config:
    """`resolve` for command lines: a bad field ends the process with its message last."""
    try:
        return resolve(config)
    except ConfigError as error:
        sys.exit(f'config error: {error}')
