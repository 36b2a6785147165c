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

from .timing import CPU_TIMING_NOTE

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


def _scorer_names(report: dict) -> list[str]:
    return [s["name"] for s in report.get("scorers", [])]


def render_table(report: dict) -> Table:
    """The full table: per shape, each scorer's time, % of its own floor and ours' speed-up over it, and the checks."""
    cpu = _is_cpu(report)
    meta = report.get("meta", {})
    bw = meta.get("copy_bandwidth_bytes_per_s") or float("nan")
    title = f"paged scorer, {meta.get('device', '?')}: times in us ({meta.get('timing', '')})"
    table = Table(title=title, title_justify="left")
    table.add_column("shape (H, batch x ctx, next_n)")
    table.add_column("FP4 floor", justify="right")
    names = _scorer_names(report)
    for name in names:
        table.add_column(name, justify="right")
        table.add_column("% floor", justify="right")
        if not name.startswith("ours"):
            table.add_column("ours x", justify="right")
    table.add_column("FP8 floor", justify="right")
    table.add_column("checks")
    for row in report.get("rows", []):
        cells = [row["label"], _us(row.get("fp4_floor_s"))]
        fails = []
        for name in names:
            res = row["results"].get(name, {})
            bad = _status_cell(res)
            if bad is not None and bad != "n/a":
                fails.append(f"{name}: {res.get('status')}" + (f" ({res['check']['detail']})" if "check" in res and not res["check"]["ok"] else ""))
            cells.append(_us(res.get("seconds")) if "seconds" in res else (bad or "-"))
            cells.append(f"{res['pct_floor']:.1f}" if "pct_floor" in res else "")
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
        lines.append(f"{'shape':<18}{'floor':>8}" + "".join(f"{n[:16]:>18}" for n in names) + "  checks")
    failed_shapes = []
    for row in report.get("rows", []):
        cells = f"{row['label']:<18}{_us(row.get('fp4_floor_s')):>8}"
        fails = []
        for name in names:
            res = row["results"].get(name, {})
            if "seconds" in res:
                if name.startswith("ours"):
                    tag = f"({res['pct_floor']:.0f}%)" if "pct_floor" in res else ""
                else:
                    sp = res.get("speedup_of_ours")
                    tag = f"(x{sp:.1f})" if sp else ""
                cell = f"{_us(res['seconds'])} {tag}"
            else:
                cell = _status_cell(res) or "-"
            if res.get("status") not in ("ok", "unavailable"):
                fails.append(name)
            cells += f"{cell:>18}"
        if fails:
            failed_shapes.append(f"{row['label']}: FAIL " + ",".join(fails))
        if rows:
            lines.append(cells + "  " + ("ok" if not fails else "FAIL " + ",".join(fails)))
    if not rows:
        lines.extend(failed_shapes)
    lines.extend(_op_lines(report, cpu))
    lines.append(f"failures: {report.get('failures', 0)}")
    if rows and any(n.startswith("ours") for n in names):
        lines.append("   ours: (% of FP4 floor); peers: (x = peer time / ours)")
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


def write_plot(report: dict, path: str | Path) -> Path:
    """Plot time vs context, one subplot per (H, batch, next_n), one line per scorer, the floors dashed.

    Log-log axes; the FP4 floor dashed, the FP8 floor dotted (when an FP8
    scorer is in the report). matplotlib is imported here (``Agg`` backend).

    Raises:
        ModuleNotFoundError: matplotlib is not installed.
        ValueError: the report has no scorer rows.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report.get("rows", [])
    if not rows:
        raise ValueError("report: no scorer rows to plot")
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["heads"], row["next_n"], row["batch"]), []).append(row)
    keys = sorted(groups, key=lambda k: (-k[0], k[1], k[2]))
    ncols = min(4, len(keys))
    nrows = -(-len(keys) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.4 * nrows), squeeze=False)
    names = _scorer_names(report)
    has_fp8 = any(s.get("key_bytes") == 132 for s in report.get("scorers", []))
    for ax, key in zip(axes.flat, keys):
        group = sorted(groups[key], key=lambda r: r["context"])
        ctx = [r["context"] for r in group]
        for name in names:
            pts = [(r["context"], r["results"].get(name, {}).get("seconds")) for r in group]
            pts = [(c, t * 1e6) for c, t in pts if t]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        ax.plot(ctx, [r["fp4_floor_s"] * 1e6 for r in group], "k--", marker="_", markersize=12, label="FP4 floor")
        if has_fp8:
            ax.plot(ctx, [r["fp8_floor_s"] * 1e6 for r in group], color="0.5", linestyle=":", marker="_",
                    markersize=12, label="FP8 floor")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"H {key[0]}, batch {key[2]}, next_n {key[1]}")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("time per call (us)")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels))
    meta = report.get("meta", {})
    title = f"paged scorer time vs context: {meta.get('device', '?')}"
    if _is_cpu(report):
        title += f" ({CPU_TIMING_NOTE})"
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
