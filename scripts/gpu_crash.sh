#!/usr/bin/env bash
# One GPU lease's real crash in one call of at most 8 minutes: configs/llama_350m.py:gpu
# launched on the one GPU, its worker SIGKILLed at random steps and restored from its
# keeper's host memory, then SIGKILLed with its keeper (the restore from the Orbax
# checkpoint on local disk); every way back taken apart (scripts/gpu_crash.py).
#
#   bash scripts/gpu_crash.sh OUT [ASSETS]        # on the GPU machine
#   bash scripts/gpu_crash.sh --smoke OUT [FLAGS]  # the same path on the CPU, configs/tiny.py
#
# ASSETS (default .gpu): whl/*.whl from scripts/gpu_wheels.sh (43 MB: ray, grain,
# ml_collections and what they need that the image lacks); corpus.txt and tokenizer.model
# to train on text, as scripts/gpu_session.sh's run did, the corpus cut to 8 MB
# (`head -c 8M`) so that a lease carries it all (40 steps read about 1.3 MB of it);
# without them, the prose of the machine's installed Python code (data.source=python_docs;
# its tokenizer is trained there first). The jobs run under WORK (default
# /tmp/gpu_crash; OUT/run for the smoke): their checkpoints stay there. Writes
# OUT/crash.{json,md} and OUT/records.tar.gz (the jobs' launch records and logs).
# STEPS, KILLS, CKPT and BUDGET (seconds, default 420) size it.
set -u
SMOKE=
if [ "${1:-}" = --smoke ]; then SMOKE=1; shift; fi
OUT=${1:?usage: gpu_crash.sh [--smoke] OUT [ASSETS | FLAGS]}
BUDGET=${BUDGET:-420}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
if [ -n "$SMOKE" ]; then
  WORK=${WORK:-$OUT/run}
  timeout "$BUDGET" python3 scripts/gpu_crash.py --smoke --config configs/tiny.py \
    --out "$WORK" "${@:2}"
  rc=$?
else
  ASSETS=${2:-.gpu}
  WORK=${WORK:-/tmp/gpu_crash}
  if ls "$ASSETS"/whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$ASSETS"/whl/*.whl && export PYTHONPATH=/tmp/site
  fi
  nvidia-smi -L
  # The keeper holds two snapshots of the 4.3 GiB state in shared memory (docs/gpu.md).
  mount -o remount,size=48G /dev/shm 2>/dev/null; df -h /dev/shm
  DATA=(--config.data.source=python_docs)  # the embedded corpus is small for 32,000 pieces
  if [ -f "$ASSETS/corpus.txt" ] && [ -f "$ASSETS/tokenizer.model" ]; then
    DATA=(--config.data.source=text --config.data.text_files="$ASSETS/corpus.txt"
          --config.data.tokenizer_path="$ASSETS/tokenizer.model")
  fi
  echo "== gpu_crash (budget ${BUDGET} s) $(date -u +%T)"
  timeout "$BUDGET" python3 scripts/gpu_crash.py --config configs/llama_350m.py:gpu \
    --config.data.global_batch_size=32 "${DATA[@]}" --out "$WORK" \
    --steps "${STEPS:-40}" --kills "${KILLS:-3}" --checkpoint_every "${CKPT:-10}"
  rc=$?
fi
cp "$WORK/crash.json" "$WORK/crash.md" "$OUT/" 2>/dev/null || echo "missing crash.json"
tar czf "$OUT/records.tar.gz" -C "$WORK" --exclude='*.npz' --exclude=xla_cache \
  --exclude=checkpoints jobs 2>/dev/null
echo "== done $(date -u +%T), exit $rc"
exit $rc
