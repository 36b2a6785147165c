"""The benchmark harness (sglang_fp4_indexer/bench) on the CPU interpreter, at tiny sizes.

What is asserted: the floor arithmetic against hand-computed byte counts;
shape parsing; the L2 rotation count; that the CPU run times with the wall
clock and says so; that every timed output is really checked -- deliberately
broken scorers, a corrupting store op and a wrong planner are reported as
failing, while the real ops pass with rows actually compared; the SGLang
layout mapping and the FP8 copy against the reference's own slot and decode
functions; the command line end to end (JSON and plot); and that SGLang's
scorer module loads without SGLang's package ``__init__`` side effects.
Prefill rows (``bench --prefill``): FLOP counting against hand-computed
pair counts and the reference's own causal windows, the chunked scoring loop
and the gather checked for real (broken scorers and a corrupting gather are
reported as failing), and the command line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from sglang_fp4_indexer.bench import floor as fl
from sglang_fp4_indexer.bench import prefill as pf
from sglang_fp4_indexer.bench.checks import OURS_REL
from sglang_fp4_indexer.bench.inputs import SCALE_CODES, random_index_k_cache
from sglang_fp4_indexer.bench.report import render_summary, write_json, load_json
from sglang_fp4_indexer.bench.runner import BenchConfig, bench_planner, bench_store, run_benchmark
from sglang_fp4_indexer.bench.scorers import (
    OursScorer,
    fp8_index_cache_from_fp4,
    make_scorers,
    sglang_request_table,
)
from sglang_fp4_indexer.bench.floor import fp4_scorer_bytes, logits_width, table_width
from sglang_fp4_indexer.bench.shapes import QUICK_SHAPES, SERVING_WIDTH, ScorerShape, full_grid, parse_shapes
from sglang_fp4_indexer.bench.timing import CPU_TIMING_NOTE, rotation_sets
from sglang_fp4_indexer.format import dequantize_index_k
from sglang_fp4_indexer.pool import read_index_k, scale_plane
from sglang_fp4_indexer.reference import fp8_dequantize_rows, paged_slots, ragged_logits_reference

REPO = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
MiB = 1 << 20


# ---------------------------------------------------------------- floor arithmetic


def test_fp4_floor_bytes_by_hand():
    # The headline shape: batch 8 x 131072, H 64: (68 + 4) B per key, ~18 us at ~4.2 TB/s.
    s = ScorerShape(64, 8, 131072, 1)
    assert fl.fp4_scorer_bytes(s) == 8 * 131072 * 68 + 8 * 131072 * 4 == 75_497_472
    assert fl.floor_seconds(75_497_472, 4.2e12) == pytest.approx(17.975e-6, rel=1e-4)
    # next_n = 4: keys are read once per request, logits written per row.
    s4 = ScorerShape(64, 8, 131072, 4)
    assert fl.fp4_scorer_bytes(s4) == 71_303_168 + 32 * 131072 * 4 == 88_080_384
    # A context that is not a whole number of pages: logits span the pages (width 128).
    odd = ScorerShape(32, 2, 100, 1)
    assert fl.logits_width(odd) == 128
    assert fl.fp4_scorer_bytes(odd) == 2 * 100 * 68 + 2 * 128 * 4 == 14_624


def test_fp8_and_store_floor_bytes_by_hand():
    # DeepGEMM's column: 132 B per key + 4 B per logit = 136 B per key at next_n 1.
    assert fl.fp8_scorer_bytes(ScorerShape(64, 8, 131072, 1)) == 8 * 131072 * 136 == 142_606_336
    # Store: 256 B of bf16 key read + 68 B written per token.
    assert fl.store_bytes(65536) == 65536 * 324 == 21_233_664
    assert fl.percent_of_floor(2e-6, 1e-6) == 50.0
    with pytest.raises(ValueError, match="bandwidth"):
        fl.floor_seconds(10, 0.0)
    with pytest.raises(ValueError, match="key_bytes"):
        fl.scorer_bytes(ScorerShape(32, 1, 64, 1), 0)


def test_tensor_core_floor_flops_and_which_floor_binds_by_hand():
    # next_n 4 with 64 heads at 8 x 128K: 256 query rows x 128 multiply-adds per key, 68.7 GFLOP.
    s4 = ScorerShape(64, 8, 131072, 4)
    assert fl.scorer_flops(s4) == 2 * 4 * 64 * 128 * 8 * 131072 == 68_719_476_736
    assert fl.scorer_flops(ScorerShape(32, 2, 100, 1)) == 2 * 32 * 128 * 200
    # At 1.25 PFLOP/s the tensor cores need 55 us, above FP4's HBM floor at 3 TB/s (29 us): they bind.
    tc = fl.scorer_flops(s4) / 1.25e15
    hbm = fl.floor_seconds(fl.fp4_scorer_bytes(s4), 3.0e12)
    assert fl.binding_floor(hbm, tc) == (tc, "tensor cores")
    # At next_n 1 the bytes bind; without a measured rate the HBM floor stands alone.
    s1 = ScorerShape(64, 8, 131072, 1)
    assert fl.binding_floor(fl.floor_seconds(fl.fp4_scorer_bytes(s1), 3.0e12), fl.scorer_flops(s1) / 1.25e15)[1] == "HBM"
    assert fl.binding_floor(2e-6, None) == (2e-6, "HBM")
    with pytest.raises(ValueError, match="tensor_core_s"):
        fl.binding_floor(1e-6, 0.0)
    with pytest.raises(ValueError, match="head_dim"):
        fl.scorer_flops(s1, head_dim=0)


def test_the_roofline_columns_show_the_binding_floor(cpu_report):
    """A CUDA report with a measured FP8 tensor-core rate: a TC floor column, each scorer's % of the roofline
    floor (the larger one) and what binds it; the CPU run measures no rate and shows none of them."""
    import copy

    from rich.console import Console

    from sglang_fp4_indexer.bench.report import render_table
    from sglang_fp4_indexer.bench.timing import fp8_mma_rate

    assert fp8_mma_rate(torch.device("cpu")) == (None, [])
    assert cpu_report["meta"]["fp8_mma_flops_per_s"] is None
    assert not any("pct_roofline" in res for row in cpu_report["rows"] for res in row["results"].values())
    console = Console(width=400, record=True)
    console.print(render_table(cpu_report))
    assert "% roofline" not in console.export_text()
    gpu = copy.deepcopy(cpu_report)
    gpu["meta"].update(device_type="cuda", fp8_mma_flops_per_s=1.2e15, fp8_mma_gemm="8192 x 8192 x 8192")
    row = gpu["rows"][0]
    row["tensor_core_floor_s"] = 3.0e-6
    ours = row["results"]["ours"]
    ours.update(seconds=4.0e-6, roofline_s=3.0e-6, binds="tensor cores", pct_roofline=75.0)
    console = Console(width=400, record=True)
    console.print(render_table(gpu))
    text = console.export_text()
    header = next(line for line in text.splitlines() if "shape (H" in line)
    assert [c.strip() for c in header.split("┃")[2:6]] == ["FP4 floor", "TC floor", "ours", "% floor"]
    line = next(line for line in text.splitlines() if f"│ {SHAPES[0].label}" in line)
    assert [c.strip() for c in line.split("│")[3:4]] == ["3.00"] and "75.0 (TC)" in line
    assert "1200 TFLOP/s" in " ".join(text.split())
    summary = next(line for line in render_summary(gpu).splitlines() if line.startswith(SHAPES[0].label))
    assert "r75% TC" in summary


def test_rotation_sets():
    l2 = 60 * MiB
    # 75.5 MB per call vs 4 x 60 MiB = 251.7 MB: ceil(3.33) = 4 sets.
    assert rotation_sets(75_497_472, l2) == 4
    assert rotation_sets(4 * l2, l2) == 1  # already 4 x L2
    assert rotation_sets(1000, l2) == 512  # capped
    assert rotation_sets(1000, None) == 1  # CPU: no L2 to defeat
    with pytest.raises(ValueError, match="case_bytes"):
        rotation_sets(0, l2)


# ---------------------------------------------------------------- shapes


def test_full_grid_and_quick():
    grid = full_grid()
    assert len(grid) == len(set(grid)) == 2 * 4 * 3 * 2
    assert {s.heads for s in grid} == {64, 32} and {s.batch for s in grid} == {1, 8, 32, 64}
    assert {s.context for s in grid} == {4096, 32768, 131072} and {s.next_n for s in grid} == {1, 4}
    # The default set: a live server's shapes, every logits buffer the model's whole context wide.
    assert {s.width for s in QUICK_SHAPES} == {SERVING_WIDTH} == {163840}
    assert {s.next_n for s in QUICK_SHAPES} == {1, 2, 4} and {s.heads for s in QUICK_SHAPES} == {64, 32}
    assert ScorerShape(64, 8, 131072, 2, SERVING_WIDTH) in QUICK_SHAPES
    assert ScorerShape(64, 1, 4096, 1, SERVING_WIDTH) in QUICK_SHAPES


def test_serving_width_shapes_and_floor():
    s = parse_shapes("64x64x4Kx1@160K")[0]
    assert s == ScorerShape(64, 64, 4096, 1, 163840) and s.spec == "64x64x4Kx1@160K" and s.label == "H64 64x4K n1 w160K"
    assert parse_shapes(s.spec) == [s]
    assert logits_width(s) == 163840 and table_width(s) == 4096
    # The floor counts the logits the top-k needs (the block table's width), not the buffer's tail.
    assert fp4_scorer_bytes(s) == 64 * 4096 * 68 + 64 * 4096 * 4
    with pytest.raises(ValueError, match="width: 100 logits columns cannot hold a context of 4096"):
        ScorerShape(64, 1, 4096, 1, 100)


def test_parse_shapes():
    got = parse_shapes("64x8x128Kx1, 32x1x100x2,64x8x131072x1")
    assert got == [ScorerShape(64, 8, 131072, 1), ScorerShape(32, 1, 100, 2)]
    assert got[0].spec == "64x8x128Kx1" and parse_shapes(got[1].spec) == [got[1]]
    assert parse_shapes("quick") == list(QUICK_SHAPES)
    for bad in ("64x8x128K", "big", "", "0x1x64x1", "64x1x2x4"):
        with pytest.raises(ValueError):
            parse_shapes(bad)


# ---------------------------------------------------------------- peer input mapping


def test_sglang_request_table_is_the_reference_slot_map():
    g = torch.Generator().manual_seed(3)
    bt = torch.randperm(12, generator=g)[:10].view(2, 5).to(torch.int32)
    table = sglang_request_table(bt, 300)
    assert table.dtype == torch.int32 and table.shape == (2, 300)
    for b in range(2):
        assert torch.equal(table[b].long(), paged_slots(bt[b], 300))
    with pytest.raises(ValueError, match="width"):
        sglang_request_table(bt, 5 * 64 + 1)


def test_fp8_copy_is_exact_in_sglang_fp8_layout():
    g = torch.Generator().manual_seed(5)
    cache = random_index_k_cache(3, CPU, g)
    codes = scale_plane(cache)
    assert int(codes.min()) >= SCALE_CODES[0] and int(codes.max()) <= SCALE_CODES[1]
    fp8 = fp8_index_cache_from_fp4(cache, chunk_pages=2)
    assert fp8.shape == (3, 64 * 132) and fp8.dtype == torch.uint8
    values = fp8[:, : 64 * 128].reshape(3 * 64, 128).view(torch.float8_e4m3fn)
    scales = fp8[:, 64 * 128 :].reshape(3 * 64, 4).contiguous().view(torch.float32).reshape(-1)
    slots = torch.arange(3 * 64)
    assert torch.equal(fp8_dequantize_rows(values, scales), dequantize_index_k(*read_index_k(cache, slots)))


# ---------------------------------------------------------------- the CPU run and its checks


class _Broken(OursScorer):
    """Ours with a planted bug applied to its output after every call."""

    def __init__(self, name, bug):
        super().__init__()
        self.name = name
        self._bug = bug

    def prepare(self, inputs, l2_bytes):
        prepared = super().prepare(inputs, l2_bytes)
        inner, bug = prepared.fn, self._bug

        def fn(s):
            out = inner(s)
            bug(out)
            return out

        return dataclasses.replace(prepared, fn=fn)


def _swap_first_two_keys(out):  # an indexing bug: two keys' logits exchanged
    out[:, [0, 1]] = out[:, [1, 0]].clone()


def _zero_tail(out):  # past-the-length columns written 0 instead of -inf
    out[out == float("-inf")] = 0.0


def _off_by_one_percent(out):  # a scale error well past the 1e-3 tolerance
    out.mul_(1.01)


SHAPES = [ScorerShape(32, 2, 130, 1), ScorerShape(64, 1, 70, 2)]


@pytest.fixture(scope="module")
def cpu_report():
    scorers = [
        OursScorer(),
        _Broken("broken-swap", _swap_first_two_keys),
        _Broken("broken-tail", _zero_tail),
        _Broken("broken-scale", _off_by_one_percent),
    ]
    config = BenchConfig(CPU, SHAPES, scorers, seed=1, store_tokens=96, planner_batch=8, copy_bytes=4 * MiB)
    return run_benchmark(config)


def test_cpu_run_checks_ours_for_real(cpu_report):
    assert CPU_TIMING_NOTE in cpu_report["meta"]["timing"]
    bw = cpu_report["meta"]["copy_bandwidth_bytes_per_s"]
    for shape, row in zip(SHAPES, cpu_report["rows"]):
        assert row["fp4_bytes"] == shape.batch * shape.context * 68 + shape.rows * fl.logits_width(shape) * 4
        assert row["fp4_floor_s"] == pytest.approx(row["fp4_bytes"] / bw)
        res = row["results"]["ours"]
        assert res["status"] == "ok", res
        assert res["timing"]["method"] == "wall-clock" and res["seconds"] > 0
        assert res["pct_floor"] == pytest.approx(100 * row["fp4_floor_s"] / res["seconds"])
        check = res["check"]
        # Both checked requests' rows were compared, and the errors were measured, within tolerance.
        checked_rows = (2 if shape.batch > 1 else 1) * shape.next_n
        assert check["ok"] and check["rows_checked"] == checked_rows
        assert check["sets_checked"] == 1 and 0 < check["worst"] <= 1
        assert f"{OURS_REL:g}" in check["detail"]


def test_cpu_run_reports_broken_scorers(cpu_report):
    for row in cpu_report["rows"]:
        res = row["results"]
        assert res["broken-swap"]["status"] == "check failed"
        assert "exceeds" in res["broken-swap"]["check"]["detail"]
        assert res["broken-tail"]["status"] == "check failed"
        assert "-inf" in res["broken-tail"]["check"]["detail"]
        assert res["broken-scale"]["status"] == "check failed"
        assert res["broken-scale"]["check"]["worst"] > 1
        assert "seconds" in res["broken-scale"]  # it was timed, then failed its check
    assert cpu_report["failures"] == 3 * len(SHAPES)
    summary = render_summary(cpu_report)
    assert "FAIL broken-swap,broken-tail,broken-scale" in summary and CPU_TIMING_NOTE in summary


def test_summary_never_puts_a_cpu_time_beside_a_gpu_target(cpu_report):
    import copy

    lines = render_summary(cpu_report).splitlines()
    planner = next(line for line in lines if line.startswith("planner, batch 8"))
    store = next(line for line in lines if line.startswith("store_index_k x 96 tokens"))
    assert "(its 5.00 us target is for a GPU; no CPU target) [check ok]" in planner and "met" not in planner
    assert "floor" not in store and store.endswith("[check ok]")
    # Without the per-shape lines (bench prints them in the wide table) the failing shapes are still named.
    short = render_summary(cpu_report, rows=False).splitlines()
    assert [line for line in short if line.startswith(SHAPES[0].label)] == [
        f"{SHAPES[0].label}: FAIL broken-swap,broken-tail,broken-scale"]
    gpu = copy.deepcopy(cpu_report)
    gpu["meta"]["device_type"] = "cuda"
    for seconds, word in ((2.4e-6, "met"), (6e-6, "missed")):
        gpu["planner"]["seconds"] = seconds
        planner = next(line for line in render_summary(gpu).splitlines() if line.startswith("planner"))
        assert f"(target 5.00 us: {word}) [check ok]" in planner, planner
    store = next(line for line in render_summary(gpu).splitlines() if line.startswith("store_index_k"))
    assert "% of its floor" in store


def test_host_time_column_beside_the_device_time(cpu_report):
    """A CUDA report carries each scorer's host time per eager call: the table gets a host column beside each
    scorer's device time and says what it is, the summary an h-figure; a CPU run measures none."""
    import copy

    from rich.console import Console

    from sglang_fp4_indexer.bench.report import HOST_NOTE, render_table

    assert not any("host_s" in res for row in cpu_report["rows"] for res in row["results"].values())
    gpu = copy.deepcopy(cpu_report)
    gpu["meta"]["device_type"] = "cuda"
    ours = gpu["rows"][0]["results"]["ours"]
    ours["seconds"], ours["host_s"] = 2.8e-6, 12.25e-6
    console = Console(width=400, record=True)
    console.print(render_table(gpu))
    text = console.export_text()
    header = next(line for line in text.splitlines() if "shape (H" in line)
    assert [c.strip() for c in header.split("┃")[3:6]] == ["ours", "host", "% floor"]
    row = next(line for line in text.splitlines() if f"│ {SHAPES[0].label}" in line)
    assert [c.strip() for c in row.split("│")[3:5]] == ["2.80", "12.2"]
    assert HOST_NOTE.split(";")[0] in " ".join(text.split())
    line = next(line for line in render_summary(gpu).splitlines() if line.startswith(SHAPES[0].label))
    assert "2.80" in line and "h12.2" in line


