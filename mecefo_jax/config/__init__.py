"""The config: its defaults, its typed schema, and the record a run keeps of it.

| module | what it owns |
|---|---|
| `defaults` | `base_config()`, `llama_config()`: every field, its default and meaning; no default is set elsewhere |
| `schema` | the typed, frozen sections a resolved config becomes (`Config`, `ConfigError`) |
| `record` | `<workdir>/config.json`, and what a mismatch with it means |
Its rules and resolution sit above the layers they check (`config_rules`, `config_resolve`).
"""


def __getattr__(name):
    # `from mecefo_jax.config import base_config`, without making every importer of
    # the schema (keeper processes, the data path) import ml_collections.
    if name in ('base_config', 'llama_config'):
        from mecefo_jax.config import defaults
        return getattr(defaults, name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
