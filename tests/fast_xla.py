"""The XLA flags the suite compiles under: faster compiles of the same programs.

The suite tests behaviour, never speed, and its tiny programs' steps are
dispatch-bound, so it trades XLA:CPU's run-time code quality for compile
time (most of an in-process test's CPU is XLA's backend compile):

- `--xla_backend_optimization_level=0`: LLVM at -O0, about half the compile
  time of the default level.
- `--xla_cpu_use_fusion_emitters=false`: XLA:CPU's elemental emitters for
  fusions instead of its MLIR fusion emitters, whose per-fusion pipeline
  dominated what was left: a 20-step rows run's cold compiles (13
  programs, tests/replicas_as_rows_test.py) took 15.6 s, 7.0 s with it.

Both change how a fused HLO computation becomes machine code, not the HLO
graph or its op order. Every comparison in the suite is between programs
compiled under the same flags (a test's reference and its subject, in one
process or in its children, which inherit them). A user's run, the scripts
and the main job set none of these: they compile under XLA's defaults.
Without the fusion emitters XLA:CPU also lowers each scatter-add to a while
loop, so a test that counts a program's loops runs it under the default
emitters (tests/bench_test.py).
"""

FLAGS = '--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false'
