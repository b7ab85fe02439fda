"""What a drill's or a soak's own run found: recoveries over their bound, steps lost, mismatches.

A run's report lists these and nothing else, or says it found none: never a
history of earlier runs (docs/chaos_soak.md and docs/crash_drill.md tell
that), which a report on a new seed would otherwise claim as its own. Each
finding is a row: what was found, where (a kill, a job), the figure measured
and the bound it broke. The bounds are the project's targets, not figures a
run measured.
"""
from __future__ import annotations

from studies.report import fmt, markdown_table

# Seconds from a death to the job's next step. A worker, a keeper or a node
# comes back within 10 s (Ray reports a lost node in about 1.5 s, the rest is
# the relaunch, restore and compile); the launcher's rerun starts Python,
# imports the stack and joins the cluster again first. A hang is declared
# only once the heartbeat times out, which comes on top of its bound.
RECOVERY_BOUND_SEC = {'worker': 10.0, 'keeper': 10.0, 'node': 10.0, 'double': 10.0,
                      'hang': 10.0, 'launcher': 20.0}
# Relative to each leaf's largest magnitude: a relaunch sums the replicas in
# another order than one process does (float32 reassociation).
REL_TOL = 1e-5

SLOW = 'recovery over its bound'
UNRECOVERED = "no recovery in the launcher's records"
REDONE = 'steps redone over the bound'
EXTRA_FAILURES = 'more failures than the one injected'
LOST = 'steps lost'
MISMATCH = 'mismatch'
PARAMS = 'parameters differ from the simulation'
LEFT = 'left behind'
EXIT = 'the launcher failed'


def recovery_bound_sec(kind: str, heartbeat_timeout_sec: float = 0.0) -> float:
    """The bound on a recovery from a death of `kind` (a `chaos_soak.KINDS` name)."""
    if kind not in RECOVERY_BOUND_SEC:
        raise ValueError(f'no recovery bound for a death of kind {kind!r}; '
                         f'known kinds: {sorted(RECOVERY_BOUND_SEC)}')
    return RECOVERY_BOUND_SEC[kind] + (heartbeat_timeout_sec if kind == 'hang' else 0.0)


def finding(what: str, where: str, measured=None, bound=None) -> dict:
    return {'what': what, 'where': where, 'measured': measured, 'bound': bound}


def over(what: str, where: str, measured, bound) -> list[dict]:
    """[the finding] where `measured` exceeds `bound`, else []."""
    return [finding(what, where, measured, bound)] if measured is not None and measured > bound else []


def recovery(where: str, row: dict, *, bound_sec: float, redone_bound: int,
             time_key: str = 'recovery_sec', redone_key: str = 'lost_steps') -> list[dict]:
    """A recovery's findings: none recorded, or its time or its redone steps over their bound."""
    if row.get(time_key) is None:
        return [finding(UNRECOVERED, where)]
    return (over(SLOW, where, row[time_key], bound_sec)
            + over(REDONE, where, row.get(redone_key), redone_bound))


def _cell(value) -> str:
    return fmt(value, '.3g') if isinstance(value, float) else ('' if value is None else str(value))


def table(found: list[dict]) -> str:
    """The findings as a markdown table; one row 'none' where the run found nothing."""
    rows = [[f['what'], f['where'], _cell(f['measured']), _cell(f['bound'])] for f in found]
    return markdown_table(['found', 'where', 'measured', 'bound'], rows or [['none', '', '', '']])
