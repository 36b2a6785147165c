"""The measured tables ``check --context`` quotes (``sglang_fp4_indexer.tables``, scripts/update_check_tables.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_fp4_indexer.tables import (bench_timing_section, build_tables, load_tables, measured_decode, model_indexers,
                                      nearest_model_cost, nearest_recall, nearest_timing, serving_timing_section,
                                      sglang_decode_section, verify_cycle_section, kv_limited_load, kv_pools, cycle_load)

REPO = Path(__file__).resolve().parents[1]


def _bench(columns: dict[str, dict], device_type: str = "cuda") -> dict:
    """A bench report in the schema ``bench.runner.run_benchmark`` writes; ``columns``: name -> {shape: us}."""
    shapes = sorted({shape for times in columns.values() for shape in times})
    rows = []
    for heads, batch, context, next_n in shapes:
        results = {}
        for name, times in columns.items():
            us = times.get((heads, batch, context, next_n))
            results[name] = {"status": "ok", "seconds": us * 1e-6} if us is not None else {"status": "unavailable"}
        keys = batch * context
        rows.append({"heads": heads, "batch": batch, "context": context, "next_n": next_n, "results": results,
                     "fp4_floor_s": keys * 68 / 4e12, "fp8_floor_s": keys * 132 / 4e12})
    return {"meta": {"device": "NVIDIA H200", "device_type": device_type, "date": "2026-12-01T10:00:00+00:00"},
            "scorers": [{"name": n} for n in columns], "rows": rows}


def _accuracy() -> dict:
    cases = [{"workload": w, "context": c, "heads": h,
              "formats": {"FP4": {"recall_mean": 0.9 - c / 2**20}, "FP8": {"recall_mean": 0.97 - c / 2**22}}}
             for w in ("text", "gaussian") for c in (4096, 131072) for h in (64, 32)]
    return {"topk": 2048, "cases": cases, "environment": {"gpu": "NVIDIA H200"}}


A, B = (64, 8, 131072, 1), (64, 1, 4096, 1)


def test_today_schema_without_fp8_times():
    bench = _bench({"ours[auto]": {A: 32.0, B: 3.3}, "ours[folded]": {A: 71.6}, "deepgemm-fp8": {}})
    t = build_tables(bench, _accuracy())
    assert t["timing"]["fp4_column"] == "ours[auto]" and t["timing"]["fp8_measured"] is False
    row = nearest_timing(t, 64, 8, 131072, 1)
    assert row["fp4_us"] == 32.0 and row["fp8_us"] is None and row["fp8_native_us"] is None
    assert row["fp8_floor_us"] == pytest.approx(8 * 131072 * 132 / 4e12 * 1e6, abs=1e-3)


def test_deepgemm_columns_are_read():
    bench = _bench({"ours": {A: 30.0, B: 3.0}, "sglang-triton-fp4": {A: 900.0},
                    "deepgemm-fp8": {A: 38.0}, "deepgemm-fp8-native": {A: 36.5}})
    t = build_tables(bench, _accuracy())
    row = nearest_timing(t, 64, 8, 131072, 1)
    assert (row["fp4_us"], row["fp8_us"], row["fp8_native_us"]) == (30.0, 38.0, 36.5)
    assert row["fp8_sm90_newer_us"] is None  # no column of DeepGEMM's newer SM90 kernel: not invented
    newer = build_tables(_bench({"ours": {A: 30.0}, "deepgemm-fp8-sm90-multicast": {A: 31.5}}), _accuracy())
    assert nearest_timing(newer, 64, 8, 131072, 1)["fp8_sm90_newer_us"] == 31.5
    assert t["timing"]["fp8_measured"] is True and t["timing"]["fp4_column"] == "ours"
    assert nearest_timing(t, 64, 1, 4096, 1)["fp8_us"] is None  # not measured there: not invented


def test_nearest_shapes():
    t = build_tables(_bench({"ours": {A: 30.0, B: 3.0, (32, 8, 131072, 1): 27.0, (64, 8, 131072, 4): 80.0}}),
                     _accuracy())
    pick = lambda *shape: tuple(nearest_timing(t, *shape)[k] for k in ("heads", "batch", "context", "next_n"))  # noqa: E731
    assert pick(64, 8, 131072, 1) == A
    assert pick(32, 4, 100000, 1) == (32, 8, 131072, 1)
    assert pick(64, 2, 2048, 1) == B
    assert pick(64, 8, 131072, 3) == (64, 8, 131072, 4)
    rows = nearest_recall(t, 32, 100000)
    assert [(r["workload"], r["context"], r["heads"]) for r in rows] == [("text", 131072, 32), ("gaussian", 131072, 32)]
    assert rows[0]["fp4"] == pytest.approx(0.9 - 131072 / 2**20)
    with pytest.raises(ValueError, match="context: expected a positive int"):
        nearest_recall(t, 64, 0)


def test_bad_reports_are_refused_by_name():
    with pytest.raises(ValueError, match="cpu.json: measured on .*not on a GPU"):
        build_tables(_bench({"ours": {A: 1.0}}, device_type="cpu"), _accuracy(), bench_source="cpu.json")
    with pytest.raises(ValueError, match="b.json: no column of this package's scorer"):
        build_tables(_bench({"deepgemm-fp8": {A: 1.0}}), _accuracy(), bench_source="b.json")
    with pytest.raises(ValueError, match="a.json: not an accuracy.json"):
        build_tables(_bench({"ours": {A: 1.0}}), {"topk": 2048, "cases": [{"workload": "text"}]}, accuracy_source="a.json")


def test_packaged_tables_are_built_from_their_recorded_sources():
    tables = load_tables()
    bench_src, acc_src = tables["sources"][:2]
    model_src = tables["model"]["sources"]
    assert tables["sources"][2:2 + len(model_src)] == model_src
    bench = json.loads((REPO / bench_src).read_text())
    acc = json.loads((REPO / acc_src).read_text())
    model = [json.loads((REPO / p).read_text()) for p in model_src]
    # The GPU long-context studies (stand-in, trained indexer) first, then the CPU study for what they lack (4K).
    assert [json.loads((REPO / p).read_text()).get("device", "cpu") for p in model_src] == ["cuda", "cuda", "cpu"]
    assert {(r["indexer"], r["device"]) for r in tables["model"]["rows"]} == {
        ("stand-in", "NVIDIA H100 80GB HBM3"), ("trained", "NVIDIA H100 80GB HBM3"), ("stand-in", "CPU")}
    assert {r["context"] for r in tables["model"]["rows"] if r["device"] == "CPU"} == {4096}
    sec = tables["sglang"]
    one_batch_src, *profile_srcs = sec["sources"]
    lines = [json.loads(x) for x in (REPO / one_batch_src).read_text().splitlines() if x.strip()]
    profiles = {k: v for p in profile_srcs for k, v in json.loads((REPO / p).read_text()).items()}
    sglang = sglang_decode_section(lines, profiles, gpu=sec["gpu"], date=sec["date"], model=sec["model"],
                                   index_heads=64, kv_cache_dtype="fp8", fp8_gemm_backend="triton", tp_size=1,
                                   sources=sec["sources"])
    srv = tables["timing_serving"]
    # The profiled model's indexer layers: make-model's v32-layers config (every layer holds an indexer).
    spec = importlib.util.spec_from_file_location("sglang_one_batch", REPO / "scripts" / "sglang_one_batch.py")
    one_batch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(one_batch)
    layers = one_batch.MODEL_SIZES["v32-layers"]["num_hidden_layers"]
    assert srv["layers"] == layers
    serving = serving_timing_section({k: v for p in srv["sources"] for k, v in json.loads((REPO / p).read_text()).items()},
                                     gpu=srv["gpu"], date=srv["date"], stack=srv["stack"], layers=layers,
                                     index_heads=64, method=srv["method"], sources=srv["sources"])
    cyc = tables["cycle"]  # the next_n of each summary: MTP 3 steps / 4 draft tokens, and MTP off
    cycle = verify_cycle_section([(json.loads((REPO / p).read_text()), 4 if "mtp3x4" in p else 1)
                                  for p in cyc["sources"]], gpu=cyc["gpu"], date=cyc["date"], stack=cyc["stack"],
                                 method=cyc["method"], sources=cyc["sources"], rank=cyc["rank"],
                                 moe_gpus=cyc["moe_gpus"])
    more = [verify_cycle_section([(json.loads((REPO / p).read_text()), 4) for p in m["sources"]], gpu=m["gpu"],
                                 date=m["date"], stack=m["stack"], method=m["method"], sources=m["sources"],
                                 rank=m["rank"], moe_gpus=m["moe_gpus"],
                                 other_orders=[(json.loads((REPO / p).read_text()), 4)
                                               for p in m.get("other_order_sources", [])] or None,
                                 other_order_sources=m.get("other_order_sources"),
                                 loads=[_load_from(m["load_sources"], x) for x in m.get("loads", [])] or None,
                                 load_sources=m.get("load_sources"))
            for m in tables["cycle_more"]]
    kernel = [bench_timing_section([json.loads((REPO / p).read_text()) for p in sec["sources"]], sec["sources"])
              for sec in tables["timing_more"]]
    f = tables["cycle_fused"]
    fused = verify_cycle_section([(json.loads((REPO / p).read_text()), 4) for p in f["sources"]], gpu=f["gpu"],
                                 date=f["date"], stack=f["stack"], method=f["method"], sources=f["sources"],
                                 rank=f["rank"], model=f["model"])
    # Up to date: re-running scripts/update_check_tables.py on the recorded sources changes nothing.
    assert tables == build_tables(bench, acc, bench_source=bench_src, accuracy_source=acc_src, model_accuracy=model,
                                  model_source=model_src, sglang=sglang, timing_serving=serving, cycle=cycle,
                                  cycle_more=more, cycle_fused=fused, timing_more=kernel)
    # GLM-5's layers, where FP4 also changes SGLang's index path: 4 x 64K verifying 4 tokens on an H100.
    assert (f["model"], f["gpu"], f["rank"]) == ("GLM-5", "NVIDIA H100 80GB HBM3", "DP-attention + EP8 rank")
    assert [(r["batch"], r["context"], r["next_n"], r["layers"], r["full_depth"]) for r in f["rows"]] == [
        (4, 65536, 4, 3, 78)]
    assert tables["timing"]["gpu"] == "NVIDIA H200" and tables["recall"]["topk"] == 2048
    assert tables["sources"][2 + len(model_src):] == (sec["sources"] + srv["sources"] + cyc["sources"]
                                                      + [p for m in tables["cycle_more"]
                                                         for p in m["sources"] + m.get("other_order_sources", [])
                                                         + m.get("load_sources", [])] + f["sources"]
                                                      + [p for k in tables["timing_more"] for p in k["sources"]])
    # The full-depth rank's KV-limited load: 9 requests of 64K at once, FP8's pool holding 8 and FP4's 9.
    assert [(x["concurrency"], x["context"], x["next_n"], x["fp8_requests"], x["fp4_requests"])
            for x in tables["cycle_more"][0]["loads"]] == [(9, 65536, 4, 8, 9)]
    # The full-depth rank in both run orders: FP8's server first, then (another machine) FP4's first.
    assert tables["cycle_more"][0]["other_order_sources"] == [
        "benchmarks/results/sglang_timeline_v32_rank61_ep32_mtp3x4_fp4_first_h100_2026-12-06.json"]
    # The ranks the cycle runs measured: 20 layers of an EP8 rank on the H200, all 61 of an EP32 rank on the H100.
    assert (cyc["gpu"], cyc["rank"], cyc["moe_gpus"]) == ("NVIDIA H200", "DP-attention + EP8 rank", 8)
    assert [(m["gpu"], m["rank"], m["moe_gpus"]) for m in tables["cycle_more"]] == [
        ("NVIDIA H100 80GB HBM3", "DP-attention + EP32 rank", 32)]
    assert srv["gpu"] == "NVIDIA H100 80GB HBM3" and [(r["batch"], r["context"]) for r in srv["rows"]] == [
        (1, 131072), (8, 65536)]
    # The recorded flags are those the runs were made with (scripts/sglang_gpu_check.sh e2e): Triton FP8 GEMMs, no
    # --tp-size (SGLang's 1).
    e2e = (REPO / "scripts" / "sglang_gpu_check.sh").read_text().split("\n  e2e)")[1].split(";;")[0]
    assert (sec["fp8_gemm_backend"], sec["tp_size"]) == ("triton", 1)
    assert e2e.count("--fp8-gemm-backend triton") == e2e.count("sglang_bench.py one-batch") > 0
    assert "--tp-size" not in e2e and "--tp " not in e2e


def _load_from(sources: list[str], recorded: dict) -> dict:
    """A recorded KV-limited load rebuilt from its sources (each server's result line, the printed pool lines; then
    the same three of each other run order, whose pools must be the first order's), with the next_n and depth it
    records (not in those files)."""
    pairs = [[json.loads((REPO / p).read_text().splitlines()[0]) for p in sources[i:i + 2]]
             for i in range(0, len(sources), 3)]
    pools = {kv_pools((REPO / p).read_text()) for p in sources[2::3]}
    assert len(pools) == 1
    (p8, p4), = pools
    return kv_limited_load(*pairs[0], fp8_pool=p8, fp4_pool=p4, next_n=recorded["next_n"], layers=recorded["layers"],
                           full_depth=recorded["full_depth"], other_orders=[tuple(x) for x in pairs[1:]] or None)


def _serving_line(**kw):
    line = {"random_input_len": 65536, "random_output_len": 512, "max_concurrency": 9, "completed": 9,
            "output_throughput": 24.0}
    return {**line, **kw}


def test_kv_limited_load_counts_the_requests_each_pool_holds_and_refuses_what_is_not_one():
    """Requests held: pool // (prompt + output), the whole output reserved; a load FP8's pool holds whole, two
    different loads, an unfinished one, or a bad pool is refused; cycle_load matches concurrency, context, next_n."""
    load = kv_limited_load(_serving_line(), _serving_line(output_throughput=27.0), fp8_pool=589120, fp4_pool=641216,
                           next_n=4, layers=61, full_depth=61)
    assert (load["fp8_requests"], load["fp4_requests"], load["fp8_tok_s"], load["fp4_tok_s"]) == (8, 9, 24.0, 27.0)
    # 65 536 + 512 = 66 048 tokens per request: 9 of them need 594 432, so one token less holds 8.
    assert kv_limited_load(_serving_line(), _serving_line(), fp8_pool=594431, fp4_pool=594432, next_n=4, layers=61,
                           full_depth=61)["fp4_requests"] == 9
    with pytest.raises(ValueError, match="not KV-limited"):
        kv_limited_load(_serving_line(), _serving_line(), fp8_pool=594432, fp4_pool=641216, next_n=4, layers=61,
                        full_depth=61)
    with pytest.raises(ValueError, match="differ"):
        kv_limited_load(_serving_line(), _serving_line(random_input_len=32768), fp8_pool=1, fp4_pool=1, next_n=4,
                        layers=61, full_depth=61)
    with pytest.raises(ValueError, match="completed"):
        kv_limited_load(_serving_line(completed=8), _serving_line(completed=8), fp8_pool=589120, fp4_pool=641216,
                        next_n=4, layers=61, full_depth=61)
    with pytest.raises(ValueError, match="fp4_pool"):
        kv_limited_load(_serving_line(), _serving_line(), fp8_pool=589120, fp4_pool=0, next_n=4, layers=61,
                        full_depth=61)
    section = {"loads": [load]}
    assert cycle_load(section, 9, 65536, 4) is load
    assert cycle_load(section, 8, 65536, 4) is None and cycle_load(section, 9, 65536, 2) is None
    assert cycle_load(None, 9, 65536, 4) is None
    with pytest.raises(ValueError, match="batch"):
        cycle_load(section, 0, 65536, 4)
    with pytest.raises(ValueError, match="load_sources"):
        verify_cycle_section([], gpu="G", date="D", stack="S", method="M", sources=[], loads=[load])


def test_kv_pools_reads_each_servers_pool_line():
    """Each server's block (under its '## ' heading) in either order; the target pool is a block's first line."""
    fp8 = ("## command 1 (FP8 server)\n"
           "[t] KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: 589120, KV size: 26.38 GB\n"
           "[t] KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: 589120, KV size: 0.43 GB\n")
    fp4 = ("## command 2 (FP4 server)\n"
           "[t] FP4 indexer active: MXFP4 index-key cache\n"
           "[t] KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: 641216, KV size: 26.38 GB\n"
           "[t] KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: 7, KV size: 0.43 GB\n")
    assert kv_pools("# header\n" + fp8 + fp4) == (589120, 641216)
    assert kv_pools(fp4 + "\n" + fp8) == (589120, 641216)
    with pytest.raises(ValueError, match="found 2 FP8 and 0 FP4"):
        kv_pools(fp8 + fp4.replace("FP4 indexer active", "something else"))
    with pytest.raises(ValueError, match="found 0 FP8 and 1 FP4"):
        kv_pools(fp4)
    with pytest.raises(ValueError, match="found 0 FP8 and 1 FP4"):  # one block: the two servers not told apart
        kv_pools(fp8.replace("## command 1 (FP8 server)\n", "") + fp4.replace("## command 2 (FP4 server)\n", ""))


def test_kv_limited_load_keeps_the_other_order_and_refuses_another_load_there():
    """The other run order's output tokens/s are kept beside the first pair's; a line of another load is refused."""
    load = kv_limited_load(_serving_line(), _serving_line(output_throughput=27.0), fp8_pool=589120,
                           fp4_pool=641216, next_n=4, layers=61, full_depth=61,
                           other_orders=[(_serving_line(output_throughput=24.5), _serving_line(output_throughput=26.3))])
    assert load["other_orders"] == [{"fp8_tok_s": 24.5, "fp4_tok_s": 26.3}] and load["fp4_tok_s"] == 27.0
    assert "other_orders" not in kv_limited_load(_serving_line(), _serving_line(), fp8_pool=589120, fp4_pool=641216,
                                                 next_n=4, layers=61, full_depth=61)
    with pytest.raises(ValueError, match=r"other_orders\[0\]: the FP8 and FP4 lines differ"):
        kv_limited_load(_serving_line(), _serving_line(), fp8_pool=589120, fp4_pool=641216, next_n=4, layers=61,
                        full_depth=61, other_orders=[(_serving_line(max_concurrency=8), _serving_line())])


def _one_batch_lines():
    return [{"run_name": "fp8", "batch_size": 1, "input_len": 4096, "median_decode_latency": 0.0031},
            {"run_name": "fp4", "batch_size": 1, "input_len": 4096, "median_decode_latency": 0.0030},
            {"run_name": "fp4_eager", "batch_size": 1, "input_len": 4096, "median_decode_latency": 0.009},
            {"run_name": "fp8", "batch_size": 8, "input_len": 2048, "median_decode_latency": 0.004}]  # no FP4 pair


def test_sglang_decode_rows_pair_the_formats_and_their_kernel_tables():
    profiles = {"/tmp/w/prof_fp8_batch1_input4096_output32_decode.trace.json.gz":
                {"us_per_step": {"indexer logits": 90.0, "GEMMs": 1000.0}, "total_us_per_step": 2400.0},
                "/tmp/w/prof_fp4_batch1_input4096_output32_decode.trace.json.gz":
                {"us_per_step": {"indexer logits": 30.0}, "total_us_per_step": 2300.0}}
    sec = sglang_decode_section(_one_batch_lines(), profiles, gpu="G", date="D", model="M", index_heads=64,
                                kv_cache_dtype="fp8", fp8_gemm_backend="triton", tp_size=1, sources=["a.jsonl"])
    assert sec["rows"] == [{"batch": 1, "context": 4096,
                            "fp8": {"decode_ms": pytest.approx(3.1), "kernel_us": 2400.0, "indexer_us": 90.0},
                            "fp4": {"decode_ms": pytest.approx(3.0), "kernel_us": 2300.0, "indexer_us": 30.0}}]
    assert (sec["fp8_gemm_backend"], sec["tp_size"]) == ("triton", 1)  # the runs' flags, recorded with them
    tables = {"sglang": sec}
    assert measured_decode(tables, 1, 4096) is sec["rows"][0]
    assert measured_decode(tables, 1, 4097) is None and measured_decode(tables, 2, 4096) is None
    assert measured_decode({}, 1, 4096) is None
    without = sglang_decode_section(_one_batch_lines(), {}, gpu="G", date="D", model="M", index_heads=64,
                                    kv_cache_dtype="fp8", fp8_gemm_backend="triton", tp_size=1, sources=[])
    assert without["rows"][0]["fp4"]["kernel_us"] is None  # no trace given: not invented
    with pytest.raises(ValueError, match="both FP8 and FP4"):
        sglang_decode_section(_one_batch_lines()[3:], {}, gpu="G", date="D", model="M", index_heads=64,
                              kv_cache_dtype="fp8", fp8_gemm_backend="triton", tp_size=1, sources=[])
    with pytest.raises(ValueError, match="context"):
        measured_decode(tables, 1, 0)


def test_serving_timing_rows_are_each_formats_scorer_kernel_per_layer():
    """The scorer kernels' time per step over the layers, paired by shape; other kernels, traces of other names and
    a shape with one format are left out; a run without its scorer kernel is an error."""
    profiles = {"/x/fp8_1x4096.trace.json.gz": {"top_kernels": [["nvjet", 600.0], ["void deep_gemm::sm90_fp8_paged_"
                                                                                  "mqa_logits<1u>(...)", 90.0]]},
                "/x/fp4_1x4096.trace.json.gz": {"top_kernels": [["fp4_paged_logits_sm90", 30.0], ["nvjet", 610.0]]},
                "/x/fp4_1x4096.gpu-only.trace.json.gz": {"top_kernels": [["fp4_paged_logits_sm90", 99.0]]},
                "/x/fp4_8x2048.trace.json.gz": {"top_kernels": [["fp4_paged_logits_sm90", 60.0]]}}
    sec = serving_timing_section(profiles, gpu="G", date="D", stack="S", layers=3, index_heads=64, method="M",
                                 sources=["a.json"])
    assert sec["rows"] == [{"heads": 64, "batch": 1, "context": 4096, "next_n": 1, "fp4_us": 10.0, "fp8_us": 30.0,
                            "fp8_native_us": None, "fp4_floor_us": None, "fp8_floor_us": None}]
    assert (sec["gpu"], sec["method"], sec["fp8_measured"]) == ("G", "M", True)
    with pytest.raises(ValueError, match="no fp8_paged_mqa_logits kernel"):
        serving_timing_section({"/x/fp8_1x4096.trace.json.gz": {"top_kernels": [["nvjet", 1.0]]}}, gpu="G",
                               date="D", stack="S", layers=3, index_heads=64, method="M", sources=[])
    with pytest.raises(ValueError, match="both FP8 and FP4"):
        serving_timing_section({k: v for k, v in profiles.items() if "8x2048" in k}, gpu="G", date="D", stack="S",
                               layers=3, index_heads=64, method="M", sources=[])
    with pytest.raises(ValueError, match="layers"):
        serving_timing_section(profiles, gpu="G", date="D", stack="S", layers=0, index_heads=64, method="M",
                               sources=[])
    with pytest.raises(ValueError, match="a second fp4_1x4096.trace.json.gz"):
        serving_timing_section({**profiles, "/y/fp4_1x4096.trace.json.gz": profiles["/x/fp4_1x4096.trace.json.gz"]},
                               gpu="G", date="D", stack="S", layers=3, index_heads=64, method="M", sources=[])


def test_update_script_writes_the_tables(tmp_path):
    bench, acc, out = tmp_path / "bench.json", tmp_path / "acc.json", tmp_path / "t.json"
    bench.write_text(json.dumps(_bench({"ours": {A: 30.0}, "deepgemm-fp8": {A: 38.0}})))
    acc.write_text(json.dumps(_accuracy()))
    script = str(REPO / "scripts" / "update_check_tables.py")
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, script, str(bench), str(acc), "--out", str(out)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "1 timing rows" in res.stdout and "FP8 measured" in res.stdout
    written = json.loads(out.read_text())
    assert written == build_tables(json.loads(bench.read_text()), _accuracy(), bench_source="bench.json",
                                   accuracy_source="acc.json")
    assert load_tables(out) == written
    bench.write_text(json.dumps(_bench({"ours": {A: 30.0}}, device_type="cpu")))
    res = subprocess.run([sys.executable, script, str(bench), str(acc), "--out", str(out)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 2 and "not on a GPU" in res.stderr and "Traceback" not in res.stderr


def test_glm5_section_needs_its_model_and_facts(tmp_path):
    """A section of an index path FP4 changes is kept apart from DeepSeek-V3.2's and must name its model: the
    update script refuses --cycle-fused without its facts, build_tables a section without ``model``."""
    bench, acc, out = tmp_path / "bench.json", tmp_path / "acc.json", tmp_path / "t.json"
    bench.write_text(json.dumps(_bench({"ours": {A: 30.0}, "deepgemm-fp8": {A: 38.0}})))
    acc.write_text(json.dumps(_accuracy()))
    summary = "benchmarks/results/sglang_timeline_glm5_layers3_mtp3x4_h100_2026-12-07.json"
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "update_check_tables.py"), str(bench), str(acc),
                          "--cycle-fused", f"{summary}:4", "--cycle-fused-gpu", "G", "--cycle-fused-date", "D",
                          "--cycle-fused-stack", "S", "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 2 and "--cycle-fused needs" in res.stderr and "--cycle-fused-model" in res.stderr
    sec = verify_cycle_section([(json.loads((REPO / summary).read_text()), 4)], gpu="G", date="D", stack="S",
                               method="M", sources=[summary])
    with pytest.raises(ValueError, match="cycle_fused: expected the model"):
        build_tables(json.loads(bench.read_text()), _accuracy(), cycle_fused=sec)
    t = build_tables(json.loads(bench.read_text()), _accuracy(), cycle_fused=dict(sec, model="GLM-5"))
    assert t["cycle_fused"]["model"] == "GLM-5" and summary in t["sources"] and "cycle_more" not in t


def _model_doc():
    w = lambda d8, d4: {"nll": {"dense": 2.0, "exact k=2048": 2.001, "fp8 k=2048": 2.0 + d8,  # noqa: E731
                                "fp4 k=2048": 2.0 + d4}, "recall": {"fp8 k=2048": {"5": 0.9}, "fp4 k=2048": {"5": 0.8}}}
    return {"model": "gemma3-270m", "loss": {
        "4096": {"topk": [2048], "windows": [w(0.001, 0.002), w(0.003, 0.002)]},
        "8192": {"topk": [2048, 256], "windows": [{"nll": {**w(0.001, 0.004)["nll"], "exact k=256": 2.03,
                                                            "fp8 k=256": 2.03, "fp4 k=256": 2.04}, "recall": {}}] * 2}},
        "passkey": {"4096": {"topk": [2048], "prompts": [
            {"depth": 0.1, "retrieved": {"dense": True, "exact k=2048": True, "fp8 k=2048": True, "fp4 k=2048": False},
             "logprob": {"dense": -1.0, "exact k=2048": -1.0, "fp8 k=2048": -1.1, "fp4 k=2048": -2.0}}]}}}


def test_model_rows_and_the_nearest_model_cost():
    t = build_tables(_bench({"ours": {A: 30.0}}), _accuracy(), model_accuracy=_model_doc(), model_source="m.json")
    assert t["sources"][-1] == "m.json" and t["model"]["sources"] == ["m.json"]
    assert {(r["indexer"], r["device"], r["source"]) for r in t["model"]["rows"]} == {("stand-in", "CPU", "m.json")}
    rows = {(r["context"], r["topk"]): r for r in t["model"]["rows"]}
    assert set(rows) == {(4096, 2048), (8192, 256), (8192, 2048)}
    r = rows[(4096, 2048)]
    assert r["delta_fp8"][0] == pytest.approx(0.002) and r["delta_fp8"][1] == pytest.approx(0.001)
    assert r["fp4_minus_fp8"][0] == pytest.approx(0.0) and r["windows"] == 2
    assert r["passkey_fp4"] == [0, 1] and r["passkey_fp8"] == [1, 1] and r["passkey_dense"] == [1, 1]
    assert r["recall_fp4"] == pytest.approx(0.8)
    # Nearest context by |log2| gap (ties: the longer), then the asked top-k, else the nearest one.
    pick = lambda c, k: (nearest_model_cost(t, c, k)["context"], nearest_model_cost(t, c, k)["topk"])  # noqa: E731
    assert pick(131072, 2048) == (8192, 2048)
    assert pick(4096, 2048) == (4096, 2048) and pick(5792, 2048) == (4096, 2048) and pick(5793, 2048) == (8192, 2048)
    assert pick(8192, 300) == (8192, 256) and pick(4096, 300) == (4096, 2048)
    assert nearest_model_cost({"timing": {}, "recall": {}}, 4096, 2048) is None
    assert nearest_model_cost(t, 4096, 2048, "trained") is None and model_indexers(t) == [("stand-in", None)]
    with pytest.raises(ValueError, match="m.json: no complete loss case"):
        build_tables(_bench({"ours": {A: 30.0}}), _accuracy(), model_accuracy={"loss": {}}, model_source="m.json")


def test_model_rows_from_several_studies_first_given_wins():
    """A GPU study of a trained indexer and a CPU study of the stand-in: each row names its indexer and device,
    a case both files measure comes from the first given, and the nearest row is chosen per indexer."""
    gpu = {**_model_doc(), "device": "cuda", "environment": {"gpu": "NVIDIA H100 80GB HBM3"}, "indexer_kind": "trained",
           "indexer": {"trained": {"context": 8192, "sequences": 12}}}
    other = {**gpu, "indexer": {"trained": {"context": 2048, "sequences": 16}}}
    gpu_stand_in = {**_model_doc(), "device": "cuda", "environment": {"gpu": "NVIDIA H100 80GB HBM3"}}
    cpu = _model_doc()
    cpu["loss"] = {**cpu["loss"], "4096": {"topk": [2048], "windows": [{"nll": {"dense": 2.0, "exact k=2048": 2.0,
                   "fp8 k=2048": 2.5, "fp4 k=2048": 2.5}, "recall": {}}] * 2}}
    t = build_tables(_bench({"ours": {A: 30.0}}), _accuracy(), model_accuracy=[gpu, gpu_stand_in, cpu, other],
                     model_source=["g.json", "s.json", "c.json", "o.json"])
    assert t["sources"][2:] == ["g.json", "s.json", "c.json", "o.json"]
    # Two trained indexers (trained on other text) are two indexers, not one case measured twice.
    assert model_indexers(t) == [("stand-in", None), ("trained", "12 x 8192 tokens"), ("trained", "16 x 2048 tokens")]
    rows = {(r["indexer"], r.get("trained_on"), r["context"], r["topk"]): r for r in t["model"]["rows"]}
    assert len(rows) == 9 and {r["source"] for k, r in rows.items() if k[0] == "stand-in"} == {"s.json"}
    assert rows["stand-in", None, 4096, 2048]["delta_fp8"][0] == pytest.approx(0.002)  # s.json's, not c.json's 0.5
    assert rows["trained", "12 x 8192 tokens", 8192, 2048]["device"] == "NVIDIA H100 80GB HBM3"
    assert nearest_model_cost(t, 131072, 2048, "trained", "12 x 8192 tokens")["source"] == "g.json"
    assert nearest_model_cost(t, 131072, 2048, "trained", "16 x 2048 tokens")["source"] == "o.json"
    assert nearest_model_cost(t, 131072, 2048, "trained") is None  # a trained indexer is named by its training
    with pytest.raises(ValueError, match="model_source: expected one name per model_accuracy result"):
        build_tables(_bench({"ours": {A: 30.0}}), _accuracy(), model_accuracy=[gpu, cpu], model_source=["g.json"])
    with pytest.raises(ValueError, match="studies of different models"):
        build_tables(_bench({"ours": {A: 30.0}}), _accuracy(), model_accuracy=[gpu, {**cpu, "model": "other"}],
                     model_source=["g.json", "c.json"])


def test_a_trained_study_without_its_training_record_stays_trained():
    """A trained indexer's result whose training settings were not recorded is still the trained indexer's row
    (never quoted as the stand-in's), with no training text to name."""
    doc = {**_model_doc(), "indexer_kind": "trained"}
    t = build_tables(_bench({"ours": {A: 30.0}}), _accuracy(), model_accuracy=doc, model_source="t.json")
    assert model_indexers(t) == [("trained", None)] and nearest_model_cost(t, 4096, 2048) is None
    assert nearest_model_cost(t, 4096, 2048, "trained")["source"] == "t.json"


def test_the_cycle_rows_are_the_timeline_summaries_and_are_quoted_only_where_measured():
    """The packaged ``cycle`` section equals one rebuilt from the committed timeline summaries; a row is found
    only at exactly its shape and next_n."""
    from sglang_fp4_indexer.tables import cycle_sections, load_tables, measured_cycle, verify_cycle_section

    results = REPO / "benchmarks" / "results"
    mtp = json.loads((results / "sglang_timeline_v32_rank20_mtp3x4_h200_2026-12-06.json").read_text())
    off = json.loads((results / "sglang_timeline_v32_rank20_mtp_off_h200_2026-12-06.json").read_text())
    packaged = load_tables()["cycle"]
    rebuilt = verify_cycle_section([(mtp, 4), (off, 1)], gpu=packaged["gpu"], date=packaged["date"],
                                   stack=packaged["stack"], method=packaged["method"], sources=packaged["sources"],
                                   rank="DP-attention + EP8 rank", moe_gpus=8)
    assert rebuilt == packaged
    # The full-depth H100 rank: measured at all 61 layers, so its "projection" is the measurement itself.
    (h100,) = load_tables()["cycle_more"]
    full = json.loads((results / "sglang_timeline_v32_rank61_ep32_mtp3x4_h100_2026-12-06.json").read_text())
    (r61,) = h100["rows"]
    agg61 = full["shapes"]["4x131072"]
    assert (r61["batch"], r61["context"], r61["next_n"], r61["layers"], r61["traces"]) == (4, 131072, 4, 61, 3)
    assert r61["fp8_ms"] == r61["fp8_61_ms"] == agg61["fp8"]["busy_us"]["median"] / 1e3
    assert r61["fp4_ms"] == agg61["fp4"]["busy_us"]["median"] / 1e3
    first4 = json.loads((results / "sglang_timeline_v32_rank61_ep32_mtp3x4_fp4_first_h100_2026-12-06.json")
                        .read_text())["shapes"]["4x131072"]
    assert r61["other_orders"] == [{"fp8_ms": first4["fp8"]["busy_us"]["median"] / 1e3,
                                    "fp4_ms": first4["fp4"]["busy_us"]["median"] / 1e3, "traces": 3}]
    # An other-order shape that no row has, or sources not one per summary, are refused by name.
    with pytest.raises(ValueError, match="other_orders: 8x131072"):
        verify_cycle_section([(full, 4)], gpu="g", date="d", stack="s", method="m", sources=["a"],
                             other_orders=[({"layers": 61, "shapes": {"8x131072": first4}}, 4)],
                             other_order_sources=["b"])
    with pytest.raises(ValueError, match="other_order_sources"):
        verify_cycle_section([(full, 4)], gpu="g", date="d", stack="s", method="m", sources=["a"],
                             other_orders=[(full, 4)], other_order_sources=None)
    assert cycle_sections(load_tables()) == [packaged, h100] and cycle_sections({}) == []
    with pytest.raises(ValueError, match="cycle_more"):
        build_tables({}, {}, cycle_more=[h100])
    row = measured_cycle({"cycle": packaged}, 8, 131072, 4)
    agg = mtp["shapes"]["8x131072"]
    assert row["fp8_ms"] == agg["fp8"]["busy_us"]["median"] / 1e3 and row["fp4_61_ms"] == agg["fp4"]["projected_busy_us"]["median"] / 1e3
    assert (row["layers"], row["full_depth"], row["traces"]) == (20, 61, 6)
    assert measured_cycle({"cycle": packaged}, 8, 131072, 1)["traces"] == 3
    assert measured_cycle({"cycle": packaged}, 8, 65536, 4) is None and measured_cycle({}, 8, 131072, 4) is None
    with pytest.raises(ValueError, match="next_n"):
        measured_cycle({"cycle": packaged}, 8, 131072, 0)
    with pytest.raises(ValueError, match="twice"):
        verify_cycle_section([(mtp, 4), (mtp, 4)], gpu="g", date="d", stack="s", method="m", sources=[])
    with pytest.raises(ValueError, match="no layer count"):
        verify_cycle_section([(dict(mtp, layers=None), 4)], gpu="g", date="d", stack="s", method="m", sources=[])


def test_the_packaged_tables_are_what_the_update_script_writes_from_their_recorded_sources(tmp_path):
    """scripts/update_check_tables.py run with every source and fact the packaged tables record (each summary's
    next_n from its name: mtp3x4 verifies 4 rows, the others 1) writes them byte for byte, the KV-limited load in
    both run orders, GLM-5's section and the H100's kernel benchmarks (--bench-more) included."""
    tables_path = REPO / "sglang_fp4_indexer" / "data" / "h200_tables.json"
    t = json.loads(tables_path.read_text())
    src, s, v, c, m = t["sources"], t["sglang"], t["timing_serving"], t["cycle"], t["cycle_more"][0]

    def with_next_n(paths):
        return [f"{p}:{4 if 'mtp3x4' in p else 1}" for p in paths]

    loads = m["load_sources"]
    assert len(m["loads"]) == 1 and len(loads) == 6  # one load, in two run orders
    out = tmp_path / "tables.json"
    argv = [src[0], src[1], "--model-accuracy", *t["model"]["sources"],
            "--sglang-one-batch", s["sources"][0], "--sglang-profile", *s["sources"][1:],
            "--sglang-gpu", s["gpu"], "--sglang-date", s["date"],
            "--serving-profile", *v["sources"], "--serving-gpu", v["gpu"], "--serving-date", v["date"],
            "--serving-stack", v["stack"], "--serving-layers", str(v["layers"]),
            "--cycle", *with_next_n(c["sources"]), "--cycle-gpu", c["gpu"], "--cycle-date", c["date"],
            "--cycle-stack", c["stack"], "--cycle-rank", c["rank"], "--cycle-moe-gpus", str(c["moe_gpus"]),
            "--cycle-more", *with_next_n(m["sources"]), "--cycle-more-gpu", m["gpu"], "--cycle-more-date", m["date"],
            "--cycle-more-stack", m["stack"], "--cycle-more-rank", m["rank"],
            "--cycle-more-moe-gpus", str(m["moe_gpus"]), "--cycle-more-other-order", *with_next_n(m["other_order_sources"]),
            "--cycle-more-load", *loads[:3], str(m["loads"][0]["next_n"]),
            "--cycle-more-load-other-order", *loads[3:],
            "--cycle-fused", *with_next_n(t["cycle_fused"]["sources"]), "--cycle-fused-gpu", t["cycle_fused"]["gpu"],
            "--cycle-fused-date", t["cycle_fused"]["date"], "--cycle-fused-stack", t["cycle_fused"]["stack"],
            "--cycle-fused-rank", t["cycle_fused"]["rank"], "--cycle-fused-model", t["cycle_fused"]["model"],
            "--bench-more", *[p for k in t["timing_more"] for p in k["sources"]],
            "--out", str(out)]
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "update_check_tables.py"), *argv], cwd=REPO,
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert out.read_bytes() == tables_path.read_bytes()
    # The other order's printed pools must be the first order's: a pair from other memory is refused, named.
    other = tmp_path / "other.txt"
    other.write_text((REPO / loads[5]).read_text().replace("#tokens: 641216", "#tokens: 641000"))
    argv[argv.index(loads[5])] = str(other)
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "update_check_tables.py"), *argv], cwd=REPO,
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 2 and (f"--cycle-more-load-other-order: {other}: its pools (589120, 641000) are not "
                                    "the first order's (589120, 641216)") in res.stderr


