#!/usr/bin/env bash
# Per-instruction (SASS) warp-state samples of the Hopper scorer at 8 x 128K, H 64 (device machine, one
# call; docs/perf-notes.md, "Not one saturated pipe, and not latency"), with the issue, pipe, occupancy and memory sections:
#   bash experiments/ncu_sm90_source.sh  -> $OUT/ncu_sm90_source.{ncu-rep,csv,txt,tsv} and _raw.csv
# The .tsv is experiments/ncu_source_summary.py's condensed form (its stall totals are printed last,
# after the headline metrics).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD"
OUTDIR="${OUT:-$PWD/out}"; mkdir -p "$OUTDIR"
R="$OUTDIR/ncu_sm90_source"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
SECTIONS=()
for s in WarpStateStats SourceCounters SpeedOfLight ComputeWorkloadAnalysis InstructionStats LaunchStats Occupancy \
         MemoryWorkloadAnalysis; do SECTIONS+=(--section "$s"); done
timeout 200 "$NCU" --clock-control none -k regex:fp4_paged_logits_sm90 -c 1 "${SECTIONS[@]}" \
  -o "$R" -f python3 -m experiments.ncu_sm90 0 >"$R.log" 2>&1
echo "ncu rc=$?"
"$NCU" -i "$R.ncu-rep" --page source --print-source sass --csv >"$R.csv" 2>&1
echo "source page rc=$? lines=$(wc -l <"$R.csv")"
"$NCU" -i "$R.ncu-rep" --page details >"$R.txt" 2>&1
"$NCU" -i "$R.ncu-rep" --page raw --csv >"${R}_raw.csv" 2>&1
python3 -m experiments.ncu_source_summary "$R.csv" >"$R.tsv"
grep -iE "duration|frequency|pipe|issue|eligible|active warps|throughput" "$R.txt" | head -40
grep "^# " "$R.tsv"
