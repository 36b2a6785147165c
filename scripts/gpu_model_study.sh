#!/usr/bin/env bash
# The long-context model study on a GPU machine, after scripts/model_files.sh brought the model there.
# Trains the lightning indexer once (seeded), then runs the study with the stand-in and with the trained
# indexer (--preset long-context, --device cuda), each resuming where an earlier call stopped; results
# live in $WORK (kept while the machine stays warm) and are copied to $OUT at the end of every call.
#
#   bash scripts/gpu_model_study.sh        # again in the next call until it prints "study complete"
# Environment: OUT (default ./out), WORK (default /tmp/model-study), LIMIT (seconds for this call, default
# 540), PYTHON (default python3), TRAIN_STEPS (default 2000), TRAIN_CONTEXT and TRAIN_SEQUENCES (tokens per
# training sequence and how many, the CLI's defaults 4096 and 16 when unset; Python 3.11's training text holds at
# most 13 sequences of 8192, 6 of 16384), MODEL_DIR (as model_files.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUTDIR="${OUT:-$PWD/out}"
WORK="${WORK:-/tmp/model-study}"
LIMIT="${LIMIT:-540}"
MODEL_DIR="${MODEL_DIR:-/tmp/gemma-model}"
mkdir -p "$OUTDIR" "$WORK"
unset TRITON_INTERPRET
export PYTHONUNBUFFERED=1
[ -f "$MODEL_DIR/env.sh" ] || { echo "no $MODEL_DIR/env.sh: run scripts/model_files.sh receive first" >&2; exit 1; }
source "$MODEL_DIR/env.sh"
END=$((SECONDS + LIMIT))
left() { echo $((END - SECONDS)); }
CLI=("$PY" -m sglang_fp4_indexer.cli model-accuracy --device cuda)
if [ ! -f "$WORK/indexer.pt" ]; then
  timeout -k 10 "$(left)" "${CLI[@]}" --train-indexer "$WORK/indexer.pt" --train-seed 0 \
    --train-steps "${TRAIN_STEPS:-2000}" ${TRAIN_CONTEXT:+--train-context "$TRAIN_CONTEXT"} \
    ${TRAIN_SEQUENCES:+--train-sequences "$TRAIN_SEQUENCES"} --out-dir "$WORK/train" >"$WORK/train.log" 2>&1
  echo "== training: rc=$? ($(tail -n 1 "$WORK/train.log"))"
fi
for KIND in stand-in trained; do
  [ "$(left)" -gt 30 ] || break
  EXTRA=()
  [ "$KIND" = trained ] && EXTRA=(--indexer trained --indexer-weights "$WORK/indexer.pt")
  RESUME=()
  [ -f "$WORK/$KIND/model-accuracy.json" ] && RESUME=(--resume)
  timeout -k 10 "$(left)" "${CLI[@]}" --preset long-context "${EXTRA[@]}" ${RESUME[@]+"${RESUME[@]}"} \
    --out-dir "$WORK/$KIND" >>"$WORK/$KIND.log" 2>&1
  RC=$?
  echo "== $KIND: rc=$RC"
  [ "$RC" = 0 ] && touch "$WORK/$KIND.done"
done
for KIND in stand-in trained; do
  [ -f "$WORK/$KIND/model-accuracy.json" ] && cp "$WORK/$KIND/model-accuracy.json" "$OUTDIR/$KIND.json"
  [ -f "$WORK/$KIND/model-accuracy.md" ] && cp "$WORK/$KIND/model-accuracy.md" "$OUTDIR/$KIND.md"
  [ -f "$WORK/$KIND.log" ] && tail -c 200000 "$WORK/$KIND.log" >"$OUTDIR/$KIND.log"
done
[ -f "$WORK/indexer.pt" ] && cp "$WORK/indexer.pt" "$OUTDIR/indexer.pt"
[ -f "$WORK/train.log" ] && cp "$WORK/train.log" "$OUTDIR/train.log"
if [ -f "$WORK/stand-in.done" ] && [ -f "$WORK/trained.done" ]; then echo "== study complete"; else
  echo "== study not complete: run this script again in the next call (it resumes)"; fi
