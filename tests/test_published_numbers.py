"""Every published number is the measured table it comes from.

One source per number: the raw measurement files under benchmarks/results/
(the decode and prefill benchmark of the H200 run, the CPU and GPU accuracy
runs) and the tables ``check`` ships (sglang_fp4_indexer/data/h200_tables.json,
built from the same files). The pages that quote them -- README.md,
docs/benchmarks.md, docs/perf-notes.md, docs/accuracy.md, CHANGELOG.md -- are
checked against those files: each quoted figure is recomputed here from the
raw numbers and must appear as printed, and the tables on the pages must equal
the files cell by cell within the digits they show. Nothing is measured here.
"""

from __future__ import annotations

import gzip
import importlib.metadata as md
import importlib.util
import json
import re
from pathlib import Path

import pytest

from sglang_fp4_indexer.dcp import dcp_capacity
from sglang_fp4_indexer.model_study import report

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
K = 1024


def _json(name):
    return json.loads((RESULTS / name).read_text())


def _page(name):
    return (REPO / name).read_text()


def _flat(text):
    return " ".join(text.split())


#: The current decode report: what the pages and the check tables quote.
DECODE_REPORT = "bench_h200_decode_2026-12-03.json"
DECODE = _json(DECODE_REPORT)
PREFILL = _json("bench_h200_prefill.json")
ACC_CPU = _json("accuracy-cpu.json")
ACC_GPU = _json("accuracy-gpu.json")
TABLES = json.loads((REPO / "sglang_fp4_indexer" / "data" / "h200_tables.json").read_text())


def _row(heads, batch, context, next_n):
    return next(r for r in DECODE["rows"]
                if (r["heads"], r["batch"], r["context"], r["next_n"]) == (heads, batch, context, next_n))


def _us(row, scorer):
    res = row["results"][scorer]
    assert res["status"] == "ok", (row["label"], scorer)
    return res["seconds"] * 1e6


def _recall(acc, workload, context, heads):
    case = next(c for c in acc["cases"] if (c["workload"], c["context"], c["heads"]) == (workload, context, heads))
    return case["formats"]["FP8"]["recall_mean"], case["formats"]["FP4"]["recall_mean"]


def _shown(text: str, value: float) -> bool:
    """``text`` (a number as a page prints it, commas allowed) is ``value`` rounded to the digits it shows."""
    text = text.replace(",", "").strip()
    decimals = len(text.split(".")[1]) if "." in text else 0
    return abs(float(text) - value) <= 0.5 * 10 ** -decimals + 1e-9


def test_check_tables_are_built_from_the_published_reports():
    models = ["benchmarks/results/model-accuracy-h100-stand-in-long-context.json",
              "benchmarks/results/model-accuracy-h100-trained-indexer-long-context.json",
              "benchmarks/results/model-accuracy-cpu.json"]
    assert TABLES["sources"][:5] == [f"benchmarks/results/{DECODE_REPORT}", "benchmarks/results/accuracy-gpu.json",
                                     *models] and TABLES["model"]["sources"] == models
    assert TABLES["sources"][5:] == (TABLES["sglang"]["sources"] + TABLES["timing_serving"]["sources"]
                                     + TABLES["cycle"]["sources"] + TABLES["cycle_more"][0]["sources"]
                                     + TABLES["cycle_more"][0]["other_order_sources"]
                                     + TABLES["cycle_more"][0]["load_sources"] + TABLES["cycle_fused"]["sources"]
                                     + TABLES["timing_more"][0]["sources"])
    # The H100's kernel rows: the bench reports docs/benchmarks.md quotes beside DeepGEMM's newer SM90 kernel.
    page = (REPO / "docs" / "benchmarks.md").read_text()
    assert all(s.startswith(("benchmarks/results/bench_h100_sm90_multicast_", "benchmarks/results/bench_h100_q_one_"))
               and Path(s).name in page for s in TABLES["timing_more"][0]["sources"])
    assert TABLES["cycle_fused"]["sources"] == [f"benchmarks/results/{_GLM5}"]
    assert TABLES["cycle_more"][0]["sources"] == [f"benchmarks/results/{_R61}"]
    # The full-depth rank's KV-limited load: each pair's result lines and printed pools, FP8 server first, then
    # FP4 server first (test_tables rebuilds it).
    assert TABLES["cycle_more"][0]["load_sources"] == [
        f"benchmarks/results/{_KV61.format(part, order=order)}{ext}" for order in _KV61_ORDERS
        for part, ext in (("fp8_", ".jsonl"), ("fp4_", ".jsonl"), ("", ".txt"))]
    assert TABLES["cycle_more"][0]["other_order_sources"] == [f"benchmarks/results/{_R61_FP4_FIRST}"]
    # The verify-cycle rows are the timeline summaries the benchmarks page quotes (medians, both run orders).
    assert TABLES["cycle"]["sources"] == ["benchmarks/results/sglang_timeline_v32_rank20_mtp3x4_h200_2026-12-06.json",
                                          "benchmarks/results/sglang_timeline_v32_rank20_mtp_off_h200_2026-12-06.json"]
    assert TABLES["cycle"]["gpu"] == "NVIDIA H200"
    assert all(s.startswith("benchmarks/results/") and "2026-12-04" in s for s in TABLES["sglang"]["sources"])
    # The H100 rows come from the serving profile docs/benchmarks.md quotes (tests/test_tables.py rebuilds them).
    assert all("serving_profile_v32_layers_fp8_fp4_h100_" in s for s in TABLES["timing_serving"]["sources"])
    for t in TABLES["timing"]["rows"]:
        row = _row(t["heads"], t["batch"], t["context"], t["next_n"])
        assert _shown(f"{t['fp4_us']:.3f}", _us(row, "ours")) and _shown(f"{t['fp8_us']:.3f}", _us(row, "deepgemm-fp8"))


