#!/usr/bin/env bash
# Per-instruction (SASS) warp-state samples of the Hopper scorer at 8 x 128K, H 64 (device machine):
#   bash scripts/ncu_sm90_source.sh  -> $OUT/ncu_sm90_source.csv (+ .txt: the stall reasons summary)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD"
OUTDIR="${OUT:-$PWD/out}"; mkdir -p "$OUTDIR"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
"$NCU" --clock-control none -k regex:fp4_paged_logits_sm90 -c 1 --section WarpStateStats --section SourceCounters \
  -o "$OUTDIR/ncu_sm90_source" -f python3 scripts/ncu_sm90.py 0 >"$OUTDIR/ncu_sm90_source.log" 2>&1
echo "ncu rc=$?"
"$NCU" -i "$OUTDIR/ncu_sm90_source.ncu-rep" --page source --print-source sass --csv >"$OUTDIR/ncu_sm90_source.csv" 2>&1
echo "source page rc=$? lines=$(wc -l <"$OUTDIR/ncu_sm90_source.csv")"
"$NCU" -i "$OUTDIR/ncu_sm90_source.ncu-rep" --page details >"$OUTDIR/ncu_sm90_source.txt" 2>&1
grep -iE "stall|issued|eligible|active warps" "$OUTDIR/ncu_sm90_source.txt" | head -40
