"""Rendering a benchmark report: the rich table, a plain-text summary, JSON and the plot.

``python -m sglang_fp4_indexer.bench.report REPORT.json`` prints the plain
summary of a saved report, decode or ``--prefill`` (scripts/gpu_run.sh ends with it).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from rich.table import Table

from .timing import CPU_TIMING_NOTE, HOST_CALLS, HOST_WARMUP

__all__ = ["render_table", "render_summary", "write_json", "load_json", "write_plot", "main"]


def _us(seconds) -> str:
    if seconds is None or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return "-"
    us = seconds * 1e6
    return f"{us:.0f}" if us >= 1000 else f"{us:.1f}" if us >= 10 else f"{us:.2f}"


def _is_cpu(report: dict) -> bool:
    return report.get("meta", {}).get("device_type") != "cuda"


def _status_cell(res: dict) -> str | None:
    status = res.get("status", "")
    if status == "ok":
        return None
    if status == "unavailable":
        return "n/a"
    if status == "check failed":
        return "CHECK FAILED"
    return "ERROR"


#: What the host column is.
HOST_NOTE = (f"host: host wall time per call made eagerly, as its serving caller makes it ({HOST_WARMUP} warm-up "
             f"calls, then {HOST_CALLS} back to back, synchronised only at the end); the other times are device "
             "times in CUDA graphs")


def _has_host(report: dict) -> bool:
    """Whether any scorer result of ``report`` has a host time (CUDA runs since host timing was added)."""
    return any("host_s" in res for row in report.get("rows", []) for res in row.get("results", {}).values())


def _scorer_names(report: dict) -> list[str]:
    return [s["name"] for s in report.get("scorers", [])]


#: Short names of what binds a roofline floor (``floor.binding_floor``).
_BINDS = {"HBM": "HBM", "tensor cores": "TC"}


def _has_roofline(report: dict) -> bool:
    """Whether the run measured the tensor-core rate, so rows carry the roofline floor (CUDA runs)."""
    return bool(report.get("meta", {}).get("fp8_mma_flops_per_s"))


def render_table(report: dict) -> Table:
    """The full table: per shape, each scorer's time, its host time per eager call (CUDA runs), % of its own
    floor and ours' speed-up over it, and the checks."""
    cpu = _is_cpu(report)
    meta = report.get("meta", {})
    bw = meta.get("copy_bandwidth_bytes_per_s") or float("nan")
    title = f"paged scorer, {meta.get('device', '?')}: times in us ({meta.get('timing', '')})"
    table = Table(title=title, title_justify="left")
    table.add_column("shape (H, batch x ctx, next_n)")
    table.add_column("FP4 floor", justify="right")
    names = _scorer_names(report)
    host = _has_host(report)
    roof = _has_roofline(report)
    if roof:
        table.add_column("TC floor", justify="right")
    for name in names:
        table.add_column(name, justify="right")
        if host:
            table.add_column("host", justify="right")
        table.add_column("% floor", justify="right")
        if roof:
            table.add_column("% roofline", justify="right")
        if not name.startswith("ours"):
            table.add_column("ours x", justify="right")
    table.add_column("FP8 floor", justify="right")
    table.add_column("checks")
    for row in report.get("rows", []):
        cells = [row["label"], _us(row.get("fp4_floor_s"))]
        if roof:
            cells.append(_us(row.get("tensor_core_floor_s")) if row.get("tensor_core_floor_s") else "")
        fails = []
        for name in names:
            res = row["results"].get(name, {})
            bad = _status_cell(res)
            if bad is not None and bad != "n/a":
                fails.append(f"{name}: {res.get('status')}" + (f" ({res['check']['detail']})" if "check" in res and not res["check"]["ok"] else ""))
            cells.append(_us(res.get("seconds")) if "seconds" in res else (bad or "-"))
            if host:
                cells.append(_us(res.get("host_s")) if "host_s" in res else "")
            cells.append(f"{res['pct_floor']:.1f}" if "pct_floor" in res else "")
            if roof:
                cells.append(f"{res['pct_roofline']:.1f} ({_BINDS[res['binds']]})" if "pct_roofline" in res else "")
            if not name.startswith("ours"):
                sp = res.get("speedup_of_ours")
                cells.append(f"{sp:.2f}" if sp else "")
        cells.append(_us(row.get("fp8_floor_s")))
        cells.append("ok" if not fails else "; ".join(fails))
        table.add_row(*cells)
    unavailable = [f"{s['name']}: {s['status']}" for s in report.get("scorers", []) if s["status"] != "available"]
    notes = [f"copy bandwidth {bw / 1e12:.3f} TB/s (read + write)" if not cpu else f"copy bandwidth {bw / 1e9:.2f} GB/s"]
    notes.append("% floor: of the scorer's own format (FP4 68 B/key, FP8 132 B/key, + 4 B/logit); "
                 "ours x: the peer's time over ours")
    if roof:
        rate = meta.get("fp8_mma_flops_per_s")
        notes.append(f"TC floor: the call's FLOPs (2 x next_n x heads x 128 per key) at the dense FP8 GEMM rate "
                     f"measured in this run, {rate / 1e12:.0f} TFLOP/s ({meta.get('fp8_mma_gemm')}); % roofline: of "
                     "the larger of the scorer's HBM floor and the TC floor (HBM or TC: which one binds)")
    if host:
        notes.append(HOST_NOTE)
    notes.extend(unavailable)
    table.caption = "\n".join(notes)
    table.caption_justify = "left"
    return table


