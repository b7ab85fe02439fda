"""How a generation ended: what the launcher decides the next one from."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Outcome:
    kind: str  # 'finished' | 'stopped' | 'preempted' | 'failed' (a crash) | 'error' (a program error)
    failed: list = dataclasses.field(default_factory=list)
    cause: str = ''
    failed_at: float = 0.0  # time.time() the failure happened (kill sent / last report)
    detected_at: float = 0.0
    completed_steps: int = 0  # the most steps any worker had completed
    unsaved: list = dataclasses.field(default_factory=list)  # a stop: workers that never saved
    deaths: list = dataclasses.field(default_factory=list)  # exits.Death of every dead worker
    # A crash's echoes: workers whose code raised because a peer died under them
    # (a collective that failed); they survive, their errors are recorded.
    echoes: dict = dataclasses.field(default_factory=dict)
