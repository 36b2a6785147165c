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
    ("void sglang::fused_store_indexer_cache<__nv_bfloat16, 128, 64>(sglang::StoreParams)", "index-key store"),
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


def _kineto_like_text(name: str, occupancy: str) -> str:
    """A trace's text as Kineto writes it: the name and the number as they come, unescaped and unquoted."""
    return ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "' + name + '", "dur": 4.0, '
            '"args": {"est. achieved occupancy %": ' + occupancy + '}}, '
            '{"ph": "X", "cat": "kernel", "name": "fused_moe_kernel", "dur": 6.0}]}')


@pytest.mark.parametrize("name, occupancy, repairs", [
    ("fp4_paged_logits_sm90", "12", []),
    ("fp4_paged_logits_sm90", "nan", ["bare nan / inf numbers read as null"]),
    ("fp4_paged_logits_sm90", "-inf", ["bare nan / inf numbers read as null"]),
    ("ns\\sm90\\paged_logits", "0", ["backslashes that start no JSON escape doubled"]),
    ("fp4_paged_logits_sm90\x01", "0", ["control characters inside strings accepted"]),
])
def test_load_trace_repairs_what_kineto_writes_unescaped(tmp_path, name, occupancy, repairs):
    """Each repair reads back the events as written (the name's characters kept), and is named."""
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        f.write(_kineto_like_text(name, occupancy))
    trace, got = bench.load_trace(str(path))
    assert got == repairs
    assert [e["name"] for e in trace["traceEvents"]] == [name, "fused_moe_kernel"]
    assert trace["traceEvents"][0]["args"]["est. achieved occupancy %"] == (
        None if occupancy in ("nan", "-inf") else float(occupancy))
    assert bench.profile_table([str(path)], steps=1)[str(path)]["us_per_step"]["indexer logits"] == 4.0


def test_load_trace_keeps_an_escaped_backslash_and_reads_bytes_that_are_not_utf8(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(b'{"traceEvents": [{"name": "a\\\\b\xff", "dur": 1}]}')
    trace, repairs = bench.load_trace(str(path))
    assert trace["traceEvents"][0]["name"] == "a\\b\ufffd" and repairs == ["bytes that are not UTF-8 replaced"]


def test_load_trace_reads_a_nul_that_begins_a_line_as_the_indentation_space(tmp_path):
    """Kineto's pretty-printed layout (every line after the first indented with spaces), a line's first byte a NUL
    as in the FP4 server's traces: read back as the text written; a NUL inside a string is not turned into a space."""
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "dur": float(i)} for i in range(40)]
    text = json.dumps({"traceEvents": events}, indent=2).encode()
    starts = [i + 1 for i, c in enumerate(text) if c == 10 and text[i + 1:i + 2] == b" "]
    corrupt = bytearray(text)
    for i in starts[5::7]:
        corrupt[i] = 0
    path = tmp_path / "t.trace.json.gz"
    path.write_bytes(gzip.compress(bytes(corrupt)))
    trace, repairs = bench.load_trace(str(path))
    assert trace == json.loads(text)
    assert repairs == ["NUL bytes that began lines read as the indentation space"]
    inside = bytearray(text)
    inside[text.index(b'"k3"') + 2] = 0  # inside a name: not a line's first byte, kept as the byte it is
    path.write_bytes(gzip.compress(bytes(inside)))
    trace, repairs = bench.load_trace(str(path))
    assert trace["traceEvents"][3]["name"] == "k\x00"
    assert repairs == ["control characters inside strings accepted"]


def test_load_trace_names_the_error_of_an_unrepairable_trace_and_waits_on_an_incomplete_one(tmp_path):
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        f.write(_kineto_like_text('fp4 "quoted" name', "1"))
    with pytest.raises(ValueError, match=r"t.trace.json.gz: not JSON.*line 1 column .*around it: .*quoted"):
        bench.load_trace(str(path))
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])  # a gzip stream cut short: still being written
    with pytest.raises(EOFError):
        bench.load_trace(str(path))
    path.write_bytes(b"")
    with pytest.raises(EOFError, match="empty"):
        bench.load_trace(str(path))


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


