"""Draw a decode benchmark report as horizontal bars: one bar per scorer per shape, the FP4 floor marked.

Usage (from the repository root; needs matplotlib):

    python scripts/plot_bench.py BENCH_JSON OUT.png

BENCH_JSON is a report written by ``sglang-fp4-indexer bench --json`` (decode rows; a
``--prefill`` report has no decode rows and is refused). One panel per index-head count (H 64,
H 32, ...); y = shape, x = time per call in µs (log scale); each scorer that ran is a bar,
the FP4 floor of the shape a black tick; the DeepGEMM columns' time over ours is written next
to their bars ("1.17x" = DeepGEMM FP8 takes 1.17 times as long as ours). Scorers whose status
is not "ok" at a shape get no bar there. docs/bench_h200.png is this script's output for the
report in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: Bar order and colours; scorers not listed here come after, in the report's order.
SCORERS = (
    ("ours", "ours (FP4)", "#1f77b4"),
    ("sglang-triton-fp4", "SGLang Triton FP4", "#2ca02c"),
    ("deepgemm-fp8", "DeepGEMM FP8, as SGLang 0.5.23 calls it", "#d62728"),
    ("deepgemm-fp8-native", "DeepGEMM FP8, native next_n", "#ff9896"),
)
#: Scorers whose time over ours is annotated.
RATIO_OF = ("deepgemm-fp8", "deepgemm-fp8-native", "sglang-triton-fp4")


def _shape_label(row: dict) -> str:
    # "H64 8x128K n2 w160K" -> "8x128K n2" (the panel says H; the width is in the title).
    parts = row["label"].split()
    return " ".join(p for p in parts[1:] if not p.startswith("w"))


def _width_note(rows: list[dict]) -> str:
    widths = {p for r in rows for p in r["label"].split()[1:] if p.startswith("w")}
    return f", logits {', '.join(sorted(w[1:] for w in widths))} wide" if widths else ""


def plot(report: dict, out: Path) -> Path:
    """Save the chart of ``report``'s decode rows to ``out``; returns ``out``.

    Raises:
        ValueError: the report has no decode rows with a timed scorer.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report.get("rows", []) if any(v.get("seconds") for v in r.get("results", {}).values())]
    if not rows:
        raise ValueError("no decode rows with a timed scorer (a --prefill report is not plotted here)")
    known = [n for n, _, _ in SCORERS]
    others = [s["name"] for s in report.get("scorers", []) if s["name"] not in known]
    names = [n for n in known + others if any(r["results"].get(n, {}).get("status") == "ok" for r in rows)]
    style = {n: (label, colour) for n, label, colour in SCORERS}
    heads = sorted({r["heads"] for r in rows}, reverse=True)
    by_heads = {h: [r for r in rows if r["heads"] == h] for h in heads}

    bar = 0.8 / max(1, len(names))
    fig, axes = plt.subplots(len(heads), 1, squeeze=False, sharex=True,
                             figsize=(9.5, 0.22 * len(rows) * max(2, len(names)) + 2.4),
                             gridspec_kw={"height_ratios": [len(by_heads[h]) for h in heads]})
    times = [v["seconds"] * 1e6 for r in rows for v in r["results"].values() if v.get("seconds")]
    times += [r["fp4_floor_s"] * 1e6 for r in rows]
    lo, hi = min(times) / 1.6, max(times) * 3.0
    for ax, h in zip(axes[:, 0], heads):
        group = by_heads[h]
        for i, row in enumerate(group):
            ours = row["results"].get("ours", {}).get("seconds")
            for j, name in enumerate(names):
                res = row["results"].get(name, {})
                if res.get("status") != "ok" or not res.get("seconds"):
                    continue
                y = i + (j - (len(names) - 1) / 2) * bar
                t = res["seconds"] * 1e6
                label, colour = style.get(name, (name, None))
                ax.barh(y, t, height=bar * 0.92, color=colour, label=label if i == 0 else None)
                if name in RATIO_OF and ours:
                    ax.text(t * 1.04, y, f"{res['seconds'] / ours:.2f}x", va="center", fontsize=7)
                elif name == "ours":
                    ax.text(t * 1.04, y, f"{t:.1f} µs", va="center", fontsize=7, color=colour)
            floor = row["fp4_floor_s"] * 1e6
            ax.plot([floor, floor], [i - 0.45, i + 0.45], color="black", linewidth=2,
                    label="FP4 floor" if i == 0 else None)
        ax.set_yticks(range(len(group)))
        ax.set_yticklabels([_shape_label(r) for r in group])
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylabel(f"H {h}")
        ax.grid(axis="x", which="both", alpha=0.3)
    axes[-1, 0].set_xlabel("time per call, µs (log scale); DeepGEMM's bars: its time over ours")
    meta = report.get("meta", {})
    bw = meta.get("copy_bandwidth_bytes_per_s")
    title = f"Indexer decode scoring on {meta.get('device', '?')}{_width_note(rows)}"
    if bw:
        title += f"\ncopy bandwidth {bw / 1e12:.2f} TB/s, CUDA graphs, median; every output checked"
    axes[0, 0].set_title(title, fontsize=10)
    handles, labels = [], []
    for ax in axes[:, 0]:
        for hnd, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(hnd)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench_json", metavar="BENCH_JSON", help="a report of 'sglang-fp4-indexer bench --json'")
    ap.add_argument("out", metavar="OUT.png", help="where the chart goes")
    args = ap.parse_args(argv)
    try:
        report = json.loads(Path(args.bench_json).read_text())
    except (OSError, ValueError) as exc:
        print(f"plot_bench: {args.bench_json}: {exc}", file=sys.stderr)
        return 2
    try:
        print(plot(report, Path(args.out)))
    except ValueError as exc:
        print(f"plot_bench: {args.bench_json}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
