"""The table of past headline results: one CSV row per decode shape of each benchmark run.

``benchmarks/results/headline.csv`` keeps, for every decode report that
``sglang-fp4-indexer bench --json`` wrote and that was committed, each shape's
time of this package's scorer beside DeepGEMM FP8 (as SGLang calls it, and
with its native next_n) and SGLang's Triton FP4 scorer, and the share of the
FP4 HBM floor reached. The rows are read from the report, never typed by hand:

    python -m sglang_fp4_indexer.bench.history append benchmarks/results/headline.csv out/bench.json

appends one row per shape of ``out/bench.json`` (``scripts/gpu_run.sh`` does
this after its benchmark, into a copy under its output folder). Only decode
reports have such rows; a ``bench --prefill`` report is refused.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

__all__ = ["COLUMNS", "headline_rows", "append_headline", "read_headline", "main"]

#: The CSV's columns, in order. Times in microseconds per call; empty where the
#: scorer was not timed or did not pass its check in that run.
COLUMNS = (
    "gpu",                    # meta.device of the report, e.g. "NVIDIA H200"
    "date",                   # meta.date of the report (ISO 8601, UTC)
    "commit",                 # the repository commit whose code was measured, where known; else empty
    "shape",                  # e.g. "H64 8x128K next_n 1 @160K" (@: logits width in columns, when set)
    "spec",                   # the same shape as bench --shapes takes it, e.g. "64x8x128Kx1@160K"
    "ours_impl",              # the paged_logits formulation timed as "ours" (wgmma, folded, scaled, ...)
    "ours_us",                # this package's paged FP4 scorer
    "deepgemm_sglang_us",     # DeepGEMM fp8_paged_mqa_logits as SGLang calls it on that GPU
    "deepgemm_native_us",     # DeepGEMM fp8_paged_mqa_logits with its native next_n
    "sglang_triton_fp4_us",   # SGLang's own Triton FP4 scorer
    "fp4_floor_us",           # FP4 bytes of the call over the copy bandwidth of the same run
    "pct_fp4_floor",          # 100 * fp4_floor / ours, in %
    "source",                 # the report the row was read from
)

#: Report scorer name for each peer column.
_PEERS = (
    ("deepgemm_sglang_us", "deepgemm-fp8"),
    ("deepgemm_native_us", "deepgemm-fp8-native"),
    ("sglang_triton_fp4_us", "sglang-triton-fp4"),
)


def _ours_name(report: dict, source: str) -> str:
    """The report's "ours" column: ``ours``, else the first ``ours[IMPL]`` of its scorer list (the
    first ``--impl`` given, which every recorded run listed first as its default)."""
    names = [s.get("name", "") for s in report.get("scorers", [])]
    for name in names:
        if name == "ours" or name.startswith("ours["):
            return name
    raise ValueError(f"report {source}: no 'ours' scorer in its scorer list {names}")


def _us(result: dict | None) -> str:
    """A timed result's seconds as microseconds (``repr``, so reading it back gives the same float);
    empty unless the result's status is ``ok``."""
    if not result or result.get("status") != "ok" or not isinstance(result.get("seconds"), (int, float)):
        return ""
    return repr(result["seconds"] * 1e6)


def _shape(row: dict) -> str:
    spec = row["spec"]
    context = row["context"]
    ctx = f"{context // 1024}K" if context % 1024 == 0 else str(context)
    width = f" @{spec.split('@', 1)[1]}" if "@" in spec else ""
    return f"H{row['heads']} {row['batch']}x{ctx} next_n {row['next_n']}{width}"


