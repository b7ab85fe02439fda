"""`ConfigDict`: ml_collections' when it is installed, else a minimal stand-in.

The benchmark and memory-plan scripts must run with only jax, flax, optax,
orbax-checkpoint and numpy installed, yet every `configs/*.py` builds its
config through `mecefo_jax.config`. This module owns the fallback those
imports get when `ml_collections` is not importable: a small class with the
parts of `ml_collections.ConfigDict` the project relies on

  * attribute and item access, `get`, `keys`/`items`/`values`, `in`;
  * nested dicts turned into ConfigDicts;
  * type safety on override, as ml_collections does it: a field keeps its
    type (an int may be assigned to a float field and becomes a float; a
    field holding None takes anything);
  * `lock()` / `unlock()` / `unlocked()`: a locked config rejects new fields,
    so a misspelt override fails loudly instead of adding a field;
  * `copy.deepcopy`, `to_dict` and `to_json_best_effort`.

Training (`python -m mecefo_jax.main`) still uses ml_collections through
`config_flags`; nothing here changes that path.
"""
from __future__ import annotations

import contextlib
import copy
import json
from typing import Any, Iterator

try:  # the real thing whenever it is there
    import ml_collections
except ImportError:  # exercised by tests/cli_test.py and the blocked-import bench test
    ml_collections = None
HAVE_ML_COLLECTIONS = ml_collections is not None


class MinimalConfigDict:
    """A nested, type-safe, lockable attribute dict (see the module docstring)."""

    def __init__(self, initial: dict | None = None):
        object.__setattr__(self, '_fields', {})
        object.__setattr__(self, '_locked', False)
        for key, value in (initial or {}).items():
            self[key] = value

    # -- access
    def __getattr__(self, name: str) -> Any:
        if name.startswith('__'):  # keep copy/pickle protocols off the fields
            raise AttributeError(name)
        fields = object.__getattribute__(self, '_fields')
        if name not in fields:
            raise AttributeError(f'{name!r} is not a field; fields: {sorted(fields)}')
        return fields[name]

    def __getitem__(self, key: str) -> Any:
        if key not in self._fields:
            raise KeyError(f'{key!r} is not a field; fields: {sorted(self._fields)}')
        return self._fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._fields.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._fields

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def keys(self):
        return self._fields.keys()

    def values(self):
        return self._fields.values()

    def items(self):
        return self._fields.items()

    # -- assignment
    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __setitem__(self, key: str, value: Any) -> None:
        if isinstance(value, dict):
            value = MinimalConfigDict(value)
        fields = self._fields
        if key not in fields:
            if self._locked:
                raise AttributeError(
                    f'Key {key!r} does not exist and cannot be added since the config is '
                    f'locked; fields: {sorted(fields)}')
            fields[key] = value
            return
        fields[key] = _same_type(key, fields[key], value)

    def __delattr__(self, name: str) -> None:
        if self._locked:
            raise AttributeError(f'cannot delete {name!r}: the config is locked')
        del self._fields[name]

    # -- locking
    def lock(self) -> 'MinimalConfigDict':
        object.__setattr__(self, '_locked', True)
        for value in self._fields.values():
            if isinstance(value, MinimalConfigDict):
                value.lock()
        return self

    def unlock(self) -> 'MinimalConfigDict':
        object.__setattr__(self, '_locked', False)
        for value in self._fields.values():
            if isinstance(value, MinimalConfigDict):
                value.unlock()
        return self

    @property
    def is_locked(self) -> bool:
        return self._locked

    @contextlib.contextmanager
    def unlocked(self):
        was_locked = self._locked
        self.unlock()
        try:
            yield self
        finally:
            if was_locked:
                self.lock()

    # -- copies and serialisation
    def __deepcopy__(self, memo) -> 'MinimalConfigDict':
        new = MinimalConfigDict()
        memo[id(self)] = new
        for key, value in self._fields.items():
            new._fields[key] = copy.deepcopy(value, memo)
        if self._locked:
            new.lock()
        return new

    def to_dict(self) -> dict:
        return {k: v.to_dict() if isinstance(v, MinimalConfigDict) else v
                for k, v in self._fields.items()}

    def to_json_best_effort(self, **kwargs) -> str:
        """JSON of the fields; values JSON cannot encode are written as their repr."""
        return json.dumps(self.to_dict(), default=repr, **kwargs)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MinimalConfigDict):
            return self.to_dict() == other.to_dict()
        return NotImplemented

    def __repr__(self) -> str:
        return f'MinimalConfigDict({self.to_dict()!r})'


def _same_type(key: str, old: Any, new: Any) -> Any:
    """`new` for field `key`, made to keep the field's type as ml_collections does."""
    if old is None or new is None or isinstance(old, MinimalConfigDict):
        return new
    if isinstance(old, float) and isinstance(new, int) and not isinstance(new, bool):
        return float(new)  # ml_collections widens ints assigned to float fields
    if type(new) is not type(old):
        raise TypeError(f'Could not override field {key!r}: {new!r} is a '
                        f'{type(new).__name__}, the field is a {type(old).__name__}.')
    return new


ConfigDict = ml_collections.ConfigDict if HAVE_ML_COLLECTIONS else MinimalConfigDict