def test_parse_shapes_reads_batch_and_input_and_names_bad_ones():
    assert bench.parse_shapes(["1:131072", "8:65536"]) == [(1, 131072), (8, 65536)]
    for bad in ("8x65536", "0:4096", "8:", "a:1", "1:2:3"):
        with pytest.raises(ValueError, match="--shapes: expected BATCH:INPUT"):
            bench.parse_shapes([bad])


def test_profile_and_stream_bodies_are_sglangs_request_types():
    """The two bodies the profile client posts build SGLang's own ``ProfileReq`` and ``GenerateReqInput`` with
    every field they carry (an unknown field would raise)."""
    from sglang.srt.managers.io_struct import GenerateReqInput, ProfileReq

    body = bench.profile_body("/tmp/p", 5, "fp4_1x131072")
    req = ProfileReq(**body)  # keyword-only: an unknown field raises
    # The HTTP server's own parse of a JSON body (FastAPI through pydantic, SGLang's schema for its structs).
    from pydantic import TypeAdapter

    assert TypeAdapter(ProfileReq).validate_json(json.dumps(body)) == req
    assert set(body) <= set(ProfileReq.__struct_fields__)
    assert (req.num_steps, req.profile_by_stage, req.with_stack, req.profile_prefix) == (5, True, False, "fp4_1x131072")
    gen = bench.stream_body([5, 6, 7], 4096)
    g = GenerateReqInput(**gen)
    assert g.input_ids == [5, 6, 7] and g.stream is True and g.sampling_params["ignore_eos"] is True


def test_sglangs_profiler_records_exactly_num_steps_decode_batches(monkeypatch):
    """SGLang's own scheduler profiler manager (profile_by_stage, as ``profile_body`` asks) starts at the next
    decode batch and stops before the (N+1)-th: the trace holds N decode batches, what ``--steps`` says.
    Only the torch profiler's start and stop are recorded instead of run (no GPU here)."""
    from types import SimpleNamespace

    from sglang.srt.managers.scheduler_components import profiler_manager as pm
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    monkeypatch.setattr(pm, "get_dp_tp_group", lambda: SimpleNamespace(cpu_group=None))
    mgr = pm.SchedulerProfilerManager(get_forward_ct=lambda: 0)
    events = []

    def start(stage=None):
        mgr.profile_in_progress = True
        events.append(("start", stage))

    def stop(stage=None):
        mgr.profile_in_progress = False
        events.append(("stop", stage))

    monkeypatch.setattr(mgr, "_start_profile", start)
    monkeypatch.setattr(mgr, "_stop_profile", stop)
    body = bench.profile_body("/tmp/p", 3, "fp8_8x65536")
    mgr._init_profile(body["output_dir"], None, body["num_steps"], body["activities"], body["with_stack"],
                      body["record_shapes"], body["profile_by_stage"], "id", False, body["profile_prefix"])
    profiled = 0
    for _ in range(6):
        mgr._profile_batch_predicate(SimpleNamespace(forward_mode=ForwardMode.DECODE, batch_size=lambda: 8))
        profiled += mgr.profile_in_progress  # this batch runs while the profiler records
    assert profiled == 3
    assert events == [("start", ForwardMode.DECODE), ("stop", ForwardMode.DECODE)]