def _table_rows(page: str, after: str) -> list[list[str]]:
    """The body rows of the first Markdown table after the line ``after``."""
    lines = page[page.index(after):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| ---"))
    rows = []
    for line in lines[start + 1:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _shape(text):
    m = re.fullmatch(r"H(\d+) (\d+) × (\d+)K next_n (\d+)", text)
    return tuple(int(g) * (K if i == 2 else 1) for i, g in enumerate(m.groups()))


def _value_and_paren(cell):
    m = re.fullmatch(r"([\d.,]+)†? \((?:\*\*)?([\d.]+)(?:\*\*)?(?: %)?\)", cell)
    assert m, cell
    return m.group(1), m.group(2)


def test_benchmarks_decode_table_is_the_measured_report():
    rows = _table_rows(_page("docs/benchmarks.md"), "### Decode and target verify")
    assert len(rows) == len(DECODE["rows"]) == 14
    for cells in rows:
        row = _row(*_shape(cells[0]))
        ours = _us(row, "ours")
        assert _shown(cells[1], row["fp4_floor_s"] * 1e6), cells
        value, pct = _value_and_paren(cells[2])
        assert _shown(value, ours) and _shown(pct, 100 * row["fp4_floor_s"] * 1e6 / ours), cells
        for cell, scorer in ((cells[3], "deepgemm-fp8"), (cells[4], "deepgemm-fp8-native"),
                             (cells[5], "sglang-triton-fp4")):
            value, ratio = _value_and_paren(cell)
            assert _shown(value, _us(row, scorer)) and _shown(ratio, _us(row, scorer) / ours), (cells, scorer)
        assert _shown(cells[6], row["fp8_floor_s"] * 1e6), cells


def test_benchmarks_prefill_and_op_tables_are_the_measured_reports():
    page = _page("docs/benchmarks.md")
    store, planner = DECODE["store"], DECODE["planner"]
    assert (f"| {store['seconds'] * 1e6:.2f} µs | {store['floor_s'] * 1e6:.2f} µs | "
            f"{100 * store['floor_s'] / store['seconds']:.0f} % |") in page
    assert f"| {planner['seconds'] * 1e6:.2f} µs |" in page
    bw = DECODE["meta"]["copy_bandwidth_bytes_per_s"]
    assert f"{bw / 1e12:.3f} TB/s" in page
    row = _row(64, 8, 128 * K, 1)
    assert f"8 x 131072 x 72 B = {row['fp4_bytes'] / 1e6:.1f} MB, {row['fp4_floor_s'] * 1e6:.1f} µs" in page
    rows = _table_rows(page, "### Prefill")
    assert len(rows) == len(PREFILL["prefill"]) == 6
    for cells, r in zip(rows, PREFILL["prefill"]):
        assert cells[0] == f"{r['new'] // K}K new + {r['prefix'] // K}{'K' if r['prefix'] else ''} prefix", cells
        gather = r["gather"]
        m = re.fullmatch(r"([\d.]+) \((\d+) %\)", cells[1])
        assert _shown(m.group(1), gather["seconds"] * 1e6) and _shown(m.group(2), gather["pct_floor"]), cells
        for cell, name in ((cells[2], "ours[deepgemm]"), (cells[3], "ours[folded]"), (cells[4], "deepgemm-fp8")):
            ms, tflops = re.fullmatch(r"([\d.]+) \((\d+)\)", cell).groups()
            res = r["results"][name]
            assert _shown(ms, res["seconds"] * 1e3) and _shown(tflops, res["tflops"]), (cells, name)
        fp8 = r["results"]["deepgemm-fp8"]["seconds"]
        assert _shown(cells[5], fp8 / r["results"]["ours[deepgemm]"]["seconds"]), cells
        assert _shown(cells[6], fp8 / r["results"]["ours[folded]"]["seconds"]), cells


@pytest.mark.parametrize("acc, heading", [(ACC_CPU, "## CPU results"), (ACC_GPU, "## GPU results (H200, up to 128K)")],
                         ids=["cpu", "gpu"])
def test_accuracy_recall_tables_are_the_measured_runs(acc, heading):
    rows = _table_rows(_page("docs/accuracy.md"), heading)
    assert len(rows) == len(acc["cases"])
    for cells in rows:
        fp8, fp4 = _recall(acc, cells[0], int(cells[1].replace(",", "")), int(cells[2]))
        assert _shown(cells[4], fp8) and _shown(cells[7], fp4) and _shown(cells[10].lstrip("+"), fp4 - fp8), cells


def _ratio_range(rows, key):
    ratios = [_us(r, key) / _us(r, "ours") for r in rows]
    return min(ratios), max(ratios)


def _decode_rows(next_n=None, heads=None, min_keys=0):
    return [r for r in DECODE["rows"] if (next_n is None or (r["next_n"] == 1) == (next_n == 1))
            and (heads is None or r["heads"] == heads) and r["batch"] * r["context"] >= min_keys]


def _floor_pct(rows):
    pcts = [100 * r["fp4_floor_s"] * 1e6 / _us(r, "ours") for r in rows]
    return f"{min(pcts):.0f}-{max(pcts):.0f} %"


def _deepgemm_native_lead(rows):
    """How much less time DeepGEMM's native next_n path takes than ours, in %, over ``rows``."""
    leads = [100 * (1 - _us(r, "deepgemm-fp8-native") / _us(r, "ours")) for r in rows]
    return f"{min(leads):.0f}-{max(leads):.0f} %"


def _tokens(kv, w=1):
    return dcp_capacity(100 * 2**30, w, kv_bytes=kv, num_layers=61, num_index_layers=61)


def test_readme_quotes_the_measured_tables():
    page = _flat(_page("README.md"))
    big, small, verify = _row(64, 8, 128 * K, 1), _row(64, 1, 4 * K, 1), _row(64, 8, 128 * K, 2)
    for kv, label in ((1152, "bf16 MLA KV cache"), (656, "FP8 MLA KV cache")):
        cap = _tokens(kv)
        assert (f"| {cap.tokens_fp8:,} | {cap.tokens_fp4_replicated:,} (**+{cap.gain_replicated * 100:.1f} %**) |"
                in page), label
    assert f"| {_us(big, 'deepgemm-fp8'):.1f} µs (DeepGEMM) | **{_us(big, 'ours'):.1f} µs** |" in page
    assert f"| {_us(small, 'deepgemm-fp8'):.2f} µs (DeepGEMM) | **{_us(small, 'ours'):.2f} µs** |" in page
    assert f"| {_us(verify, 'deepgemm-fp8'):.1f} µs (DeepGEMM as SGLang 0.5.23 calls it on Hopper) |" in page
    assert f"| **{_us(verify, 'ours'):.1f} µs** |" in page
    (f8a, f4a), (f8b, f4b) = _recall(ACC_GPU, "text", 4 * K, 64), _recall(ACC_GPU, "text", 128 * K, 64)
    assert f"| {f8a:.3f} / {f8b:.3f} | {f4a:.3f} / {f4b:.3f} |" in page
    assert f"further from the exact one ({(f8b - f4b) * 100:.1f} points of recall at 128K on text)" in page
    assert f"FP4 still costs about {(f8a - f4a) * 100:.0f} points of recall at 4K" in page
    # DeepSeek-V3.2 has 64 index heads: its ranges come from the 64-head rows only, GLM-5's 32-head rows get their
    # own sentence (the 32-head ratios are higher and must not stretch a DeepSeek-V3.2 range).
    lo, hi = _ratio_range(_decode_rows(next_n=1, heads=64), "deepgemm-fp8")
    lo2, hi2 = _ratio_range(_decode_rows(next_n=2, heads=64), "deepgemm-fp8")
    v32 = page[page.index("**The scorer alone (DeepSeek-V3.2, 64 index heads)**"):page.index("**GLM-5.x:**")]
    assert (f"{lo:.2f}-{hi:.2f}x in decode and {lo2:.2f}-{hi2:.2f}x in MTP target verify at the shapes measured (H200, "
            "target verify with 2 query tokens;") in _flat(v32)
    h32 = {n: _us(_row(32, 8, 128 * K, n), "deepgemm-fp8") / _us(_row(32, 8, 128 * K, n), "ours") for n in (1, 2, 4)}
    assert max(h32.values()) > hi2 and not any(f"{x:.2f}" in v32 for x in h32.values())
    assert (f"at 32 heads and 8 × 128K on an H200: {h32[1]:.2f}x DeepGEMM FP8 in decode, {h32[2]:.2f}x and "
            f"{h32[4]:.2f}x in target verify with 2 and 4 query tokens") in page
    chat = _row(64, 64, 4 * K, 1)
    assert (f"({_us(small, 'deepgemm-fp8') / _us(small, 'ours'):.2f}x at 1 × 4K and "
            f"{_us(chat, 'deepgemm-fp8') / _us(chat, 'ours'):.2f}x at 64 × 4K in decode") in page
    glm52 = dcp_capacity(100 * 2**30, 1, kv_bytes=1152, num_layers=78, num_index_layers=21)
    assert f"21 of its 78 layers: +{glm52.gain_replicated * 100:.1f} % KV tokens with a bf16 MLA KV cache" in page
    # GLM-5 / 5.1: an index key in every layer, the MLA KV of bf16 (1152 B) or SGLang's FP8 format (656 B).
    glm5 = [dcp_capacity(100 * 2**30, 1, kv_bytes=kv, num_layers=78, num_index_layers=78) for kv in (1152, 656)]
    assert (f"GLM-5 and 5.1 keep index keys in all 78 layers: +{glm5[0].gain_replicated * 100:.1f} % KV tokens (bf16 "
            f"MLA KV cache) or +{glm5[1].gain_replicated * 100:.1f} % (FP8)") in page
    native_rows = [r for r in _decode_rows(next_n=2, heads=64) if r["next_n"] == 2]
    bench_page = _flat(_page("docs/benchmarks.md"))
    assert f"that path is {_deepgemm_native_lead(native_rows)} faster than ours there" in bench_page
    # The status table, moved to the user guide.
    page = _flat(_page("docs/user-guide.md"))
    assert (f"{_us(big, 'ours'):.1f} µs at batch 8 × 128 K, H 64 on H200 against DeepGEMM FP8's "
            f"{_us(big, 'deepgemm-fp8'):.1f} µs in the same run ({_us(big, 'deepgemm-fp8') / _us(big, 'ours'):.2f}×), "
            f"{_us(small, 'ours'):.2f} µs at 1 × 4 K ({_us(small, 'deepgemm-fp8') / _us(small, 'ours'):.2f}×), "
            f"{_us(verify, 'ours'):.1f} µs vs {_us(verify, 'deepgemm-fp8'):.1f} µs in target verify") in page
    assert (f"takes {_us(verify, 'deepgemm-fp8-native'):.1f} µs: "
            f"{_us(verify, 'deepgemm-fp8-native') / _us(verify, 'ours'):.2f}×); "
            f"{_us(big, 'sglang-triton-fp4') / _us(big, 'ours'):.0f}× SGLang 0.5.23's Triton FP4 scorer") in page
    assert (f"{_floor_pct(_decode_rows(next_n=1, heads=64, min_keys=2**20))} of its memory-bandwidth floor in decode "
            f"at 1 M keys or more per call and {_floor_pct(native_rows)} at next_n 2") in page
    store, planner = DECODE["store"], DECODE["planner"]
    assert (f"{store['seconds'] * 1e6:.2f} µs for 64 K tokens = {100 * store['floor_s'] / store['seconds']:.0f} % "
            "of its HBM floor on H200") in page
    assert f"{planner['seconds'] * 1e6:.2f} µs per call at batch 64" in page
    ratios = [r["results"]["deepgemm-fp8"]["seconds"] / r["results"]["ours[deepgemm]"]["seconds"]
              for r in PREFILL["prefill"]]
    tflops = [r["results"]["ours[deepgemm]"]["tflops"] for r in PREFILL["prefill"]]
    assert f"{min(ratios):.2f}-{max(ratios):.2f}× DeepGEMM on FP8 keys" in page
    assert f"{min(tflops):.0f}-{max(tflops):.0f} TFLOP/s" in page
    fp8_kv, bf16_kv = _tokens(656, 8), _tokens(1152, 8)
    assert (f"+{fp8_kv.gain_sharded * 100:.0f} % tokens at W = 8 with an FP8 MLA KV cache, "
            f"+{bf16_kv.gain_sharded * 100:.0f} % with bf16") in page
    fp8, fp4 = zip(*(_recall(ACC_CPU, w, 64 * K, h) for w in ("text", "gaussian") for h in (64, 32)))
    out8, out4 = zip(*(_recall(ACC_CPU, "outlier", 64 * K, h) for h in (64, 32)))
    assert len({f"{x:.2f}" for x in fp8}) == 1 and len({f"{x:.2f}" for x in out8 + out4}) == 2  # one figure each
    assert (f"top-2048 recall at 64K FP4 {min(fp4):.2f}-{max(fp4):.2f} vs FP8 {fp8[0]:.2f} (text, gaussian), "
            f"{out4[0]:.2f} vs {out8[0]:.2f} with outlier channels") in page


def test_readme_times_are_all_measured_ones():
    """No stale figure anywhere on the README: every time in µs is one of the measured report's (or the eager host
    time inside SGLang, from its own run)."""
    measured = set()
    for r in DECODE["rows"]:
        for res in r["results"].values():
            if res.get("status") == "ok":
                measured |= {f"{res['seconds'] * 1e6:.1f}", f"{res['seconds'] * 1e6:.2f}"}
    for op in (DECODE["store"], DECODE["planner"]):
        measured |= {f"{op['seconds'] * 1e6:.2f}", f"{op['floor_s'] * 1e6:.2f}" if "floor_s" in op else ""}
    for fmt in ("fp8", "fp4"):  # the eager host time per indexer call inside SGLang (H100)
        measured.add(f"{_json(f'sglang_eager_host_v32_layers_64x896_h100_{fmt}_2026-12-05.json')['median_us']:.1f}")
    measured |= {f"{us:.1f}" for per in _h100_scorer_per_layer().values() for us in per}  # inside SGLang (H100)
    for name in _MC + _Q1:  # the H100 runs against DeepGEMM's newer SM90 kernel (before and after one round trip)
        for r in _json(name)["rows"]:
            measured |= {f"{res['seconds'] * 1e6:.1f}" for res in r["results"].values() if res.get("status") == "ok"}
    # GLM-5's scorers per verify cycle inside SGLang (H100, 3 layers), whole µs as quoted.
    measured |= {f"{v:.0f}" for n, pair in _glm5_kernels().items() if "paged_mqa_logits<" in n
                 or "fp4_paged_logits" in n for v in pair if v}
    quoted = re.findall(r"([\d.]+)(?: / ([\d.]+))? µs", _page("README.md"))
    quoted = [q for pair in quoted for q in pair if q]
    assert quoted and [q for q in quoted if q not in measured] == []


def _h100_scorer_per_layer() -> dict:
    """The scorer kernel's time per layer and decode step inside SGLang's server on an H100, 1 x 128K and 8 x 64K:
    ``{"fp8": [us, us], "fp4": [us, us]}`` from the profiles' kernel totals over their 3 layers (the figures
    ``check`` quotes for an H100, tests/test_tables.py)."""
    kernel = {"fp8": "sm90_fp8_paged_mqa_logits", "fp4": "fp4_paged_logits_sm90"}
    out = {"fp8": [], "fp4": []}
    for shape in ("1x131072", "8x65536"):
        for key, run in _json(f"sglang_serving_profile_v32_layers_fp8_fp4_h100_{shape}_2026-12-05.json").items():
            fmt = key.rsplit("/", 1)[-1][:3]
            if "gpu-only" not in key:
                out[fmt].append(next(us for name, us in run["top_kernels"] if kernel[fmt] in name) / 3)
    return out


def test_readme_h100_scorer_row_is_what_check_quotes_for_an_h100():
    """The README's H100 scorer row: the profiles' kernel times per layer, the same as check's H100 table rows."""
    from sglang_fp4_indexer.tables import load_tables

    per = _h100_scorer_per_layer()
    page = _flat(_page("README.md"))
    assert (f"1 × 128K / 8 × 64K | {per['fp8'][0]:.1f} / {per['fp8'][1]:.1f} µs (DeepGEMM) | "
            f"**{per['fp4'][0]:.1f} / {per['fp4'][1]:.1f} µs** |") in page
    rows = load_tables()["timing_serving"]["rows"]
    assert [(r["batch"], r["context"]) for r in rows] == [(1, 131072), (8, 65536)]
    assert [f"{r['fp8_us']:.1f}" for r in rows] == [f"{x:.1f}" for x in per["fp8"]]
    assert [f"{r['fp4_us']:.1f}" for r in rows] == [f"{x:.1f}" for x in per["fp4"]]
    # Sums of kernel times are not shown as a step time (kernels overlap on two streams).
    runs = [next(iter(_json(f"sglang_serving_profile_v32_layers_fp8_fp4_h100_{s}_2026-12-05.json").values()))
            for s in ("1x131072", "8x65536")]
    assert all(f"{r['total_us_per_step'] / 1e3:.2f} ms" not in page for r in runs)
    assert "decode step's GPU time" not in page


def test_readme_says_what_the_headline_was_measured_on():
    page = _flat(_page("README.md"))
    meta = DECODE["meta"]
    assert f"torch {meta['torch']}, triton {meta['triton']}, Python {meta['python']}" in page
    sglang = {r.split("==")[0]: r.split("==")[1].split(";")[0] for r in md.requires("sglang") if "==" in r}
    triton = next(r for r in md.requires("torch") if r.startswith("triton"))
    triton_pin = re.search(r"~=([\d.]+)", triton).group(1)
    assert (f"brings torch {sglang['torch']}, triton {triton_pin} and sgl-deep-gemm {sglang['sgl-deep-gemm']}"
            in page)
    assert f"(with sglang-kernel {sglang['sglang-kernel']})" in page
    assert "sglang-fp4-indexer bench --device cuda --quick" in page
    # The stack inside SGLang, as the runs recorded it (H200 and H100), and the DeepGEMM commit of the H200 run.
    ran = {_json(n)["versions"]["sglang-kernel"] for n in ("sglang_one_batch_h200.json",
                                                            "sglang_radix_tiny_h100_fp4_2026-12-06.json")}
    assert len(ran) == 1 and f"torch {meta['torch']} and sglang-kernel {ran.pop()} in place of SGLang's pin" in page
    assert "a348cd9" in (RESULTS / "bench_h200_summary_2026-12-03.log").read_text() and "DeepGEMM` a348cd9" in page


def test_perf_notes_query_load_table_quotes_its_run():
    """The query-load table (perf notes, open item 5): every cell is its raw run's median, rounded as shown."""
    run = _json("sm90_small_ab_qload_h100_2026-12-07.json")
    assert run["meta"]["device"] == "NVIDIA H100 80GB HBM3"
    page = _page("docs/perf-notes.md")
    rows = re.findall(r"^ *\| (\d+) x (\d+)K next_n (\d) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", page, re.M)
    assert len(rows) == 5
    for batch, ctx, next_n, *cells in rows:
        row = next(r for r in run["rows"] if (r["heads"], r["batch"], r["context"], r["next_n"])
                   == (64, int(batch), int(ctx) * K, int(next_n)))
        assert row["results"]["ab[coop_q]"]["status"] == "ok" and row["results"]["ab[product]"]["status"] == "ok"
        for cell, name in zip(cells, ("ab[product]", "ab[coop_q]", "ab[no_qload]")):
            us = row["results"][name]["seconds"] * 1e6
            assert cell == f"{us:.{len(cell.split('.')[1])}f}", (row["label"], name, cell, us)

def test_perf_notes_query_load_dense_run_quotes_its_run():
    """The second query-load run (dense constant queries): product, no_qload, no_qload_dense per shape as quoted."""
    run = _json("sm90_small_ab_qload_dense_h100_2026-12-07.json")
    assert run["meta"]["device"] == "NVIDIA H100 80GB HBM3"
    page = _flat(_page("docs/perf-notes.md"))
    names = {"1 x 128K next_n 4": (1, 128, 4), "8 x 4K next_n 2": (8, 4, 2), "8 x 128K next_n 4": (8, 128, 4),
             "4 x 128K next_n 4": (4, 128, 4), "8 x 128K next_n 1": (8, 128, 1)}
    for i, (name, (batch, ctx, next_n)) in enumerate(names.items()):
        row = next(r for r in run["rows"] if (r["heads"], r["batch"], r["context"], r["next_n"])
                   == (64, batch, ctx * K, next_n))
        us = [row["results"][v]["seconds"] * 1e6 for v in ("ab[product]", "ab[no_qload]", "ab[no_qload_dense]")]
        assert row["results"]["ab[product]"]["status"] == "ok"
        digits = 2 if us[0] < 10 else 1
        text = (f"{name}: product {us[0]:.{digits}f}, `no_qload` {us[1]:.{digits}f}, `no_qload_dense` {us[2]:.{digits}f}"
                if i == 0 else f"{name}: {us[0]:.{digits}f}, {us[1]:.{digits}f}, {us[2]:.{digits}f}")
        assert text in page, text
    drop = {name: row for name, row in zip(names, (next(r for r in run["rows"] if (r["batch"], r["context"] // K, r["next_n"])
                                                         == b) for b in names.values()))}

    def saved(name):
        res = drop[name]["results"]
        p, q = res["ab[product]"]["seconds"] * 1e6, res["ab[no_qload_dense]"]["seconds"] * 1e6
        return p - q, 100 * (p - q) / p

    (a, ap), (b, bp), (c, cp) = saved("1 x 128K next_n 4"), saved("8 x 128K next_n 4"), saved("8 x 128K next_n 1")
    assert f"costs {a:.1f} µs at 1 x 128K next_n 4" in page and f"; {ap:.0f} % of the time), {b:.1f} µs ({bp:.0f} %)" in page
    assert f"and {c:.1f} µs ({cp:.0f} %) at 8 x 128K next_n 1" in page
    lo, hi = min(saved(n)[1] for n in names), max(saved(n)[1] for n in names)
    assert f"their load costs {lo:.0f}-{hi:.0f} % of the time" in page


def test_perf_notes_query_round_trip_runs_quote_their_runs():
    """The query round-trip table (product, q_one_chunk, q_cp_async, no_qload_dense) and the repeat in the other
    variant order: every figure is its raw run's median, rounded as shown; every product and variant output
    other than no_qload_dense's (constant queries) passed its check."""
    first, again = _json("sm90_small_ab_qcopy_h100_2026-12-07.json"), _json(
        "sm90_small_ab_qonechunk_repeat_h100_2026-12-07.json")
    assert first["meta"]["device"] == again["meta"]["device"] == "NVIDIA H100 80GB HBM3"
    raw = _page("docs/perf-notes.md")
    page = _flat(raw)

    def us(run, heads, batch, ctx, next_n, name):
        row = next(r for r in run["rows"] if (r["heads"], r["batch"], r["context"], r["next_n"])
                   == (heads, batch, ctx * K, next_n))
        if name != "ab[no_qload_dense]":
            assert row["results"][name]["status"] == "ok", (row["label"], name)
        return row["results"][name]["seconds"] * 1e6

    rows = re.findall(r"^ *\| (\d+) x (\d+)K next_n (\d) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", raw, re.M)
    assert len(rows) == 4
    for batch, ctx, next_n, *cells in rows:
        for cell, name in zip(cells, ("ab[product]", "ab[q_one_chunk]", "ab[q_cp_async]", "ab[no_qload_dense]")):
            got = us(first, 64, int(batch), int(ctx), int(next_n), name)
            assert cell == f"{got:.{len(cell.split('.')[1])}f}", (batch, ctx, next_n, name, cell, got)
    p1, q1 = us(first, 64, 1, 128, 4, "ab[product]"), us(first, 64, 1, 128, 4, "ab[q_one_chunk]")
    p4, q4 = us(first, 64, 4, 128, 4, "ab[product]"), us(first, 64, 4, 128, 4, "ab[q_one_chunk]")
    assert f"{p1 - q1:.1f} µs ({100 * (p1 - q1) / p1:.0f} %) faster at 1 x 128K next_n 4 and {p4 - q4:.1f} µs" in page
    d1 = p1 - us(first, 64, 1, 128, 4, "ab[no_qload_dense]")
    assert (f"about {100 * (p1 - q1) / d1:.0f} % of what reading the queries costs ({p1 - q1:.1f} of the {d1:.1f} µs "
            "between the product and `no_qload_dense` in the same run)") in page
    shapes = (("1 x 128K next_n 4 ({pct:.0f} %)", 64, 1, 128), ("4 x 128K", 64, 4, 128), ("8 x 128K", 64, 8, 128),
              ("32 x 32K", 64, 32, 32))
    for text, heads, batch, ctx in shapes:
        a, b = us(again, heads, batch, ctx, 4, "ab[q_one_chunk]"), us(again, heads, batch, ctx, 4, "ab[product]")
        assert f"{a:.1f} against {b:.1f} at {text.format(pct=100 * (b - a) / b)}" in page.replace(
            "against 15.2 µs at", "against 15.2 at"), text
    h8 = us(again, 32, 8, 128, 4, "ab[q_one_chunk]"), us(again, 32, 8, 128, 4, "ab[product]")
    h1 = us(again, 32, 1, 128, 4, "ab[q_one_chunk]"), us(again, 32, 1, 128, 4, "ab[product]")
    assert (f"at 32 heads {h8[0]:.1f} against {h8[1]:.1f} (8 x 128K next_n 4) and {h1[0]:.2f} against {h1[1]:.2f} "
            "(1 x 128K next_n 4)") in page


def test_perf_notes_quote_the_benchmark():
    page = _flat(_page("docs/perf-notes.md"))
    big, small, verify = _row(64, 8, 128 * K, 1), _row(64, 1, 4 * K, 1), _row(64, 8, 128 * K, 2)
    serving = _row(64, 64, 4 * K, 1)
    bw = DECODE["meta"]["copy_bandwidth_bytes_per_s"]
    assert f"({big['fp4_floor_s'] * 1e6:.1f} µs at the {bw / 1e12:.3f} TB/s of the current benchmark)" in page
    assert (f"H64 next_n 2 is {_us(verify, 'ours'):.1f} µs at 8 x 128K against DeepGEMM's "
            f"{_us(verify, 'deepgemm-fp8-native'):.1f} with its native next_n and {_us(verify, 'deepgemm-fp8'):.1f} "
            "as SGLang 0.5.23 calls it on Hopper") in page
    assert f"(64 x 4K at serving width: {_us(serving, 'ours'):.1f} µs, benchmarks.md)" in page
    store, planner = DECODE["store"], DECODE["planner"]
    assert (f"In the current benchmark: {store['seconds'] * 1e6:.2f} µs "
            f"({100 * store['floor_s'] / store['seconds']:.0f} % of its floor) and {planner['seconds'] * 1e6:.2f} µs") in page
    lo, hi = _ratio_range(_decode_rows(next_n=1, heads=64), "deepgemm-fp8")
    native_rows = [r for r in _decode_rows(next_n=2, heads=64) if r["next_n"] == 2]
    nlo, nhi = _ratio_range(native_rows, "deepgemm-fp8-native")
    assert f"at next_n 1 the scorer is {lo:.2f}-{hi:.2f}x DeepGEMM FP8 at H64" in page
    assert f"at next_n 2 it is {nlo:.2f}-{nhi:.2f}x DeepGEMM's native path" in page
    assert f"1 x 4K is {_us(small, 'ours'):.2f} µs in the benchmark" in page
    assert (f"The scorer sits at {_floor_pct(_decode_rows(next_n=1, heads=64, min_keys=2**20))} of its floor at "
            "next_n 1 with 1 M keys or more per call") in page


def _gaps(acc, workloads, min_context=2049):
    return [100 * (fp8 - fp4) for c in acc["cases"] if c["workload"] in workloads and c["context"] >= min_context
            for fp8, fp4 in [(c["formats"]["FP8"]["recall_mean"], c["formats"]["FP4"]["recall_mean"])]]


def test_changelog_and_readme_recall_cost_include_every_workload():
    every = _gaps(ACC_GPU, {"text", "gaussian", "needle", "outlier"})
    plain = _gaps(ACC_GPU, {"text", "gaussian", "needle"})
    outlier = _gaps(ACC_GPU, {"outlier"})
    assert max(every) == max(outlier) > 14  # the outlier workload is the worst case
    text = (f"top-2048 recall is {min(every):.0f}-{max(every):.0f} points below FP8's beyond 2048 tokens "
            f"({min(plain):.0f}-{max(plain):.0f} on the text, gaussian and needle workloads, "
            f"{min(outlier):.0f}-{max(outlier):.0f} on the outlier workload")
    assert text in _flat(_page("CHANGELOG.md"))


def test_accuracy_plain_words_are_the_cpu_run():
    page = _flat(_page("docs/accuracy.md"))
    gap = lambda ctx, ws: [100 * (a - b) for w in ws for h in (64, 32) for a, b in [_recall(ACC_CPU, w, ctx, h)]]  # noqa: E731
    g4, g16, g64 = (gap(c * K, ("text", "gaussian")) for c in (4, 16, 64))
    o16, o64 = gap(16 * K, ("outlier",)), gap(64 * K, ("outlier",))
    assert (f"the gap is {min(g4):.0f} points at 4K, {min(g16):.0f}-{max(g16):.0f} points at 16K and "
            f"{min(g64):.0f}-{max(g64):.0f} points at 64K ({min(o16):.0f} and {min(o64):.0f} on the outlier workload)"
            ) in page
    assert round(min(g4)) == round(max(g4))
    g128 = _gaps(ACC_GPU, {"text", "gaussian", "needle"}, 128 * K)
    o128 = _gaps(ACC_GPU, {"outlier"}, 128 * K)
    assert (f"in the H200 measurement {min(g128):.1f}-{max(g128):.0f} points at 128K ({min(o128):.0f} on the outlier "
            "workload)") in page
    for internal in ("the issue's", "goal", "not met", "target"):
        assert internal not in page, internal


def test_benchmarks_summary_against_deepgemm_is_the_decode_table():
    rows = _table_rows(_page("docs/benchmarks.md"), "### Against DeepGEMM FP8, in short")
    rng = lambda rs, col: "-".join(dict.fromkeys(f"{x:.2f}" for x in _ratio_range(rs, col)))  # noqa: E731
    h64 = lambda n: [r for r in DECODE["rows"] if r["heads"] == 64 and r["next_n"] == n]  # noqa: E731
    h32 = [_row(32, 8, 128 * K, n) for n in (1, 2, 4)]
    want = [
        [rng(h64(1), "deepgemm-fp8"), rng(h64(1), "deepgemm-fp8-native")],
        [rng(h64(2), "deepgemm-fp8"), f"**{rng(h64(2), 'deepgemm-fp8-native')}**"],
        [rng(h64(4), "deepgemm-fp8"), rng(h64(4), "deepgemm-fp8-native")],
        [" / ".join(f"{_us(r, c) / _us(r, 'ours'):.2f}" for r in h32) for c in ("deepgemm-fp8", "deepgemm-fp8-native")],
    ]
    assert [cells[1:] for cells in rows[:4]] == want
    ratios = [r["results"]["deepgemm-fp8"]["seconds"] / r["results"]["ours[deepgemm]"]["seconds"]
              for r in PREFILL["prefill"]]
    assert rows[4][1].startswith(f"{min(ratios):.2f}-{max(ratios):.2f} ")
    page = _page("docs/benchmarks.md")
    assert "| goal |" not in page and "missed" not in page and "target <" not in page


def test_benchmarks_headline_history_is_the_headline_table():
    """docs/benchmarks.md's 8 x 128K history: each row is headline.csv's row of that raw file, and the
    bandwidth range is the reports' (headline.csv itself is checked against the reports in
    tests/test_bench_history.py)."""
    import csv

    with open(RESULTS / "headline.csv", newline="") as fh:
        table = [r for r in csv.DictReader(fh) if r["spec"].split("@")[0] == "64x8x128Kx1"]
    page = _page("docs/benchmarks.md")
    rows = _table_rows(page, "## Earlier results")
    assert [cells[5] for cells in rows] == [Path(r["source"]).name for r in table]
    for cells, r in zip(rows, table):
        assert cells[0] == r["date"][:16].replace("T", " "), cells
        m = re.fullmatch(r"([\d.]+) \((\d+) %\)", cells[2])
        assert _shown(m.group(1), float(r["ours_us"])) and _shown(m.group(2), float(r["pct_fp4_floor"])), cells
        for cell, col in ((cells[3], "deepgemm_sglang_us"), (cells[4], "sglang_triton_fp4_us")):
            assert (cell == "--") if not r[col] else _shown(cell, float(r[col])), (cells, col)
    bws = [_json(Path(r["source"]).name)["meta"]["copy_bandwidth_bytes_per_s"] / 1e12 for r in table]
    assert f"({min(bws):.2f}-{max(bws):.2f} TB/s)" in _flat(page)


def test_user_pages_name_no_run_or_issue_numbers():
    """README.md and docs/ cite raw files by name (which may carry a run number, e.g. ``_run23.json``) but
    never a run, an issue or the internal engineering log in their own words."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    found = [(p.name, m.group(0)) for p in pages for m in re.finditer(r"\b(?:run|issue) ?\d+|PERF_LOG", p.read_text(), re.I)]
    assert found == []
    # Every raw file a page links under benchmarks/results/ exists.
    links = {(p.name, m.group(1)) for p in pages
             for m in re.finditer(r"\]\(\.\./benchmarks/results/([^)#]+)\)", p.read_text())}
    assert links and [(page, f) for page, f in sorted(links) if not (RESULTS / f).exists()] == []


def test_every_raw_file_is_cited():
    """Each file under benchmarks/results/ is named by a page (docs/, README.md) or by one of the two logs there."""
    citing = " ".join(p.read_text() for p in [REPO / "README.md", *(REPO / "docs").glob("*.md"),
                                               RESULTS / "HISTORY.md", RESULTS / "PERF_LOG.md"])
    raw = sorted(p.name for p in RESULTS.iterdir() if p.is_file() and p.suffix != ".md")
    assert len(raw) > 60 and [name for name in raw if name not in citing] == []


def test_benchmarks_page_names_only_impls_bench_takes():
    from sglang_fp4_indexer.bench.scorers import make_scorers

    listed = re.findall(r"`--impl ([\w,]+)`", _page("docs/benchmarks.md"))
    assert listed
    for names in listed:
        make_scorers(["ours"], names.split(","))  # raises ValueError on a name bench refuses


def test_benchmarks_cpu_host_overhead_is_the_measured_file():
    """The CPU-side Python overhead quoted in docs/benchmarks.md ("Host time") is host_overhead_cpu.json's, in µs."""
    run = _json("host_overhead_cpu.json")
    shapes = ("1 x 4K", "64 x 4K", "8 x 4K next_n 2")
    before, after = (" / ".join(f"{run[side][s] * 1e6:.1f}" for s in shapes) for side in ("before", "after"))
    text = _flat(_page("docs/benchmarks.md"))
    assert f"{before} µs per call before the launchers" in text and f"{after} µs after" in text


def _serving_runs():
    """SGLang's serving result lines and the KV pool tokens of the FP8 and FP4 servers with MTP (H100)."""
    base = "sglang_serving_v32_layers_mtp34_eager_prefill_h100_{}_2026-12-05"
    runs = [json.loads((RESULTS / f"{base.format(fmt)}.jsonl").read_text().splitlines()[0]) for fmt in ("fp8", "fp4")]
    pools = [int(re.search(r"#tokens: (\d+)", (RESULTS / f"{base.format(fmt)}.txt").read_text())[1])
             for fmt in ("fp8", "fp4")]
    return runs, pools


def _study(name, context):
    """The model study's rows at ``context`` tokens by top-k (``report.summarize``) of a raw result file."""
    return report.summarize(_json(name))["loss"][context]["topk"]


def _ms(x):
    """A number as the docs write thousands: rounded, a space between groups of three digits."""
    return f"{round(x):,}".replace(",", " ")


def test_benchmarks_mtp_serving_table_is_the_measured_runs():
    """The FP8-against-FP4 table behind launch_server quotes SGLang's result lines and pool lines as printed."""
    page = _flat(_page("docs/benchmarks.md"))
    (f8, f4), (p8, p4) = _serving_runs()
    assert (f"| output tokens/s | {f8['output_throughput']:.1f} | {f4['output_throughput']:.1f} |") in page
    assert (f"| median / mean TPOT | {f8['median_tpot_ms']:.2f} / {f8['mean_tpot_ms']:.2f} ms | "
            f"{f4['median_tpot_ms']:.2f} / {f4['mean_tpot_ms']:.2f} ms |") in page
    assert f"| {f8['median_itl_ms']:.2f} ms | {f4['median_itl_ms']:.2f} ms |" in page
    assert f"| median TTFT | {_ms(f8['median_ttft_ms'])} ms | {_ms(f4['median_ttft_ms'])} ms |" in page
    assert f"| KV pool (tokens) | {_ms(p8)} | **{_ms(p4)} (+{100 * (p4 / p8 - 1):.1f} %)** |" in page
    table = _json("sglang_serving_v32_layers_mtp34_eager_prefill_h100_table_2026-12-05.json")[0]
    assert table["output_throughput"] == {"fp8": f8["output_throughput"], "fp4": f4["output_throughput"]}


def _pair(load):
    """SGLang's serving result lines of one same-machine pair (FP8, FP4), its serving-table row and the printed
    table with the servers' start-up and pool lines (``load``: the part of the raw files' names that names the load)."""
    name = "sglang_serving_v32_layers_" + load + "_{}2026-12-05"
    runs = [json.loads((RESULTS / (name.format(f"{fmt}_") + ".jsonl")).read_text().splitlines()[0])
            for fmt in ("fp8", "fp4")]
    return runs, _json(name.format("table_") + ".json")[0], (RESULTS / (name.format("") + ".txt")).read_text()


def _pools(printed):
    """The FP8 and FP4 pool tokens from a pair's printed start-up lines (the FP4 server's follow its start-up line)."""
    tokens = [int(t) for t in re.findall(r"KV Cache is allocated\. .*#tokens: (\d+)", printed)]
    fp4_at = printed.index("FP4 indexer active")
    fp4 = int(re.search(r"#tokens: (\d+)", printed[fp4_at:])[1])
    return next(t for t in tokens if t != fp4), fp4


def test_readme_serving_rows_are_the_measured_runs():
    """The README's launch_server rows quote the same-machine pairs' result lines and pool lines."""
    page = _flat(_page("README.md"))
    (a8, a4), _, printed = _pair("mtp34_same_machine_h100_fp8_first")
    (b8, b4), _, _ = _pair("mtp34_same_machine_h100_fp4_first")
    assert (f"| {a8['output_throughput']:.1f}; {b8['output_throughput']:.1f} | "
            f"{a4['output_throughput']:.1f}; {b4['output_throughput']:.1f} |") in page
    p8, p4 = _pools(printed)
    assert f"| {p8:,} | {p4:,} (**+{100 * (p4 / p8 - 1):.1f} %**) |" in page
    (o8, o4), _, _ = _pair("no_mtp_h100")
    assert f"| {o8['output_throughput']:.1f} | {o4['output_throughput']:.1f} |" in page
    (k8, k4), _, _ = _pair("kv_limited_100k_h100")
    gain = 100 * (k4["output_throughput"] / k8["output_throughput"] - 1)
    assert f"| {k8['output_throughput']:.1f} | **{k4['output_throughput']:.1f} (+{gain:.1f} %)** |" in page


def test_benchmarks_same_machine_mtp_table_is_the_measured_runs():
    """Both orders of the MTP pair, as docs/benchmarks.md's table and prose quote them."""
    page = _flat(_page("docs/benchmarks.md"))
    (a8, a4), ta, printed = _pair("mtp34_same_machine_h100_fp8_first")
    (b8, b4), tb, _ = _pair("mtp34_same_machine_h100_fp4_first")
    assert ta["output_throughput"] == {"fp8": a8["output_throughput"], "fp4": a4["output_throughput"]}
    assert tb["output_throughput"] == {"fp8": b8["output_throughput"], "fp4": b4["output_throughput"]}
    assert f"| output tokens/s, FP8 server first | {a8['output_throughput']:.1f} | {a4['output_throughput']:.1f} |" in page
    assert f"| output tokens/s, FP4 server first | {b8['output_throughput']:.1f} | {b4['output_throughput']:.1f} |" in page
    for key, label in (("median_tpot_ms", "median TPOT, FP8 first / FP4 first"),
                       ("median_itl_ms", "median inter-token latency (one verify step and its draft steps), FP8 first / FP4 first")):
        assert (f"| {label} | {a8[key]:.2f} / {b8[key]:.2f} ms | {a4[key]:.2f} / {b4[key]:.2f} ms |") in page
    assert (f"| median TTFT, FP8 first / FP4 first | {_ms(a8['median_ttft_ms'])} / {_ms(b8['median_ttft_ms'])} ms | "
            f"{_ms(a4['median_ttft_ms'])} / {_ms(b4['median_ttft_ms'])} ms |") in page
    p8, p4 = _pools(printed)
    assert f"| KV pool (tokens) | {_ms(p8)} | {_ms(p4)} (+{100 * (p4 / p8 - 1):.1f} %) |" in page
    second_slower = (100 * (1 - b8["output_throughput"] / a8["output_throughput"]),
                     100 * (1 - a4["output_throughput"] / b4["output_throughput"]))
    assert f"FP8 by {second_slower[0]:.1f} %, FP4 by {second_slower[1]:.1f} %" in page
    m8 = (a8["output_throughput"] + b8["output_throughput"]) / 2
    m4 = (a4["output_throughput"] + b4["output_throughput"]) / 2
    assert f"FP4 gives {m4 / m8:.3f} of FP8's output tokens/s ({m4:.1f} against {m8:.1f})" in page


def test_benchmarks_no_mtp_and_kv_limited_tables_are_the_measured_runs():
    """The MTP-off pair and the KV-limited pair as docs/benchmarks.md's tables quote them."""
    page = _flat(_page("docs/benchmarks.md"))
    (o8, o4), to, printed = _pair("no_mtp_h100")
    assert to["output_throughput"] == {"fp8": o8["output_throughput"], "fp4": o4["output_throughput"]}
    assert f"| output tokens/s | {o8['output_throughput']:.1f} | {o4['output_throughput']:.1f} |" in page
    assert f"| median TPOT | {o8['median_tpot_ms']:.2f} ms | {o4['median_tpot_ms']:.2f} ms |" in page
    assert f"| median inter-token latency (one decode step) | {o8['median_itl_ms']:.2f} ms | {o4['median_itl_ms']:.2f} ms |" in page
    p8, p4 = _pools(printed)
    assert f"| KV pool (tokens) | {_ms(p8)} | {_ms(p4)} (+{100 * (p4 / p8 - 1):.1f} %) |" in page
    assert f"was {100 * (o4['output_throughput'] / o8['output_throughput'] - 1):.1f} % faster" in page
    assert f"{o8['median_itl_ms'] - o4['median_itl_ms']:.2f} ms shorter" in page
    (k8, k4), tk, printed = _pair("kv_limited_100k_h100")
    assert tk["output_throughput"] == {"fp8": k8["output_throughput"], "fp4": k4["output_throughput"]}
    assert (k8["completed"], k4["completed"]) == (12, 12) and k8["random_input_len"] == 100000
    gain = 100 * (k4["output_throughput"] / k8["output_throughput"] - 1)
    assert f"| output tokens/s | {k8['output_throughput']:.1f} | **{k4['output_throughput']:.1f} (+{gain:.1f} %)** |" in page
    assert f"| benchmark duration | {k8['duration']:.2f} s | {k4['duration']:.2f} s |" in page
    assert f"| median TTFT | {_ms(k8['median_ttft_ms'])} ms | {_ms(k4['median_ttft_ms'])} ms |" in page
    assert f"| median TPOT | {k8['median_tpot_ms']:.2f} ms | {k4['median_tpot_ms']:.2f} ms |" in page
    p8, p4 = _pools(printed)
    assert f"SGLang allocates {p8:,}".replace(",", " ") in page and f"{p4:,} allocated".replace(",", " ") in page
    # The requests that fit: 100 000 + 256 tokens each.
    assert (p8 // 100256, p4 // 100256) == (3, 4)
    assert f"{(k8['median_ttft_ms'] - k4['median_ttft_ms']) / 1000:.2f} s less median TTFT" in page


@pytest.mark.parametrize("name", ["model-accuracy-cpu-trained-indexer-1200.json", "model-accuracy-cpu-stand-in-4k.json",
                                  "model-accuracy-cpu-trained-indexer-1200-8k-top128.json",
                                  "model-accuracy-cpu-stand-in-8k-top128.json"])
def test_accuracy_trained_indexer_tables_are_the_measured_runs(name):
    """docs/accuracy.md's trained-indexer sections (4K and 8K) hold every table row of each run as the study
    renders them."""
    page = _page("docs/accuracy.md")
    rows = [line for line in report.render_markdown(_json(name)).splitlines()
            if line.startswith("| ") and not line.startswith("| ---") and not line.startswith("| context")]
    assert len(rows) == 8 and [r for r in rows if r not in page] == []


def test_accuracy_trained_indexer_prose_is_the_measured_runs():
    """The differences the trained-indexer section states are computed from the two runs."""
    page = _flat(_page("docs/accuracy.md"))
    trained, stand_in = (_study(n, 4096) for n in ("model-accuracy-cpu-trained-indexer-1200.json",
                                                "model-accuracy-cpu-stand-in-4k.json"))
    lost = [rows[k]["attention_recall"]["fp8"][0] - rows[k]["attention_recall"]["fp4"][0]
            for rows in (trained, stand_in) for k in (2048, 256)]
    assert (f"{lost[0]:.4f} and {lost[1]:.4f} with the trained indexer, {lost[2]:.3f} and {lost[3]:.3f} "
            "with the stand-in") in page
    kl = _json("model-accuracy-cpu-trained-indexer-1200.json")["indexer"]["trained"]
    assert (" / ".join(f"{kl['kl_before'][la]:.2f}" for la in ("5", "11", "17")) + " to "
            + " / ".join(f"{kl['kl_after'][la]:.2f}" for la in ("5", "11", "17"))) in page


def test_accuracy_trained_indexer_400_steps_sentence_is_its_run():
    page = _flat(_page("docs/accuracy.md"))
    kl = _json("model-accuracy-cpu-trained-indexer-400.json")["indexer"]["trained"]["kl_after"]
    rows = _study("model-accuracy-cpu-trained-indexer-400.json", 4096)
    att = [rows[k]["attention_recall"]["exact"][0] for k in (2048, 256)]
    cost = [rows[k]["delta"]["exact"][0] for k in (2048, 256)]
    assert (f"after 400 steps (KL {kl['5']:.2f} / {kl['11']:.2f} / {kl['17']:.2f}) it recalled {att[0]:.2f} and "
            f"{att[1]:.2f} and cost +{cost[0]:.4f} and +{cost[1]:.3f}") in page


def test_benchmarks_launch_host_steps_are_the_measured_run():
    """The host-time steps docs/benchmarks.md quotes for 8 x 4K next_n 2 are the probe's medians."""
    import statistics

    page = _flat(_page("docs/benchmarks.md"))
    sec = _json("launch_host_h100_8x4096_n2_2026-12-05.json")["seconds"]
    us = {k: f"{statistics.median(v) * 1e6:.2f}" for k, v in sec.items()}
    assert (f"the logits' `torch.empty` {us['empty']} µs, reading and packing the arguments {us['arg_values']}, "
            f"torch's current stream {us['stream']}, `cuLaunchKernel` through `cuda.bindings` {us['launch_bindings']} "
            f"(through `ctypes`, the other way to call the driver from Python, {us['launch_ctypes']}") in page
    assert (f"the launcher's whole call {us['launcher']} and the hook's call with its logits allocated "
            f"{us['hook_call']}") in page


EIGHT_K = ("model-accuracy-cpu-trained-indexer-1200-8k-top128.json", "model-accuracy-cpu-stand-in-8k-top128.json")


def test_accuracy_8k_prose_and_readme_are_the_measured_runs():
    """The FP4 - FP8 figures, recalls and attention recalls the 8K prose quotes."""
    page = _flat(_page("docs/accuracy.md"))
    trained, stand_in = (_study(n, 8192) for n in EIGHT_K)
    d = {(who, k): rows[k]["fp4_minus_fp8"] for who, rows in (("t", trained), ("s", stand_in)) for k in (2048, 128)}
    assert (f"add {d['t', 128][0]:+.4f} ± {d['t', 128][1]:.4f} nats/token to the loss over FP8 with the trained "
            f"indexer and {d['s', 128][0]:+.4f} ± {d['s', 128][1]:.4f} with the stand-in") in page
    assert all(abs(m) > 3 * e for m, e in (d["t", 128], d["s", 128]))  # "more than three standard errors"
    assert (f"the difference is {d['t', 2048][0]:+.4f} ± {d['t', 2048][1]:.4f} (trained) and "
            f"{d['s', 2048][0]:+.4f} ± {d['s', 2048][1]:.4f} (stand-in)") in page
    rec = [rows[k]["recall"]["fp4"][0] for rows in (trained, stand_in) for k in (2048, 128)]
    assert f"{rec[0]:.3f} and {rec[1]:.3f} at top-2048 and top-128, against {rec[2]:.3f} and {rec[3]:.3f}" in page
    att = [rows[k]["attention_recall"]["exact"][0] for rows in (trained, stand_in) for k in (2048, 128)]
    assert f"recalls {att[0]:.2f} and {att[1]:.2f} of the layer's attention top-2048 and top-128 (stand-in: {att[2]:.2f} and {att[3]:.2f})" in page
    att4 = [_study(n, 4096)[2048]["attention_recall"]["exact"][0]
            for n in ("model-accuracy-cpu-trained-indexer-1200.json", "model-accuracy-cpu-stand-in-4k.json")]
    assert (f"falls from {att4[0]:.2f} to {att[0]:.2f}, the stand-in's from {att4[1]:.2f} to {att[2]:.2f}") in page
    cost = [rows[k]["delta"]["exact"][0] for rows in (trained, stand_in) for k in (2048, 128)]
    assert f"costs {cost[0]:+.3f} and {cost[1]:+.3f} nats/token (stand-in: {cost[2]:+.3f} and {cost[3]:+.3f})" in page
    kl = _json(EIGHT_K[0])["indexer"]["trained"]["kl_after"]
    assert "the same KL after training, " + " / ".join(f"{kl[la]:.2f}" for la in ("5", "11", "17")) in page


def test_benchmarks_serving_profile_table_is_the_measured_traces():
    """The serving profile's FP8 / FP4 table, per-layer scorer times, shares and the GPU-only cross-check as
    docs/benchmarks.md quotes them, from the table JSON profile-table wrote; and the earlier FP8-only run."""
    page = _flat(_page("docs/benchmarks.md"))
    shapes = ("1x131072", "8x65536")
    runs = {}
    for shape in shapes:
        per_trace = _json(f"sglang_serving_profile_v32_layers_fp8_fp4_h100_{shape}_2026-12-05.json")
        for key, run in per_trace.items():
            name = key.rsplit("/", 1)[-1]
            runs[("gpu-only" if "gpu-only" in name else name[:3]), shape] = run
            assert ("NUL bytes that began lines read as the indentation space" in run["trace_repairs"]) == (
                name.startswith("fp4"))
    cols = [runs[f, s] for s in shapes for f in ("fp8", "fp4")]
    rows = (("indexer logits (scorer and its schedule)", ("indexer logits",)),
            ("indexer top-k (SGLang's)", ("indexer top-k",)), ("index-key store", ("index-key store",)),
            ("sparse MLA (FlashMLA)", ("sparse MLA",)), ("GEMMs", ("GEMMs",)), ("MoE", ("MoE",)),
            ("norm, RoPE, activation, quantization", ("norm, RoPE, activation, quant",)),
            ("rest and copies", ("rest", "copies")))
    for label, cats in rows:
        cells = []
        for k, run in enumerate(cols):
            us = sum(run["us_per_step"][c] for c in cats)
            cell = f"{us:.1f} ({100 * us / run['total_us_per_step']:.1f} %)"
            cells.append(f"**{cell}**" if label.startswith("indexer logits") and k % 2 else cell)
        assert f"| {label} | {' | '.join(cells)} |" in page, label
    assert ("| **sum of kernel times (not a step time)** | "
            + " | ".join(f"**{r['total_us_per_step']:.1f}**" for r in cols) + " |") in page
    kernel = {k: dict(r["top_kernels"]) for k, r in runs.items()}
    fp4 = [kernel["fp4", s]["fp4_paged_logits_sm90"] for s in shapes]
    dg = [next(v for k, v in kernel["fp8", s].items() if "fp8_paged_mqa_logits" in k) for s in shapes]
    assert (f"takes {fp4[0] / 3:.1f} µs (FP4, `fp4_paged_logits_sm90`) against {dg[0] / 3:.1f} µs (FP8, DeepGEMM's "
            f"`sm90_fp8_paged_mqa_logits`) at 1 × 131 072, and {fp4[1] / 3:.1f} against {dg[1] / 3:.1f} µs at 8 × 65 536 "
            f"({fp4[0]:.1f} / {dg[0]:.1f} and {fp4[1]:.1f} / {dg[1]:.1f} µs over 3 layers): "
            f"{dg[0] / fp4[0]:.2f}x and {dg[1] / fp4[1]:.2f}x") in page
    share = {k: 100 * (r["us_per_step"]["indexer logits"] + r["us_per_step"]["indexer top-k"]) / r["total_us_per_step"]
             for k, r in runs.items()}
    assert (f"falls from {share['fp8', shapes[0]]:.1f} % to {share['fp4', shapes[0]]:.1f} % at 1 × 131 072 and from "
            f"{share['fp8', shapes[1]]:.1f} % to {share['fp4', shapes[1]]:.1f} % at 8 × 65 536") in page
    drop = [100 * (1 - runs["fp4", s]["total_us_per_step"] / runs["fp8", s]["total_us_per_step"]) for s in shapes]
    assert f"the sum of kernel times falls by {drop[0]:.1f} % and {drop[1]:.1f} %" in page
    g = [runs["gpu-only", s] for s in shapes]
    cut_g = [100 * (1 - g[k]["us_per_step"]["indexer logits"] / runs["fp8", s]["us_per_step"]["indexer logits"])
             for k, s in enumerate(shapes)]
    cut_t = [100 * (1 - runs["fp4", s]["us_per_step"]["indexer logits"] / runs["fp8", s]["us_per_step"]["indexer logits"])
             for s in shapes]
    cuts = cut_g + cut_t
    assert (f"their indexer logits are {g[0]['us_per_step']['indexer logits']:.1f} and "
            f"{g[1]['us_per_step']['indexer logits']:.1f} µs ({min(cuts):.0f}-{max(cuts):.0f} % under FP8's, against "
            f"{min(cut_t):.0f}-{max(cut_t):.0f} % for the traces in the table") in page
    assert f"totals {g[0]['total_us_per_step']:.1f} and {g[1]['total_us_per_step']:.1f} µs" in page
    assert (f"differ by {runs['fp4', shapes[1]]['total_us_per_step'] - g[1]['total_us_per_step']:.0f} µs") in page
    assert f"has {g[1]['us_per_step']['indexer top-k']:.1f} µs" in page
    guide = _flat(_page("docs/user-guide.md"))  # the feature table, moved there from the README
    cut = [100 * (1 - r["us_per_step"]["indexer logits"] / runs["fp8", s]["us_per_step"]["indexer logits"])
           for (f, s), r in runs.items() if f != "fp8"]  # both FP4 traces of each shape
    assert f"FP4's indexer logits {min(cut):.0f}-{max(cut):.0f} % shorter" in guide
    earlier = [next(iter(_json(f"sglang_serving_profile_v32_layers_h100_{s}_2026-12-05.json").values())) for s in shapes]
    assert (f"gave {earlier[0]['us_per_step']['indexer logits']:.1f} / {earlier[1]['us_per_step']['indexer logits']:.1f} "
            f"µs of indexer logits and {earlier[0]['total_us_per_step']:.1f} / {earlier[1]['total_us_per_step']:.1f} µs "
            "in total") in page

    first = next(iter(_json("sglang_serving_profile_v32_layers_fp4_first_h100_8x65536_2026-12-06.json").values()))
    cat = first["us_per_step"]
    assert "NUL bytes that began lines read as the indentation space" in first["trace_repairs"]
    assert (f"its indexer logits were {cat['indexer logits']:.1f} µs and its total {first['total_us_per_step']:.1f} µs "
            f"per step at 8 × 65 536 (index-key store {cat['index-key store']:.1f}, top-k {cat['indexer top-k']:.1f})"
            ) in page
    probe = (RESULTS / "trace_nul_probe_h100_2026-12-06.txt").read_text()
    assert "'line_starts_at_4k_minus_1': 149, 'nul': 149, 'nul_at_those_line_starts': 149" in probe
    assert "plain 2.11.0+cu130 NVIDIA H100 80GB HBM3 {'bytes': 957268, 'line_starts_at_4k_minus_1': 5, 'nul': 0," in probe
    assert "wrote 149 NUL bytes, one at each line start at 4 KiB - 1" in page and "`plain` mode wrote none" in page


def test_user_guide_radix_hicache_table_is_the_run():
    """The radix-cache and HiCache rows of docs/user-guide.md's H100 table, from the four runs' JSON: every check
    passed, the prefix reused, pages reloaded byte for byte, the host page size, the top-k rows paired and equal."""
    page = _flat(_page("docs/user-guide.md"))
    runs = {(m, f): _json(f"sglang_{m}_tiny_h100_{f}_2026-12-06.json") for m in ("radix", "hicache") for f in ("fp4", "fp8")}
    assert all(r["passed"] and all(r["checks"].values()) for r in runs.values())
    radix = [runs["radix", f]["cached_tokens"][1] for f in ("fp4", "fp8")]
    assert f"reuses the 4 096-token prefix (`cached_tokens`) | {radix[0]:,} | {radix[1]:,} |".replace(",", " ") in page
    host = [runs["hicache", f]["cached_tokens_details"]["host"] for f in ("fp4", "fp8")]
    assert f"| {host[0]:,} from host | {host[1]:,} from host |".replace(",", " ") in page
    probes = [runs["hicache", f]["probe"] for f in ("fp4", "fp8")]
    assert all(p["pages_identical"] == p["pages_loaded"] for p in probes)
    assert (f"bytes at backup | {probes[0]['pages_identical']} of {probes[0]['pages_loaded']} | "
            f"{probes[1]['pages_identical']} of {probes[1]['pages_loaded']} |") in page
    assert runs["hicache", "fp4"]["checks"]["host index page is 4352 bytes per layer"]
    assert runs["hicache", "fp8"]["checks"]["host index page is 8448 bytes per layer"]
    assert "| 4 352 B (64 x 68) | 8 448 B (64 x 132) |" in page
    for mode, label in (("radix", "equal with and without reuse"), ("hicache", "equal to the run that never evicted")):
        agree = [runs[mode, f]["topk_agreement"] for f in ("fp4", "fp8")]
        assert all(a["unpaired_rows"] == 0 and a["equal_rows"] == a["rows"] for a in agree)
        assert (f"{label} | {agree[0]['equal_rows']} of {agree[0]['rows']} rows | "
                f"{agree[1]['equal_rows']} of {agree[1]['rows']} rows |") in page


def test_user_guide_mtp_h100_table_is_the_trace_check():
    """The H100 EAGLE table of docs/user-guide.md: rows checked, failures and overlap as trace-check printed them."""
    page = _flat(_page("docs/user-guide.md"))
    table = page.split("| EAGLE (H100) |")[1]
    for steps, draft, modes in ((1, 2, ("target verify", "draft extend")),
                                (3, 4, ("target verify", "draft extend", "draft decode"))):
        printed = (RESULTS / f"sglang_mtp{steps}_h100_2026-12-05.txt").read_text()
        for mode in modes:
            rows = {}
            for fmt in ("FP8", "FP4"):
                m = re.search(rf"{fmt}: every {mode} top-k row valid +PASS (\d+) rows in (\d+) calls.*?(\d+) failures", printed)
                rows[fmt] = m.groups()
            assert rows["FP8"] == rows["FP4"] and rows["FP8"][2] == "0"
            o = re.search(rf"FP4 vs FP8 {mode} top-k overlap \(reported\) PASS mean ([\d.]+), lowest row ([\d.]+)", printed)
            label = f"| {steps} step{'s' if steps > 1 else ''}, {draft} draft tokens | {mode}"
            cells = table[table.index(label):].split("|")[3:6]
            assert cells[0].strip().startswith(f"{rows['FP8'][0]} / {rows['FP4'][0]}"), (label, cells)
            assert cells[1].strip() == "0 / 0"
            assert cells[2].strip() == f"{float(o.group(1)):.3f} ({float(o.group(2)):.3f})", (label, cells)


def test_benchmarks_eager_host_time_inside_sglang_is_the_measured_run():
    """The eager-decode host time per indexer call and bench_one_batch's figures as docs/benchmarks.md quotes them."""
    page = _flat(_page("docs/benchmarks.md"))
    host = {f: _json(f"sglang_eager_host_v32_layers_64x896_h100_{f}_2026-12-05.json") for f in ("fp8", "fp4")}
    cells = [f"{h['median_us']:.1f} ({h['p10_us']:.1f}-{h['p90_us']:.1f})" for h in host.values()]
    assert f"| host µs per indexer call, median (10th-90th percentile) | {cells[0]} | **{cells[1]}** |" in page
    assert all(h["calls"] == 90 for h in host.values()) and "90 calls per format" in page
    lines = [json.loads(x) for x in (RESULTS / "sglang_eager_host_v32_layers_64x896_h100_one_batch_2026-12-05.jsonl")
             .read_text().splitlines()]
    run = {x["run_name"]: x for x in lines}
    fp8, fp4 = run["fp8_eager"], run["fp4_eager"]
    assert (f"| decode step, median (`bench_one_batch`) | {fp8['median_decode_latency'] * 1e3:.2f} ms | "
            f"{fp4['median_decode_latency'] * 1e3:.2f} ms |") in page
    assert f"| prefill of the batch | {fp8['prefill_latency']:.3f} s | {fp4['prefill_latency']:.3f} s |" in page
    less = host["fp8"]["median_us"] - host["fp4"]["median_us"]
    assert f"costs the host {less:.1f} µs less than SGLang's FP8 call, {100 * less / host['fp8']['median_us']:.0f} %" in page
    longer = 100 * (fp4["median_decode_latency"] / fp8["median_decode_latency"] - 1)
    assert f"The eager decode step was {longer:.1f} % longer with FP4" in page
    assert f"the indexer calls are {3 * less:.0f} µs of host time per step shorter" in page
    readme = _flat(_page("README.md"))
    assert (f"host time per indexer call, eager decode (no CUDA graphs), 64 × 896 tokens, median | "
            f"{host['fp8']['median_us']:.1f} µs (SGLang's FP8 call) | **{host['fp4']['median_us']:.1f} µs** |") in readme


def test_benchmarks_gpu_suite_sentence_is_the_log():
    """The whole-suite GPU test result docs/benchmarks.md quotes is the sum of the four calls' pytest summaries."""
    log = (RESULTS / "pytest_gpu_h100_2026-12-06.log").read_text()
    summaries = re.findall(r"^(\d+) passed(?:, (\d+) skipped)?, \d+ deselected.* in ([\d.]+)s", log, re.M)
    assert len(summaries) == 4 and not re.search(r"\d+ (failed|errors?)\b|^(FAILED|ERROR) ", log, re.M)
    passed = sum(int(p) for p, _, _ in summaries)
    skipped = sum(int(s or 0) for _, s, _ in summaries)
    seconds = sum(float(t) for _, _, t in summaries)
    assert passed + skipped == 103  # every GPU-marked test of the suite (pytest -m gpu --collect-only)
    assert (f"{passed} passed, {skipped} skipped, none failed, {seconds:.0f} s of test time in all"
            in _flat(_page("docs/benchmarks.md")))


LONG = ("model-accuracy-h100-stand-in-long-context.json", "model-accuracy-h100-trained-indexer-long-context.json")
CONTEXTS = (8192, 16384, 32768)


def _long(name):
    from sglang_fp4_indexer.model_study.report import summarize

    return summarize(_json(name))


def test_accuracy_long_context_tables_are_the_measured_runs():
    """docs/accuracy.md's H100 section holds each run's loss and attention-recall rows as the study renders them,
    and its passkey table is the runs' counts."""
    page = _page("docs/accuracy.md")
    for name in LONG:
        doc = _json(name)
        assert doc["device"] == "cuda" and doc["environment"]["gpu"] == "NVIDIA H100 80GB HBM3"
        md = report.render_markdown(doc)
        loss = [x for x in md.split("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")[1]
                .split("\n\n")[0].splitlines()]
        att = md.split("| context | k | exact selection | FP8 | FP4 |\n| ---: | ---: | ---: | ---: | ---: |\n")[1]
        att = att.split("\n\n")[0].splitlines()
        assert len(loss) == 6 and len(att) == 6 and [r for r in loss + att if r not in page] == []
    s, t = (_long(n) for n in LONG)
    for c in CONTEXTS:
        pk = lambda x, n: "%d/%d" % tuple(x["passkey"][c]["variants"][n]["retrieved"])  # noqa: E731
        ks, kt = min(s["loss"][c]["topk"]), min(t["loss"][c]["topk"])
        assert pk(s, "dense") == pk(t, "dense")
        assert (f"| {c // 1024}K | {pk(s, 'dense')} | {pk(s, 'fp8 k=2048')} / {pk(s, 'fp4 k=2048')} | k {ks}: "
                f"{pk(s, f'fp8 k={ks}')} / {pk(s, f'fp4 k={ks}')} | {pk(t, 'fp8 k=2048')} / {pk(t, 'fp4 k=2048')} | "
                f"k {kt}: {pk(t, f'fp8 k={kt}')} / {pk(t, f'fp4 k={kt}')} |") in page


def test_accuracy_long_context_prose_and_readme_are_the_measured_runs():
    """The figures the H100 section's prose, the README's rows and its sentence quote, from the two runs."""
    page, readme = _flat(_page("docs/accuracy.md")), _flat(_page("README.md"))
    s, t = (_long(n) for n in LONG)
    pm = lambda ms: f"{ms[0]:+.4f} ± {ms[1]:.4f}"  # noqa: E731
    row = lambda x, c, k=None: x["loss"][c]["topk"][k or min(x["loss"][c]["topk"])]  # noqa: E731
    diffs = [r["fp4_minus_fp8"][0] for c in CONTEXTS for r in t["loss"][c]["topk"].values()]
    lo, hi = min(diffs), max(diffs)
    assert f"FP4 − FP8 is between {lo:+.4f} and {hi:+.4f} nats/token at every context and top-k" in page
    assert f"by {lo:+.4f} to {hi:+.4f} nats/token from 8K to 32K tokens" in readme
    worst = row(t, 32768)["fp4_minus_fp8"]
    assert worst[0] == lo and abs(worst[0]) > 2 * worst[1]  # "more than two standard errors from zero"
    assert f"at 32K and top-512 FP4 is even {pm(worst)}" in page
    rec = lambda x: " / ".join(f"{x['loss'][c]['topk'][2048]['recall']['fp4'][0]:.3f}" for c in CONTEXTS)  # noqa: E731
    assert f"Its FP4 keys keep {rec(t)} of the exact top-2048 at 8K / 16K / 32K" in page
    assert f"({rec(s)} at top-2048)" in page
    ratio = [row(s, c)["fp4_minus_fp8"] for c in CONTEXTS]
    assert f"FP4 − FP8 is {', '.join(map(pm, ratio))} at top-128 of 8K, top-256 of 16K and top-512 of 32K" in page
    assert ", ".join(pm(row(s, c, 2048)["fp4_minus_fp8"]) for c in CONTEXTS) + " at top-2048" in page
    assert f"adds {pm(ratio[0])} nats/token at top-128 of 8K, falling to {pm(ratio[2])} at top-512 of 32K" in readme
    top = [row(s, c, 2048)["fp4_minus_fp8"][0] for c in CONTEXTS]
    assert f"{min(top):+.4f} to {max(top):+.4f} at top-2048" in readme
    att = lambda x, c, k, f: x["loss"][c]["topk"][k]["attention_recall"][f][0]  # noqa: E731
    lost = lambda x: " / ".join(  # noqa: E731
        f"{att(x, c, min(x['loss'][c]['topk']), 'fp8') - att(x, c, min(x['loss'][c]['topk']), 'fp4'):.{p}f}"
        for c in CONTEXTS for p in [2 if x is s else 3])
    assert f"({lost(s)} fewer of the attention's top-k at the three 1/64 cases)" in page
    assert f"the trained indexer's FP4 selection loses {lost(t)}" in page
    assert f"At 8K it recalls {att(t, 8192, 2048, 'exact'):.2f} of the layer's attention top-2048" in page
    assert (f"at 16K and 32K {att(t, 16384, 2048, 'exact'):.2f} and {att(t, 32768, 2048, 'exact'):.2f}, below the "
            f"stand-in's {att(s, 16384, 2048, 'exact'):.2f} and {att(s, 32768, 2048, 'exact'):.2f}") in page
    cost = lambda x: " and ".join(f"{row(x, c, 2048)['delta']['exact'][0]:+.3f}" for c in CONTEXTS[1:])  # noqa: E731
    assert f"({cost(t)} at top-2048 of 16K / 32K, stand-in {cost(s)})" in page
    assert f"8K-token sequences (with other changes too: 2 000 steps, 12 x 8K tokens, Python 3.12's text; \"Long context on an H100\" below) it recalls {att(t, 8192, 2048, 'exact'):.2f} at 8K" in page
    assert (f"it recalls {att(t, 8192, 2048, 'exact'):.2f} of the layer's attention top-2048 (the stand-in "
            f"{att(s, 8192, 2048, 'exact'):.2f}; trained on 2K sequences it recalled") in page
    assert f"at top-128 {att(t, 8192, 128, 'exact'):.2f} (the stand-in {att(s, 8192, 128, 'exact'):.2f})" in page
    worst_z = max(m / e for c in CONTEXTS for m, e in (r["fp4_minus_fp8"] for r in t["loss"][c]["topk"].values()))
    assert f"none of it a cost more than {worst_z:.1f} standard errors from zero" in page
    kl = _json(LONG[1])["indexer"]["trained"]
    assert (kl["context"], kl["sequences"], kl["steps"], kl["seed"]) == (8192, 12, 2000, 0)
    assert (" / ".join(f"{kl['kl_before'][la]:.2f}" for la in ("5", "11", "17")) + " to "
            + " / ".join(f"{kl['kl_after'][la]:.2f}" for la in ("5", "11", "17"))) in page
    assert f"{kl['sequences'] * (kl['context'] - 1):,}".replace(",", " ") + " tokens" in page
    cpu = _study(EIGHT_K[1], 8192)
    assert (f"{pm(cpu[128]['fp4_minus_fp8'])} on the CPU and {pm(row(s, 8192)['fp4_minus_fp8'])} here at top-128, "
            f"{pm(cpu[2048]['fp4_minus_fp8'])} and {pm(row(s, 8192, 2048)['fp4_minus_fp8'])} at top-2048") in page
    assert all(f"{cpu[k]['recall']['fp4'][0]:.3f}" == f"{row(s, 8192, k)['recall']['fp4'][0]:.3f}" for k in (2048, 128))
    g, c = (_json(n)["loss"]["8192"]["windows"] for n in (LONG[0], EIGHT_K[1]))
    assert [w["start"] for w in g] == [w["start"] for w in c]  # the same windows: paired
    paired = [report.mean_se([(a["nll"][f"fp4 k={k}"] - a["nll"][f"fp8 k={k}"]) - (b["nll"][f"fp4 k={k}"] - b["nll"][f"fp8 k={k}"])
                              for a, b in zip(g, c)]) for k in (128, 2048)]
    dense = report.mean_se([a["nll"]["dense"] - b["nll"]["dense"] for a, b in zip(g, c)])
    assert (f"GPU minus CPU is {pm(paired[0])} and {pm(paired[1])} (the dense loss {pm(dense)})") in page
    # The README's rows.
    d = lambda x, c, k, f: pm(row(x, c, k)["delta"][f])  # noqa: E731
    assert (f"| {d(t, 8192, 2048, 'fp8')} / {d(t, 32768, 2048, 'fp8')} | "
            f"{d(t, 8192, 2048, 'fp4')} / {d(t, 32768, 2048, 'fp4')} |") in readme
    assert (f"| {d(s, 8192, 128, 'fp8')} / {d(s, 32768, 512, 'fp8')} | "
            f"{d(s, 8192, 128, 'fp4')} / {d(s, 32768, 512, 'fp4')} |") in readme


def _timeline_cell(agg, fmt, key, ms):
    v, d = agg[fmt][key], (1e3 if ms else 1.0)
    f = (lambda x: f"{x / d:.2f}") if ms else (lambda x: f"{x:.1f}")
    return f"{f(v['median'])} [{f(v['min'])}-{f(v['max'])}]"


def test_benchmarks_v32_rank_timeline_tables_and_prose_are_the_measured_traces():
    """The full-depth rank section: both tables cell by cell from the timeline summaries, the traces' counts and
    runs, the ratios and figures the prose quotes, the projection's arithmetic, the KV pool sizes from the
    printed server lines, and the median scorer launches from the committed traces."""
    import io
    import statistics
    import tarfile

    page = _page("docs/benchmarks.md")
    mtp = _json("sglang_timeline_v32_rank20_mtp3x4_h200_2026-12-06.json")
    off = _json("sglang_timeline_v32_rank20_mtp_off_h200_2026-12-06.json")
    assert mtp["layers"] == off["layers"] == 20 and mtp["full_depth"] == 61 and mtp["steps"] == 5
    rows = (("GPU busy time per cycle, 20 layers (ms)", "busy_us", True),
            ("span per cycle: first kernel's start to last kernel's end, 20 layers (ms)", "span_us", True),
            ("indexer logits running alone, nothing else on the GPU, per cycle (ms)", "indexer_exposed_us", True),
            ("one layer: busy time between consecutive scorer launches, median (µs)", "layer_busy_us", False),
            ("**projected to 61 layers**: busy time per cycle (ms)", "projected_busy_us", True),
            ("**projected to 61 layers**: span per cycle (ms)", "projected_span_us", True))
    for summary, shapes in ((mtp, ("8x131072", "1x131072")), (off, ("8x131072",))):
        for label, key, ms in rows:
            cells = []
            for s in shapes:
                agg = summary["shapes"][s]
                cells += [_timeline_cell(agg, "fp8", key, ms), _timeline_cell(agg, "fp4", key, ms),
                          f"{agg['fp8_over_fp4'][key]:.3f}x"]
            assert f"| {label} | " + " | ".join(cells) + " |" in page, (label, shapes)
    for s in ("8x131072", "1x131072"):  # 6 traces per format: 3 from each run order
        for fmt in ("fp8", "fp4"):
            assert mtp["shapes"][s][fmt]["traces"] == 6 and mtp["shapes"][s][fmt]["runs"] == ["fp4_first", "fp8_first"]
    assert off["shapes"]["8x131072"]["fp8"]["traces"] == 3
    flat = _flat(page)
    a = mtp["shapes"]["8x131072"]
    r = a["fp8_over_fp4"]
    assert (f"At 8 x 128K the verify cycle is {r['busy_us']:.3f}x faster with FP4 on the GPU's busy time and "
            f"{r['span_us']:.3f}x on its span, at 20 layers; projected to 61 layers, {r['projected_busy_us']:.3f}x and "
            f"{r['projected_span_us']:.3f}x. At 1 x 128K the two are level "
            f"({mtp['shapes']['1x131072']['fp8_over_fp4']['busy_us']:.3f}x)") in flat
    spread = max(max(v["max"] / v["median"] - 1, 1 - v["min"] / v["median"])
                 for v in (a["fp8"]["busy_us"], a["fp4"]["busy_us"]))
    assert spread < 0.007 and "lies within 0.7 % of its median" in flat
    span_top = max(v["max"] / v["median"] - 1 for v in (a["fp8"]["span_us"], a["fp4"]["span_us"]))
    assert f"up to {100 * span_top:.1f} % above its median" in flat
    lb = {f: a[f]["layer_busy_us"]["median"] for f in ("fp8", "fp4")}
    assert (f"A layer's busy time falls by {lb['fp8'] - lb['fp4']:.1f} µs ({lb['fp8']:.1f} to {lb['fp4']:.1f})") in flat
    ex = {f: a[f]["indexer_exposed_us"]["median"] / 1e3 for f in ("fp8", "fp4")}
    assert f"falls from {ex['fp8']:.2f} to {ex['fp4']:.2f} ms per cycle" in flat
    p8, p4 = (a[f]["projected_busy_us"]["median"] / 1e3 for f in ("fp8", "fp4"))
    need = p4 - p8 / 1.15
    assert (f"{r['projected_busy_us']:.3f}x projected at 61 layers" in flat
            and f"from {p4:.2f} to {p8:.2f} / 1.15 = {p8 / 1.15:.2f} ms, {need:.2f} ms per cycle, about "
                f"{1e3 * need / 64:.0f} µs per scorer launch at 64 launches per cycle" in flat)
    gflop = 4 * 64 * 128 * 2 * 8 * 131072 / 1e9
    assert f"({gflop:.1f} GFLOP at 8 x 128K), so 47 µs means {gflop / 47e-6 / 1e6:.2f} PFLOP/s" in flat
    # The median scorer launch in the committed traces (the FP8-first server's first trace of each format).
    bench_spec = importlib.util.spec_from_file_location("sglang_bench", REPO / "scripts" / "sglang_bench.py")
    bench = importlib.util.module_from_spec(bench_spec)
    bench_spec.loader.exec_module(bench)
    med, launches = {}, {}
    with tarfile.open(RESULTS / "sglang_timeline_v32_rank20_mtp3x4_h200_traces_2026-12-06.tar.gz") as tar:
        for fmt in ("fp8", "fp4"):
            raw = tar.extractfile(f"fp8_first/{fmt}_8x131072_r1.trace.json.gz").read()
            trace = json.loads(gzip.decompress(raw))
            d = [iv[1] - iv[0] for iv in bench.gpu_intervals(trace) if re.search(bench.SCORER_KERNELS, iv[3])
                 and not re.search(bench.SCHEDULE_KERNELS, iv[3])]
            med[fmt], launches[fmt] = statistics.median(d), len(d) / 5
    assert launches == {"fp8": 23, "fp4": 23} and "23 scorer launches per cycle" in flat
    assert f"the median launch takes {med['fp8']:.1f} µs (FP8) and {med['fp4']:.1f} µs (FP4)" in flat
    assert f"drop from about {med['fp4']:.0f} to about {med['fp4'] - 1e3 * need / 64:.0f} µs" in flat
    o = off["shapes"]["8x131072"]
    assert (f"a layer gains {o['fp8']['layer_busy_us']['median'] - o['fp4']['layer_busy_us']['median']:.1f} µs, the "
            f"step {o['fp8_over_fp4']['busy_us']:.3f}x") in flat
    text = (RESULTS / "sglang_timeline_v32_rank20_h200_2026-12-06.txt").read_text()
    pools = [int(n) for n in re.findall(r"KV Cache is allocated\. dtype: \S+, #tokens: (\d+), KV size: 70", text)]
    assert sorted(set(pools)) == [4795328, 5219200]
    assert (f"held {4795328:,} tokens with FP8 and {5219200:,} with FP4 (+{100 * (5219200 / 4795328 - 1):.1f} %)"
            .replace(",", " ")) in flat


def test_readme_first_screen_figures_are_the_raw_files():
    """The figures of "Should you turn it on?", each from the raw file (or the format arithmetic) it comes from."""
    page = _flat(_page("README.md"))
    first = page[page.index("## Should you turn it on?"):page.index("### Memory:")]
    bf16, fp8 = _tokens(1152), _tokens(656)
    assert (f"+{bf16.gain_replicated * 100:.1f} % KV tokens (bf16 MLA KV cache) "
            f"or +{fp8.gain_replicated * 100:.1f} % (FP8 MLA KV cache) in the same memory (computed, any GPU)") in first
    (k8, k4), _, printed = _pair("kv_limited_100k_h100")
    p8, p4 = _pools(printed)
    per = 100000 + 256  # each request: its 100 000-token prompt and 256 output tokens
    # The 3-layer KV-limited load (MTP off, 100K) sits in the H100 table below the first screen.
    assert (f"| H100, KV-limited: {k8['completed']} prompts of 100K at concurrency {k8['max_concurrency']}, MTP off, "
            f"FP8's pool holds {p8 // per} requests and FP4's {p4 // per} in the same memory: output tokens/s (one "
            f"pair, FP8 first) | {k8['output_throughput']:.1f} | **{k4['output_throughput']:.1f} "
            f"(+{100 * (k4['output_throughput'] / k8['output_throughput'] - 1):.1f} %)** |") in page
    # The full-depth pair's figures in this row: test_full_depth_kv_limited_load_is_the_measured_pair.
    assert "| What was measured (dummy weights; details below) |" in first
    t = _long(LONG[1])
    diffs = [r["fp4_minus_fp8"][0] for c in CONTEXTS for r in t["loss"][c]["topk"].values()]
    assert f"changed the loss by {min(diffs):+.4f} to {max(diffs):+.4f} nats/token against FP8" in first
    # The GPU each table row was measured on heads the row; each GPU's table holds only that GPU's rows, and every
    # end-to-end row names its GPU.
    lines = _page("README.md").splitlines()
    for heading, gpu in (("### One H200", "H200"), ("### One H100", "H100"), ("### End to end inside SGLang", None)):
        start = next(i for i, line in enumerate(lines) if line.startswith(heading))
        end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("##"))
        body = [line.split("|")[1].strip() for line in lines[start:end] if line.startswith("| ") and "FP8 index" not in line
                and not line.startswith("| ---")]
        labels = {m.group(1) if m else None for m in (re.match(r"(H\d+), ", cell) for cell in body)}
        assert body and None not in labels and (gpu is None or labels == {gpu}), (heading, body)


def test_readme_verify_cycle_rows_and_sentence_are_the_timeline_summaries():
    """The README's H200 end-to-end rows and its first-screen sentence, from the timeline summaries (medians over
    6 traces per format, both run orders) and the KV pool lines the servers printed."""
    readme = _page("README.md")
    flat = _flat(readme)
    mtp = _json("sglang_timeline_v32_rank20_mtp3x4_h200_2026-12-06.json")["shapes"]
    off = _json("sglang_timeline_v32_rank20_mtp_off_h200_2026-12-06.json")["shapes"]["8x131072"]

    def cells(agg, key, bold):
        f8, f4 = agg["fp8"][key]["median"] / 1e3, agg["fp4"][key]["median"] / 1e3
        fp4 = f"{f4:.2f} ms ({f8 / f4:.3f}x)"
        return f"| {f8:.2f} ms | " + (f"**{fp4}**" if bold else fp4) + " |"

    a8, a1 = mtp["8x131072"], mtp["1x131072"]
    assert a8["fp8"]["traces"] == a8["fp4"]["traces"] == 6 and "median of 6 traces" in flat
    assert ("| H200, MTP (3 steps / 4 draft tokens: verify next_n 4), 8 × 128K: busy time per verify cycle, 20 layers "
            + cells(a8, "busy_us", True)) in readme
    assert ("| H200, the same projected to 61 layers (a step time, not a configuration one H200 can hold: 8 × 128K "
            "beside 61 layers needs more memory) " + cells(a8, "projected_busy_us", True)) in readme
    assert "| H200, the same at 1 × 128K, 20 layers " + cells(a1, "busy_us", False) in readme
    assert "| H200, MTP off, 8 × 128K: busy time per decode step, 20 layers " + cells(off, "busy_us", False) in readme
    r = a8["fp8_over_fp4"]
    first = flat[flat.index("## Should you turn it on?"):flat.index("### Memory:")]
    assert (f"verify cycle {r['busy_us']:.3f}x faster in GPU busy time (H200, 20 of 61 layers; "
            f"{r['projected_busy_us']:.3f}x projected to 61)") in first
    assert "(the H200's 61-layer figures are projections)" in first  # the projected figure is not a run
    text = (RESULTS / "sglang_timeline_v32_rank20_h200_2026-12-06.txt").read_text()
    assert "#tokens: 4795328, KV size: 70.39 GB" in text and "#tokens: 5219200, KV size: 70.38 GB" in text
    assert "| 4,795,328 | 5,219,200 (**+8.8 %**) |" in readme and f"{100 * (5219200 / 4795328 - 1):.1f}" == "8.8"


def test_user_guide_first_oracle_run_is_the_raw_file():
    """The first GPU run of ``trace-check --oracle`` as the user guide tells it: FP4 recorded no oracle row, FP8 draft
    decode missed in 28 of 30 rows by at most 1.1e-20, FP8 target verify and draft extend passed on 60 rows each."""
    checks = {c["check"]: c for c in _json("sglang_mtp3_oracle_first_h100_2026-12-06.json")["checks"]}
    pre = "EAGLE 3 step(s), 4 draft tokens, "
    oracle = "top-k = fp64 oracle on the server's pages, within the scorer's bound"
    for mode in ("draft decode", "draft extend", "target verify"):
        assert checks[f"{pre}FP4: {mode} {oracle}"]["detail"].startswith("0 rows of the first request in 0 calls")
    dd = checks[f"{pre}FP8: draft decode {oracle}"]
    m = re.search(r"(\d+) rows of the first request .* (\d+) failed, worst margin (\S+)", dd["detail"])
    assert (int(m.group(1)), int(m.group(2))) == (30, 28) and f"{-float(m.group(3)):.1e}" == "1.1e-20"
    for mode in ("draft extend", "target verify"):
        c = checks[f"{pre}FP8: {mode} {oracle}"]
        assert c["ok"] and c["detail"].startswith("60 rows of the first request")
    text = _flat(_page("docs/user-guide.md"))
    assert "28 of 30 FP8 draft decode rows missed by up to 1.1e-20" in text
    assert "FP8 target verify (60 rows) and draft extend (60 rows) passed the oracle there" in text


def test_user_guide_second_oracle_run_is_the_raw_file():
    """The fixed check's GPU run as the user guide tells it: target verify and draft extend pass for both formats
    (60 rows each, the worst margins quoted), draft decode misses in 28 of 30 rows for both (margins quoted), every
    structural check passes, the overlaps average 0.93."""
    checks = {c["check"]: c for c in _json("sglang_mtp3_oracle_second_h100_2026-12-06.json")["checks"]}
    pre = "EAGLE 3 step(s), 4 draft tokens, "
    oracle = "top-k = fp64 oracle on the server's pages, within the scorer's bound"

    def got(fmt, mode):
        c = checks[f"{pre}{fmt}: {mode} {oracle}"]
        m = re.search(r"(\d+) rows of the first request .* (\d+) failed, worst margin (\S+)", c["detail"])
        return c["ok"], int(m.group(1)), int(m.group(2)), float(m.group(3))

    margins = {}
    for fmt in ("FP8", "FP4"):
        for mode in ("target verify", "draft extend"):
            ok, rows, failed, margin = got(fmt, mode)
            assert ok and (rows, failed) == (60, 0)
            margins[(fmt, mode)] = f"{margin:.1e}"
        ok, rows, failed, margin = got(fmt, "draft decode")
        assert not ok and (rows, failed) == (30, 28)
        margins[(fmt, "draft decode")] = f"{margin:.1e}"
    for fmt in ("FP8", "FP4"):
        for mode in ("draft decode", "draft extend", "target verify"):
            assert checks[f"{pre}{fmt}: every {mode} top-k row valid"]["ok"]
    text = _flat(_page("docs/user-guide.md"))
    v, e = [margins[(f, "target verify")] for f in ("FP8", "FP4")], [margins[(f, "draft extend")] for f in ("FP8", "FP4")]
    assert v == ["8.8e-17", "4.4e-17"] and e == ["2.0e-20", "9.5e-21"]
    assert f"worst margins {v[0]} / {v[1]} and {e[0]} / {e[1]}" in text
    d = [margins[(f, "draft decode")] for f in ("FP8", "FP4")]
    assert f"28 of 30 draft decode rows still miss, FP8 and FP4 alike (worst margins {d[0]} and {d[1]})" in text
    means = [float(re.search(r"mean (\S+),", c["detail"]).group(1)) for k, c in checks.items() if "overlap" in k]
    assert len(means) == 3 and f"{sum(means) / 3:.2f}" == "0.93" and "overlap FP8's by 0.93 on average" in text


def test_user_guide_first_soak_run_is_the_raw_files():
    """The first short soak as the user guide tells it: about 50 s of load per server, and the empty prompt that
    stopped both servers (no answer, FP8 and FP4 alike), from the runs and checks it wrote."""
    runs, checks = _soak_files("sglang_soak_tiny_short_h100_2026-12-06.tar.gz")
    text = _flat(_page("docs/user-guide.md"))
    assert "(50 s of load per format, dummy logit scale;" in text
    for f in checks:
        assert 50 <= runs[f]["load"]["seconds"] < 60 and runs[f]["load"]["counts"].get("error", 0) == 0
        bad = {b["input"]: b["status"] for b in runs[f]["bad_inputs"]}
        assert bad["prompt longer than the context"] == 400 and bad["empty prompt"] == 0
        assert not checks[f]["bad input, empty prompt: an answer, server healthy"]["ok"]
    assert "found that SGLang 0.5.23 stops on a prompt of zero tokens" in text


def test_readme_check_example_paragraph_is_the_raw_files():
    """The paragraph before the README's second check example: the KV memory the full-depth rank's server allocated
    (SGLang's log, GiB), the busy-time ratios of both orders that check quotes, and the wall-time ratios beside."""
    import io
    import tarfile

    kv = set()
    for name in ("sglang_timeline_v32_rank61_ep32_h100_logs_2026-12-06.tar.gz",
                 "sglang_timeline_v32_rank61_ep32_fp4_first_h100_logs_2026-12-06.tar.gz"):
        with tarfile.open(RESULTS / name) as tar:
            for member in tar.getmembers():
                if member.isfile() and "server" in member.name:
                    raw = tar.extractfile(member).read()
                    text = (gzip.decompress(raw) if member.name.endswith(".gz") else raw).decode(errors="replace")
                    kv |= {float(m) for m in re.findall(r"#tokens: \d+, KV size: ([\d.]+) GB", text) if float(m) > 1}
    assert kv == {26.38}
    orders = [_json(n)["shapes"]["4x131072"]["fp8_over_fp4"] for n in (_R61, _R61_FP4_FIRST)]
    busy = sorted(o["busy_us"] for o in orders)
    wall = sorted(o["wall_ms_per_cycle"] for o in orders)
    text = _flat(_page("README.md"))
    assert (f"in the 26.38 GiB of KV memory that rank's server allocated), `check` quotes the measured cycle's GPU "
            f"busy time in both run orders ({busy[0]:.3f}-{busy[1]:.3f}x; the wall time at the client, "
            f"{wall[0]:.3f}-{wall[1]:.3f}x, is in the tables below)") in text
    assert "--memory-gib 26.38" in text


def test_user_guide_real_scale_oracle_run_and_topk_probe_are_the_raw_files():
    """At a real logit scale every mode passes the oracle for both formats (rows, largest logits, worst margins and
    the overlap as quoted), and the top-k probe's findings (exact at scale 1, the differing entries at 1e-19 on long
    rows only) as the user guide tells them."""
    checks = {c["check"]: c for c in _json("sglang_mtp3_oracle_real_scale_h100_2026-12-06.json")["checks"]}
    assert all(c["ok"] for c in checks.values())
    pre = "EAGLE 3 step(s), 4 draft tokens, "
    oracle = "top-k = fp64 oracle on the server's pages, within the scorer's bound"
    text = _flat(_page("docs/user-guide.md"))
    rows, margins, logits = {}, {}, []
    for mode in ("target verify", "draft extend", "draft decode"):
        for fmt in ("FP8", "FP4"):
            m = re.search(r"(\d+) rows of the first request .* largest \|logit\| (\S+), (\d+) failed, worst margin (\S+)",
                          checks[f"{pre}{fmt}: {mode} {oracle}"]["detail"])
            rows.setdefault(mode, set()).add(int(m.group(1)))
            assert int(m.group(3)) == 0
            logits.append(float(m.group(2)))
            margins.setdefault(mode, []).append(f"{float(m.group(4)):.2f}")
        assert f"{margins[mode][0]} / {margins[mode][1]} ({mode if mode != 'target verify' else 'target verify, FP8 / FP4'})" in text
    assert rows == {"target verify": {60}, "draft extend": {60}, "draft decode": {30}}
    assert "target verify (60 per format), draft extend (60) and draft decode (30)" in text
    assert f"largest logits of {min(logits):.1f} to {max(logits):.1f}" in text
    means = [float(re.search(r"mean (\S+),", c["detail"]).group(1)) for k, c in checks.items() if "overlap" in k]
    assert len(means) == 3 and f"overlap FP8's by {sum(means) / 3:.2f} on average" in text
    probe = _json("sglang_topk_probe_h100_2026-12-06.json")
    assert {p["width"] for p in probe} == {163840, 5184}
    at_one = [p for p in probe if p["scale"] == 1.0]
    assert at_one and all(p["rows_differ"] == 0 for p in at_one)
    lens = sorted({n for p in at_one for n in p["lens"]})
    assert (lens[0], lens[-1]) == (3000, 131072) and "(2 to 32 rows of 3,000 to 131,072 keys)" in text
    tiny = [p for p in probe if p["scale"] != 1.0]
    differ = {n for p in tiny if p["rows_differ"] for n in p["lens"]}
    exact = {n for p in tiny if not p["rows_differ"] for n in p["lens"]}
    assert differ == {65536, 131072} and exact == {3000, 3077, 5121}
    at_128k = sorted(p["entries_differ"] for p in tiny if p["lens"] == [131072])
    assert f"({at_128k[0]:,} to {at_128k[-1]:,} of 2,048 entries in a row of 131,072)" in text


def _soak_names(arm: str) -> tuple[str, str, str]:
    """A soak arm's run, checks and server log as scripts/sglang_gpu_check.sh names them: ``fp4`` ->
    ``soak_fp4.json``, ``soak_checks_fp4.json``, ``soak_server_fp4.log.gz``; ``hicache_fp4`` -> ``soak_hicache_...``."""
    tag, _, fmt = ("soak_" + arm).rpartition("_")
    return f"{tag}_{fmt}.json", f"{tag}_checks_{fmt}.json", f"{tag}_server_{fmt}.log.gz"


def _soak_files(name: str, arms: tuple[str, ...] = ("fp4", "fp8")) -> tuple[dict, dict]:
    """The runs and checks (by check name) per arm (``_soak_names``) in a committed soak tarball."""
    import io
    import tarfile

    with tarfile.open(RESULTS / name) as tar:
        read = lambda n: json.load(io.TextIOWrapper(tar.extractfile(f"./{n}")))  # noqa: E731
        runs = {f: read(_soak_names(f)[0]) for f in arms}
        checks = {f: {c["check"]: c for c in read(_soak_names(f)[1])} for f in arms}
    return runs, checks


_SOAK_NEW = "sglang_soak_tiny_fp4_hicache_h100_2026-12-07.tar.gz"
_SOAK_RETRACT = "sglang_soak_tiny_retract_h100_2026-12-07.tar.gz"


def _soak_published() -> tuple[dict, dict]:
    """The published soak's servers: FP8 (the retraction run), FP4 and FP4 with HiCache (the rerun)."""
    old_runs, old_checks = _soak_files(_SOAK_RETRACT)
    runs, checks = _soak_files(_SOAK_NEW, ("fp4", "hicache_fp4"))
    return {"fp8": old_runs["fp8"], **runs}, {"fp8": old_checks["fp8"], **checks}


def test_user_guide_soak_run_is_the_raw_files():
    """The soak as the user guide and README tell it: per server the requests sent, completed, disconnected and
    aborted, the seconds of load, retractions, no server error, the pool back to full, the sampled rows and worst
    oracle margins, HiCache's reloaded prefix tokens, every check passed; and the earlier FP4 run's one failed check,
    whose every request aborted unasked has as its rid's prefix the rid of one the load aborted (SGLang's prefix
    match, the explanation the docs give)."""
    runs, checks = _soak_published()
    text = _flat(_page("docs/user-guide.md"))
    c = {f: runs[f]["load"]["counts"] for f in runs}
    sent = {f: sum(v for k, v in c[f].items() if k != "not sent (time limit)") for f in c}
    secs = {f: runs[f]["load"]["seconds"] for f in runs}
    assert all(c[f].get("error", 0) == 0 for f in c)
    assert (f"{sent['fp8']:,} (FP8) and {sent['fp4']:,} (FP4) requests sent in {secs['fp8']:.0f} s and "
            f"{secs['fp4']:.0f} s, {c['fp8']['completed']:,} and {c['fp4']['completed']:,} completed, "
            f"{c['fp8']['disconnected']} and {c['fp4']['disconnected']} disconnected by their clients, "
            f"{c['fp8']['aborted']} and {c['fp4']['aborted']} aborted, no server error") in text
    oracle = "sampled rows = fp64 oracle top-k on the server's pages (within the bound)"
    retract = "retraction exercised: SGLang retracted decode requests"
    hicache = "HiCache exercised: prefix tokens evicted to host memory and loaded back"
    got = {}
    for f in checks:
        assert all(p["free_tokens"] == p["max_total_num_tokens"] == 262144
                   for p in (runs[f]["pool_before"], runs[f]["pool_after"]))
        assert checks[f][retract]["ok"] and runs[f]["load"]["unasked_aborts"] == 0
        d = checks[f][oracle]["detail"]
        got[f] = (sum(int(n) for n in re.findall(r"(\d+) rows, 0 failed", d)),
                  f"{float(d.rsplit('worst margin ', 1)[1].split(';')[0]):.2f}")
        assert checks[f][oracle]["ok"] and len(re.findall(r"0 failed", d)) == 3
        assert all(v["ok"] for v in checks[f].values()), f
    assert {f: len(checks[f]) for f in checks} == {"fp8": 16, "fp4": 16, "hicache_fp4": 17}
    assert (hicache in checks["hicache_fp4"]) and all(hicache not in checks[f] for f in ("fp8", "fp4"))
    assert "(16, and 17 with HiCache; three were added since" in text
    assert (f"(FP8: {got['fp8'][0]:,} rows, FP4: {got['fp4'][0]:,}, of the three modes; worst margins "
            f"{got['fp8'][1]} and {got['fp4'][1]})") in text
    h, hc = runs["hicache_fp4"]["load"], runs["hicache_fp4"]["load"]["cache"]
    assert (f"{sent['hicache_fp4']:,} requests sent, {h['counts']['completed']:,} completed, "
            f"{hc['from_host']:,} prefix tokens loaded back from host memory for {hc['requests_from_host']} of them"
            ) in text
    assert (f"({got['hicache_fp4'][0]:,} oracle rows, worst margin {got['hicache_fp4'][1]})") in text
    assert checks["hicache_fp4"][hicache]["detail"] == (
        f"{hc['from_host']} tokens loaded back for {hc['requests_from_host']} requests")
    stages = (RESULTS / _SOAK_NEW.replace(".tar.gz", ".txt")).read_text()
    assert "soak_fp4 server ready after 233 s" in _tar_text(_SOAK_NEW, "stages.txt")
    assert "soak_hicache_fp4 server ready after 96 s" in _tar_text(_SOAK_NEW, "stages.txt")
    assert "soak_fp4 rc=0 270 s" in _tar_text(_SOAK_NEW, "stages.txt") and "(that call took 106 s)" in stages
    assert ("a server's start took 96 s once SGLang's and DeepGEMM's JIT kernels were compiled and 233 s on a "
            "fresh machine, which compiles them; the FP4 load 270 s and its checks 106 s") in text
    readme = _flat(_page("README.md"))
    assert (f"{sent['fp8']:,} (FP8) and {sent['fp4']:,} (FP4) streamed requests with disconnecting and aborted "
            f"clients, and {sent['hicache_fp4']} more to an FP4 server with HiCache ({hc['from_host']:,} prefix tokens "
            "evicted to host memory and loaded back), gave no server error") in readme
    # The earlier FP4 run beside the FP8 one: its one failed check, the load's rids.
    old, old_checks = _soak_files(_SOAK_RETRACT)
    failed = {f: sorted(k for k, v in old_checks[f].items() if not v["ok"]) for f in old_checks}
    assert failed == {"fp4": ["no request aborted by the server that its client did not abort"], "fp8": []}
    results = old["fp4"]["load"]["results"]
    asked = [i for i, r in enumerate(results) if r and r.get("abort_asked")]
    unasked = [i for i, r in enumerate(results) if r and r["outcome"] == "aborted" and not r.get("abort_asked")]
    assert len(unasked) == old["fp4"]["load"]["unasked_aborts"] == 6
    assert all(any(str(i).startswith(str(j)) and i != j for j in asked) for i in unasked)
    assert min(unasked) == 21 and max(unasked) == 29 and 2 in asked
    assert "(`soak-0-21` ... `soak-0-29` after `soak-0-2`)" in text
    assert "6 of its requests were aborted unasked" in text
    # The rerun's rids: all of one width, so none is another's prefix (soak.py's own rule, and the docs' example).
    assert len(runs["fp4"]["load"]["results"]) == 3000 and "(`soak-0-0002`)" in _flat(_page("docs/benchmarks.md"))
    first, _ = _soak_files("sglang_soak_tiny_h100_2026-12-06.tar.gz")
    c = {f: first[f]["load"]["counts"] for f in first}
    assert all(sum(c[f].values()) == 3000 for f in c)
    assert (f"3,000 requests per format, {c['fp4']['completed']:,} (FP4) and {c['fp8']['completed']:,} (FP8) "
            "completed, no server error, the pool back to full") in text


def _tar_text(name: str, member: str) -> str:
    """One text member of a committed tarball."""
    import tarfile

    with tarfile.open(RESULTS / name) as tar:
        return tar.extractfile(f"./{member}").read().decode()


def test_benchmarks_soak_table_is_rebuilt_from_the_raw_files(tmp_path):
    """The soak's table in docs/benchmarks.md equals scripts/soak.py's table rebuilt from the runs, checks and
    server logs in the committed tarballs (FP8 from the retraction run, FP4 and FP4 with HiCache from the rerun)."""
    import importlib.util
    import tarfile

    for name, sub in ((_SOAK_RETRACT, "old"), (_SOAK_NEW, "new")):
        with tarfile.open(RESULTS / name) as tar:
            tar.extractall(tmp_path / sub, filter="data")
    spec = importlib.util.spec_from_file_location("soak_for_table", REPO / "scripts" / "soak.py")
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    arms = {"FP4": ("new", "fp4"), "FP8": ("old", "fp8"), "FP4 with HiCache": ("new", "hicache_fp4")}
    runs = {a: json.loads((tmp_path / d / _soak_names(f)[0]).read_text()) for a, (d, f) in arms.items()}
    checks = {a: json.loads((tmp_path / d / _soak_names(f)[1]).read_text()) for a, (d, f) in arms.items()}
    logs = {a: gzip.open(tmp_path / d / _soak_names(f)[2], "rt", errors="replace").read()
            for a, (d, f) in arms.items()}
    lines = ["| | FP4 | FP8 | FP4 with HiCache |", "| --- | --- | --- | --- |"] + [
        f"| {label} | " + " | ".join(str(v) for v in vals) + " |" for label, vals in soak.summary_rows(runs, logs, checks)]
    page = _page("docs/benchmarks.md")
    assert "\n".join(lines) in page
    assert "\n".join(lines) in (RESULTS / _SOAK_NEW.replace(".tar.gz", ".txt")).read_text()
    for name in (_SOAK_NEW, _SOAK_RETRACT):
        assert f"`benchmarks/results/{name}`" in page


_MC = ("bench_h100_sm90_multicast_n4n2_2026-12-06.json", "bench_h100_sm90_multicast_shapes_2026-12-06.json",
       "bench_h100_sm90_multicast_repeat_2026-12-06.json")


def _mc_rows():
    """(label, tag, row) of the three H100 runs with DeepGEMM's newer SM90 kernel, in file order."""
    out = []
    for i, name in enumerate(_MC):
        run = _json(name)
        assert run["meta"]["device"] == "NVIDIA H100 80GB HBM3" and run["failures"] in (0, [], None)
        for row in run["rows"]:
            assert all(r.get("check", {}).get("ok") for r in row["results"].values()), row["label"]
            out.append((row["label"], "again" if i == 2 else "first", row))
    return out


def test_benchmarks_newer_sm90_kernel_table_is_the_raw_files():
    """Each line of the H100 table against DeepGEMM's newer SM90 kernel, rebuilt from its raw row."""
    page = _page("docs/benchmarks.md")

    def cell(us, ours):
        ratio = us / ours
        return f"{us * 1e6:.1f} ({ratio:.2f})" if ratio >= 1 else f"{us * 1e6:.1f} (**{ratio:.2f}**)"

    rows = _mc_rows()
    assert len(rows) == 12
    for label, tag, r in rows:
        h, bc, n, _ = label.split()
        b, c = bc.split("x")
        res = r["results"]
        ours = res["ours"]["seconds"]
        binds = "TC" if res["ours"]["binds"] == "tensor cores" else "HBM"
        line = (f"| {h} {b} × {c} next_n {n[1:]}{' (again)' if tag == 'again' else ''} | {r['fp4_floor_s'] * 1e6:.1f} / "
                f"{r['tensor_core_floor_s'] * 1e6:.1f} | {ours * 1e6:.1f} ({res['ours']['pct_roofline']:.0f} %, {binds}) | "
                f"{cell(res['deepgemm-fp8']['seconds'], ours)} | {cell(res['deepgemm-fp8-native']['seconds'], ours)} | "
                f"{cell(res['deepgemm-fp8-sm90-multicast']['seconds'], ours)} |")
        assert line in page, line
    rates = [_json(n)["meta"]["fp8_mma_flops_per_s"] for n in _MC]
    assert f"({min(rates) / 1e12:.0f}-{max(rates) / 1e12:.0f} TFLOP/s" in page


_Q1 = ("bench_h100_q_one_chunk_2026-12-07.json", "bench_h100_q_one_chunk_reverse_2026-12-07.json")


def test_readme_newer_sm90_kernel_sentence_is_the_raw_files():
    """The README's sentence on DeepGEMM's newer SM90 kernel quotes the current kernel's two H100 runs (both scorer
    orders) at 8 x 128K and 1 x 128K next_n 4 as ranges over the runs; 4 x 128K: its own test, from its own runs."""
    us = {}
    for name in _Q1:
        for r in _json(name)["rows"]:
            if (r["heads"], r["context"], r["next_n"]) == (64, 131072, 4) and r["batch"] in (1, 8):
                for col in ("ours", "deepgemm-fp8-sm90-multicast"):
                    us.setdefault((r["batch"], col), []).append(r["results"][col]["seconds"] * 1e6)
    assert all(len(v) == 2 for v in us.values()) and len(us) == 4

    def span(v):
        lo, hi = f"{min(v):.1f}", f"{max(v):.1f}"
        return lo if lo == hi else f"{lo}-{hi}"

    text = _flat(_page("README.md"))
    assert (f"is level with ours at 8 × 128K (it {span(us[8, 'deepgemm-fp8-sm90-multicast'])} µs, ours "
            f"{span(us[8, 'ours'])} µs), 2 % faster than ours at 4 × 128K and faster at 1 × 128K (it "
            f"{span(us[1, 'deepgemm-fp8-sm90-multicast'])} µs, ours {span(us[1, 'ours'])} µs) on an H100") in text


_R61 = "sglang_timeline_v32_rank61_ep32_mtp3x4_h100_2026-12-06.json"
_MC4 = ("bench_h100_sm90_multicast_4x128k_2026-12-06.json", "bench_h100_sm90_multicast_4x128k_repeat_2026-12-06.json")


_R61_FP4_FIRST = "sglang_timeline_v32_rank61_ep32_mtp3x4_fp4_first_h100_2026-12-06.json"


def _r61_rows(s: dict) -> tuple[dict, dict, list[str]]:
    """One order's summary as the benchmarks page's table rows (every cell: median [min-max] over 3 traces, the
    wall time median [quartiles] of the client's intervals)."""
    agg = s["shapes"]["4x131072"]
    wall = {r["format"]: r["ms_per_cycle"] for r in s["wall_rows"]}
    assert {r["format"]: r["tokens_per_cycle"] for r in s["wall_rows"]} == {"fp8": 1.0, "fp4": 1.0}

    def cells(key, scale, fmt, bold=False):
        v = [agg[f][key] for f in ("fp8", "fp4")]
        c = [f"{x['median'] / scale:{fmt}} [{x['min'] / scale:{fmt}}-{x['max'] / scale:{fmt}}]" for x in v]
        r = f"{v[0]['median'] / v[1]['median']:.3f}x"
        return f"| {c[0]} | {c[1]} | " + (f"**{r}**" if bold else r) + " |"

    w = [f"{wall[f]['median']:.2f} [{wall[f]['q1']:.2f}-{wall[f]['q3']:.2f}]" for f in ("fp8", "fp4")]
    rows = [f"| wall time between a request's streamed chunks, at the client (ms) | {w[0]} | {w[1]} | "
            f"**{wall['fp8']['median'] / wall['fp4']['median']:.3f}x** |",
            "| GPU busy time per cycle (ms) " + cells("busy_us", 1e3, ".2f", True),
            "| span per cycle: first kernel's start to last kernel's end (ms) " + cells("span_us", 1e3, ".2f"),
            "| indexer logits running alone, nothing else on the GPU, per cycle (ms) "
            + cells("indexer_exposed_us", 1e3, ".2f"),
            "| one layer: busy time between consecutive scorer launches, median (µs) "
            + cells("layer_busy_us", 1, ".1f")]
    return agg, wall, rows


def test_benchmarks_full_depth_rank_table_is_the_timeline_and_wall_records():
    """The H100 61-layer rank's two tables (FP8 server first; FP4 server first): every cell from that order's
    timeline summary (3 traces per server, and the wall records' intervals), the KV pool lines from what the servers
    printed, the sentences' arithmetic from both."""
    page = _page("docs/benchmarks.md")
    flat = _flat(page)
    orders = {}
    for name, runs, title in ((_R61, (["s1_fp8"], ["s2_fp4"]), "FP8 server first"),
                              (_R61_FP4_FIRST, (["s4_fp8"], ["s3_fp4"]), "FP4 server first")):
        s = _json(name)
        assert s["layers"] == 61 and s["full_depth"] == 61
        agg, wall, rows = _r61_rows(s)
        assert agg["fp8"]["traces"] == agg["fp4"]["traces"] == 3
        assert (agg["fp8"]["runs"], agg["fp4"]["runs"]) == runs
        table = page[page.index(f"| per verify cycle, 4 × 131 072, 61 layers, {title} |"):]
        table = table[: table.index("\n\n")]
        for row in rows:
            assert row in table, row
        assert "| 589,120 | 641,216 (+8.8 %) | |" in table
        assert f"the {wall['fp8']['n']} (FP8) and {wall['fp4']['n']} (FP4) intervals" in flat
        orders[title] = (agg, wall)
    for text in ((RESULTS / "sglang_timeline_v32_rank61_ep32_h100_2026-12-06.txt").read_text(),
                 (RESULTS / "sglang_timeline_v32_rank61_ep32_fp4_first_h100_2026-12-06.txt").read_text()):
        assert "#tokens: 589120, KV size: 26.38 GB" in text and "#tokens: 641216, KV size: 26.38 GB" in text
    assert f"{100 * (641216 / 589120 - 1):.1f}" == "8.8"
    assert f"(FP8 {589120 / 131072:.2f}, FP4 {641216 / 131072:.2f} requests' worth of tokens)" in flat
    text = (RESULTS / "sglang_timeline_v32_rank61_ep32_h100_2026-12-06.txt").read_text()
    assert "gen throughput (token/s): 108.26" in text and "gen throughput (token/s): 117.96" in text
    text2 = (RESULTS / "sglang_timeline_v32_rank61_ep32_fp4_first_h100_2026-12-06.txt").read_text()
    assert "gen throughput (token/s): 106.62" in text2 and "gen throughput (token/s): 115.98" in text2
    assert ("108.26 against 117.96 generated tokens/s (FP8 server first) and 106.62 against 115.98 (FP4 server "
            "first)") in flat
    # The ratios' range quoted in the prose and the README, over both orders, wall and busy time.
    ratios = sorted(f"{v:.3f}" for agg, wall in orders.values()
                    for v in (wall["fp8"]["median"] / wall["fp4"]["median"],
                              agg["fp8"]["busy_us"]["median"] / agg["fp4"]["busy_us"]["median"]))
    assert f"verify cycle {ratios[0]}-{ratios[-1]}x faster, in wall time and busy time alike, in both orders" in flat
    (a1, w1), (a2, w2) = orders["FP8 server first"], orders["FP4 server first"]
    assert (f"busy time {a1['fp8']['busy_us']['median'] / a1['fp4']['busy_us']['median']:.3f}x and "
            f"{a2['fp8']['busy_us']['median'] / a2['fp4']['busy_us']['median']:.3f}x, wall time "
            f"{w1['fp8']['median'] / w1['fp4']['median']:.3f}x and {w2['fp8']['median'] / w2['fp4']['median']:.3f}x") in flat
    assert (f"FP8's busy time {a2['fp8']['busy_us']['median'] / 1e3:.2f} against {a1['fp8']['busy_us']['median'] / 1e3:.2f} ms, "
            f"FP4's {a2['fp4']['busy_us']['median'] / 1e3:.2f} against {a1['fp4']['busy_us']['median'] / 1e3:.2f}") in flat
    # The README's end-to-end rows and first-screen figure, from the same summaries.
    readme = _page("README.md")
    b = [(a["fp8"]["busy_us"]["median"] / 1e3, a["fp4"]["busy_us"]["median"] / 1e3) for a, _ in orders.values()]
    w = [(x["fp8"]["median"], x["fp4"]["median"]) for _, x in orders.values()]
    assert ("4 × 128K, 61 layers: wall time per verify cycle at the client, median; FP8 first; FP4 first | "
            f"{w[0][0]:.2f} ms; {w[1][0]:.2f} ms | **{w[0][1]:.2f} ms ({w[0][0] / w[0][1]:.3f}x); "
            f"{w[1][1]:.2f} ms ({w[1][0] / w[1][1]:.3f}x)** |") in readme
    assert ("GPU busy time per verify cycle, median of 3 traces; FP8 first; FP4 first | "
            f"{b[0][0]:.2f} ms; {b[1][0]:.2f} ms | **{b[0][1]:.2f} ms ({b[0][0] / b[0][1]:.3f}x); "
            f"{b[1][1]:.2f} ms ({b[1][0] / b[1][1]:.3f}x)** |") in readme
    assert f"| 589,120 | 641,216 (**+{100 * (641216 / 589120 - 1):.1f} %**) |" in readme
    first = _flat(readme)[:_flat(readme).index("### Memory:")]
    assert (f"all 61 layers, 4 × 128K: verify cycle {ratios[0]}-{ratios[-1]}x faster in wall time at the client and in "
            "GPU busy time (H100, one DP-attention + EP32 rank, FP8 and FP4 servers in both orders)") in first


def test_benchmarks_full_depth_rank_bench_and_arithmetic_are_the_raw_files():
    """The 4 x 128K bench rows (ours, SGLang's call, the newer SM90 kernel) and the sentences computed from them and
    the timeline: the scorer saving against the busy-time difference, the 1.15x target, the tensor-core bound."""
    page = _page("docs/benchmarks.md")
    flat = _flat(page)
    runs = [_json(n) for n in _MC4]
    rows = {}
    for i, run in enumerate(runs):
        assert run["meta"]["device"] == "NVIDIA H100 80GB HBM3" and run["failures"] in (0, [], None)
        for r in run["rows"]:
            assert all(x.get("check", {}).get("ok") for x in r["results"].values()), r["label"]
            rows[(r["label"], i)] = r
    for (label, i), r in rows.items():
        res = r["results"]
        us = {k: v["seconds"] * 1e6 for k, v in res.items()}
        n = label.split()[2][1:]
        name = f"H64 4 × 128K next_n {n}" + (" (the draft passes)" if n == "1" and i == 0 else "") + (" (again)" if i else "")
        binds = "TC" if res["ours"]["binds"] == "tensor cores" else "HBM"
        sg, mc = us["deepgemm-fp8"] / us["ours"], us["deepgemm-fp8-sm90-multicast"] / us["ours"]
        line = (f"| {name} | {r['fp4_floor_s'] * 1e6:.1f} / {r['tensor_core_floor_s'] * 1e6:.1f} | "
                f"{us['ours']:.1f} ({res['ours']['pct_roofline']:.0f} %, {binds}) | {us['deepgemm-fp8']:.1f} ({sg:.2f}) | "
                + (f"{us['deepgemm-fp8-sm90-multicast']:.1f} (**{mc:.2f}**) |" if mc < 1
                   else f"{us['deepgemm-fp8-sm90-multicast']:.1f} ({mc:.2f}) |"))
        assert line in page, line
    n4 = [rows[("H64 4x128K n4 w160K", i)]["results"] for i in (0, 1)]
    ours = [x["ours"]["seconds"] * 1e6 for x in n4]
    sgl = [x["deepgemm-fp8"]["seconds"] * 1e6 for x in n4]
    mc = [x["deepgemm-fp8-sm90-multicast"]["seconds"] * 1e6 for x in n4]
    assert f"{min(ours):.1f}-{max(ours):.1f} µs for ours" in flat and f"{sgl[0]:.1f} µs per verify call" in flat
    assert f"it takes {min(mc):.1f}-{max(mc):.1f} µs per verify call: {mc[0] / ours[0]:.2f}x ours" in flat
    agg = _json(_R61)["shapes"]["4x131072"]
    b8, b4 = (agg[f]["busy_us"]["median"] / 1e3 for f in ("fp8", "fp4"))
    mean_ours, mean_sgl = sum(ours) / 2, sum(sgl) / 2
    saving = mean_sgl - mean_ours
    assert f"{saving:.0f} µs x 61 verify calls is {saving * 61 / 1e3:.1f} ms" in flat
    assert f"the whole busy-time difference ({b8 - b4:.2f} ms)" in flat
    target = b8 / 1.15
    assert f"FP4's at {b8:.2f} / 1.15 = {target:.2f} ms, {b4 - target:.2f} ms less" in flat
    assert f"{(b4 - target) * 1e3 / 61:.0f} µs per verify call, i.e. ours at about {mean_ours - (b4 - target) * 1e3 / 61:.0f} µs" in flat
    tc = n4[0]["ours"]["seconds"] * n4[0]["ours"]["pct_roofline"] / 100 * 1e6  # the binding floor: the tensor cores
    tc_floor = rows[("H64 4x128K n4 w160K", 0)]["tensor_core_floor_s"] * 1e6
    assert abs(tc - tc_floor) < 0.05
    bound = b4 - 61 * (mean_ours - tc_floor) / 1e3
    assert (f"{b4:.2f} - 61 x ({mean_ours:.1f} - {tc_floor:.1f}) µs = {bound:.2f} ms, {b8 / bound:.3f}x") in flat
    rates = [r["meta"]["fp8_mma_flops_per_s"] / 1e15 for r in runs]
    assert f"{min(rates):.2f}-{max(rates):.2f} PFLOP/s" in flat
    # The README's scorer bullet: the first run's ratio to SGLang's call, and the newer kernel's lead over ours.
    readme = _flat(_page("README.md"))
    now = next(r for r in _json(_Q1[1])["rows"] if (r["heads"], r["batch"], r["context"], r["next_n"]) == (64, 4, 131072, 4))
    now = now["results"]["deepgemm-fp8"]["seconds"] / now["results"]["ours"]["seconds"]
    assert f"with 4 query tokens, as MTP ships, {now:.2f}x at 4 × 128K (H100)" in readme  # the current kernel's run
    assert f"{round(100 * (1 - mc[0] / ours[0]))} % faster than ours at 4 × 128K" in readme
    assert round(100 * (1 - mc[1] / ours[1])) == round(100 * (1 - mc[0] / ours[0]))  # both runs say the same


_KV61 = "sglang_serving_v32_rank61_ep32_kv_limited_64k_{order}h100_{}2026-12-07"
_KV61_ORDERS = ("", "fp4_first_")  # FP8 server first; FP4 server first (a later machine)


def _kv61_decode_log(fmt: str, order: str) -> list[tuple[int, float]]:
    """(requests running, generated tokens/s) of every decode log line of one server of one full-depth KV-limited
    pair, from its logs tarball (SGLang logs one line per 40 decode batches)."""
    import tarfile

    with tarfile.open(RESULTS / (_KV61.format("logs_", order=order) + ".tar.gz")) as tar:
        log = tar.extractfile(f"logs/serving_{fmt}.jsonl.server.log").read().decode()
    return [(int(m[1]), float(m[2])) for m in
            re.finditer(r"Decode batch, #running-req: (\d+),.*?gen throughput \(token/s\): ([\d.]+)", log)]


def _kv61_pair(order: str) -> dict:
    """One full-depth KV-limited pair's figures as the pages quote them: SGLang's result lines, checked against the
    pair's serving-table, the pools printed at start-up, and the servers' decode log lines (requests running, and
    the decode throughput with the pool full: every line at the most requests running but the first, whose interval
    since the previous log line includes the prefill)."""
    f8, f4 = (json.loads((RESULTS / (_KV61.format(f"{fmt}_", order=order) + ".jsonl")).read_text().splitlines()[0])
              for fmt in ("fp8", "fp4"))
    table = _json(_KV61.format("table_", order=order) + ".json")[0]
    assert table["output_throughput"] == {"fp8": f8["output_throughput"], "fp4": f4["output_throughput"]}
    assert (f8["completed"], f4["completed"], f8["random_input_len"], f8["random_output_len"], f8["max_concurrency"]) \
        == (9, 9, 65536, 512, 9)
    p8, p4 = _pools((RESULTS / (_KV61.format("", order=order) + ".txt")).read_text())
    per_request = 65536 + 512
    assert (p8, p4, p8 // per_request, p4 // per_request) == (589120, 641216, 8, 9)
    logs = {fmt: _kv61_decode_log(fmt, order) for fmt in ("fp8", "fp4")}
    assert max(n for n, _ in logs["fp8"]) == 8 and {n for n, _ in logs["fp8"]} == {1, 8}
    assert {n for n, _ in logs["fp4"]} == {9}
    full = {fmt: [t for n, t in rows if n == max(m for m, _ in rows)][1:] for fmt, rows in logs.items()}
    return {"f8": f8, "f4": f4, "table": table,
            "span": {fmt: f"{min(v):.1f}-{max(v):.1f}" for fmt, v in full.items()},
            "ratio": (sum(full["fp4"]) / len(full["fp4"])) / (sum(full["fp8"]) / len(full["fp8"])),
            "gain": 100 * (f4["output_throughput"] / f8["output_throughput"] - 1)}


def test_full_depth_kv_limited_load_is_the_measured_pair():
    """The full-depth rank's KV-limited load in both server orders as docs/benchmarks.md's table (each cell: the
    FP8-first pair's figure; the FP4-first pair's) and the README's rows quote it."""
    a, b = (_kv61_pair(order) for order in _KV61_ORDERS)

    def cell(fmt, spec, scale=1.0, unit=""):
        return "; ".join(f"{x[fmt][spec[0]] / scale:.{spec[1]}f}{unit}" for x in (a, b))

    page = _flat(_page("docs/benchmarks.md"))
    assert (f"| output tokens/s | {a['f8']['output_throughput']:.1f}; {b['f8']['output_throughput']:.1f} | "
            f"**{a['f4']['output_throughput']:.1f} (+{a['gain']:.1f} %); {b['f4']['output_throughput']:.1f} "
            f"(+{b['gain']:.1f} %)** |") in page
    assert f"| benchmark duration | {cell('f8', ('duration', 2), unit=' s')} | {cell('f4', ('duration', 2), unit=' s')} |" in page
    assert (f"| decode throughput with the pool full (SGLang's decode log, tokens/s) | {a['span']['fp8']}; "
            f"{b['span']['fp8']} (8 running) | **{a['span']['fp4']}; {b['span']['fp4']} (9 running)** |") in page
    assert (f"| median inter-token latency (one verify cycle and its draft steps) | "
            f"{cell('f8', ('median_itl_ms', 2), unit=' ms')} | {cell('f4', ('median_itl_ms', 2), unit=' ms')} |") in page
    ttft = {fmt: "; ".join(f"{x[fmt]['median_ttft_ms'] / 1e3:.1f} s / {x[fmt]['p99_ttft_ms'] / 1e3:.1f} s"
                           for x in (a, b)) for fmt in ("f8", "f4")}
    assert f"| median TTFT / p99 TTFT | {ttft['f8']} | {ttft['f4']} |" in page
    assert f"| median TPOT | {cell('f8', ('median_tpot_ms', 2), unit=' ms')} | {cell('f4', ('median_tpot_ms', 2), unit=' ms')} |" in page
    assert (f"| median end-to-end latency of a request | {cell('f8', ('median_e2e_latency_ms', 1), 1e3, ' s')} | "
            f"{cell('f4', ('median_e2e_latency_ms', 1), 1e3, ' s')} |") in page
    assert f"{a['ratio']:.2f}x the decode throughput in both orders" in page and f"{b['ratio']:.2f}" == f"{a['ratio']:.2f}"
    assert f"towards the decode throughput's {a['ratio']:.2f}x" in page
    assert f"the whole benchmark gains {a['gain']:.1f} % (FP8 first) and {b['gain']:.1f} % (FP4 first)" in page
    lo, hi = sorted(x["table"]["output_ratio"] for x in (a, b))
    assert f"The output throughput here is {lo:.3f}-{hi:.3f}x FP8's (two pairs, one per order)" in page
    assert f"prefilling the {a['f8']['total_input_tokens']:,} input tokens".replace(",", " ") in page
    assert a["f8"]["total_input_tokens"] == b["f8"]["total_input_tokens"]
    assert f"one verify cycle {a['f4']['median_itl_ms']:.1f} against {a['f8']['median_itl_ms']:.1f} ms" in page
    d4, d8 = (b[f]["duration"] - a[f]["duration"] for f in ("f4", "f8"))
    assert (f"FP4's server took {d4:.1f} s longer over the benchmark (its median TTFT "
            f"{b['f4']['median_ttft_ms'] / 1e3:.1f} against {a['f4']['median_ttft_ms'] / 1e3:.1f} s), while FP8's "
            f"moved by {abs(d8):.1f} s") in page
    readme = _flat(_page("README.md"))
    assert (f"output tokens/s; FP8 first; FP4 first | {a['f8']['output_throughput']:.1f}; "
            f"{b['f8']['output_throughput']:.1f} | **{a['f4']['output_throughput']:.1f} (+{a['gain']:.1f} %); "
            f"{b['f4']['output_throughput']:.1f} (+{b['gain']:.1f} %)** |") in readme
    assert (f"| {a['span']['fp8']}; {b['span']['fp8']} | **{a['span']['fp4']}; {b['span']['fp4']}** |") in readme
    g_lo, g_hi = sorted((a["gain"], b["gain"]))
    assert (f"(FP8's pool holds 8, FP4's 9): FP4 +{g_lo:.1f} to +{g_hi:.1f} % output tokens/s, one pair in each server "
            "order;") in _flat(_page("docs/user-guide.md"))
    assert (f"**+{g_lo:.1f} to +{g_hi:.1f} % output tokens/s** and {a['ratio']:.2f}x the decode throughput with the "
            f"pool full (H100, one pair in each server order") in readme


def test_glm5_index_path_run_is_the_raw_file():
    """The interleaved-RoPE (GLM-5.x) run: FP4's rows, calls and worst margins as the user guide quotes them, every
    check passed, and the FP8 engine stopped at its limit (so the page says there is no FP8 run to compare with)."""
    raw = _json("sglang_mtp1_interleaved_h100_2026-12-07.json")
    assert raw["checks"] and all(c["ok"] for c in raw["checks"]) and set(raw["modes"]) == {"FP4"}
    modes = raw["modes"]["FP4"]
    tv, de = modes["TARGET_VERIFY"], modes["DRAFT_EXTEND_V2"]
    assert (tv["rows"], tv["calls"], tv["graph_calls"], de["rows"], de["calls"], de["graph_calls"]) == (
        120, 30, 30, 60, 15, 15)
    assert all(m[k] == 0 for m in (tv, de) for k in ("count", "duplicate", "out_of_range", "missing_rows", "stale"))
    margin = {}
    for c in raw["checks"]:
        m = re.search(r"(\d+) rows of the first request .* (\d+) failed, worst margin (\S+)", c["detail"])
        if m:
            assert int(m.group(2)) == 0
            margin["target verify" if "target verify" in c["check"] else "draft extend"] = (int(m.group(1)),
                                                                                              float(m.group(3)))
    text = _flat(_page("docs/user-guide.md"))
    assert (f"120 target verify rows in 30 calls and 60 draft extend rows in 15, all from CUDA-graph replays" in text)
    assert (f"the {margin['target verify'][0]} + {margin['draft extend'][0]} rows of the first request" in text)
    assert (f"(worst margins {margin['target verify'][1]:.2f} and {margin['draft extend'][1]:.2f})" in text)
    printed = (RESULTS / "sglang_mtp1_interleaved_h100_2026-12-07.txt").read_text()
    assert "mtp1_fp8 rc=124 150 s, mtp1_fp4 rc=0 110 s" in printed and "within the 150 s the" in _page("docs/user-guide.md")


_GLM5 = "sglang_timeline_glm5_layers3_mtp3x4_h100_2026-12-07.json"


def _glm5_kernels() -> dict[str, tuple[float, float]]:
    """The per-kernel lines of the GLM-5 run's printed record: kernel name (up to its call counts) -> (FP8 µs,
    FP4 µs) per verify cycle; "all kernels" for the summed line."""
    text = (RESULTS / "sglang_timeline_glm5_layers3_h100_2026-12-07.txt").read_text()
    out = {}
    for m in re.finditer(r"^ *(-?[\d.]+) +([\d.]+) +([\d.]+)  (.+?)(?: \(\d+/\d+\))?$", text, flags=re.M):
        d, a, b, name = float(m.group(1)), float(m.group(2)), float(m.group(3)), m.group(4)
        assert abs((b - a) - d) < 0.11, m.group(0)
        out["all kernels" if name.startswith("all kernels") else name] = (a, b)
    return out


def test_benchmarks_glm5_table_and_kernels_are_the_raw_files():
    """docs/benchmarks.md's GLM-5 table from the timeline summary (medians, ranges, ratios), and the kernel sums it
    quotes from the run's printed per-kernel lines."""
    sh = _json(_GLM5)["shapes"]["4x65536"]
    page = _flat(_page("docs/benchmarks.md"))

    def cell(fmt, key, scale=1.0, digits=1):
        v = sh[fmt][key]
        return f"{v['median'] / scale:.{digits}f} [{v['min'] / scale:.{digits}f}-{v['max'] / scale:.{digits}f}]"

    r = sh["fp8_over_fp4"]
    for label, key, scale, digits in (("GPU busy time per verify cycle (µs)", "busy_us", 1, 1),
                                      ("span per verify cycle, first kernel to last (µs)", "span_us", 1, 1),
                                      ("indexer time not hidden behind other kernels (µs)", "indexer_exposed_us", 1, 1),
                                      ("busy time projected to GLM-5's 78 layers (ms)", "projected_busy_us", 1e3, 2)):
        assert (f"| {label} | {cell('fp8', key, scale, digits)} | {cell('fp4', key, scale, digits)} | "
                f"{r[key]:.3f}x |") in page, label
    w = [sh[f]["wall_ms_per_cycle"]["median"] for f in ("fp8", "fp4")]
    assert f"| wall time per cycle at the client, one server each (ms) | {w[0]:.3f} | {w[1]:.3f} | {r['wall_ms_per_cycle']:.3f}x |" in page
    assert f"**{(1 / r['busy_us'] - 1) * 100:.1f} % longer in GPU busy time**" in page
    k = _glm5_kernels()
    scorer = [v for n, v in k.items() if "paged_mqa_logits<" in n][0][0], k["fp4_paged_logits_sm90"][1]
    plan = [v for n, v in k.items() if "paged_mqa_logits_metadata" in n][0][0], k["plan_paged_schedule"][1]
    topk = sum(v[0] - v[1] for n, v in k.items() if "topk_" in n)
    fused = sum(v[0] for n, v in k.items() if "fused_k_indexer" in n or "fused_q_indexer" in n)
    unfused = sum(v[1] - v[0] for n, v in k.items() if v[1] > v[0] and not any(
        x in n for x in ("fp4_paged_logits", "plan_paged", "_w8a8", "act_and_mul", "all kernels")))
    assert (f"FP4's scorer took {scorer[1]:.1f} µs where DeepGEMM's took {scorer[0]:.1f}, its schedule "
            f"{plan[1]:.1f} µs where DeepGEMM's took {plan[0]:.1f}, and the top-k {topk:.0f} µs less") in page
    assert f"SGLang's two fused kernels took {fused:.1f} µs for queries and keys" in page
    assert f"the FP4 store, {unfused:.1f} µs" in page
    total = k["all kernels"]
    assert f"Summed over all kernels the two steps differ by {total[1] - total[0]:.1f} µs" in page
    busy = sh["fp4"]["busy_us"]["median"] - sh["fp8"]["busy_us"]["median"]
    assert f"the busy time by {busy:.0f} µs" in page
    spread = max((sh[f]["busy_us"]["max"] - sh[f]["busy_us"]["min"]) / sh[f]["busy_us"]["median"] for f in ("fp8", "fp4"))
    assert spread < 0.0007 and "(three traces within 0.07 %)" in page


def test_readme_and_user_guide_glm5_figures_are_the_raw_files():
    """The GLM-5 figures the README and the user guide quote: busy time per cycle, the 0.8 %, the scorer times."""
    sh = _json(_GLM5)["shapes"]["4x65536"]
    b8, b4 = sh["fp8"]["busy_us"]["median"] / 1e3, sh["fp4"]["busy_us"]["median"] / 1e3
    pct = f"{(b4 / b8 - 1) * 100:.1f} %"
    k = _glm5_kernels()
    s8 = [v for n, v in k.items() if "paged_mqa_logits<" in n][0][0]
    s4 = k["fp4_paged_logits_sm90"][1]
    readme = _flat(_page("README.md"))
    assert (f"the verify cycle's GPU busy time was {pct} longer with FP4 ({b4:.2f} against {b8:.2f} ms)") in readme
    assert f"inside SGLang its scorer took {s4:.0f} against FP8's {s8:.0f} µs per verify cycle" in readme
    guide = _flat(_page("docs/user-guide.md"))
    assert f"that made the verify cycle's GPU busy time {pct} longer than with FP8" in guide
    assert (f"the verify cycle's GPU busy time was {b8:.2f} ms with FP8 and {b4:.2f} ms with FP4 ({pct} longer)"
            in guide)
    assert f"FP4's scorer is faster ({s4:.0f} against {s8:.0f} µs per cycle over the 3 layers)" in guide
    yaml = " ".join(line.lstrip("# ") for line in (REPO / "configs" / "glm-5.yaml").read_text().splitlines())
    assert f"that made the verify cycle's GPU busy time {pct} longer than with FP8" in " ".join(yaml.split())


def test_user_guide_quotes_the_ab_run_on_the_gpu():
    """The user guide's status of `sglang-fp4-indexer ab`: the verdict the report printed, the arms' times and
    their tail latencies, from the arms the command kept (the tar.gz) and the report built from them."""
    import io
    import tarfile

    page = _flat(_page("docs/user-guide.md"))
    report = _json("ab_tiny_h100_2026-12-07_report.json")
    assert f'Its verdict, as printed: "{report["verdict"][0][len("verdict: "):]}"' in page
    with tarfile.open(RESULTS / "ab_tiny_h100_2026-12-07.tar.gz") as tar:
        arms = {a: json.load(io.TextIOWrapper(tar.extractfile(f"ab_tiny/fp8-first/{a}/result.json")))
                for a in ("fp8", "fp4")}
        names = tar.getnames()
        progress = tar.extractfile("ab_tiny/ab_command.log").read().decode()
    # Each server's start: the progress bar's elapsed time when the arm moved from its launch to GSM8K.
    starts = {a: re.findall(r"\[(\d\d):(\d\d)<[^\]]*, fp8-first/" + a + r": GSM8K\]", progress)[-1] for a in ("fp8", "fp4")}
    start_s = {a: int(m) * 60 + int(s) for a, (m, s) in starts.items()}
    assert f"of which {start_s['fp8']} s was the server's start" in page and f"of which {start_s['fp4']} s was its start" in page
    assert "ab_tiny/fp4-first/fp4/result.json" not in names  # the other order did not finish
    assert f"FP8's arm {arms['fp8']['wall_s']:.0f} s" in page and f"FP4's arm {arms['fp4']['wall_s']:.0f} s" in page
    env = arms["fp8"]["environment"]
    assert env["gpu"]["name"] == "NVIDIA H100 80GB HBM3" and f"driver {env['gpu']['driver']}" in page
    b8, b4 = ({b["max_concurrency"]: b for b in arms[a]["bench"]} for a in ("fp8", "fp4"))
    assert (f"p99 TPOT ({b8[8]['p99_tpot_ms']:.1f} and {b8[64]['p99_tpot_ms']:.1f} ms, against FP4's "
            f"{b4[8]['p99_tpot_ms']:.1f} and {b4[64]['p99_tpot_ms']:.1f})") in page
    assert (f"p99 TTFT ({b8[8]['p99_ttft_ms'] / 1e3:.1f} and {b8[64]['p99_ttft_ms'] / 1e3:.1f} s, against "
            f"{b4[8]['p99_ttft_ms'] / 1e3:.2f} and {b4[64]['p99_ttft_ms'] / 1e3:.1f})") in page
    assert all(arms[a]["kv"]["max_total_num_tokens"] == 131072 for a in arms) and "capped at 131,072 tokens" in page
    assert arms["fp4"]["kv"]["fp4_indexer_active"] and arms["fp8"]["kv"]["fp4_indexer_active"] is None


def test_the_one_round_trip_query_table_is_its_two_runs():
    """docs/benchmarks.md, "With the query loads in one round trip (H100)": each row is its raw run's row (floors, ours
    with its % of the binding floor and what binds, each FP8 peer with peer / ours), in the runs' order; the prose's
    rates are the runs' own."""
    page = _page("docs/benchmarks.md")
    rows = _table_rows(page, "### With the query loads in one round trip (H100)")
    want = []
    for name, tag in (("bench_h100_q_one_chunk_2026-12-07.json", ""),
                      ("bench_h100_q_one_chunk_reverse_2026-12-07.json", " (peers first)")):
        report = _json(name)
        assert report["meta"]["device"] == "NVIDIA H100 80GB HBM3"
        want += [(r, tag) for r in report["rows"]]
        assert f"{report['meta']['fp8_mma_flops_per_s'] / 1e15:.2f}" in page
        assert f"{report['meta']['copy_bandwidth_bytes_per_s'] / 1e12:.2f}" in page
    assert len(rows) == len(want)
    for cells, (r, tag) in zip(rows, want):
        assert cells[0] == f"H{r['heads']} {r['batch']} × {r['context'] // 1024}K next_n {r['next_n']}{tag}", cells
        hbm, tc = cells[1].split(" / ")
        assert _shown(hbm, r["fp4_floor_s"] * 1e6) and _shown(tc, r["tensor_core_floor_s"] * 1e6), cells
        ours = r["results"]["ours"]
        m = re.fullmatch(r"([\d.]+) \((\d+) %, (TC|HBM)\)", cells[2])
        assert m and _shown(m.group(1), ours["seconds"] * 1e6) and _shown(m.group(2), ours["pct_roofline"]), cells
        assert m.group(3) == ("TC" if ours["binds"] == "tensor cores" else "HBM"), cells
        for cell, col in zip(cells[3:], ("deepgemm-fp8", "deepgemm-fp8-native", "deepgemm-fp8-sm90-multicast")):
            peer = r["results"][col]
            assert peer["status"] == "ok" and peer["check"]["ok"], (cells, col)
            m = re.fullmatch(r"([\d.]+) \(([\d.]+)\)", cell)
            assert m and _shown(m.group(1), peer["seconds"] * 1e6), (cells, col)
            assert _shown(m.group(2), peer["seconds"] / ours["seconds"]), (cells, col)
