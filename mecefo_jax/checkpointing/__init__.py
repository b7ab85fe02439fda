"""Checkpoints on disk (Orbax), with the data iterator's state.

| module | what it owns |
|---|---|
| `checkpoint` | saving and restoring the train state and the data position; whether a requested tree fits a saved one |
| `damage` | recognising a damaged step, moving it aside, resuming from an older one |
"""