def headline_rows(bench_json: dict, source: str = "", commit: str | None = None) -> list[dict]:
    """One headline row per decode shape of a benchmark report.

    Args:
        bench_json: a decode report as ``sglang-fp4-indexer bench --json``
            writes it (``meta``, ``scorers``, ``rows``; each row's ``results``
            keyed by scorer name, with ``status``, ``seconds`` and, for ours,
            ``pct_floor`` and ``impl``).
        source: the report's file name, recorded in the ``source`` column.
        commit: the commit whose code was measured; ``None`` takes the
            report's ``meta.commit`` when it has one, else the column is empty.

    Returns:
        A list of dicts with exactly the keys of ``COLUMNS``, all values
        strings, in the report's shape order. Times are microseconds per call
        (the report's seconds times 1e6); a scorer that was not in the run,
        was unavailable or failed its check leaves its cell empty.

    Raises:
        ValueError: ``bench_json`` is not a decode report (no ``rows``, e.g. a
            ``bench --prefill`` report) or has no ``ours`` scorer.
    """
    if not isinstance(bench_json, dict) or not isinstance(bench_json.get("rows"), list):
        kind = "a bench --prefill report" if isinstance(bench_json, dict) and "prefill" in bench_json else "not a report"
        raise ValueError(f"report {source or '(given)'}: no decode rows ({kind}); "
                         "the headline table takes decode reports of sglang-fp4-indexer bench --json")
    meta = bench_json.get("meta", {})
    ours_name = _ours_name(bench_json, source)
    if commit is None:
        commit = meta.get("commit") or ""
    out = []
    for row in bench_json["rows"]:
        results = row.get("results", {})
        ours = results.get(ours_name)
        timed = bool(_us(ours))
        impl = (ours or {}).get("impl") or (ours_name[5:-1] if ours_name.startswith("ours[") else "")
        floor_s = row.get("fp4_floor_s")
        pct = ours.get("pct_floor") if timed else None
        if timed and pct is None and isinstance(floor_s, (int, float)):
            pct = 100 * floor_s / ours["seconds"]
        rec = {
            "gpu": meta.get("device", ""),
            "date": meta.get("date", ""),
            "commit": commit,
            "shape": _shape(row),
            "spec": row["spec"],
            "ours_impl": impl,
            "ours_us": _us(ours),
            **{col: _us(results.get(name)) for col, name in _PEERS},
            "fp4_floor_us": repr(floor_s * 1e6) if isinstance(floor_s, (int, float)) else "",
            "pct_fp4_floor": repr(pct) if pct is not None else "",
            "source": source,
        }
        out.append(rec)
    return out


def read_headline(csv_path: str | Path) -> list[dict]:
    """The rows of a headline CSV as dicts of strings (``csv.DictReader``).

    Raises:
        ValueError: the file's header is not ``COLUMNS``.
    """
    with open(csv_path, newline="") as fh:
        reader = csv.DictReader(fh)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(f"csv_path {csv_path}: header {reader.fieldnames} is not the headline table's "
                             f"{list(COLUMNS)}")
        return list(reader)


def append_headline(csv_path: str | Path, bench_json_path: str | Path, commit: str | None = None,
                    source: str | None = None) -> list[dict]:
    """Append the headline rows of the report at ``bench_json_path`` to the CSV at ``csv_path``.

    The CSV is created with its header when it does not exist. ``source``
    defaults to the report's path as given (relative to the working folder
    when under it). A run is identified by (gpu, date, spec): appending a
    report whose rows are already there is refused, so the table never counts
    a measurement twice.

    Returns:
        The rows appended (``headline_rows``).

    Raises:
        ValueError: the report is not a decode report, the CSV's header is not
            ``COLUMNS``, or the CSV already holds a row of this run.
        OSError: a file cannot be read or written.
    """
    path = Path(bench_json_path)
    if source is None:
        try:
            source = str(path.resolve().relative_to(Path.cwd().resolve()))
        except ValueError:
            source = str(path)
    rows = headline_rows(json.loads(path.read_text()), source=source, commit=commit)
    csv_path = Path(csv_path)
    exists = csv_path.exists() and csv_path.stat().st_size > 0
    if exists:
        seen = {(r["gpu"], r["date"], r["spec"]) for r in read_headline(csv_path)}
        dup = [r["spec"] for r in rows if (r["gpu"], r["date"], r["spec"]) in seen]
        if dup:
            raise ValueError(f"report {source}: the run of {rows[0]['date']} on {rows[0]['gpu']} is already in "
                             f"{csv_path} ({len(dup)} of its {len(rows)} shapes)")
    with open(csv_path, "a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, lineterminator="\n")
        if not exists:
            writer.writeheader()
        writer.writerows(rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    """``python -m sglang_fp4_indexer.bench.history append CSV REPORT.json [--commit C] [--source NAME]``.

    Returns:
        0 when the rows were appended, 2 on a usage error or a refused report
        (the message names the argument).
    """
    parser = argparse.ArgumentParser(prog="python -m sglang_fp4_indexer.bench.history",
                                     description="the table of past headline results (benchmarks/results/headline.csv)")
    sub = parser.add_subparsers(dest="action", required=True)
    app = sub.add_parser("append", help="append one row per decode shape of a bench --json report")
    app.add_argument("csv", help="the headline table (created with its header if missing)")
    app.add_argument("report", help="a decode report written by sglang-fp4-indexer bench --json")
    app.add_argument("--commit", default=None, help="the commit whose code was measured (default: the report's, "
                                                    "if it records one, else empty)")
    app.add_argument("--source", default=None, help="the name recorded in the source column (default: the "
                                                    "report's path as given)")
    args = parser.parse_args(argv)
    try:
        rows = append_headline(args.csv, args.report, commit=args.commit, source=args.source)
    except (ValueError, OSError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.csv}: {len(rows)} row(s) appended from {rows[0]['source'] if rows else args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
