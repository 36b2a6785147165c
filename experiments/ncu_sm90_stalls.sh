#!/usr/bin/env bash
# Warp stall reasons of the Hopper scorer (device machine): bash experiments/ncu_sm90_stalls.sh -> $OUT/ncu_sm90_stalls.txt
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD"
OUTDIR="${OUT:-$PWD/out}"; mkdir -p "$OUTDIR"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
"$NCU" --clock-control none -k regex:fp4_paged_logits_sm90 -c 1 \
  --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active,smsp__inst_executed.sum' \
  python3 -m experiments.ncu_sm90 >"$OUTDIR/ncu_sm90_stalls.txt" 2>&1
echo "ncu rc=$?"
grep -E "stalled|pipe_|inst_executed" "$OUTDIR/ncu_sm90_stalls.txt" | awk '$NF+0 > 0.05' | sort -k3 -g -r | head -40