def _standin_server(state, *, fail_second=False, trace_text=None):
    """A small local HTTP server standing in for SGLang's /generate (streamed as SGLang's ``stream_results``
    writes it), /start_profile (writes the trace file SGLang would) and /abort_request; the real server needs a
    GPU. The second request streams 1.5 s late, or, with ``fail_second``, sends SGLang's error chunk;
    ``trace_text``: the trace file's text, or a function of the ``/start_profile`` body giving it (default: an
    empty trace, valid JSON)."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    t0 = time.time()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/generate":
                state["bodies"].append(body)
                aborts = state.setdefault("aborts", 0)  # SGLang's abort_all ends the requests running then only
                second = state["started"] == 1
                state["started"] += 1
                self.send_response(200)
                self.end_headers()
                if second and fail_second:
                    self.wfile.write(b'data: {"error":{"message":"input too long","code":400}}\n\n')
                    self.wfile.write(b"data: [DONE]\n\n")
                    return
                time.sleep(1.5 if second else 0.0)
                for k in range(200):
                    if state["aborts"] != aborts:
                        break
                    meta = f'"meta_info":{{"completion_tokens":{2 * k + 1}}}'  # 2 tokens a chunk, as MTP may
                    self.wfile.write(f'data: {{"text":"","output_ids":[{k}],{meta}}}\n\n'.encode())
                    self.wfile.flush()
                    time.sleep(0.02)
                self.wfile.write(b"data: [DONE]\n\n")
            elif self.path == "/start_profile":
                state["profile_at"] = time.time() - t0
                name = f"{body['profile_prefix']}-123-TP-0-DECODE.trace.json.gz"
                with gzip.open(Path(body["output_dir"]) / name, "wt") as f:
                    text = trace_text(body) if callable(trace_text) else trace_text
                    f.write(text if text is not None else json.dumps({"traceEvents": []}))
                state.setdefault("activities", []).append(body["activities"])
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b'{"success": true}')
            elif self.path == "/abort_request":
                state["aborts"] = state.get("aborts", 0) + 1
                state["aborted"].set()
                self.send_response(200)
                self.end_headers()

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_profile_decode_posts_the_profile_only_once_every_request_decodes(tmp_path):
    """The profile is not asked for before the late request has decoded; the trace's path comes back and
    every request is aborted afterwards."""
    import threading

    state = {"started": 0, "profile_at": None, "aborted": threading.Event(), "bodies": []}
    srv = _standin_server(state)
    try:
        (tmp_path / "raw").mkdir()
        path = bench.profile_decode(f"http://127.0.0.1:{srv.server_port}", 2, 16, out_dir=str(tmp_path / "raw"),
                                    prefix="fp4_2x16", steps=3, output_len=64, timeout=30)
    finally:
        srv.shutdown()
    assert path == str(tmp_path / "raw" / "fp4_2x16-123-TP-0-DECODE.trace.json.gz")
    assert state["profile_at"] is not None and state["profile_at"] >= 1.5
    assert state["aborted"].is_set() and len(state["bodies"]) == 2
    assert all(len(b["input_ids"]) == 16 and b["stream"] for b in state["bodies"])
    assert state["bodies"][0]["input_ids"] != state["bodies"][1]["input_ids"]


def test_profile_decode_reports_a_whole_trace_that_is_not_json_at_once(tmp_path):
    """A trace written whole but not JSON fails the shape within seconds, naming the file, instead of waiting
    for it to become readable until the timeout; the requests are aborted."""
    import threading
    import time

    state = {"started": 0, "profile_at": None, "aborted": threading.Event(), "bodies": []}
    srv = _standin_server(state, trace_text=_kineto_like_text('a "quoted" name', "1"))
    t0 = time.time()
    try:
        (tmp_path / "raw").mkdir()
        with pytest.raises(bench.TraceUnreadable, match="2 x 16: the decode trace is not JSON") as err:
            bench.profile_decode(f"http://127.0.0.1:{srv.server_port}", 2, 16, out_dir=str(tmp_path / "raw"),
                                 prefix="fp4_2x16", steps=3, output_len=64, timeout=60)
    finally:
        srv.shutdown()
    assert time.time() - t0 < 15
    assert err.value.path == str(tmp_path / "raw" / "fp4_2x16-123-TP-0-DECODE.trace.json.gz")
    assert state["aborted"].is_set()


def test_profile_decode_gives_up_on_a_gzip_stream_that_stays_broken(tmp_path, monkeypatch):
    """A trace file that keeps its size but whose gzip stream stays broken (here: cut short) is whole but
    unreadable after ``TRACE_SETTLE_S``, not waited on until the timeout."""
    import threading
    import time

    whole = gzip.compress(json.dumps({"traceEvents": []}).encode())
    monkeypatch.setattr(bench, "TRACE_SETTLE_S", 2.0)
    state = {"started": 0, "profile_at": None, "aborted": threading.Event(), "bodies": []}
    srv = _standin_server(state)
    t0 = time.time()
    real_post = bench.post_json

    def post_then_break(url, body, timeout):  # the stand-in writes a good trace; cut it short as a broken one
        answer = real_post(url, body, timeout)
        if url.endswith("/start_profile"):
            for f in (tmp_path / "raw").iterdir():
                f.write_bytes(whole[: len(whole) - 6])
        return answer

    monkeypatch.setattr(bench, "post_json", post_then_break)
    try:
        (tmp_path / "raw").mkdir()
        with pytest.raises(bench.TraceUnreadable, match=r"unchanged for 2 s\) is not a whole gzip stream: EOFError"):
            bench.profile_decode(f"http://127.0.0.1:{srv.server_port}", 1, 16, out_dir=str(tmp_path / "raw"),
                                 prefix="fp4_1x16", steps=3, output_len=64, timeout=60)
    finally:
        srv.shutdown()
    assert time.time() - t0 < 20 and state["aborted"].is_set()


def test_profile_shape_keeps_a_trace_that_is_not_json_and_profiles_the_gpu_alone(tmp_path, capsys):
    """When the CPU and GPU trace is not JSON, it is kept under its own name and the shape is profiled again
    with GPU activity only, whose trace becomes the shape's."""
    import threading

    state = {"started": 0, "profile_at": None, "aborted": threading.Event(), "bodies": []}
    gpu_only = json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "fp4_paged_logits_sm90", "dur": 3.0}]})
    srv = _standin_server(state, trace_text=lambda body: _kineto_like_text('cpu "op"', "1")
                          if "CPU" in body["activities"] else gpu_only)
    try:
        (tmp_path / "raw").mkdir()
        path = bench.profile_shape(f"http://127.0.0.1:{srv.server_port}", 1, 16, name="fp4_1x16",
                                   raw=str(tmp_path / "raw"), out_dir=str(tmp_path), steps=3, output_len=64,
                                   timeout=30)
    finally:
        srv.shutdown()
    assert path == str(tmp_path / "fp4_1x16.trace.json.gz")
    assert state["activities"] == [["CPU", "GPU"], ["GPU"]]
    assert (tmp_path / "fp4_1x16.unreadable.trace.json.gz").exists()
    assert bench.profile_table([path], steps=1)[path]["us_per_step"] == {"indexer logits": 3.0}
    assert "profiled again with GPU activity only" in capsys.readouterr().err