#: The H100 kernel benchmarks beside DeepGEMM's newer SM90 kernel (docs/benchmarks.md), as their files are named.
_H100_BENCHES = [f"benchmarks/results/bench_h100_sm90_multicast_{name}_2026-12-06.json"
                 for name in ("n4n2", "shapes", "repeat", "4x128k", "4x128k_repeat")] + [
    f"benchmarks/results/bench_h100_q_one_chunk{name}_2026-12-07.json" for name in ("", "_reverse")]


def test_the_h100_kernel_rows_are_the_median_of_the_runs_that_measured_each_shape():
    """The packaged ``timing_more`` section is the seven H100 bench reports: per shape and column, the median of the
    passing times of the reports of the newest day that measured that shape (the oracle: the raw files, read here),
    DeepGEMM's newer SM90 kernel included, None where no report has a column."""
    import statistics

    (sec,) = load_tables()["timing_more"]
    assert sec["sources"] == _H100_BENCHES and sec["gpu"] == "NVIDIA H100 80GB HBM3"
    columns = {"fp4_us": "ours", "fp8_us": "deepgemm-fp8", "fp8_native_us": "deepgemm-fp8-native",
               "fp8_sm90_newer_us": "deepgemm-fp8-sm90-multicast"}
    dated: dict = {}
    for path in _H100_BENCHES:
        report = json.loads((REPO / path).read_text())
        for row in report["rows"]:
            dated.setdefault((row["heads"], row["batch"], row["context"], row["next_n"]), []).append(
                (report["meta"]["date"][:10], row["results"]))
    # The runs of the newest day that measured a shape (a later run measured the current kernel).
    measured = {shape: [res for day, res in runs if day == max(d for d, _ in runs)] for shape, runs in dated.items()}
    assert {(r["heads"], r["batch"], r["context"], r["next_n"]): r["runs"] for r in sec["rows"]} == {
        shape: len(runs) for shape, runs in measured.items()}
    for row in sec["rows"]:
        runs = measured[row["heads"], row["batch"], row["context"], row["next_n"]]
        for field, column in columns.items():
            times = [r[column]["seconds"] * 1e6 for r in runs if r.get(column, {}).get("status") == "ok"]
            assert (row[field] is None) is (not times), (row, field)
            if times:
                assert row[field] == pytest.approx(statistics.median(times), abs=1e-3), (row, field)
    # 4 x 128K next_n 4: the two runs of 2026-12-06 (no native next_n column) give way to the newest day's one run.
    assert next(r for r in sec["rows"] if (r["batch"], r["next_n"]) == (4, 4))["runs"] == 1