def test_cpu_run_store_and_planner_rows(cpu_report, tmp_path):
    store, planner = cpu_report["store"], cpu_report["planner"]
    assert store["status"] == "ok" and store["bytes"] == 96 * 324
    assert store["check"]["rows_checked"] == 96 and "bit-exact" in store["check"]["detail"]
    assert planner["status"] == "ok" and planner["check"]["ok"] and planner["seconds"] > 0
    path = write_json(cpu_report, tmp_path / "r.json")
    assert load_json(path)["rows"][0]["spec"] == SHAPES[0].spec


def test_store_check_catches_a_corrupting_store(monkeypatch):
    import sglang_fp4_indexer.ops.quantize as quantize

    real = quantize.store_index_k

    def corrupt(k, cache, slots, page_size=64, **kw):
        real(k, cache, slots, page_size, **kw)
        cache[0, 0] ^= 0x11  # one payload byte of one token wrong

    monkeypatch.setattr(quantize, "store_index_k", corrupt)
    row = bench_store(CPU, 64, None, 1e9)
    assert row["status"] == "check failed" and "differ" in row["check"]["detail"]


def test_planner_check_catches_a_wrong_schedule(monkeypatch):
    import sglang_fp4_indexer.ops.schedule as sched

    real = sched.plan_paged_schedule_into

    def wrong(lens, block_kv, out):
        real(lens, block_kv, out)
        out[1, 1] += 1
        return out

    monkeypatch.setattr(sched, "plan_paged_schedule_into", wrong)
    row = bench_planner(CPU, 8)
    assert row["status"] == "check failed"