def _op_line(name: str, row: dict | None, extra: str) -> str | None:
    """One op's summary line: time, ``extra`` (its floor or target; empty on the CPU), then its check."""
    if not row:
        return None
    if "seconds" not in row:
        return f"{name}: {row.get('status')}"
    check = row.get("check", {})
    status = row.get("status")
    detail = f": {check.get('detail', '')}" if check and not check.get("ok") else ""
    return f"{name}: {_us(row['seconds'])} us{' ' + extra if extra else ''} [check {status}{detail}]"


def _op_lines(report: dict, cpu: bool) -> list[str | None]:
    """The store op's and the planner's lines. A CPU time is not compared with a GPU floor or target."""
    lines: list[str | None] = []
    store = report.get("store")
    if store:
        pct = ("" if cpu or "pct_floor" not in store
               else f"= {store['pct_floor']:.0f}% of its floor {_us(store.get('floor_s'))} us")
        lines.append(_op_line(f"store_index_k x {store.get('tokens')} tokens", store, pct))
    planner = report.get("planner")
    if planner:
        target = planner.get("target_s")
        if cpu or not target or "seconds" not in planner:
            extra = "" if not cpu else f"(its {_us(target)} us target is for a GPU; no CPU target)"
        else:
            extra = f"(target {_us(target)} us: {'met' if planner['seconds'] <= target else 'missed'})"
        lines.append(_op_line(f"planner, batch {planner.get('batch')}", planner, extra))
    return lines


def render_summary(report: dict, rows: bool = True) -> str:
    """A short plain-text summary (fits a log tail): one line per shape, then the store op and the planner.

    Args:
        report: from ``runner.run_benchmark`` (or ``load_json``).
        rows: include the per-shape lines; ``bench`` passes False because it
            has just printed them in the wide table (``render_table``).

    On the CPU (the Triton interpreter) times are not speed figures: the store
    op's floor and the planner's GPU target are left out of its lines.
    """
    cpu = _is_cpu(report)
    meta = report.get("meta", {})
    names = _scorer_names(report)
    host = _has_host(report)
    cell_w = (28 if host else 21) + (10 if _has_roofline(report) else 0)
    bw = meta.get("copy_bandwidth_bytes_per_s") or float("nan")
    lines = [
        f"== benchmark summary: {meta.get('device', '?')}, torch {meta.get('torch')}, triton {meta.get('triton')}",
        (f"   copy bandwidth {bw / 1e12:.3f} TB/s; times in us per call (CUDA graphs, median)" if not cpu
         else f"   times: {CPU_TIMING_NOTE}"),
    ]
    for s in report.get("scorers", []):
        if s["status"] != "available":
            lines.append(f"   {s['name']}: {s['status']}")
    if rows:
        lines.append(f"{'shape':<22}{'floor':>8}" + "".join(f"{n[:20]:>{cell_w}}" for n in names) + "  checks")
    failed_shapes = []
    for row in report.get("rows", []):
        cells = f"{row['label']:<22}{_us(row.get('fp4_floor_s')):>8}"
        fails = []
        for name in names:
            res = row["results"].get(name, {})
            if "seconds" in res:
                if name.startswith("ours"):
                    tag = f"({res['pct_floor']:.0f}%)" if "pct_floor" in res else ""
                    if "pct_roofline" in res:
                        tag = f"({res['pct_floor']:.0f}%, r{res['pct_roofline']:.0f}% {_BINDS[res['binds']]})"
                else:
                    sp = res.get("speedup_of_ours")
                    tag = f"(x{sp:.2f})" if sp else ""
                cell = f"{_us(res['seconds'])} {tag}" + (f" h{_us(res['host_s'])}" if "host_s" in res else "")
            else:
                cell = _status_cell(res) or "-"
            if res.get("status") not in ("ok", "unavailable"):
                fails.append(name)
            cells += f"{cell:>{cell_w}}"
        if fails:
            failed_shapes.append(f"{row['label']}: FAIL " + ",".join(fails))
        if rows:
            lines.append(cells + "  " + ("ok" if not fails else "FAIL " + ",".join(fails)))
    if not rows:
        lines.extend(failed_shapes)
    lines.extend(_op_lines(report, cpu))
    lines.append(f"failures: {report.get('failures', 0)}")
    if rows and any(n.startswith("ours") for n in names):
        lines.append("   ours: (% of FP4 floor" + (", r% of the roofline floor and what binds it" if _has_roofline(report)
                                                    else "") + "); peers: (x = peer time / ours)"
                     + ("; h: host time per eager call" if host else ""))
    return "\n".join(line for line in lines if line is not None)


