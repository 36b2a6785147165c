#!/usr/bin/env bash
# Hardware counters of the hot kernels (device machine, Firecracker: ncu works there).
# Usage: bash experiments/ncu_probe.sh   (writes $OUT/ncu.txt, prints the key lines)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD"
OUTDIR="${OUT:-$PWD/out}"; mkdir -p "$OUTDIR"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
"$NCU" --clock-control none -k regex:'_paged_logits_kernel|_store_index_k_kernel|_plan_kernel' \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis --section SchedulerStats \
  python3 -m experiments.ncu_driver >"$OUTDIR/ncu.txt" 2>&1
echo "ncu rc=$?"
grep -E "^  [_a-zA-Z].*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Block Limit Registers|Block Limit Shared|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Dynamic Shared|Static Shared|L1/TEX Hit|L2 Hit" "$OUTDIR/ncu.txt" | grep -v "^==PROF" | head -120
