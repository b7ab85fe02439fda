"""A persistent cache of compiled programs that every process of a job reads and writes.

JAX's own cache alone fails on multi-process CPU (jax 0.10.2): only process 0 writes,
and the key hashes a per-process topology, so process 1 looks up keys nobody writes.
Here each process stores its own executable (`serialize_executable`) keyed by the
lowered text, its devices and owning processes, its place in the job and the JAX/XLA
build, so a job renumbered as a compile-ahead job was (`launch.compile_ahead`) finds
every program. Tracing and lowering cost more than loading on the way back from a
crash, so `load_or_compile` first looks up by what decides a program before tracing
(`program_context`: the config fields programs read and this package's source; the
identity; the abstract inputs; devices; process; build). On CPU a loaded program's
first call is checked (`_FirstCallCheck`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import pickle
import re
import time
import warnings

import jax
import jaxlib

from mecefo_jax.host import files
from mecefo_jax.model.optim import schedule_steps


@dataclasses.dataclass
class Stats:
    hits: int = 0
    misses: int = 0
    compile_sec: float = 0.0  # compiling on a miss
    load_sec: float = 0.0  # deserialising on a hit
    programs: list = dataclasses.field(default_factory=list)  # (name, 'hit'|'miss', seconds)
    untraced_hits: int = 0  # hits found before tracing (`load_or_compile`)


stats = Stats()
_directory: str | None = None
_context = ''  # what decides a program besides its inputs ('' : no untraced lookups)

# Config sections no program reads: the launcher's and the snapshots'.
_SECTIONS_OUTSIDE_PROGRAMS = ('launch', 'snapshot')
# Fields of `train` that only the host's loop reads (how long, how often to log, evaluate
# and save). `steps` reaches a program only through the learning-rate schedule's length,
# which the context holds instead: a rerun that trains longer or logs more often finds
# its programs untraced.
_TRAIN_FIELDS_OUTSIDE_PROGRAMS = ('steps', 'log_every', 'eval_every', 'eval_batches',
                                  'checkpoint_every', 'keep_checkpoints')
# The package's source, every file of it: a program may come from any of its modules.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def enable(directory: str, context: str = '') -> None:
    """Store and look up this process's compiled programs under `directory` ('': no more); with
    a `context` (`program_context`), `load_or_compile` finds programs without tracing them."""
    global _directory, _context
    if directory:
        os.makedirs(directory, exist_ok=True)
    _directory, _context = directory or None, context


# The layers a launcher's processes use, all by default: JAX's own persistent cache ('jax'),
# this one's programs by lowered text ('programs'), and its lookups before tracing
# ('untraced'). docs/launch.md's table of what each saves a recovery left each one out.
LAYERS_VARIABLE = 'MECEFO_CACHE_LAYERS'


def configure(setting: str, workdir: str, context: str = '') -> str:
    """`launch.compilation_cache` for a launcher process: JAX's cache and this one under it
    ('auto': `<workdir>/launch/xla_cache`; '': both off), shared by every job. Returns it."""
    if not setting:
        return ''
    layers = set(os.environ.get(LAYERS_VARIABLE, 'jax,programs,untraced').split(','))
    cache = os.path.join(workdir, 'launch', 'xla_cache') if setting == 'auto' else setting
    if 'jax' in layers:
        jax.config.update('jax_compilation_cache_dir', cache)
        jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
    if 'programs' in layers:
        enable(os.path.join(cache, 'programs'), context if 'untraced' in layers else '')
    return cache


def program_context(cfg) -> str:
    """The config fields programs read, and this package's source: part of every untraced key."""
    sections = {k: v for k, v in cfg.to_dict().items() if k not in _SECTIONS_OUTSIDE_PROGRAMS}
    train = {k: v for k, v in sections['train'].items() if k not in _TRAIN_FIELDS_OUTSIDE_PROGRAMS}
    sections['train'] = dict(train, schedule_steps=schedule_steps(cfg.train))
    return json.dumps(sections, sort_keys=True, default=repr) + source_fingerprint()


