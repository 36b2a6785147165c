"""scripts/sglang_bench.py on the CPU: the decode profile's table by kernel category, on a planted trace.

Its ``one-batch`` subcommand runs SGLang's ``bench_one_batch`` on a GPU (docs/benchmarks.md, "Inside SGLang").
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "sglang_bench.py"
_spec = importlib.util.spec_from_file_location("sglang_bench", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.mark.parametrize("name, cat", [
    ("fp4_paged_logits_sm90", "indexer logits"),
    ("void deep_gemm::sm90_fp8_paged_mqa_logits<1u, 64u>(unsigned int)", "indexer logits"),
    ("plan_paged_schedule", "indexer logits"),
    ("store_index_k", "index-key store"),
    ("void sglang::topk_small_batch_cluster_kernel<true>(sglang::TopKPagedParams)", "indexer top-k"),
    ("fused_moe_kernel", "MoE"),
    ("void legacy::sm90::decode::sparse::flash_fwd_splitkv_mla_fp8_sparse_kernel<>", "sparse MLA"),
    ("_w8a8_block_fp8_matmul", "GEMMs"),
    ("nvjet_sm90_tst_128x8_64x12_2x1_v_bz_TNT", "GEMMs"),
    ("void at::native::elementwise_kernel<128, 2>", "rest"),
])
def test_kernel_names_fall_in_their_category(name, cat):
    assert bench.categorize(name) == cat


def test_profile_table_sums_gpu_time_per_step(tmp_path):
    events = [
        {"ph": "X", "cat": "kernel", "name": "fp4_paged_logits_sm90", "dur": 10.0},
        {"ph": "X", "cat": "kernel", "name": "fp4_paged_logits_sm90", "dur": 12.0},
        {"ph": "X", "cat": "kernel", "name": "fused_moe_kernel", "dur": 30.0},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "dur": 2.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 500.0},  # host side: not GPU time
    ]
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    got = bench.profile_table([str(path)], steps=2)[str(path)]
    assert got["us_per_step"] == {"MoE": 15.0, "indexer logits": 11.0, "copies": 1.0}
    assert got["total_us_per_step"] == 27.0 and got["top_kernels"][0] == ("fused_moe_kernel", 15.0)


def test_profile_table_refuses_a_trace_without_kernels_and_bad_steps(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "dur": 1}]}))
    with pytest.raises(ValueError, match="no GPU kernel events"):
        bench.profile_table([str(path)], steps=1)
    with pytest.raises(ValueError, match="steps"):
        bench.profile_table([str(path)], steps=0)


def test_host_time_summary_percentiles():
    got = bench.host_time_summary([i * 1e-6 for i in range(1, 101)])  # 1 .. 100 µs
    assert got["calls"] == 100
    assert got["median_us"] == pytest.approx(51.0) and got["p10_us"] == pytest.approx(11.0)
    assert got["p90_us"] == pytest.approx(91.0)
    with pytest.raises(ValueError, match="no indexer call"):
        bench.host_time_summary([])


def _serving_line(il, tput, tpot, accept=None):
    """One result line as ``python -m sglang.benchmark.serving --output-file`` writes it (the fields read)."""
    return {"random_input_len": il, "random_output_len": 256, "max_concurrency": 4, "completed": 8,
            "output_throughput": tput, "median_tpot_ms": tpot, "median_ttft_ms": 900.0, "accept_length": accept}


def test_serving_table_pairs_the_runs_by_shape(tmp_path, capsys):
    fp8 = [_serving_line(32768, 400.0, 9.5), _serving_line(100000, 120.0, 30.0)]
    fp4 = [_serving_line(32768, 440.0, 8.6, accept=1.7)]  # the 100000 run did not finish: not paired
    rows = bench.serving_table(fp8, fp4)
    assert len(rows) == 1 and rows[0]["input_len"] == 32768 and rows[0]["concurrency"] == 4
    assert rows[0]["output_ratio"] == pytest.approx(1.1)
    assert rows[0]["median_tpot_ms"] == {"fp8": 9.5, "fp4": 8.6}
    assert rows[0]["accept_length"] == {"fp8": None, "fp4": 1.7}
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps(x) + "\n" for x in fp8))
    b.write_text("".join(json.dumps(x) + "\n" for x in fp4))
    assert bench._serving_table(["--fp8", str(a), "--fp4", str(b), "--json", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert "output tok/s       FP8      400.0  FP4      440.0" in out and "FP4 / FP8 output tok/s 1.100" in out
    assert "accepted length    FP8          -  FP4       1.70" in out
    assert json.loads((tmp_path / "t.json").read_text())[0]["output_ratio"] == pytest.approx(1.1)
    assert bench._serving_table(["--fp8", str(a), "--fp4", str(a)]) == 0
    b.write_text(json.dumps(_serving_line(2048, 1.0, 1.0)) + "\n")
    assert bench._serving_table(["--fp8", str(a), "--fp4", str(b)]) == 1


def test_the_datasets_standin_lets_sglangs_serving_client_import(tmp_path):
    """SGLang's ``sglang.benchmark.serving`` imports with ``scripts/bench_standins`` ahead of any installed
    ``datasets`` (as on the GPU machine, which has none), and the stand-in refuses to load data."""
    import os
    import subprocess
    import sys

    standins = _PATH.parent / "bench_standins"
    code = ("import datasets, sglang.benchmark.serving as s; print(datasets.__file__); "
            "print(s.get_dataset.__module__)\n"
            "try:\n    datasets.load_dataset('x')\nexcept RuntimeError as e:\n    print('refused:', e)")
    env = dict(os.environ, PYTHONPATH=str(standins))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[0] == str(standins / "datasets" / "__init__.py")
    assert lines[1] == "sglang.benchmark.datasets"
    assert lines[2].startswith("refused: datasets is a stand-in here")
