"""The config: every field declared once, resolved once, and recorded with the run.

| module | what it owns |
|---|---|
| `defaults` | every field's default, type, rules and meaning; `Config`; `base_config()`, the ConfigDict configs edit |
| `resolve` | a ConfigDict resolved into the checked `Config`, once per process; what command lines do first |
| `record` | `<workdir>/config.json`, and what a mismatch with it means |

`configs/*.py` start from `base_config()` or `llama_config(...)`, both here.
"""
from mecefo_jax.config.defaults import base_config, llama_config

__all__ = ['base_config', 'llama_config']