def source_files(root: str = _PACKAGE_ROOT) -> list[str]:
    """Every Python file under `root`, relative to it, in a fixed order."""
    files = []
    for folder, dirs, names in sorted(os.walk(root)):
        dirs.sort()
        files += [os.path.relpath(os.path.join(folder, n), root) for n in sorted(names) if n.endswith('.py')]
    return files


@functools.cache
def source_fingerprint() -> str:
    """sha256 of every Python file of this package: an edited rule means a new program."""
    digest = hashlib.sha256()
    for relative in source_files():
        digest.update(relative.encode())
        with open(os.path.join(_PACKAGE_ROOT, relative), 'rb') as f:
            digest.update(f.read())
    return digest.hexdigest()


def enabled() -> bool:
    return _directory is not None


def _digest(parts) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b'\0')
    return digest.hexdigest()


# Entries are fresh compiles from format 2 on; older ones may hold bytes that fail to run.
# Format 3's untraced entries say whether the program calls LAPACK.
_FORMAT = '3'


def _process_parts(devices) -> tuple:
    """This process, its devices and its JAX/XLA build: the same program text differs by these."""
    backend = jax.devices()[0].client
    return (_FORMAT, jax.__version__, jaxlib.__version__, backend.platform, backend.platform_version,
            os.environ.get('XLA_FLAGS', ''), repr((jax.process_index(), jax.process_count())),
            repr([(d.id, d.process_index) for d in devices]))


def program_key(lowered, devices) -> str:
    """What makes a compiled program reusable by this process (see module docstring)."""
    return _digest((lowered.as_text(), *_process_parts(devices)))


def _abstract(leaf) -> str:
    """A leaf as a program sees it: shape, dtype, weak type, sharding and its devices."""
    sharding = getattr(leaf, 'sharding', None)
    mesh = getattr(sharding, 'mesh', None)
    devices = [d.id for d in mesh.devices.flat] if mesh is not None else None
    return repr((tuple(leaf.shape), str(leaf.dtype), bool(getattr(leaf, 'weak_type', False)),
                 repr(sharding), getattr(sharding, 'memory_kind', None), devices))


def untraced_key(identity: str, args, devices) -> str:
    """The lookup before tracing (module docstring): context, identity, inputs, process, JAX."""
    leaves, tree = jax.tree.flatten(args)
    config = repr(sorted((k, repr(v)) for k, v in jax.config.values.items()))
    return _digest((_context, identity, str(tree), *map(_abstract, leaves), config,
                    *_process_parts(devices)))


def load_or_compile(jitted, args, devices, name: str, identity: str = ''):
    """`jitted.lower(*args).compile()` through the cache, found before tracing when it can be;
    `identity` tells apart programs of one name with the same inputs (a train step's layout)."""
    devices = list(devices)
    if not _context:  # off, or on without untraced lookups
        return compile(jitted.lower(*args), devices, name)
    key = untraced_key(f'{name}:{identity}', args, devices)
    path = os.path.join(_directory, f'{name}-untraced-{key}.bin')
    start = time.perf_counter()
    compiled = _load_untraced(path, devices)
    if compiled is not None:
        _count_hit(name, time.perf_counter() - start)
        stats.untraced_hits += 1
        return _checked_on_first_call(compiled, lambda: _store_fresh(
            jitted.lower(*args), devices, name, path), path)
    lowered = jitted.lower(*args)
    compiled, payload = _compile_or_load(lowered, devices, name, untraced_path=path)
    if payload is not None:
        _store_untraced(path, payload, lowered)
    return compiled


def load_or_compute(name: str, identity: str, compute):
    """A host value that the context and `identity` decide (a state's layout), pickled beside
    the programs: a relaunched process reads it instead of tracing for it again. Without a
    context, `compute()`."""
    if not _context:
        return compute()
    key = _digest((_context, name, identity, _FORMAT, jax.__version__, jaxlib.__version__))
    path = os.path.join(_directory, f'{name}-{key}.pkl')
    try:
        with open(path, 'rb') as f:
            return pickle.load(f)
    except FileNotFoundError:
        pass
    except Exception as error:  # a damaged entry: compute it and write it again
        warnings.warn(f'program cache: could not load {path} ({error!r}); computing it.', stacklevel=2)
    value = compute()
    files.write_bytes(path, pickle.dumps(value))
    return value


