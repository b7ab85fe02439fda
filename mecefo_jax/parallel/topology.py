"""One mesh and everything compiled for it, cached so no topology is built or compiled twice.

Every program compiles through `program_cache`, so a process that compiled it before (or
a compile-ahead job) loads it.
"""
import dataclasses
import time

import jax
import numpy as np

from mecefo_jax.config.defaults import Config
from mecefo_jax.neighbour.layout import Layout
from mecefo_jax.parallel import program_cache, sharding
from mecefo_jax.parallel import step as step_lib
from mecefo_jax.parallel.state import StateLayout


class CachedProgram:
    """A jitted function compiled through `program_cache` once per input signature (a plain jit
    call while the cache is off); `compile` takes ShapeDtypeStructs too, to compile ahead."""

    def __init__(self, jitted, mesh, name: str):
        self.jitted, self._mesh, self._name = jitted, mesh, name
        self._compiled: dict = {}

    def compile(self, *args):
        leaves, tree = jax.tree.flatten(args)
        key = (tree, tuple((tuple(x.shape), str(x.dtype), x.sharding,
                            bool(getattr(x, 'weak_type', False))) for x in leaves))
        if key not in self._compiled:
            self._compiled[key] = program_cache.load_or_compile(
                self.jitted, args, self._mesh.devices.flat, self._name)
        return self._compiled[key]

    def __call__(self, *args):
        if not program_cache.enabled():
            return self.jitted(*args)
        return self.compile(*args)(*args)


@dataclasses.dataclass
class Topology:
    """The mesh of one set of live replica rows, the state's shardings there, and its programs."""
    rows: tuple
    mesh: jax.sharding.Mesh
    state_shardings: object
    eval_step: CachedProgram
    refresh: CachedProgram
    build_sec: float
    train_step: object  # fn(programs) -> the jitted (not yet compiled) train step
    compiled: dict = dataclasses.field(default_factory=dict)  # layout signature -> program

    @property
    def num_replicas(self) -> int:
        return len(self.rows)

    def compiled_step(self, state, batch, layout: Layout):
        """AOT-compiled step for the layout's signature; (fn, compile seconds or 0)."""
        key = layout.signature
        if key in self.compiled:
            return self.compiled[key], 0.0
        start = time.perf_counter()
        self.compiled[key] = program_cache.load_or_compile(
            self.train_step(layout.programs), (state, batch), self.mesh.devices.flat, 'train_step',
            identity=repr(key))
        return self.compiled[key], time.perf_counter() - start

    def batch_spec(self, layout: Layout, seq: int) -> dict:
        """Abstract step inputs for `layout`, to compile before the data arrives."""
        return sharding.abstract_batch(self.mesh, layout.capacity, seq, len(layout.replicas))

    def put_batch(self, host_batch: dict):
        """Host step inputs -> global arrays on this mesh (multi-process safe)."""
        shardings = sharding.batch_shardings(self.mesh)
        if jax.process_count() == 1:
            return jax.device_put(host_batch, {k: shardings[k] for k in host_batch})
        return {k: jax.make_array_from_callback(np.shape(v), shardings[k],
                                                lambda i, v=v: np.asarray(v)[i])
                for k, v in host_batch.items()}


class TopologyCache:
    """Builds each topology (by its live rows) once, and keeps it."""

    def __init__(self, model, optimizer, state_layout: StateLayout, cfg: Config):
        self._model, self._optimizer, self._layout = model, optimizer, state_layout
        self._mecefo, self._ordered = cfg.mecefo, cfg.train.ordered_reduction
        self._cache: dict[tuple, Topology] = {}

    def get(self, rows) -> Topology:
        rows = tuple(tuple(r) for r in rows)
        if rows not in self._cache:
            self._cache[rows] = self._build(rows)
        return self._cache[rows]

    def _build(self, rows) -> Topology:
        start = time.perf_counter()
        mesh = sharding.mesh_from_rows(rows)
        shardings = self._layout.shardings(mesh)
        m = self._mecefo
        refresh = step_lib.make_refresh_fn(m.rank, shardings, method=m.refresh,
                                           iterations=m.refresh_iters,
                                           split_min_elements=m.refresh_split_min_elements)

        def train_step(programs):
            return step_lib.make_train_step(self._model, self._optimizer, mesh, shardings, programs,
                                            ordered_reduction=self._ordered)
        return Topology(
            rows=rows, mesh=mesh, state_shardings=shardings,
            eval_step=CachedProgram(step_lib.make_eval_step(self._model, mesh, shardings.params),
                                    mesh, 'eval_step'),
            refresh=CachedProgram(refresh, mesh, 'refresh'),
            build_sec=time.perf_counter() - start, train_step=train_step)

    def __len__(self):
        return len(self._cache)
