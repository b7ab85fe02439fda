"""Cluster-scale projection of the fault-tolerance strategies (pure numpy; docs/cluster.md)."""
