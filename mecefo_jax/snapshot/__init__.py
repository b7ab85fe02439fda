"""In-memory snapshots of the train state that survive a worker's crash.

Keeper processes outlive the workers and hold the state in host memory, so a relaunch
restores from them, not from disk (REFT, arXiv 2310.12670; DLRover flash checkpoint;
Gemini, SOSP 2023). docs/launch.md, "Snapshots", has the data path and its measurements.

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

Only `jax_io` and `async_writer` import jax, so the keeper process stays light. The
names below load their module on first use.
"""
import importlib

_MODULES = {
    'keeper_actor': ('start_keeper', 'find_keeper', 'stop_keeper', 'KeeperHandle', 'LocalKeeper'),
    'client': ('KeeperClient', 'KeeperError', 'SnapshotWriter', 'open_snapshots', 'open_sources', 'BlobSnapshot'),
    'jax_io': ('host_shards', 'pinned_host_shardings', 'restore', 'pinned_local_copies', 'feasible_steps',
               'SnapshotMissingError'),
    'async_writer': ('AsyncSnapshotter', 'SnapshotError'),
    'blob': ('XorCode',),
    'parity': ('ParityPusher', 'rebuild_member', 'ParityLossError'),
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    return getattr(importlib.import_module(f'{__name__}.{module}'), name)
