#!/usr/bin/env bash
# One GPU lease, one command: the GPU report but its MFU sweep (scripts/gpu_mfu.sh runs
# that), the refresh at 1B and 7B and a 24-layer failure compile (the studies that measure
# them, on this GPU), then configs/llama_60m.py trained end to end.
#
#   bash scripts/gpu_session.sh OUT [ASSETS]
#
# ASSETS (default .gpu) holds what a machine with no network lacks:
#   whl/*.whl        ml_collections (scripts/gpu_wheels.sh), grain and their missing needs;
#   corpus.txt       the training text (any UTF-8 text; the last run used CPython's
#                    standard library sources, 24 MB, cut at 24 M characters);
#   tokenizer.model  a 32,000-piece sentencepiece model trained on it by the pipeline.
# Writes under OUT: gpu_report.{json,md}, bench_step.json, bench_step_1b.json,
# refresh_{1b,7b}/bench_refresh.{json,md}, compile_350m/bench_compile.json,
# llama_60m_metrics.jsonl, llama_60m_summary.json and logs.tar.gz (section logs).
# Every stage has its own time limit, so a slow one cannot starve the next.
set -u
OUT=${1:?usage: gpu_session.sh OUT [ASSETS]}
ASSETS=${2:-.gpu}
REPORT_BUDGET=${REPORT_BUDGET:-330}
SECTIONS=${SECTIONS:-environment,step,step_1b,attention,snapshot}
STUDY_LIMIT=${STUDY_LIMIT:-60}
TRAIN_LIMIT=${TRAIN_LIMIT:-180}
TRAIN_STEPS=${TRAIN_STEPS:-300}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
if ls "$ASSETS"/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$ASSETS"/whl/*.whl && export PYTHONPATH=/tmp/site
fi
nvidia-smi -L; df -h /dev/shm
# The snapshot section keeps two 4.4 GB snapshots in shared memory (docs/gpu.md).
mount -o remount,size=48G /dev/shm 2>/dev/null && df -h /dev/shm

echo "== gpu_report --sections $SECTIONS (budget ${REPORT_BUDGET} s) $(date -u +%T)"
timeout $((REPORT_BUDGET + 20)) python3 scripts/gpu_report.py --out /tmp/gpu_report \
  --sections "$SECTIONS" --budget_sec "$REPORT_BUDGET"
for f in gpu_report.json gpu_report.md bench_step.json bench_step_1b.json; do
  cp /tmp/gpu_report/$f "$OUT/" 2>/dev/null || echo "missing $f"
done

for m in 1b 7b; do
  echo "== refresh at llama_${m}'s FFN shapes (limit ${STUDY_LIMIT} s) $(date -u +%T)"
  timeout "$STUDY_LIMIT" python3 scripts/bench_refresh.py --config "configs/llama_${m}.py" \
    --full_repeats 1 --out "$OUT/refresh_${m}" > "/tmp/refresh_${m}.log" 2>&1; echo "refresh exit $?"
done
echo "== failure-step compile, 350M widths at 24 layers (limit ${STUDY_LIMIT} s) $(date -u +%T)"
timeout "$STUDY_LIMIT" python3 scripts/bench_compile.py --config configs/llama_350m.py:gpu \
  --config.data.global_batch_size=16 --depths 24 --out "$OUT/compile_350m" > /tmp/compile.log 2>&1
echo "compile exit $?"

echo "== llama_60m, ${TRAIN_STEPS} steps (limit ${TRAIN_LIMIT} s) $(date -u +%T)"
timeout "$TRAIN_LIMIT" python3 -m mecefo_jax.main --config configs/llama_60m.py \
  --config.data.source=text --config.data.text_files="$ASSETS/corpus.txt" \
  --config.data.tokenizer_path="$ASSETS/tokenizer.model" \
  --config.train.steps="$TRAIN_STEPS" --config.train.eval_every=100 \
  --config.train.eval_batches=4 --config.train.checkpoint_every="$TRAIN_STEPS" \
  --config.train.log_every=10 --workdir /tmp/llama_60m > /tmp/llama_60m.log 2>&1
echo "llama_60m exit $?"; tail -25 /tmp/llama_60m.log
cp /tmp/llama_60m/metrics.jsonl "$OUT/llama_60m_metrics.jsonl" 2>/dev/null
tail -30 /tmp/llama_60m.log | sed -n '/^{/,/^}/p' > "$OUT/llama_60m_summary.json"
tar czf "$OUT/logs.tar.gz" -C /tmp gpu_report/sections llama_60m.log refresh_1b.log refresh_7b.log \
  compile.log 2>/dev/null
echo "== done $(date -u +%T)"
