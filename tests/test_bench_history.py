"""The table of past headline results (sglang_fp4_indexer/bench/history.py, benchmarks/results/headline.csv).

What is asserted: rows read from real committed reports, written to a CSV and
read back, equal the report's own numbers (the report is the oracle: each
scorer's ``seconds`` x 1e6, ``pct_floor``, ``fp4_floor_s``); which "ours"
column a report with several ``--impl`` variants contributes; that scorers
that were unavailable or not run leave empty cells; that a prefill report, a
second append of the same run and a foreign CSV header are refused; the
command line; and that the committed headline.csv is exactly what its source
reports give, covering every committed decode report.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_fp4_indexer.bench.history import COLUMNS, append_headline, headline_rows, main, read_headline

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
HEADLINE = RESULTS / "headline.csv"
PEERS = {"deepgemm_sglang_us": "deepgemm-fp8", "deepgemm_native_us": "deepgemm-fp8-native",
         "sglang_triton_fp4_us": "sglang-triton-fp4"}


def _report(name):
    return json.loads((RESULTS / name).read_text())


def _decode_reports():
    return sorted(p.name for p in RESULTS.glob("bench_*.json") if "rows" in json.loads(p.read_text()))


def _assert_row_is_report(cells: dict, report: dict, ours: str):
    """One CSV row against the report row of the same spec, float for float."""
    row = next(r for r in report["rows"] if r["spec"] == cells["spec"])
    res = row["results"]
    assert float(cells["ours_us"]) == res[ours]["seconds"] * 1e6
    assert float(cells["pct_fp4_floor"]) == res[ours]["pct_floor"]
    assert float(cells["fp4_floor_us"]) == row["fp4_floor_s"] * 1e6
    for col, name in PEERS.items():
        if name in res and res[name]["status"] == "ok":
            assert float(cells[col]) == res[name]["seconds"] * 1e6, (cells["spec"], col)
        else:
            assert cells[col] == "", (cells["spec"], col)
    assert (cells["gpu"], cells["date"]) == (report["meta"]["device"], report["meta"]["date"])


def test_current_report_round_trips_through_the_csv(tmp_path):
    csv_path = tmp_path / "headline.csv"
    src = RESULTS / "bench_h200_decode.json"
    written = append_headline(csv_path, src, commit="abc1234", source="benchmarks/results/bench_h200_decode.json")
    back = read_headline(csv_path)
    assert back == written and len(back) == 14
    report = _report("bench_h200_decode.json")
    for cells in back:
        _assert_row_is_report(cells, report, "ours")
        assert cells["ours_impl"] == "wgmma" and cells["commit"] == "abc1234"
        assert cells["source"] == "benchmarks/results/bench_h200_decode.json"
    big = next(c for c in back if c["spec"] == "64x8x128Kx1@160K")
    assert big["shape"] == "H64 8x128K next_n 1 @160K"
    # The figures docs/benchmarks.md prints for this shape.
    assert f"{float(big['ours_us']):.1f}" == "32.8" and f"{float(big['deepgemm_sglang_us']):.1f}" == "38.3"
    assert f"{float(big['pct_fp4_floor']):.0f}" == "56"
    assert f"{float(big['sglang_triton_fp4_us']):.1f}" == "935.6"


def test_older_report_takes_its_first_impl_and_leaves_unavailable_peers_empty():
    rows = headline_rows(_report("bench_h200_run3.json"), source="run3")
    assert [r["ours_impl"] for r in rows] == ["scaled"] * 7
    for cells in rows:
        _assert_row_is_report(cells, _report("bench_h200_run3.json"), "ours[scaled]")
        assert cells["deepgemm_sglang_us"] == cells["deepgemm_native_us"] == "" and cells["commit"] == ""
    assert rows[0]["shape"] == "H64 1x4K next_n 1"  # block-table width: no @
    later = headline_rows(_report("bench_h200_run32.json"))
    assert {r["ours_impl"] for r in later} == {"wgmma"}
    assert f"{float(later[2]['ours_us']):.1f}" == "32.0"  # HISTORY.md's 8 x 128K figure of that run


def test_a_failed_ours_check_leaves_the_time_empty():
    report = _report("bench_h200_decode.json")
    report["rows"][0]["results"]["ours"]["status"] = "check failed"
    row = headline_rows(report)[0]
    assert row["ours_us"] == row["pct_fp4_floor"] == ""
    assert float(row["deepgemm_sglang_us"]) == report["rows"][0]["results"]["deepgemm-fp8"]["seconds"] * 1e6


def test_refusals(tmp_path):
    with pytest.raises(ValueError, match="prefill"):
        headline_rows(_report("bench_h200_prefill.json"), source="bench_h200_prefill.json")
    report = _report("bench_h200_decode.json")
    report["scorers"] = [s for s in report["scorers"] if s["name"] != "ours"]
    with pytest.raises(ValueError, match="no 'ours' scorer"):
        headline_rows(report)
    csv_path = tmp_path / "h.csv"
    append_headline(csv_path, RESULTS / "bench_h200_run32.json")
    with pytest.raises(ValueError, match="already in"):
        append_headline(csv_path, RESULTS / "bench_h200_run32.json", source="elsewhere.json")
    assert len(read_headline(csv_path)) == 7  # nothing written by the refused append
    foreign = tmp_path / "foreign.csv"
    foreign.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="header"):
        append_headline(foreign, RESULTS / "bench_h200_run32.json")


def test_command_line(tmp_path, capsys):
    csv_path = tmp_path / "h.csv"
    assert main(["append", str(csv_path), str(RESULTS / "bench_h200_decode_first.json"), "--source", "first.json"]) == 0
    assert "14 row(s) appended" in capsys.readouterr().out
    assert main(["append", str(csv_path), str(RESULTS / "bench_h200_decode.json")]) == 0
    rows = read_headline(csv_path)
    assert len(rows) == 28 and rows[0]["source"] == "first.json"
    assert csv_path.read_text().splitlines()[0] == ",".join(COLUMNS)
    assert main(["append", str(csv_path), str(RESULTS / "bench_h200_prefill.json")]) == 2
    assert "no decode rows" in capsys.readouterr().err


def test_committed_headline_table_is_its_sources():
    rows = read_headline(HEADLINE)
    sources = list(dict.fromkeys(r["source"] for r in rows))
    assert sorted(Path(s).name for s in sources) == _decode_reports()  # every committed decode report, once
    for src in sources:
        want = headline_rows(json.loads((REPO / src).read_text()), source=src)
        got = [r for r in rows if r["source"] == src]
        assert [{k: v for k, v in r.items() if k != "commit"} for r in got] == \
               [{k: v for k, v in r.items() if k != "commit"} for r in want], src
    dates = [r["date"] for r in rows]
    assert dates == sorted(dates)  # appended in the order the runs were made
    for name, commit in (("bench_h200_decode.json", "8fa316f"), ("bench_h200_decode_2026-12-03.json", "d8bdeac")):
        measured = [r for r in rows if r["source"] == f"benchmarks/results/{name}"]
        assert len(measured) == 14 and {r["commit"] for r in measured} == {commit}, name