def test_profile_decode_reports_an_error_chunk_at_once_and_still_aborts(tmp_path):
    """A request SGLang answers with its error chunk fails the shape within seconds (not at the timeout), names
    the error, asks for no profile, and the other request is aborted."""
    import threading
    import time

    state = {"started": 0, "profile_at": None, "aborted": threading.Event(), "bodies": []}
    srv = _standin_server(state, fail_second=True)
    t0 = time.time()
    try:
        (tmp_path / "raw").mkdir()
        # the stand-in fails the second request to arrive, which either of the two can be
        with pytest.raises(RuntimeError, match="2 x 16: request [01]: .*input too long"):
            bench.profile_decode(f"http://127.0.0.1:{srv.server_port}", 2, 16, out_dir=str(tmp_path / "raw"),
                                 prefix="fp8_2x16", steps=3, output_len=64, timeout=30)
    finally:
        srv.shutdown()
    assert time.time() - t0 < 10
    assert state["profile_at"] is None and state["aborted"].is_set()


# A planted two-cycle trace (µs): SGLang's second stream runs the scorer beside a GEMM. Worked out by hand:
# busy 15 + 20 + 20 + 30 + 25 = 110 (A, plan and S1 overlap in 0-15), span 160; alone: GEMMs 0-2 and 3-5 (4),
# indexer logits 10-15, 40-45, 100-110, 135-140 (25), MoE 75; scorer starts 5, 40, 100, 135 (the plan kernel is
# not an anchor): layer windows of span 35, 60, 35 and busy 30, 20, 30.
_PLANTED = [
    ("_w8a8_block_fp8_matmul", 0, 10), ("plan_paged_schedule", 2, 1), ("fp4_paged_logits_sm90", 5, 10),
    ("fused_moe_kernel", 15, 20), ("fp4_paged_logits_sm90", 40, 5), ("fused_moe_kernel", 45, 15),
    ("fp4_paged_logits_sm90", 100, 10), ("fused_moe_kernel", 110, 20), ("fp4_paged_logits_sm90", 135, 5),
    ("fused_moe_kernel", 140, 20),
]


