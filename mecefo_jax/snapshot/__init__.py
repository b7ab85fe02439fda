"""In-memory snapshots that survive a worker crash (placeholder)."""
