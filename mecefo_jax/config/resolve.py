"""A ConfigDict (or nested dict) resolved into the typed, checked `Config`, once per process.

`configs/*.py` build an ml_collections ConfigDict on `base_config()`, and command
lines override it with `--config.section.field=value`. Every entry point calls
`resolve` (or `start`, for command lines) once, before any process, device or file
is touched: each field gets its declared type and is checked against its rules
(`defaults.py`), and an error names the field and the fix. The code reads only the
result, with the same paths (`cfg.train.steps`), and a launcher hands its workers
that same object.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from mecefo_jax.config.defaults import SECTIONS, Config, ConfigError, check

_KINDS = {'int': int, 'float': float, 'bool': bool, 'str': str}
_KIND_NAMES = {int: 'an int', float: 'a number', bool: 'true or false', str: 'a string'}


def _typed(dotted: str, annotation: str, value: Any) -> Any:
    """`value` as the field's declared type; ConfigError naming the field otherwise.

    An int is a valid float (ml_collections widens it too); a bool is not an
    int; numpy integers (experiments' seed loops) become ints.
    """
    if annotation == 'int | str':  # a step count or 'auto'
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


def _named_exactly(given, declared, what: str, where: str) -> None:
    """ConfigError naming the first unknown or missing name of `given` against `declared`."""
    unknown, missing = sorted(set(given) - set(declared)), sorted(set(declared) - set(given))
    if unknown:
        raise ConfigError(f'{where}{unknown[0]}: no such config {what}; every {what} is defined '
                          '(and explained) in mecefo_jax/config/defaults.py.')
    if missing:
        raise ConfigError(f'{where}{missing[0]}: missing; build configs on '
                          'mecefo_jax.config.base_config(), which defines every field.')


def _section(name: str, values: Any):
    cls = SECTIONS[name]
    declared = {f.name: f.type for f in dataclasses.fields(cls)}
    _named_exactly(values.keys(), declared, 'field', f'{name}.')
    return cls(**{field: _typed(f'{name}.{field}', kind, values[field])
                  for field, kind in declared.items()})


def resolve(config: Any) -> Config:
    """The typed, checked Config of a ConfigDict (or a nested dict of sections)."""
    _named_exactly(config.keys(), SECTIONS, 'section', '')
    cfg = Config(**{name: _section(name, config[name]) for name in SECTIONS})
    check(cfg)
    return cfg


def updated(cfg: Config, changes: Mapping[str, Any]) -> Config:
    """A checked copy of `cfg` with `{'section.field': value}` changed (experiments' variants)."""
    values = cfg.to_dict()
    for dotted, value in changes.items():
        section, _, name = dotted.partition('.')
        if section not in values or name not in values[section]:
            raise ConfigError(f'{dotted}: no such config field; the fields are those of '
                              'mecefo_jax/config/defaults.py.')
        values[section][name] = value
    return resolve(values)


def resolve_or_exit(config: Any) -> Config:
    """`resolve` for command lines: a bad field ends the process with its message last."""
    try:
        return resolve(config)
    except ConfigError as error:
        sys.exit(f'config error: {error}')


def start(config: Any, *, cpu_devices: Callable[[Config], int] | None = None) -> Config:
    """What every command line does first, before jax starts: the config resolved (or the
    process ended naming the field), absl's INFO logs quieted (Orbax logs every save), and
    fake CPU devices asked for (`cpu_devices(cfg)`, else mesh.num_cpu_devices; backends start
    lazily, so this holds while jax is imported but unused; GPUs are used as they are)."""
    from absl import logging
    cfg = resolve_or_exit(config)
    logging.set_verbosity(logging.WARNING)
    simulate_cpu_devices(cpu_devices(cfg) if cpu_devices else cfg.mesh.num_cpu_devices)
    return cfg


def simulate_cpu_devices(count: int) -> None:
    """Ask XLA for `count` fake CPU devices; effective only before jax starts a backend.

    Fake devices run side by side in threads, and each one's LAPACK call into a
    multi-threaded OpenBLAS oversubscribes the cores (a refresh at 32 fake devices on 2
    cores took minutes instead of milliseconds). So BLAS gets one thread per call unless
    OPENBLAS_NUM_THREADS is set, which also keeps results bit-identical between a
    launcher's worker and one process.
    """
    flags = os.environ.get('XLA_FLAGS', '')
    if 'xla_force_host_platform_device_count' not in flags:
        os.environ['XLA_FLAGS'] = f'{flags} --xla_force_host_platform_device_count={count}'.strip()
    os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')