def _planted_trace(path, scale=1.0, names=None):
    events = [{"ph": "X", "cat": "kernel", "name": (names or {}).get(n, n), "ts": t * scale, "dur": d * scale}
              for n, t, d in _PLANTED]
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1000})  # host side: ignored
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return str(path)


def test_union_time_counts_overlapping_kernels_once_and_clips_to_a_window():
    ivs = [(0.0, 10.0), (5.0, 15.0), (20.0, 25.0)]
    assert bench.union_time(ivs) == 20.0
    assert bench.union_time(ivs, 8.0, 22.0) == 9.0  # 8-15 and 20-22
    assert bench.union_time([]) == 0.0


def test_timeline_splits_a_planted_trace_into_busy_alone_and_layers(tmp_path):
    got = bench.timeline(_planted_trace(tmp_path / "fp4_2x64.trace.json.gz"), steps=2, layers=2, full_depth=4)
    assert got["busy_us_per_step"] == 55.0 and got["span_us_per_step"] == 80.0 and got["idle_us_per_step"] == 25.0
    assert got["alone_us_per_step"] == {"MoE": 37.5, "indexer logits": 12.5, "GEMMs": 2.0}
    assert got["indexer_exposed_us_per_step"] == 12.5 and got["scorer_launches_per_step"] == 2.0
    assert got["layer_span_us"]["n"] == 3 and got["layer_span_us"]["median"] == 35.0
    assert got["layer_busy_us"]["median"] == 30.0
    assert got["projection"]["busy_us_per_step"] == 55.0 + 2 * 30.0
    assert got["projection"]["span_us_per_step"] == 80.0 + 2 * 35.0
    assert "projected to 4 layers" in got["projection"]["what"]
    # DeepGEMM's FP8 scorer anchors the layers too; its metadata kernel (one per forward) does not.
    fp8 = bench.timeline(_planted_trace(tmp_path / "fp8.json.gz", names={
        "fp4_paged_logits_sm90": "void deep_gemm::sm90_fp8_paged_mqa_logits<1u, 64u>(unsigned int)",
        "plan_paged_schedule": "void deep_gemm::sched::smxx_paged_mqa_logits_metadata<32u>(unsigned int)"}), steps=2)
    assert fp8["scorer_launches_per_step"] == 2.0 and fp8["layer_busy_us"]["median"] == 30.0
    assert "projection" not in fp8


def test_timeline_refuses_bad_arguments_and_a_trace_without_kernels(tmp_path):
    path = _planted_trace(tmp_path / "t.json.gz")
    with pytest.raises(ValueError, match="steps"):
        bench.timeline(path, steps=0)
    with pytest.raises(ValueError, match="layers: expected 1..61"):
        bench.timeline(path, steps=1, layers=62)
    empty = tmp_path / "e.json"
    empty.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 0, "dur": 1}]}))
    with pytest.raises(ValueError, match="no GPU kernel events"):
        bench.timeline(str(empty), steps=1)


