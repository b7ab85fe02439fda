"""The launcher's durability drills: real deaths on simulated Ray clusters, and what each run found.

These test the launcher (`python -m mecefo_jax.launch`) at a scale the suite
cannot run every time; they are tests, not experiments, so they live beside
the launcher's tests. `scripts/crash_drill.py` and `scripts/chaos_soak.py`
run them; tests import them as `tests.drills.<module>` (`tests` is a
namespace package: it has no `__init__.py`, and pytest collects only its
`*_test.py` files, none of which live here).

| module | owns |
|---|---|
| `sim_cluster` | several Ray nodes on one machine, one of which can be lost at once (tests and drills) |
| `crash_drill`, `crash_drill_nodes` | real crashes, a lost node and a killed launcher, recovered from memory and disk |
| `crash_drill_jobs` | the drill's launcher jobs and what their records say about each recovery |
| `crash_drill_random` | kills at a uniformly random step under the default snapshot cadence |
| `crash_drill_report` | the drill's JSON, its tables and what it found |
| `chaos_soak` | one launcher job and many random deaths of every kind |
| `chaos_verify` | what the soak's job must show once it ends: nothing lost, the right model, nothing leaked |
| `chaos_report` | the soak from start to report: its JSON, its tables and what it found |
| `gpu_crash` | one worker on one GPU killed at random steps, back from memory and from disk, each way back in parts |
| `findings` | what a run found against its bounds (the only list a run's report carries) |

How a drill's figures read, and what earlier runs found, is written in
docs/crash_drill.md and docs/chaos_soak.md.
"""
