"""What the launcher hands one worker of one generation (`WorkerArgs`).

Its own module: the actor (`worker`), its records (`worker_records`) and its
snapshot wiring (`worker_snapshots`) all read it, and the launcher builds it.
"""
from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass(frozen=True)
class WorkerArgs:
    """What one worker of one generation runs (sent by the launcher to its actor)."""
    cfg: object  # the job's resolved `Config`: one resolution for every worker of every generation
    workdir: str
    coordinator: str  # host:port of the jax.distributed coordinator (process 0)
    members: tuple  # worker ids of this generation, in process order
    worker: int  # this worker (stable across relaunches)
    workers: int  # workers of the full job
    generation: int = 0
    resume: str = 'fresh'  # 'fresh' | 'memory' | 'disk'
    resume_step: int = 0  # memory: the snapshot step to restore (0: the processes agree)
    stop_at: int = 0  # stop after this step (0: train.steps)
    own_run: bool = False  # the workdir's run is this job's: with nothing saved, start over
    keepers: tuple = ()  # each worker's KeeperHandle, None where it has none
    hold_in_publish: int = 0  # drills: hold inside the publish of this snapshot step (0: never)
    hold_after_snapshot: int = 0  # drills: hold after the first snapshot at or after this step
    observed_failures_per_hour: float = 0.0  # the job's failures so far / its hours so far

    @property
    def process_id(self) -> int:
        return self.members.index(self.worker)

    @property
    def out_dir(self) -> str:
        return os.path.join(self.workdir, 'launch')

    @property
    def tag(self) -> str:
        return f'g{self.generation}_w{self.worker}'
