"""What the launcher and its recovery planner share about one job (`JobState`).

The launcher (`supervisor`) owns one; between generations `recovery_plan`
reads and changes it (where workers run, their keepers, lost nodes) and
nothing else of the launcher, so each module reads alone.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from mecefo_jax.config.defaults import Config
from mecefo_jax.launch.compile_ahead import CompileAhead
from mecefo_jax.launch.keepers import JobKeepers
from mecefo_jax.launch.kills import Injector
from mecefo_jax.launch.placement import Placement


@dataclasses.dataclass
class JobState:
    cfg: Config
    placement: Placement
    keepers: JobKeepers
    nodes: dict[int, str]  # worker -> Ray node id; the injector holds this same dict
    injector: Injector
    ahead: CompileAhead
    log: Callable[[str], None]
    lost_nodes: list[str] = dataclasses.field(default_factory=list)
    workdir: str = ''  # the job's real path: its Orbax checkpoints are under it

    @property
    def recovery(self) -> str:
        return self.cfg.launch.recovery

    @property
    def uses_keepers(self) -> bool:
        return self.recovery == 'memory' and self.cfg.snapshot.every != 0
