#!/usr/bin/env bash
# Hardware counters of the Hopper scorer (device machine): bash experiments/ncu_sm90.sh  -> $OUT/ncu_sm90.txt
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD"
OUTDIR="${OUT:-$PWD/out}"; mkdir -p "$OUTDIR"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
"$NCU" --clock-control none -k regex:fp4_paged_logits_sm90 --launch-skip 0 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
  --section InstructionStats --section ComputeWorkloadAnalysis --section SourceCounters \
  python3 -m experiments.ncu_sm90 >"$OUTDIR/ncu_sm90.txt" 2>&1
echo "ncu rc=$?"
grep -E "fp4_paged_logits_sm90|Duration|Compute \(SM\) Throughput|DRAM Throughput|Executed Ipc A|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Achieved Occupancy|Executed Instructions  |Stall|stall" "$OUTDIR/ncu_sm90.txt" | grep -v "^==PROF" | head -80