def _store_untraced(path: str, payload: bytes, lowered) -> None:
    _, in_tree = jax.tree_util.tree_flatten(lowered.args_info)
    entry = (payload, in_tree, lowered.out_tree, calls_lapack(lowered.as_text()))
    files.write_bytes(path, pickle.dumps(entry))


def calls_lapack(program_text: str) -> bool:
    """Whether a lowered program calls one of jaxlib's CPU LAPACK kernels (QR, SVD, ...)."""
    from jaxlib import lapack
    kernels = lapack.registrations()['cpu']
    return bool({name for name, _, _ in kernels} & set(re.findall(r'custom_call @([\w.]+)', program_text)))


@functools.cache
def _prepare_lapack() -> None:
    """Set up JAX's CPU LAPACK kernels (QR, SVD, ...) for a loaded program that calls them.

    JAX does it while lowering the first program that uses one; a loaded one that calls
    them in a process that never lowered one crashes (SIGSEGV, jax 0.10.2). Lowering one
    small QR sets up all of them: about 0.3 CPU-s, spared where no loaded program calls one.
    """
    import jax.numpy as jnp
    jax.jit(jnp.linalg.qr).lower(jax.ShapeDtypeStruct((2, 2), jnp.float32))


def _load_untraced(path: str, devices):
    """The executable stored at `path` with its input/output trees, or None."""
    from jax.experimental import serialize_executable
    try:
        with open(path, 'rb') as f:
            payload, in_tree, out_tree, lapack = pickle.load(f)
        if lapack:
            _prepare_lapack()
        return serialize_executable.deserialize_and_load(
            payload, in_tree, out_tree, backend=devices[0].client, execution_devices=devices)
    except FileNotFoundError:
        return None
    except Exception as error:  # a damaged or incompatible entry: trace and look up again
        warnings.warn(f'program cache: could not load {path} ({error!r}); tracing it.',
                      stacklevel=3)
        return None


def compile(lowered, devices, name: str = 'program'):  # noqa: A001 (mirrors Lowered.compile)
    """`lowered.compile()`, loaded from the cache when this process stored it before."""
    devices = list(devices)
    if _directory is None:
        return lowered.compile()
    return _compile_or_load(lowered, devices, name)[0]


def _compile_or_load(lowered, devices, name: str, untraced_path: str | None = None):
    """(executable, its serialised bytes or None): loaded by the lowered key, or compiled and stored.

    The bytes are always those of a fresh compile: an executable that was
    itself loaded from serialised bytes (ours, or JAX's own persistent cache)
    serialises into bytes that load but fail to run on CPU ("Function ...
    not found", jax 0.10.2), so it is never serialised again.
    """
    path = _lowered_path(lowered, devices, name)
    start = time.perf_counter()
    try:
        with open(path, 'rb') as f:
            payload = f.read()
        compiled = _load(payload, lowered, devices)
    except FileNotFoundError:
        pass
    except Exception as error:  # a damaged or incompatible entry: compile again
        warnings.warn(f'program cache: could not load {path} ({error!r}); compiling.',
                      stacklevel=3)
    else:
        _count_hit(name, time.perf_counter() - start)
        return _checked_on_first_call(compiled, lambda: _store_fresh(
            lowered, devices, name, untraced_path), path), payload
    return _fresh(lowered, devices, path, name)


def _lowered_path(lowered, devices, name: str) -> str:
    return os.path.join(_directory, f'{name}-{program_key(lowered, devices)}.bin')