def test_kernel_sections_are_one_gpu_each_and_name_what_they_refuse():
    one = _bench({"ours": {A: 30.0, B: 3.0}, "deepgemm-fp8": {A: 40.0}})
    two = _bench({"ours": {A: 32.0}, "deepgemm-fp8": {A: 41.0}, "deepgemm-fp8-sm90-multicast": {A: 33.0}})
    three = _bench({"ours": {A: 40.0}, "deepgemm-fp8": {A: 45.0}})
    sec = bench_timing_section([one, two, three], ["a.json", "b.json", "c.json"])
    rows = {(r["heads"], r["batch"], r["context"], r["next_n"]): r for r in sec["rows"]}
    assert (rows[A]["fp4_us"], rows[A]["fp8_us"], rows[A]["fp8_sm90_newer_us"], rows[A]["runs"]) == (32.0, 41.0, 33.0, 3)
    assert (rows[B]["fp4_us"], rows[B]["fp8_us"], rows[B]["runs"]) == (3.0, None, 1)
    pair = bench_timing_section([one, two], ["a", "b"])["rows"]
    assert next(r for r in pair if r["batch"] == 8)["fp4_us"] == 31.0  # of two: their mean
    other = _bench({"ours": {A: 1.0}})
    other["meta"]["device"] = "NVIDIA H100 80GB HBM3"
    with pytest.raises(ValueError, match="bench reports of different GPUs"):
        bench_timing_section([one, other], ["a.json", "h100.json"])
    with pytest.raises(ValueError, match="sources: expected one name per bench report"):
        bench_timing_section([one], [])
    with pytest.raises(ValueError, match="cpu.json: measured on"):
        bench_timing_section([_bench({"ours": {A: 1.0}}, device_type="cpu")], ["cpu.json"])
    t = build_tables(one, _accuracy(), timing_more=[sec])
    assert t["timing_more"] == [sec] and t["sources"][-3:] == ["a.json", "b.json", "c.json"]
    with pytest.raises(ValueError, match="timing_more: expected one section per GPU"):
        build_tables(one, _accuracy(), timing_more=[sec, sec])


