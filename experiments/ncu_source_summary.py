"""Condense `ncu --page source --csv` output (experiments/ncu_sm90_source.sh) to one line per SASS instruction.

Usage: python3 -m experiments.ncu_source_summary ncu_sm90_source.csv > summary.tsv
Columns: offset from the kernel start, executions (warp level), warp-state samples, the three
largest stall reasons, the instruction. A last block totals the samples per stall reason.
"""
import collections
import csv
import sys

rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[1]
data = [r for r in rows[2:] if len(r) >= len(hdr)]
ix = {h: i for i, h in enumerate(hdr)}
stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
base = int(data[0][0], 16)
total = collections.Counter()
print("offset\texecuted\tsamples\ttop_stalls\tsass")
for r in data:
    st = {h[6:]: int(r[ix[h]] or 0) for h in stalls}
    total.update(st)
    top = " ".join(f"{k}={v}" for k, v in sorted(st.items(), key=lambda x: -x[1])[:3] if v)
    print(f"{int(r[0], 16) - base:x}\t{r[ix['Instructions Executed']]}\t{r[ix['Warp Stall Sampling (All Samples)']]}\t{top}\t{r[1].strip()}")
n = sum(total.values())
print("\n# samples per stall reason")
for k, v in total.most_common():
    print(f"# {k}\t{v}\t{100 * v / max(n, 1):.1f}%")
