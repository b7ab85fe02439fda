"""Several Ray nodes on one machine, one of which can be lost at once: node loss, drilled and tested.

`SimulatedCluster(nodes=K)` starts a head and K-1 more Ray nodes on this
machine (`ray.cluster_utils.Cluster`), each its own raylet with its own
object store, so the launcher places workers and keepers on distinct nodes
as it would on K hosts. `lose(node_id)` kills a node abruptly, its raylet and
every process on it (the worker and keeper there included), as a host that
dies would; `add()` brings a new node, and `lose(node_id, replace=True)` has
a new one join at once, without waiting for it (as `add(wait=False)`, in
this process, since Ray's nodes start from the main thread only): a
replacement is a node like the others and can be lost in turn, so a soak of
many node losses keeps losing hosts rather than running out of them. Nodes report dead within about
1.5 s (a 500 ms health check, 3 misses), so the launcher sees a lost node in
well under the 5 s the project aims for.

All nodes share this machine's /dev/shm, so a lost keeper's segments stay
behind on disk where on a real host they would die with it; the launcher
never reads a lost keeper's memory (it reaches peers through their actors)
and unlinks the segments of dead keepers (`shm.remove_stale`).
"""
from __future__ import annotations

import os
import time

from mecefo_jax.launch.ray_host import SYSTEM_CONFIG


class SimulatedCluster:
    """A head node plus `nodes - 1` worker nodes on this machine; this process is their owner."""

    def __init__(self, nodes: int, *, object_store_mb: int = 96, connect: bool = True):
        if os.environ.setdefault('RAY_AUTH_MODE', 'token') == 'token':
            from mecefo_jax.launch.cluster import ensure_token
            ensure_token()  # a fresh machine has none, and Cluster's head would not start
        from ray.cluster_utils import Cluster
        start = time.perf_counter()
        # No log monitor: it streams worker logs to drivers, and every driver here
        # connects with log_to_driver=False.
        node_args = {'num_cpus': 1, 'object_store_memory': object_store_mb << 20,
                     'include_log_monitor': False}
        self._node_args = node_args
        self.cluster = Cluster(initialize_head=True, head_node_args=dict(
            node_args, include_dashboard=False, _system_config=SYSTEM_CONFIG))
        self.nodes = {self.cluster.head_node.node_id: self.cluster.head_node}
        for _ in range(nodes - 1):
            self.add(wait=False)
        self.cluster.wait_for_nodes()
        self.start_sec = time.perf_counter() - start
        self.address = self.cluster.address
        if connect:
            from mecefo_jax.launch.cluster import use_token_auth
            use_token_auth()
            import ray
            ray.init(address=self.address, log_to_driver=False, logging_level='WARNING')

    @property
    def head(self) -> str:
        return self.cluster.head_node.node_id

    def add(self, wait: bool = True) -> str:
        """A new node (a replacement host); its id."""
        node = self.cluster.add_node(**self._node_args)
        self.nodes[node.node_id] = node
        if wait:
            self.cluster.wait_for_nodes()
        return node.node_id

    def lose(self, node_id: str, replace: bool = False) -> None:
        """Kill a node abruptly, everything on it with it (the head cannot be lost: it is the
        cluster); with `replace`, a new node starts joining (`settle` waits for it)."""
        if node_id == self.head:
            raise ValueError('Losing the head node ends the whole simulated cluster; '
                             'place what should die on another node.')
        self.cluster.remove_node(self.nodes.pop(node_id), allow_graceful=False)
        if replace:
            self.add(wait=False)

    def settle(self) -> None:
        """Wait until every node started has joined."""
        self.cluster.wait_for_nodes()

    def shutdown(self) -> None:
        import ray
        ray.shutdown()
        self.cluster.shutdown()

    def __enter__(self) -> SimulatedCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
