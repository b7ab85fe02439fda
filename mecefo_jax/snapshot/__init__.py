"""In-memory snapshots of the train state that survive a worker's crash.

A real device failure kills a worker process; the job is torn down and
relaunched on the survivors. The state then comes back from host memory
held by *keeper* processes that outlive the workers (REFT, arXiv
2310.12670; DLRover flash checkpoint; Gemini, SOSP 2023), not from disk.

| module | owns |
|---|---|
| `keeper` | the keeper's state: slots, parity stripes, and what requests it accepts |
| `keeper_actor` | the keeper as a process: sessions, the Ray actor and its handle; `LocalKeeper` in process |
| `blob` | the byte format of one snapshot, its xxh3_64 hash lists, XOR over blocks |
| `client` | the worker's side: `KeeperClient`, `SnapshotWriter`, `Snapshot` readers |
| `async_writer` | the copy written in a background thread while training goes on |
| `jax_io` | pytrees to shards and back: `pinned_host_shardings`, `restore`, `feasible_steps` |
| `parity` | RAID-5 parity across a group of keepers: the pusher, the rebuild |
| `shm` | shared-memory segments: who creates, attaches and unlinks |
| `cadence` | how often to snapshot (`snapshot.every=auto`) |

A worker, given its keeper (a `KeeperHandle`) and its peers':

    client = KeeperClient(own)
    snapshotter = AsyncSnapshotter(SnapshotWriter(client))
    host_sh = pinned_host_shardings(state_shardings)
    for step ...:
        state = train_step(state, batch)                  # dispatched, not finished
        snapshotter.submit(step, jax.device_put(state, host_sh), data_state)

and after a relaunch:

    snaps = open_sources(own, peers)   # own keeper's shared memory, then peers through Ray
    state, data_state, report = restore(abstract_state, snaps)

Only the modules that need jax import it (`jax_io`, `async_writer`); the
keeper process stays light. Names below load their module on first use.
"""
import importlib

_EXPORTS = {
    'start_keeper': 'keeper_actor', 'find_keeper': 'keeper_actor', 'stop_keeper': 'keeper_actor',
    'KeeperHandle': 'keeper_actor', 'LocalKeeper': 'keeper_actor',
    'KeeperClient': 'client', 'KeeperError': 'client', 'SnapshotWriter': 'client',
    'open_snapshots': 'client', 'open_sources': 'client', 'BlobSnapshot': 'client',
    'host_shards': 'jax_io', 'pinned_host_shardings': 'jax_io', 'restore': 'jax_io',
    'pinned_local_copies': 'jax_io',
    'feasible_steps': 'jax_io', 'SnapshotMissingError': 'jax_io',
    'AsyncSnapshotter': 'async_writer', 'SnapshotError': 'async_writer',
    'XorCode': 'blob',
    'ParityPusher': 'parity', 'rebuild_member': 'parity', 'ParityLossError': 'parity',
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    return getattr(importlib.import_module(f'{__name__}.{module}'), name)
