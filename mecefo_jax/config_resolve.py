"""A ConfigDict resolved into the typed, frozen `Config`, checked once per process.

`configs/*.py` build an `ml_collections.ConfigDict` on `mecefo_jax.config.base_config`
(the one place defaults live), and command lines override it with
`--config.section.field=value`. Every entry point then calls `resolve` once,
before any process, device or file is touched: each field gets its declared
type (`mecefo_jax/config/schema.py`) and is checked (`mecefo_jax/config_rules.py`),
and an error names the field and the fix. The code reads only the result,
with the same paths (`cfg.train.steps`, `cfg.model.d_model`), and never
re-supplies defaults or casts.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from typing import Any

from mecefo_jax.config.schema import SECTIONS, Config, ConfigError
from mecefo_jax.config_rules import check

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
                          'defined (and commented) in mecefo_jax/config/defaults.py base_config.')
    if missing:
        raise ConfigError(f'{name}.{missing[0]}: missing; build configs on '
                          'mecefo_jax.config.base_config(), which defines every field.')
    return cls(**{field: _typed(f'{name}.{field}', kind, values[field])
                  for field, kind in declared.items()})


def updated(cfg: Config, changes: Mapping[str, Any]) -> Config:
    """A validated copy of `cfg` with `{'section.field': value}` changed (experiments' variants)."""
    values = cfg.to_dict()
    for dotted, value in changes.items():
        section, _, name = dotted.partition('.')
        if section not in values or name not in values[section]:
            raise ConfigError(f'{dotted}: no such config field; the fields are those of '
                              'mecefo_jax/config/defaults.py.')
        values[section][name] = value
    return resolve(values)


def resolve(config: Any) -> Config:
    """The typed, validated Config of a ConfigDict (or a nested dict of sections)."""
    given = set(config.keys())
    unknown = sorted(given - set(SECTIONS))
    if unknown:
        raise ConfigError(f'{unknown[0]}: no such config section; sections are '
                          f'{", ".join(SECTIONS)} (mecefo_jax/config/defaults.py).')
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
