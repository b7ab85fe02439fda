"""Config files and `--config.a.b=value` overrides for scripts, without ml_collections.

`python -m mecefo_jax.main` parses its config with `ml_collections.config_flags`.
The benchmark scripts (`scripts/bench_step.py`, `scripts/memory_plan.py`)
must run with only jax, flax, optax, orbax-checkpoint and numpy installed, so
they go through this module instead:

  * `load_config(path)` imports a `configs/*.py` file and calls its
    `get_config()`, then locks the result (no new fields);
  * `apply_override(cfg, 'model.d_model', '256')` sets an existing field,
    coercing the text to the field's current type, as config_flags does;
  * `parse(parser, argv)` runs an argparse parser that has a `--config`
    option, collects every `--config.a.b=value` (or `--config.a.b value`)
    argument in order, and returns `(args, cfg)` with the overrides applied.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import os
from typing import Any, Sequence

_TRUE = ('true', 't', 'yes', 'y', '1')
_FALSE = ('false', 'f', 'no', 'n', '0')
PREFIX = '--config.'


def load_config(path: str):
    """`get_config()` of the Python file at `path`, locked against new fields."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f'--config={path}: no such file; pass a configs/*.py path.')
    name = '_mecefo_config_' + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, 'get_config'):
        raise ValueError(f'--config={path} defines no get_config() function.')
    cfg = module.get_config()
    cfg.lock()
    return cfg


def coerce(field: str, current: Any, text: str) -> Any:
    """`text` as a value of `current`'s type; ValueError naming `field` otherwise."""
    kind = type(current)
    try:
        if isinstance(current, bool):
            low = text.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(text)
        if isinstance(current, int):
            return int(text)
        if isinstance(current, float):
            return float(text)
        if isinstance(current, str):
            return text
        if current is None or isinstance(current, (tuple, list, dict)):
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                if current is None:
                    return text  # a None field takes a plain string as it is
                raise
            if current is not None and not isinstance(value, kind):
                raise ValueError(text)
            return value
    except ValueError:
        raise ValueError(f'--config.{field}={text!r}: {field} is of type {kind.__name__} '
                         f'(currently {current!r}) and {text!r} is not one.') from None
    raise ValueError(f'--config.{field}: cannot override a field of type {kind.__name__}.')


def apply_override(cfg, dotted: str, text: str) -> None:
    """Set the existing field `dotted` ('section.field') of `cfg` from `text`."""
    *sections, field = dotted.split('.')
    node, walked = cfg, []
    for section in sections:
        walked.append(section)
        if section not in node:
            raise ValueError(f'--config.{dotted}: no section {".".join(walked)!r}; '
                             f'have {sorted(node.keys())}.')
        node = node[section]
    if not field or field not in node:
        where = '.'.join(sections) or 'the config'
        raise ValueError(f'--config.{dotted}: {where} has no field {field!r}; '
                         f'fields are {sorted(node.keys())}.')
    current = node[field]
    if hasattr(current, 'keys'):
        raise ValueError(f'--config.{dotted} is a section; override its fields instead, '
                         f'e.g. --config.{dotted}.{sorted(current.keys())[0]}=...')
    node[field] = coerce(dotted, current, text)


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """(other arguments, [(dotted field, text), ...]) from a command line."""
    rest, overrides = [], []
    argv = list(argv)
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith(PREFIX):
            body = arg[len(PREFIX):]
            if '=' in body:
                dotted, text = body.split('=', 1)
            elif i + 1 < len(argv):
                dotted, text = body, argv[i + 1]
                i += 1
            else:
                raise ValueError(f'{arg} needs a value: {arg}=VALUE.')
            overrides.append((dotted, text))
        else:
            rest.append(arg)
        i += 1
    return rest, overrides


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None):
    """(parsed args, config with overrides applied); `parser` must define --config."""
    import sys
    argv = sys.argv[1:] if argv is None else argv
    rest, overrides = split_overrides(argv)
    args = parser.parse_args(rest)
    cfg = load_config(args.config)
    for dotted, text in overrides:
        try:
            apply_override(cfg, dotted, text)
        except ValueError as error:
            parser.error(str(error))
    return args, cfg
