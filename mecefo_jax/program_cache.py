"""A persistent cache of compiled programs that every process of a job reads and writes.

Why not JAX's own persistent cache alone: on multi-process CPU only process
0 ever finds its programs there, for two reasons (jax 0.10.2):

* `jax._src.compiler._cache_write` writes an entry only when
  `distributed.global_state.process_id == 0`; the others log "Not writing
  persistent cache entry since process_id != 0".
* The key differs per process: `cache_key.get` hashes the
  `accelerator_config`, the fingerprint of
  `xla_client.get_topology_for_devices(devices)`, which on CPU depends on
  the calling process (a 2-process job over 4 devices gives the same
  computation and compile-options hashes on both processes but a different
  accelerator_config hash; the device assignment is global and identical,
  and is stripped from the key only on GPU anyway). So process 1 looks up a
  key nobody ever writes.

Here each process stores its own executable (`jax.experimental.
serialize_executable`, a public API) under a key of the lowered program's
text, the devices it runs on (global ids and owning processes), this
process's index and count, and the JAX/XLA versions and flags. A relaunched
job whose processes are renumbered exactly as a compile-ahead job was
(`mecefo_jax.launch.compile_ahead`) finds every program, on every process.

`enable(directory)` turns it on for this process (the launcher's workers
do); `compile(lowered, devices)` is then load-or-compile-and-store, and
plain `lowered.compile()` when disabled. `stats` counts hits and misses.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import time
import warnings

import jax
import jaxlib


@dataclasses.dataclass
class Stats:
    hits: int = 0
    misses: int = 0
    compile_sec: float = 0.0  # compiling on a miss
    load_sec: float = 0.0  # deserialising on a hit
    programs: list = dataclasses.field(default_factory=list)  # (name, 'hit'|'miss', seconds)


stats = Stats()
_directory: str | None = None


def enable(directory: str) -> None:
    """Store and look up this process's compiled programs under `directory`."""
    global _directory
    os.makedirs(directory, exist_ok=True)
    _directory = directory


def configure(setting: str, workdir: str) -> str:
    """`launch.compilation_cache` for a launcher process: JAX's cache and this one, under it.

    'auto' is `<workdir>/launch/xla_cache`, '' turns both off. Shared by
    every worker, generation and compile-ahead job. Returns the directory.
    """
    if not setting:
        return ''
    cache = os.path.join(workdir, 'launch', 'xla_cache') if setting == 'auto' else setting
    jax.config.update('jax_compilation_cache_dir', cache)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
    enable(os.path.join(cache, 'programs'))
    return cache


def disable() -> None:
    global _directory
    _directory = None


def enabled() -> bool:
    return _directory is not None


def program_key(lowered, devices) -> str:
    """What makes a compiled program reusable by this process (see module docstring)."""
    backend = jax.devices()[0].client
    digest = hashlib.sha256()
    parts = (lowered.as_text(), jax.__version__, jaxlib.__version__, backend.platform,
             backend.platform_version, os.environ.get('XLA_FLAGS', ''),
             repr((jax.process_index(), jax.process_count())),
             repr([(d.id, d.process_index) for d in devices]))
    for part in parts:
        digest.update(part.encode())
        digest.update(b'\0')
    return digest.hexdigest()


def compile(lowered, devices, name: str = 'program'):  # noqa: A001 (mirrors Lowered.compile)
    """`lowered.compile()`, loaded from the cache when this process stored it before."""
    devices = list(devices)
    if _directory is None:
        return lowered.compile()
    path = os.path.join(_directory, f'{name}-{program_key(lowered, devices)}.bin')
    start = time.perf_counter()
    if os.path.exists(path):
        try:
            compiled = _load(path, lowered, devices)
        except Exception as error:  # a damaged or incompatible entry: compile again
            warnings.warn(f'program cache: could not load {path} ({error!r}); compiling.',
                          stacklevel=2)
        else:
            seconds = time.perf_counter() - start
            stats.hits += 1
            stats.load_sec += seconds
            stats.programs.append((name, 'hit', seconds))
            return compiled
    compiled = lowered.compile()
    seconds = time.perf_counter() - start
    stats.misses += 1
    stats.compile_sec += seconds
    stats.programs.append((name, 'miss', seconds))
    _store(path, compiled)
    return compiled


def _load(path: str, lowered, devices):
    from jax.experimental import serialize_executable
    with open(path, 'rb') as f:
        payload = f.read()
    _, in_tree = jax.tree_util.tree_flatten(lowered.args_info)
    return serialize_executable.deserialize_and_load(
        payload, in_tree, lowered.out_tree, backend=devices[0].client,
        execution_devices=devices)


def _store(path: str, compiled) -> None:
    from jax.experimental import serialize_executable
    try:
        payload, _, _ = serialize_executable.serialize(compiled)
    except (ValueError, NotImplementedError) as error:
        warnings.warn(f'program cache: cannot serialise {os.path.basename(path)}: {error}',
                      stacklevel=3)
        return
    tmp = f'{path}.{os.getpid()}.tmp'
    with open(tmp, 'wb') as f:
        f.write(payload)
    os.replace(tmp, path)