def test_peers_unavailable_on_cpu_say_why():
    report = run_benchmark(BenchConfig(CPU, [ScorerShape(32, 1, 64, 1)], make_scorers(["sglang", "deepgemm"]),
                                       store_tokens=None, planner_batch=None, copy_bytes=MiB))
    status = {s["name"]: s["status"] for s in report["scorers"]}
    assert status["sglang-triton-fp4"].startswith("unavailable: needs a CUDA device")
    assert status["deepgemm-fp8"].startswith("unavailable: needs a CUDA device")
    assert report["failures"] == 0 and "store" not in report and "planner" not in report


def test_make_scorers_rejects_unknown():
    with pytest.raises(ValueError, match="unknown"):
        make_scorers(["ours", "flashinfer"])
    assert [s.name for s in make_scorers(["ours"], ["scaled", "folded"])] == ["ours[scaled]", "ours[folded]"]


# ---------------------------------------------------------------- command line and peer loading


def _clean_env():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO)
    return env


def test_cli_bench_cpu_end_to_end(tmp_path):
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    cmd = [sys.executable, "-m", "sglang_fp4_indexer.cli", "bench", "--device", "cpu", "--shapes", "32x1x64x1",
           "--scorers", "ours,sglang", "--store-tokens", "64", "--planner-batch", "4", "--copy-mib", "4",
           "--json", str(out_json), "--plot", str(out_png)]
    # TRITON_INTERPRET is not set: the command must set it itself before Triton is imported.
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env(), cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out_json.read_text())
    assert report["rows"][0]["results"]["ours"]["check"]["ok"]
    assert report["meta"]["device_type"] == "cpu" and report["failures"] == 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tail = proc.stdout.strip().splitlines()
    assert tail[-2].startswith("failures: 0") or tail[-1].startswith("failures: 0")
    assert "unavailable: needs a CUDA device" in proc.stdout
    # The shape's row appears once, in the wide table (the summary after it does not repeat the rows).
    assert sum(line.startswith("│ H32 1x64 n1") for line in tail) == 1
    assert not any(line.startswith("H32 1x64 n1") for line in tail)
    planner = next(line for line in tail if line.startswith("planner, batch 4"))
    assert "target is for a GPU; no CPU target" in planner and "[check ok]" in planner, planner