def _fresh(lowered, devices, path: str, name: str):
    """(executable, its bytes or None): compiled for real and stored at `path`."""
    start = time.perf_counter()
    with _jax_cache_off(devices[0].client):
        compiled = lowered.compile()
    seconds = time.perf_counter() - start
    stats.misses += 1
    stats.compile_sec += seconds
    stats.programs.append((name, 'miss', seconds))
    payload = _serialise(compiled, path)
    if payload is not None:
        files.write_bytes(path, payload)
    return compiled, payload


def _store_fresh(lowered, devices, name: str, untraced_path: str | None):
    """A fresh compile stored under its keys, in place of the entries that failed."""
    compiled, payload = _fresh(lowered, devices, _lowered_path(lowered, devices, name), name)
    if payload is not None and untraced_path is not None:
        _store_untraced(untraced_path, payload, lowered)
    return compiled


def _count_hit(name: str, seconds: float) -> None:
    stats.hits += 1
    stats.load_sec += seconds
    stats.programs.append((name, 'hit', seconds))


@contextlib.contextmanager
def _jax_cache_off(backend):
    """Compile for real, not from JAX's persistent cache (see `_compile_or_load`). JAX decides at
    a process's first compile whether its cache is used (`is_cache_used`): deciding it here,
    with the cache on, keeps a process whose first compile is this one from losing it."""
    from jax._src import compilation_cache  # no public switches for either
    from jax._src import config as jax_config
    compilation_cache.is_cache_used(backend)
    with jax_config.enable_compilation_cache(False):
        yield


def _load(payload: bytes, lowered, devices):
    from jax.experimental import serialize_executable
    _, in_tree = jax.tree_util.tree_flatten(lowered.args_info)
    return serialize_executable.deserialize_and_load(
        payload, in_tree, lowered.out_tree, backend=devices[0].client,
        execution_devices=devices)


def _serialise(compiled, path: str) -> bytes | None:
    from jax.experimental import serialize_executable
    try:
        return serialize_executable.serialize(compiled)[0]
    except (ValueError, NotImplementedError) as error:
        warnings.warn(f'program cache: cannot serialise {os.path.basename(path)}: {error}',
                      stacklevel=4)
        return None


def _checked_on_first_call(loaded, recompile, path: str):
    """`loaded`, or on CPU a `_FirstCallCheck` of it: no stored program can fail a recovery."""
    if loaded.runtime_executable().client.platform != 'cpu':
        return loaded
    return _FirstCallCheck(loaded, recompile, path)


class _FirstCallCheck:
    """A loaded program whose first call fails as a bad entry does is compiled again, and called.

    XLA:CPU resolves a loaded program's kernels by name on its first run: bytes that lack
    one (serialised from a loaded executable, `_compile_or_load`) load, then fail that call
    with NOT_FOUND. That must never stop a worker. A failed call has consumed its donated
    inputs, so the first call keeps copies of those.
    """

    def __init__(self, loaded, recompile, path: str):
        self._compiled, self._recompile, self._path = loaded, recompile, path
        self._checked = False

    def __call__(self, *args):
        if self._checked:
            return self._compiled(*args)
        kept = _copies_of_donated(self._compiled, args)
        try:  # the failure may come with the call or, dispatched asynchronously, in its outputs
            out = jax.block_until_ready(self._compiled(*args))
        except jax.errors.JaxRuntimeError as error:
            if 'NOT_FOUND' not in str(error):
                raise
            warnings.warn(f'program cache: {self._path} loaded but failed its first call '
                          f'({error}); compiling it again.', stacklevel=2)
            self._compiled = self._recompile()
            out = self._compiled(*kept)
        self._checked = True
        return out

    def __getattr__(self, attribute):  # the rest of `jax.stages.Compiled`
        return getattr(self._compiled, attribute)


def _copies_of_donated(compiled, args) -> tuple:
    """`args` with a copy of every leaf the program donates (a failed call deletes those)."""
    infos = jax.tree.leaves(compiled.args_info[0])
    leaves, tree = jax.tree.flatten(args)
    if len(infos) != len(leaves):
        return args
    return jax.tree.unflatten(tree, [
        jax.device_put(x, x.sharding, may_alias=False) if info.donated else x
        for x, info in zip(leaves, infos)])
