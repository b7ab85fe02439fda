"""The projection refresh as one jitted program: top-r subspaces of every FFN kernel.

MeCeFO refreshes the neighbour's projections `V` at each failure onset and
every `tau` steps while a neighbour is active (`neighbour/projections.py` has
the maths and the schedule). Large kernels are split over the `data` axis, so
each replica refreshes a share of them; small ones refresh whole everywhere.
"""
import math

import jax
from jax import lax
from jax.sharding import PartitionSpec as P

from mecefo_jax.neighbour import projections as proj_lib
from mecefo_jax.parallel import sharding

DATA = sharding.DATA_AXIS


def data_split_spec(spec: P, shape, mesh_shape) -> P:
    """`spec` with 'data' added on the kernel's long axis (the longer of the last two).

    The FFN kernels are identical on every data-parallel replica, so the
    refresh's products can be split over 'data' too: each replica computes
    1/data of them. 'data' goes minor to an axis already split on 'model',
    so the reshard is a local slice. When the long axis does not split
    evenly, the other one is taken if it does; if neither does, GSPMD pads
    the long axis (ceil(n / parts) rows per device: still about 1/data).
    """
    axes = list(spec) + [None] * (len(shape) - len(spec))

    def parts(dim):
        current = axes[dim]
        named = () if current is None else (current if isinstance(current, tuple) else (current,))
        return named + (DATA,)

    def even(dim):
        return shape[dim] % math.prod(mesh_shape[a] for a in parts(dim)) == 0

    long_dim, short_dim = (-2, -1) if shape[-2] > shape[-1] else (-1, -2)
    dim = long_dim if even(long_dim) or not even(short_dim) else short_dim
    axes[dim] = parts(dim)
    return P(*axes)


def _refresh_split_for(state_shardings, min_elements: int):
    """path, kernel -> RefreshSplit: the kernel split over 'data' as well, blocks replicated;
    a kernel under `min_elements` per layer stays where the model puts it (no split)."""
    kernels = state_shardings.params
    mesh = getattr(jax.tree.leaves(kernels)[0], 'mesh', None)  # None: not a NamedSharding
    mesh_shape = dict(mesh.shape) if mesh is not None else {}

    def split_for(path, kernel_nm):
        sharding_ = kernels
        for key in path:
            sharding_ = sharding_[key]
        if mesh_shape.get(DATA, 1) == 1 or not isinstance(sharding_, jax.sharding.NamedSharding):
            return proj_lib.RefreshSplit()  # one replica: nothing to split
        if math.prod(kernel_nm.shape[-2:]) < min_elements:
            return proj_lib.RefreshSplit()  # cheaper whole than with two collectives
        spec = tuple(data_split_spec(sharding_.spec, kernel_nm.shape, mesh_shape))
        lead = spec[:-2]

        def place(*axes):
            named = jax.sharding.NamedSharding(mesh, P(*axes))
            return lambda x: lax.with_sharding_constraint(x, named)
        return proj_lib.RefreshSplit(
            kernel=place(*spec), product_m=place(*lead, spec[-1], None),
            product_n=place(*lead, spec[-2], None), block=place())
    return split_for


def make_refresh_fn(rank, state_shardings, *, method: str, iterations: int,
                    split_min_elements: int = 0):
    """Jitted state -> state with every FFN projection V recomputed.

    `method` 'svd' is exact; 'subspace' runs `iterations` of subspace
    iteration warm-started from the V the state holds (mecefo.refresh),
    its products split over the data axis (`data_split_spec`) for kernels
    of at least `split_min_elements` per layer
    (mecefo.refresh_split_min_elements).
    """
    split_for = _refresh_split_for(state_shardings, split_min_elements)

    def refresh(state):
        return state.replace(projections=proj_lib.refresh_projections(
            state.params, state.projections, rank, method=method, iterations=iterations,
            split_for=split_for))
    return jax.jit(refresh, in_shardings=(state_shardings,),
                   out_shardings=state_shardings, donate_argnums=0)
