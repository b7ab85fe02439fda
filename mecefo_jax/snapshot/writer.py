"""Writing a snapshot into a keeper's slot: begin, copy and checksum, publish, push parity.

`SnapshotWriter` turns host shards into a published snapshot through a
`client.KeeperClient` (which imports this module, so it is not imported
here): begin a slot, copy and checksum into shared memory (`blob.fill`),
publish, then (optionally) push parity to the group.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from mecefo_jax.snapshot import blob
from mecefo_jax.snapshot.keeper_actor import KeeperError, KeeperUnreachable


@dataclasses.dataclass(frozen=True)
class WriteInfo:
    step: int
    nbytes: int
    checksum: int
    copy_sec: float  # begin (slot allocation, if it grows) + copy + checksum into shared memory
    publish_sec: float
    parity_sec: float
    parity_bytes: int
    parity_error: str | None = None  # a group member's keeper was gone: this step has no parity


class SnapshotWriter:
    """Writes snapshots into one keeper's slots and publishes them.

    `parity` (a `parity.ParityPusher`) sends this member's parity chunks to
    the group after each publish. `before_publish(step)` runs after the
    bytes are written and before publish (tests use it to die there).
    """

    def __init__(self, client, *, parity=None,
                 before_publish: Callable[[int], None] | None = None):
        self.client = client
        self.parity = parity
        self.before_publish = before_publish

    def write(self, step: int, shards: Sequence[blob.HostShard], data_state: dict,
              meta: dict | None = None) -> WriteInfo:
        step = int(step)
        data_state = blob.normalise_data_state(data_state, step)
        entries, data_end = blob.layout(shards)
        bound = data_end + blob.header_bound(step, data_state, entries, meta)
        t0 = time.perf_counter()
        slot = self.client.begin(bound)
        buf = self.client.segment(slot['shm'], slot['slot']).buf
        nbytes, checksum, h_off = blob.fill(buf, shards, entries, step, data_state, meta)
        t1 = time.perf_counter()
        if self.before_publish is not None:
            self.before_publish(step)
        self.client.publish(slot['slot'], slot['token'], step=step, nbytes=nbytes, checksum=checksum,
                            header_offset=h_off, header_len=nbytes - h_off)
        t2 = time.perf_counter()
        parity_bytes, parity_error = 0, None
        if self.parity is not None:
            # The slot stays intact until this writer's next begin().
            try:
                parity_bytes = self.parity.push(step, buf[:nbytes], checksum)
            except KeeperUnreachable as e:
                # A peer's keeper died: its own worker meets that loss; this snapshot stands,
                # without parity, and the launcher recovers the job.
                parity_error = str(e)
            except KeeperError as e:
                raise KeeperError(f'Step {step} is published, but pushing its parity failed: {e}') from e
        return WriteInfo(step=step, nbytes=nbytes, checksum=checksum, copy_sec=t1 - t0,
                         publish_sec=t2 - t1, parity_sec=time.perf_counter() - t2,
                         parity_bytes=parity_bytes, parity_error=parity_error)

    def write_blob(self, raw):
        """Publish a complete blob as is (e.g. one rebuilt from parity)."""
        header = blob.parse(raw)
        slot = self.client.begin(header.nbytes)
        self.client.segment(slot['shm'], slot['slot']).buf[:header.nbytes] = memoryview(raw)[:header.nbytes]
        _, h_off, h_len, _ = blob.read_preamble(raw)
        return self.client.publish(slot['slot'], slot['token'], step=header.step, nbytes=header.nbytes,
                                   checksum=header.checksum, header_offset=h_off, header_len=h_len)
