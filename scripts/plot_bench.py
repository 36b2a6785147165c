"""Draw a decode benchmark report as horizontal bars (``bench.report.write_plot``, what ``bench --plot`` draws).

Usage (from the repository root; needs matplotlib):

    python scripts/plot_bench.py BENCH_JSON OUT.png

BENCH_JSON is a report written by ``sglang-fp4-indexer bench --json`` (decode rows; a
``--prefill`` report has none and is refused with exit code 2). docs/bench_h200.png is this
script's output for the report in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sglang_fp4_indexer.bench.report import write_plot


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
        print(write_plot(report, Path(args.out)))
    except ValueError as exc:
        print(f"plot_bench: {args.bench_json}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