def test_cli_bench_bad_options():
    for args in (["--shapes", "64x8"], ["--scorers", "nope"], ["--store-tokens", "-1"]):
        proc = subprocess.run([sys.executable, "-m", "sglang_fp4_indexer.cli", "bench", "--device", "cpu", *args],
                              capture_output=True, text=True, env=_clean_env(), timeout=300)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "error:" in proc.stderr


def test_cli_bench_refuses_gpu_sets_on_the_cpu_and_unrunnable_shapes_up_front(monkeypatch, capsys):
    from sglang_fp4_indexer.cli import main
    from sglang_fp4_indexer.ops.paged_logits import MAX_NEXT_N, SUPPORTED_HEADS

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # what the command sets for --device cpu; restored afterwards
    assert 48 not in SUPPORTED_HEADS and MAX_NEXT_N < 9
    for args, flag, detail in (
        (["--quick"], "--quick", "--shapes cpu"),
        (["--shapes", "quick"], "--shapes", "'quick'"),
        (["--shapes", "cpu,FULL"], "--shapes", "'full'"),
        (["--shapes", "48x1x128x1"], "--shapes", "48x1x128x1"),
        (["--shapes", "32x1x128x1,64x1x128x9"], "--shapes", "64x1x128x9"),
        (["--shapes", "32x1x64x1", "--impl", "scaled,bogus"], "--impl", "'bogus'"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(["bench", "--device", "cpu", *args])
        captured = capsys.readouterr()
        assert exc.value.code == 2, args
        assert f"error: {flag}: " in captured.err and detail in captured.err, (args, captured.err)
        assert "copy bandwidth" not in captured.out  # refused before anything ran


@pytest.mark.sglang
def test_sglang_scorer_module_loads_without_package_init():
    code = textwrap.dedent(
        """
        import sys
        from sglang_fp4_indexer.bench.peers import load_sglang_fp4_indexer
        m = load_sglang_fp4_indexer()
        assert callable(m.fp4_index_logits_paged)
        heavy = [n for n in ("sglang.lang", "sglang.lang.api", "transformers", "sglang.srt.utils.network", "zmq")
                 if n in sys.modules]
        print("HEAVY", heavy)
        assert not heavy, heavy
        assert not hasattr(sys.modules["sglang"], "__version__")  # sglang/__init__.py did not run
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_clean_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------- prefill rows


def test_prefill_flops_by_hand():
    # 3 new tokens on a 2-token prefix: windows of 3, 4 and 5 keys = 12 pairs; 2 * 64 * 128 FLOP per pair.
    assert pf.visible_pairs(3, 2) == 12
    assert pf.prefill_flops(pf.PrefillShape(64, 3, 2)) == 2 * 64 * 128 * 12 == 196_608
    assert pf.visible_pairs(4, 0) == 1 + 2 + 3 + 4
    # The largest prefill row: 32K new on a 32K prefix = 2**30 + 32768 * 32769 / 2 pairs, 26.4 PFLOP at H 64.
    assert pf.visible_pairs(32768, 32768) == 1_073_741_824 + 536_887_296 == 1_610_629_120
    assert pf.prefill_flops(pf.PrefillShape(64, 32768, 32768)) == 16384 * 1_610_629_120 == 26_388_547_502_080
    assert pf.gather_bytes(100) == 100 * 136
    with pytest.raises(ValueError, match="new"):
        pf.visible_pairs(-1, 0)


def test_prefill_pairs_are_the_reference_visible_entries():
    # The pair count equals the finite entries of the oracle's logits for causal windows [0, prefix + t + 1).
    g = torch.Generator().manual_seed(9)
    new, prefix = 5, 7
    payload = torch.randint(0, 256, (new + prefix, 64), generator=g, dtype=torch.uint8)
    scales = torch.randint(124, 132, (new + prefix, 4), generator=g, dtype=torch.uint8)
    q = torch.randn(new, 2, 128, generator=g).to(torch.float8_e4m3fn)
    w = torch.rand(new, 2, generator=g)
    ks = torch.zeros(new, dtype=torch.int64)
    ke = prefix + 1 + torch.arange(new)
    ref = ragged_logits_reference(q, w, payload, scales, ks, ke)
    assert int(torch.isfinite(ref).sum()) == pf.visible_pairs(new, prefix) == 5 * 7 + 15


def test_prefill_shapes_and_checked_rows():
    assert [s.spec for s in pf.GPU_PREFILL_SHAPES] == ["64x4Kx0", "64x4Kx32K", "64x16Kx0", "64x16Kx32K",
                                                       "64x32Kx0", "64x32Kx32K"]
    got = pf.parse_prefill_shapes("64x16Kx32K, 16x12x20,64x16384x32768")
    assert got == [pf.PrefillShape(64, 16384, 32768), pf.PrefillShape(16, 12, 20)]
    assert got[0].keys == 49152 and got[0].label == "H64 16K new + 32K prefix"
    assert pf.parse_prefill_shapes("cpu") == list(pf.CPU_PREFILL_SHAPES)
    for bad in ("64x4K", "64x0x0", "big", ""):
        with pytest.raises(ValueError):
            pf.parse_prefill_shapes(bad)
    assert pf.checked_rows(12) == [0, 4, 7, 11] and pf.checked_rows(1) == [0] and pf.checked_rows(3) == [0, 1, 2]


def _broken_prefill(name, bug=None, shrink=False):
    """The first default scoring column with a planted bug applied to every chunk, or its windows one key short."""
    ours = pf.default_variants(CPU)[0]

    def chunks(q, w, payload, scales, ks, ke, **kw):
        for start, end, chunk in ours.chunks(q, w, payload, scales, ks, ke - 1 if shrink else ke, **kw):
            if bug is not None:
                bug(chunk)
            yield start, end, chunk

    return pf.PrefillVariant(name, name, chunks)


PREFILL_SHAPES = [pf.PrefillShape(16, 12, 20), pf.PrefillShape(32, 20, 0)]


@pytest.fixture(scope="module")
def prefill_report():
    variants = pf.default_variants(CPU) + [
        _broken_prefill("broken-scale", _off_by_one_percent),
        _broken_prefill("broken-tail", _zero_tail),
        _broken_prefill("broken-window", shrink=True),  # drops each row's last visible key
    ]
    config = pf.PrefillConfig(CPU, PREFILL_SHAPES, variants, budget_bytes=512, mma_size=64, seed=3, copy_bytes=4 * MiB)
    return pf.bench_prefill(config)


def test_prefill_cpu_run_counts_and_checks_for_real(prefill_report):
    report = prefill_report
    assert [v["name"] for v in report["variants"]][:2] == ["ours[folded]", "ours[grouped]"]  # FP8 MMA emulated
    mma = report["mma"]
    assert mma["status"] == "ok" and mma["flops"] == 2 * 64**3
    assert mma["tflops"] == pytest.approx(mma["flops"] / mma["seconds"] / 1e12)
    assert mma["seconds"] == min(v["seconds"] for v in mma["variants"].values())
    # Hand-computed: 12 new on 20 prefix = 12 * 20 + 78 = 318 pairs; 20 new on 0 = 210 pairs.
    assert [r["visible_pairs"] for r in report["prefill"]] == [318, 210]
    assert [r["flops"] for r in report["prefill"]] == [2 * 16 * 128 * 318, 2 * 32 * 128 * 210] == [1_302_528, 1_720_320]
    for shape, row in zip(PREFILL_SHAPES, report["prefill"]):
        gather = row["gather"]
        assert gather["status"] == "ok" and gather["bytes"] == shape.keys * 136
        assert gather["check"]["rows_checked"] == shape.keys and "bit-exact" in gather["check"]["detail"]
        for name in ("ours[folded]", "ours[grouped]"):
            res = row["results"][name]
            assert res["status"] == "ok", res
            assert res["timing"]["method"] == "wall-clock"
            assert res["tflops"] == pytest.approx(row["flops"] / res["seconds"] / 1e12)
            assert res["pct_mma"] == pytest.approx(100 * res["tflops"] / mma["tflops"])
            # 512 B budget at 4 B per logit over `keys` columns.
            assert res["rows_per_chunk"] == 512 // (4 * shape.keys)
            assert res["chunks"] == -(-shape.new // res["rows_per_chunk"]) >= 2
            check = res["check"]
            assert check["ok"] and check["rows_checked"] == len(pf.checked_rows(shape.new)) == 4
            assert 0 < check["worst"] <= 1 and f"{pf.PREFILL_REL:g}" in check["detail"]
        assert row["results"][pf.SGLANG_PEER]["status"] == "unavailable"
    assert report["peers"][pf.SGLANG_PEER] == "unavailable: needs a CUDA device"


def test_prefill_cpu_run_reports_broken_scorers(prefill_report):
    for row in prefill_report["prefill"]:
        res = row["results"]
        assert res["broken-scale"]["status"] == "check failed" and res["broken-scale"]["check"]["worst"] > 1
        assert res["broken-tail"]["status"] == "check failed" and "-inf" in res["broken-tail"]["check"]["detail"]
        assert res["broken-window"]["status"] == "check failed"
        assert "not finite" in res["broken-window"]["check"]["detail"]
    assert prefill_report["failures"] == 3 * len(PREFILL_SHAPES)
    summary = pf.render_prefill_summary(prefill_report)
    assert "FAIL broken-scale" in summary and "needs a CUDA device" in summary and "512 B budget" in summary


def test_prefill_gather_check_catches_a_corrupting_gather(monkeypatch):
    import sglang_fp4_indexer.ops.gather as gather_ops

    real = gather_ops.gather_index_k

    def corrupt(*args, **kw):
        payload, scales = real(*args, **kw)
        scales[-1, 0] ^= 1  # one scale code of the last key wrong
        return payload, scales

    monkeypatch.setattr(gather_ops, "gather_index_k", corrupt)
    report = pf.bench_prefill(pf.PrefillConfig(CPU, [pf.PrefillShape(16, 4, 60)], pf.default_variants(CPU)[:1],
                                               budget_bytes=1 << 20, mma_size=0, copy_bytes=MiB))
    row = report["prefill"][0]
    assert row["gather"]["status"] == "check failed" and "differ" in row["gather"]["check"]["detail"]
    assert row["results"]["ours[folded]"]["status"] == "ok"  # the scorer reads the oracle's planes
    assert report["failures"] == 1 and report["mma"] == {}


def test_cli_bench_prefill_cpu_end_to_end(tmp_path):
    out_json = tmp_path / "prefill.json"
    cmd = [sys.executable, "-m", "sglang_fp4_indexer.cli", "bench", "--device", "cpu", "--prefill",
           "--prefill-shapes", "16x8x8", "--mma-size", "32", "--copy-mib", "4", "--json", str(out_json)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env(), cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out_json.read_text())
    row = report["prefill"][0]
    assert row["flops"] == 2 * 16 * 128 * (8 * 8 + 36) and row["results"]["ours[folded]"]["check"]["ok"]
    assert report["meta"]["budget_bytes"] == pf.CPU_BUDGET_BYTES and report["failures"] == 0
    assert "2048 B budget" in proc.stdout and "sglang-triton-fp4: unavailable: needs a CUDA device" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "failures: 0"
    summary = subprocess.run([sys.executable, "-m", "sglang_fp4_indexer.bench.report", str(out_json)],
                             capture_output=True, text=True, env=_clean_env(), timeout=300)
    assert summary.returncode == 0 and summary.stdout.startswith("== prefill summary")
    for args in (["--quick"], ["--prefill-shapes", "64x8"], ["--prefill-budget-mib", "0"]):
        bad = subprocess.run([sys.executable, "-m", "sglang_fp4_indexer.cli", "bench", "--device", "cpu", "--prefill",
                              *args], capture_output=True, text=True, env=_clean_env(), timeout=300)
        assert bad.returncode == 2 and "error:" in bad.stderr, bad.stdout + bad.stderr


# ---------------------------------------------------------------- GPU (device machine)


@pytest.mark.gpu
def test_gpu_bench_small_shapes_all_scorers_checked():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dev = torch.device("cuda")
    shapes = [ScorerShape(64, 2, 4096, 1), ScorerShape(32, 1, 4096, 4)]
    report = run_benchmark(BenchConfig(dev, shapes, make_scorers(["ours", "sglang", "deepgemm"]),
                                       store_tokens=4096, planner_batch=64, copy_bytes=256 * MiB))
    assert report["meta"]["copy_bandwidth_bytes_per_s"] > 1e12
    for row in report["rows"]:
        ours = row["results"]["ours"]
        assert ours["status"] == "ok", ours
        assert ours["timing"]["method"] == "cuda-graph" and ours["timing"]["calls_per_graph"] >= 20
        assert ours["sets"] > 1  # small case: rotated to defeat L2
        for peer in ("sglang-triton-fp4", "deepgemm-fp8"):
            assert row["results"][peer]["status"] in ("ok", "unavailable"), row["results"][peer]
    assert report["store"]["status"] == "ok" and report["planner"]["status"] == "ok"


@pytest.mark.gpu
def test_gpu_bench_prefill_small_shape_checked():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dev = torch.device("cuda")
    report = pf.bench_prefill(pf.PrefillConfig(dev, [pf.PrefillShape(64, 4096, 4096)], mma_size=4096,
                                               copy_bytes=256 * MiB))
    assert report["mma"]["status"] == "ok" and report["mma"]["tflops"] > 100
    row = report["prefill"][0]
    assert row["gather"]["status"] == "ok", row["gather"]
    for name in ("ours[folded]", "ours[grouped]"):
        res = row["results"][name]
        assert res["status"] == "ok", res
        assert res["timing"]["method"] == "cuda-graph" and res["check"]["rows_checked"] == 4
    assert report["failures"] == 0


def test_write_plot_draws_decode_rows_and_refuses_a_report_without_them(tmp_path):
    """The chart of a saved H200 report is a PNG; a report without timed decode rows (a prefill report) is refused."""
    from sglang_fp4_indexer.bench.report import write_plot

    report = load_json(REPO / "benchmarks" / "results" / "bench_h200_decode_first.json")
    out = write_plot(report, tmp_path / "plot.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    prefill = load_json(REPO / "benchmarks" / "results" / "bench_h200_prefill_first.json")
    with pytest.raises(ValueError, match="no decode rows"):
        write_plot(prefill, tmp_path / "prefill.png")
