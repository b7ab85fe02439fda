"""Moving the train state onto another mesh, as the fault controller rebuilds it.

Replicas along `data` hold identical copies, so every process can rebuild its
new local shards from its own old ones, without reading another's memory.
"""
import jax
import numpy as np
from jax.sharding import NamedSharding


def retarget(shardings, mesh):
    """The same partition specs on another mesh."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s.spec), shardings)


def move_state(state, shardings):
    """Place `state` on the arrays' new shardings (possibly another mesh).

    Single-process: a device-to-device `device_put`. Multi-process: every
    process rebuilds its new local shards from an old local shard with the
    same index (replicas along 'data' hold identical copies), so no process
    needs another's memory.
    """
    if jax.process_count() == 1:
        return jax.device_put(state, shardings)

    def move(x, new_sharding):
        local = {}
        for shard in x.addressable_shards:
            local.setdefault(_index_key(shard.index, x.shape), shard.data)

        def fetch(index):
            return np.asarray(local[_index_key(index, x.shape)])
        return jax.make_array_from_callback(x.shape, new_sharding, fetch)
    return jax.tree.map(move, state, shardings)


def _index_key(index, shape):
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))