def test_timeline_summary_pairs_formats_per_shape_over_runs_and_repeats(tmp_path, capsys):
    (tmp_path / "runA").mkdir()
    (tmp_path / "runB").mkdir()
    paths = [_planted_trace(tmp_path / "runA" / "fp4_2x64_r1.trace.json.gz"),
             _planted_trace(tmp_path / "runB" / "fp4_2x64_r2.trace.json.gz", scale=1.5),
             _planted_trace(tmp_path / "runA" / "fp8_2x64.trace.json.gz", scale=2.0)]
    s = bench.timeline_summary(paths, steps=2, layers=2, full_depth=4)
    assert [(r["run"], r["format"], r["batch"], r["input"], r["repeat"]) for r in s["rows"]] == [
        ("runA", "fp4", 2, 64, 1), ("runB", "fp4", 2, 64, 2), ("runA", "fp8", 2, 64, 1)]
    agg = s["shapes"]["2x64"]
    assert agg["fp4"]["traces"] == 2 and agg["fp4"]["runs"] == ["runA", "runB"]
    assert agg["fp4"]["busy_us"] == {"median": 55.0 * 1.25, "min": 55.0, "max": 55.0 * 1.5}
    assert agg["fp8"]["busy_us"]["median"] == 110.0
    assert agg["fp8_over_fp4"]["busy_us"] == 110.0 / (55.0 * 1.25)
    assert agg["fp8_over_fp4"]["projected_busy_us"] == 230.0 / (115.0 * 1.25)
    bench.print_timeline_summary(s)
    out = capsys.readouterr().out
    assert "2x64: fp8 1 traces in 1 runs, fp4 2 traces in 2 runs" in out and f"{110 / 68.75:.3f}x" in out
    with pytest.raises(ValueError, match="FMT_BATCHxINPUT"):
        bench.timeline_summary([_planted_trace(tmp_path / "bf16_2x64.trace.json.gz")], steps=1)


def test_profile_decode_takes_every_repeat_from_one_prefill(tmp_path):
    """With repeats, the same requests decode through every profile: one /generate per request, one trace per
    repeat under PREFIX_rK, each asked for only once the one before is written, then one abort."""
    import threading

    state = {"started": 0, "profile_at": None, "aborted": threading.Event(), "bodies": []}
    srv = _standin_server(state)
    try:
        (tmp_path / "raw").mkdir()
        paths = bench.profile_decode(f"http://127.0.0.1:{srv.server_port}", 2, 16, out_dir=str(tmp_path / "raw"),
                                     prefix="fp4_2x16", steps=3, output_len=64, timeout=30, repeats=3)
    finally:
        srv.shutdown()
    assert paths == [str(tmp_path / "raw" / f"fp4_2x16_r{k}-123-TP-0-DECODE.trace.json.gz") for k in (1, 2, 3)]
    assert len(state["bodies"]) == 2 and state["aborts"] == 1
    with pytest.raises(ValueError, match="repeats"):
        bench.profile_decode("http://127.0.0.1:9", 1, 16, out_dir=str(tmp_path), prefix="x", steps=1,
                             output_len=8, repeats=0)


def test_profile_decode_times_the_streamed_chunks_before_the_first_profile(tmp_path):
    """wall_s: the client times the chunks (one every 20 ms per request in the stand-in, 2 tokens each) for that
    long before the profile is asked for; wall_stats reads the cycle time and the tokens per cycle off the record."""
    import threading

    state = {"started": 0, "profile_at": None, "aborted": threading.Event(), "bodies": []}
    srv = _standin_server(state)
    wall = tmp_path / "fp4_2x16.wall.json"
    try:
        (tmp_path / "raw").mkdir()
        bench.profile_decode(f"http://127.0.0.1:{srv.server_port}", 2, 16, out_dir=str(tmp_path / "raw"),
                             prefix="fp4_2x16", steps=3, output_len=64, timeout=30, wall_s=0.6, wall_path=str(wall))
    finally:
        srv.shutdown()
    record = json.loads(wall.read_text())
    assert (record["batch"], record["input_len"]) == (2, 16) and record["window_s"] >= 0.6
    assert all(0 <= t <= record["window_s"] for chunks in record["requests"] for t, _ in chunks)
    st = bench.wall_stats(record)
    # 20 ms sleeps between chunks; a loaded CI machine may stretch them, never shorten them.
    assert 19.0 <= st["ms_per_cycle"]["median"] <= 60.0 and st["ms_per_cycle"]["n"] >= 10
    assert st["tokens_per_cycle"] == 2.0
    # the profile came after the window, from the first decoded chunk of the late request on
    assert state["profile_at"] >= 1.5 + 0.6