def test_bench_more_refuses_what_check_would_never_read(tmp_path):
    """--bench-more takes other GPUs' bench reports: a file that is no JSON object, or a report of BENCH_JSON's own
    GPU (whose section check quotes instead, so it would never be read), is one line naming it (exit 2)."""
    bench, acc, out = tmp_path / "bench.json", tmp_path / "acc.json", tmp_path / "t.json"
    bench.write_text(json.dumps(_bench({"ours": {A: 30.0}, "deepgemm-fp8": {A: 38.0}})))
    acc.write_text(json.dumps(_accuracy()))
    listed, same = tmp_path / "list.json", tmp_path / "same.json"
    listed.write_text("[1, 2]")
    same.write_text(json.dumps(_bench({"ours": {A: 31.0}})))
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    for path, said in ((listed, f"--bench-more: {listed}: not a 'sglang-fp4-indexer bench --json' report"),
                       (same, f"--bench-more: {same} was measured on {json.loads(bench.read_text())['meta']['device']}, "
                              "the GPU of BENCH_JSON")):
        res = subprocess.run([sys.executable, str(REPO / "scripts" / "update_check_tables.py"), str(bench), str(acc),
                              "--bench-more", str(path), "--out", str(out)], cwd=REPO, capture_output=True,
                             text=True, env=env, timeout=120)
        assert res.returncode == 2 and said in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not out.exists()
