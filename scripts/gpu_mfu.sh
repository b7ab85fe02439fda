#!/usr/bin/env bash
# One GPU lease's MFU work in one call of at most 8 minutes: the report's sweep, the step at
# the sweep's best batch and at 16 x 256 (350M, 1B), and a profile of one step.
#
#   bash scripts/gpu_mfu.sh OUT [ASSETS]     # ASSETS: from scripts/gpu_wheels.sh (default .gpu)
#
# Runs `python scripts/gpu_report.py --sections mfu` (environment, sweep, step, step_best,
# step_1b, profile; docs/gpu.md) within BUDGET seconds (default 420; the sweep takes what
# the other sections leave) and writes under OUT, 8 files at most: gpu_report.{json,md},
# mfu_sweep.{json,md}, bench_step.json, bench_step_best.json, bench_step_1b.json and
# trace_and_logs.tar.gz (the profile's trace and every section's log).
# SECTIONS=all runs the whole report instead (attention and snapshot too).
set -u
OUT=${1:?usage: gpu_mfu.sh OUT [ASSETS]}
ASSETS=${2:-.gpu}
BUDGET=${BUDGET:-420}
WORK=/tmp/gpu_mfu
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
if ls "$ASSETS"/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$ASSETS"/whl/*.whl && export PYTHONPATH=/tmp/site
fi
nvidia-smi -L
echo "== gpu_report --sections ${SECTIONS:-mfu} (budget ${BUDGET} s) $(date -u +%T)"
timeout $((BUDGET + 30)) python3 scripts/gpu_report.py --out "$WORK" \
  --sections "${SECTIONS:-mfu}" --budget_sec "$BUDGET"
for f in gpu_report.json gpu_report.md mfu_sweep.json mfu_sweep.md bench_step.json \
    bench_step_best.json bench_step_1b.json; do
  cp "$WORK/$f" "$OUT/" 2>/dev/null || echo "missing $f"
done
tar czf "$OUT/trace_and_logs.tar.gz" -C "$WORK" sections profile_trace 2>/dev/null
echo "== done $(date -u +%T)"
