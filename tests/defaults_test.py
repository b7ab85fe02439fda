"""Defaults live in one place: `mecefo_jax/config/defaults.py`.

A dataclass elsewhere that gives a config field a default can drift from the
config's (a model config class once repeated eight of them). This test imports every
library module and holds each dataclass field named as a config field to
having no default.
"""
import dataclasses
import importlib
import pkgutil

import mecefo_jax
from mecefo_jax.config import base_config

# Modules that import optional engines at import time, or run on import.
SKIPPED = ('mecefo_jax.launch.__main__',)


def _library_modules():
    for info in pkgutil.walk_packages(mecefo_jax.__path__, 'mecefo_jax.'):
        if info.name not in SKIPPED:
            yield importlib.import_module(info.name)


def _config_fields() -> set[tuple[str, str]]:
    cfg = base_config()
    return {(section, field) for section in cfg for field in cfg[section]}


def _dataclasses_of(module):
    for value in vars(module).values():
        if dataclasses.is_dataclass(value) and isinstance(value, type) and value.__module__ == module.__name__:
            yield value


def test_no_dataclass_outside_the_config_defaults_a_config_field():
    fields = _config_fields()
    names = {field for _, field in fields}
    offenders = []
    for module in _library_modules():
        if module.__name__ == 'mecefo_jax.config.defaults':
            continue  # the declaration itself
        for cls in _dataclasses_of(module):
            for f in dataclasses.fields(cls):
                has_default = (f.default is not dataclasses.MISSING
                               or f.default_factory is not dataclasses.MISSING)
                if has_default and f.name in names:
                    offenders.append(f'{module.__name__}.{cls.__name__}.{f.name}')
    assert offenders == [], (
        f'{offenders}: these dataclass fields repeat a config default; take the value from '
        'the resolved config and set defaults only in mecefo_jax/config/defaults.py')


def test_the_check_sees_a_repeated_default():
    """The scan above must fail on the pattern it forbids (a field named as a config field)."""
    @dataclasses.dataclass
    class Repeats:
        rank: float = 0.25

    names = {field for _, field in _config_fields()}
    repeated = [f.name for f in dataclasses.fields(Repeats)
                if f.default is not dataclasses.MISSING and f.name in names]
    assert repeated == ['rank']


def test_no_default_constant_outside_the_config_defaults():
    """A named default (`DEFAULT_*`) for a config field sits in config/defaults.py, below its readers."""
    from mecefo_jax.config import defaults
    config_defaults = {name for name in vars(defaults) if name.startswith('DEFAULT_')}
    for module in _library_modules():
        if module is defaults:
            continue
        own = {name for name, value in vars(module).items()
               if name.startswith('DEFAULT_') and getattr(defaults, name, None) is not value}
        assert not own & config_defaults, (module.__name__, own & config_defaults)