def _jsonable(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_json(report: dict, path: str | Path) -> Path:
    """Write the report as JSON (non-finite floats as ``null``); creates parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_jsonable(report), indent=1) + "\n")
    return path


def load_json(path: str | Path) -> dict:
    """Read a report written by ``write_json``."""
    return json.loads(Path(path).read_text())


#: Bar order and colours; scorers not listed here come after, in the report's order.
PLOT_SCORERS = (
    ("ours", "ours (FP4)", "#1f77b4"),
    ("sglang-triton-fp4", "SGLang Triton FP4", "#2ca02c"),
    ("deepgemm-fp8", "DeepGEMM FP8, as SGLang 0.5.23 calls it", "#d62728"),
    ("deepgemm-fp8-native", "DeepGEMM FP8, native next_n", "#ff9896"),
    ("deepgemm-fp8-sm90-multicast", "DeepGEMM FP8, newer SM90 kernel (2-CTA next_n 4)", "#9467bd"),
)
#: Scorers whose time over ours is annotated.
_RATIO_OF = ("deepgemm-fp8", "deepgemm-fp8-native", "deepgemm-fp8-sm90-multicast", "sglang-triton-fp4")


def _shape_label(row: dict) -> str:
    # "H64 8x128K n2 w160K" -> "8x128K n2" (the panel says H; the width is in the title).
    parts = row["label"].split()
    return " ".join(p for p in parts[1:] if not p.startswith("w"))


def _width_note(rows: list[dict]) -> str:
    widths = {p for r in rows for p in r["label"].split()[1:] if p.startswith("w")}
    return f", logits {', '.join(sorted(w[1:] for w in widths))} wide" if widths else ""


def write_plot(report: dict, path: str | Path) -> Path:
    """Save a horizontal bar chart of ``report``'s decode rows to ``path`` (PNG); returns the path.

    One panel per index-head count; y = shape, x = time per call in µs (log
    scale); one bar per scorer that ran (status ``ok``), the shape's FP4 floor
    a black tick; the peers' time over ours written next to their bars. A CPU
    report says so in the title (its times are the interpreter's, not a
    speed). matplotlib is imported here (``Agg`` backend).

    Raises:
        ModuleNotFoundError: matplotlib is not installed.
        ValueError: the report has no decode rows with a timed scorer (a ``--prefill`` report).
    """
    out = Path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report.get("rows", []) if any(v.get("seconds") for v in r.get("results", {}).values())]
    if not rows:
        raise ValueError("no decode rows with a timed scorer (a --prefill report is not plotted here)")
    known = [n for n, _, _ in PLOT_SCORERS]
    others = [s["name"] for s in report.get("scorers", []) if s["name"] not in known]
    names = [n for n in known + others if any(r["results"].get(n, {}).get("status") == "ok" for r in rows)]
    style = {n: (label, colour) for n, label, colour in PLOT_SCORERS}
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
                if name in _RATIO_OF and ours:
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
    if _is_cpu(report):
        title += f"\n({CPU_TIMING_NOTE})"
    elif bw:
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
    """Print ``render_summary`` of each JSON report named on the command line."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m sglang_fp4_indexer.bench.report REPORT.json [...]", file=sys.stderr)
        return 2
    for path in argv:
        report = load_json(path)
        if "prefill" in report:  # a ``bench --prefill`` report
            from .prefill import render_prefill_summary

            print(render_prefill_summary(report))
        else:
            print(render_summary(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
