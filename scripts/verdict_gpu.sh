#!/usr/bin/env bash
# The verdict's paper_like_60m point on one GPU lease: resumes per (seed, run) from the
# committed records, trains what is missing within a time budget, leaves every finished record
# for the session to commit (docs/gpu.md, "The verdict's 60M point").
#
#   bash scripts/verdict_gpu.sh OUT [ASSETS]           # on the GPU; ASSETS default .gpu
#   bash scripts/verdict_gpu.sh --smoke OUT [ASSETS]   # the same path on CPU (or SMOKE=1):
#                                                      # configs/tiny.py's model, 4 steps, 1 seed,
#                                                      # fault_free and drop; ASSETS default OUT/assets
#
# ASSETS holds what a machine with no network lacks (carry it: .gpu is git-ignored):
#   whl/*.whl                ml_collections and grain (scripts/gpu_wheels.sh);
#   verdict_corpus/, verdict_tokenizer.model, verdict_corpus.json
#                            the exported corpus: python -m studies.corpus_export --out ASSETS
#                            (the smoke exports a small one itself where it is missing).
# Writes under OUT: verdict_runs/paper_like_60m/seed<s>/<run>.json (committed ones and new),
# report/verdict.{json,md,png}, bench_60m/bench_step.json (the step ratios at 16 x 256 tokens),
# verdict.log. Checkpoints stay in WORK (default /tmp/verdict_gpu_work): a killed run loses only
# the run in progress. Limits (seconds): VERDICT_BUDGET, REPORT_LIMIT, BENCH_LIMIT (0: no bench).
set -u
SMOKE=${SMOKE:-0}
if [ "${1:-}" = --smoke ]; then SMOKE=1; shift; fi
case "${1:-}" in -h|--help|'') sed -n '2,20p' "$0"; [ -n "${1:-}" ]; exit $?;; esac
mkdir -p "$1" && OUT=$(cd "$1" && pwd)  # absolute: keep() copies from WORK
POINT=paper_like_60m
WORK=${WORK:-/tmp/verdict_gpu_work}
VERDICT_BUDGET=${VERDICT_BUDGET:-320}
REPORT_LIMIT=${REPORT_LIMIT:-40}
BENCH_LIMIT=${BENCH_LIMIT:-75}
FLAGS=()
if [ "$SMOKE" = 1 ]; then
  ASSETS=${2:-$OUT/assets}
  export VERDICT_SMOKE=1
  FLAGS=(--seeds=1 --runs=fault_free,drop:high)
  BENCH_LIMIT=0
else
  ASSETS=${2:-.gpu}
fi
export VERDICT_ASSETS=$ASSETS PYTHONUNBUFFERED=1
mkdir -p "$OUT/verdict_runs/$POINT" "$WORK/$POINT"
if ls "$ASSETS"/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$ASSETS"/whl/*.whl && export PYTHONPATH=/tmp/site
fi
command -v nvidia-smi >/dev/null && nvidia-smi -L
if [ "$SMOKE" = 1 ] && [ ! -f "$ASSETS/verdict_corpus.json" ]; then
  EMAIL=$(python3 -c 'import email, os; print(os.path.dirname(email.__file__))')
  python3 -m studies.corpus_export --out "$ASSETS" --roots "$EMAIL" --vocab_size 256 >/dev/null || exit 1
fi

# Resume: the committed records, then what an earlier call left in OUT (newer).
for src in "docs/results/verdict_runs/$POINT" "$OUT/verdict_runs/$POINT"; do
  [ -d "$src" ] && cp -r "$src/." "$WORK/$POINT/"
done
keep() {  # every finished record (and the point's report, once complete) into OUT
  (cd "$WORK/$POINT" && find . \( -name work -o -name fork \) -prune -o -name '*.json' -print |
    xargs -r cp --parents -t "$OUT/verdict_runs/$POINT/")
}

echo "== $POINT (budget ${VERDICT_BUDGET} s, assets $ASSETS) $(date -u +%T)"
timeout -k 10 "$VERDICT_BUDGET" python3 scripts/verdict.py --work "$WORK" --points "$POINT" \
  --report_dir "$OUT/report" "${FLAGS[@]}" 2>&1 | tee "$OUT/verdict.log"
code=${PIPESTATUS[0]}
echo "verdict exit $code"
keep
if [ "$code" != 0 ]; then  # killed at the budget: the report of what finished
  timeout "$REPORT_LIMIT" python3 scripts/verdict.py --work "$WORK" --points "$POINT" \
    --report_dir "$OUT/report" --report_only >> "$OUT/verdict.log" 2>&1 || echo "no report"
fi
echo "records: $(find "$OUT/verdict_runs/$POINT" -name '*.json' -path '*/seed*' | wc -l)"

if [ "$BENCH_LIMIT" -gt 0 ]; then
  echo "== step ratios at the 60M shape, 16 x 256 tokens a device (limit ${BENCH_LIMIT} s) $(date -u +%T)"
  timeout -k 5 "$BENCH_LIMIT" python3 scripts/bench_step.py --config configs/llama_60m.py:gpu \
    --config.data.seq_len=256 --config.mecefo.rank=128 --batch 16 --no_overhead \
    --out "$OUT/bench_60m" > "$OUT/bench_60m.log" 2>&1; echo "bench exit $?"
  # TODO(gpu_report): scripts/gpu_report.py times the 350M and 1B shapes only; once it takes a
  # named config, time this shape there and drop this bench_step call.
fi
echo "== done $(date -u +%T)"
[ "$code" = 0 ] || [ "$code" = 124 ] || [ "$code" = 137 ]
