#!/usr/bin/env bash
# ncu of the default Hopper scorer at 8 x 128K, H 64 (device machine, one call; docs/perf-notes.md runs 20, 25):
# warp-state samples per SASS instruction, pipe utilisation, issue and memory sections.
#   bash scripts/ncu_wgs_probe.sh  -> "$OUT/ncu0."{ncu-rep,csv,txt,tsv} and ncu0_raw.csv; prints the stall
#   totals and the headline metrics last. The .tsv is scripts/ncu_source_summary.py's condensed form.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
timeout 200 "$NCU" --clock-control none -k regex:fp4_paged_logits_sm90 -c 1 --section WarpStateStats --section SourceCounters --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
  -o "$OUT/ncu0" -f python3 scripts/ncu_sm90.py 0 > "$OUT/ncu0.log" 2>&1; echo rc=$?
"$NCU" -i "$OUT/ncu0.ncu-rep" --page source --print-source sass --csv > "$OUT/ncu0.csv" 2>&1
"$NCU" -i "$OUT/ncu0.ncu-rep" --page details > "$OUT/ncu0.txt" 2>&1
"$NCU" -i "$OUT/ncu0.ncu-rep" --page raw --csv > "$OUT/ncu0_raw.csv" 2>&1
python3 scripts/ncu_source_summary.py "$OUT/ncu0.csv" > "$OUT/ncu0.tsv"
tail -22 "$OUT/ncu0.tsv"
grep -iE "duration|frequency|pipe|issue|eligible|active warps|throughput" "$OUT/ncu0.txt" | head -60