def test_wall_stats_pools_the_intervals_of_every_request_and_refuses_an_empty_window():
    rec = {"batch": 2, "input_len": 8, "window_s": 1.0,
           "requests": [[(0.0, 10), (0.010, 12), (0.030, 13)], [(0.005, 4), (0.045, 8)], [(0.5, 1)]]}
    st = bench.wall_stats(rec)
    # intervals 10, 20 and 40 ms; token steps 2, 1, 4
    assert st["ms_per_cycle"]["n"] == 3 and st["ms_per_cycle"]["median"] == pytest.approx(20.0)
    assert st["tokens_per_cycle"] == pytest.approx(7 / 3)
    assert bench.wall_stats({"requests": [[(0.0, None), (0.01, None)]]})["tokens_per_cycle"] is None
    with pytest.raises(ValueError, match="no two chunks"):
        bench.wall_stats({"batch": 1, "input_len": 8, "window_s": 2.0, "requests": [[(0.1, 3)], []]})


def test_timeline_summary_adds_the_client_wall_time_per_shape(tmp_path, capsys):
    def write(path, step_ms):
        path.parent.mkdir(exist_ok=True)
        chunks = [(k * step_ms / 1e3, k + 1) for k in range(5)]
        path.write_text(json.dumps({"batch": 2, "input_len": 64, "window_s": 1.0, "requests": [chunks, chunks]}))
        return str(path)

    walls = [write(tmp_path / "s1" / "fp8_2x64.wall.json", 30.0), write(tmp_path / "s2" / "fp4_2x64.wall.json", 24.0),
             write(tmp_path / "s3" / "fp8_2x64.wall.json", 32.0)]
    traces = [_planted_trace(tmp_path / "s1" / "fp8_2x64.trace.json.gz", scale=2.0),
              _planted_trace(tmp_path / "s2" / "fp4_2x64.trace.json.gz")]
    s = bench.timeline_summary(traces, steps=2, walls=walls)
    agg = s["shapes"]["2x64"]
    assert agg["fp8"]["wall_ms_per_cycle"] == {"median": pytest.approx(31.0), "min": pytest.approx(30.0),
                                               "max": pytest.approx(32.0)}
    assert agg["fp8"]["wall_servers"] == 2 and agg["fp4"]["tokens_per_cycle"] == 1.0
    assert agg["fp8_over_fp4"]["wall_ms_per_cycle"] == pytest.approx(31.0 / 24.0)
    assert agg["fp8_over_fp4"]["busy_us"] == pytest.approx(2.0)  # the traces' fields are kept
    assert [(r["run"], r["format"]) for r in s["wall_rows"]] == [("s1", "fp8"), ("s2", "fp4"), ("s3", "fp8")]
    bench.print_timeline_summary(s)
    assert f"{31 / 24:.3f}x" in capsys.readouterr().out
    with pytest.raises(ValueError, match="FMT_BATCHxINPUT.wall.json"):
        bench.timeline_summary([], steps=1, walls=[write(tmp_path / "bf16_2x64.wall.json", 1.0)])


def test_host_time_record_keeps_every_call_beside_the_summary():
    times = [3e-6, 1e-6, 2e-6, 10e-6]
    got = bench.host_time_record(times)
    assert got["samples_us"] == pytest.approx([3.0, 1.0, 2.0, 10.0])  # call order, not sorted
    assert {k: got[k] for k in ("calls", "median_us")} == {"calls": 4, "median_us": pytest.approx(3.0)}
    with pytest.raises(ValueError, match="no indexer call"):
        bench.host_time_record([])
