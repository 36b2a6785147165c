"""scripts/soak.py on the CPU: the load's client and the checks against a stand-in server, with planted faults.

The real soak runs against SGLang's server on a GPU (``scripts/sglang_gpu_check.sh soak``); here a small local
HTTP server stands in for it (SGLang's server needs a GPU): ``/generate`` streamed and not, ``/abort_request``
by ``rid`` (every request whose rid starts with it, as SGLang 0.5.23's scheduler matches), ``/health`` and
``/get_server_info``, answering as SGLang's do in the fields the script reads.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_PATH = ROOT / "scripts" / "soak.py"
_spec = importlib.util.spec_from_file_location("soak", _PATH)
soak = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(soak)

CONTEXT = 20000
#: The tiny model's vocabulary (scripts/sglang_one_batch.py VOCAB), which the soak runs on.
VOCAB = 16384


POOL = 100000


def _standin(fault=None, hicache=False):
    """The stand-in server. ``fault``: ``"nan"`` (a NaN log-probability), ``"drift"`` (the probes' answers change
    once the load has run), ``"error"`` (every 7th streamed request gets SGLang's error chunk), ``"leak"`` (each
    disconnected request keeps 64 tokens of the KV pool, as a page freed on no path would), ``"short"`` (every 5th
    request finishes one token short of what it asked for, as a retracted request re-admitted without its last
    token would), ``"eos"`` (every 3rd request stops at an end-of-sequence token half way, finish reason
    ``stop`` matching token 1, as a model may), ``"nan_stop"`` (every 3rd request stops half way with SGLang's
    ``NaN happened`` stop), ``"self_abort"`` (every 7th streamed request is aborted by the server half way, as a
    request lost in a retraction would be), ``"no_reload"`` (with ``hicache``: no prefix ever comes back from host
    memory). ``hicache``: the server says it runs HiCache (``/get_server_info``, nested as SGLang 0.5.23 nests it)
    and every second request behind a prompt it has seen before reports its first 64 tokens loaded back from host
    memory (SGLang's ``cached_tokens_details``). ``/v1/loads``
    answers as SGLang's does in the fields the script reads, from the tokens the stand-in holds."""
    state = {"aborted": set(), "generated": 0, "lock": threading.Lock(), "held": 0}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *a):
            pass

        def _send(self, code, obj):
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self._send(200, {})
            elif self.path == "/get_server_info":
                self._send(200, {"max_total_num_tokens": POOL, "max_req_input_len": CONTEXT,
                                 "memory": {"enable_hierarchical_cache": hicache}})
            elif self.path == "/v1/loads":
                self._send(200, {"loads": [{"dp_rank": 0, "num_running_reqs": 0, "num_waiting_reqs": 0,
                                            "num_used_tokens": state["held"], "max_total_num_tokens": POOL}]})
            else:
                self._send(404, {})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/abort_request":
                state["aborted"].add(body.get("rid"))
                return self._send(200, {})
            if self.path == "/flush_cache":
                return self._send(200, {})
            ids = body.get("input_ids") or []
            if any(not 0 <= t < VOCAB for t in ids):  # SGLang 0.5.23 does not check: the server would stop
                return self._send(400, {"error": {"message": "token id outside the vocabulary"}})
            if not ids and "text" in body:
                return self._send(400, {"error": {"message": "empty prompt"}})
            if len(ids) > CONTEXT:
                return self._send(400, {"error": {"message": f"input of {len(ids)} tokens exceeds {CONTEXT}"}})
            n = body["sampling_params"]["max_new_tokens"]
            with state["lock"]:
                state["generated"] += 1
                k = state["generated"]
            shift = 1 if fault == "drift" and k > 20 else 0
            finish = {"type": "length"}
            if fault == "short" and body.get("stream") and k % 5 == 0 and n > 1:
                n -= 1
            if fault == "eos" and body.get("stream") and k % 3 == 0 and n > 1:
                n, finish = n // 2, {"type": "stop", "matched": 1}
            if fault == "nan_stop" and body.get("stream") and k % 3 == 0 and n > 1:
                n, finish = n // 2, {"type": "stop", "matched": "NaN happened"}
            if fault == "self_abort" and body.get("stream") and k % 7 == 0 and n > 1:
                n, finish = n // 2, {"type": "abort"}
            out = [(sum(ids) + j + shift) % 997 for j in range(n)]
            lp = float("nan") if fault == "nan" else -0.5
            with state["lock"]:
                seen = state.setdefault("prefixes", {})
                key = tuple(ids[:64])
                seen[key] = seen.get(key, 0) + 1
                hits = seen[key]
            cached = 64 if hits > 1 and len(ids) > 64 else 0
            host = cached if hicache and fault != "no_reload" and hits % 2 == 0 else 0
            meta = {"finish_reason": finish, "cached_tokens": cached, "num_retractions": 1 if k % 11 == 0 else 0,
                    "cached_tokens_details": {"device": cached - host, "host": host} if cached else None,
                    "output_token_logprobs": [[lp, t, None] for t in out] if body.get("return_logprob") else None}
            if not body.get("stream"):
                return self._send(200, {"output_ids": out, "meta_info": meta})
            self.send_response(200)
            self.end_headers()
            if fault == "error" and k % 7 == 0:
                self.wfile.write(b'data: {"error":{"message":"planted","code":500}}\n\n')
                return
            for j in range(n):
                time.sleep(0.005)
                if any(str(body.get("rid")).startswith(a) for a in state["aborted"]):  # by prefix, as SGLang's
                    chunk = {"output_ids": out[:j], "meta_info": dict(meta, finish_reason={"type": "abort"})}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    break
                chunk = {"output_ids": out[: j + 1], "meta_info": meta if j == n - 1 else {}}
                try:
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                except OSError:  # the client left
                    if fault == "leak":
                        with state["lock"]:
                            state["held"] += 64
                    return
            self.wfile.write(b"data: [DONE]\n\n")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _run(fault=None, hicache=False, **kw):
    srv = _standin(fault, hicache)
    base = f"http://127.0.0.1:{srv.server_port}"
    try:
        args = dict(requests=60, concurrency=8, min_len=10, max_len=2000, output_len=40, shared_frac=1 / 3,
                    disconnect_frac=0.2, abort_frac=0.2, logprob_frac=0.3, seed=3, time_limit=120.0,
                    abort_within_s=0.1)
        args.update(kw)
        run = soak.soak_run(base, args, CONTEXT, probe_output_len=4, settle_s=0)
    finally:
        srv.shutdown()
    return run


def _ok(rows):
    return {r["check"]: r["ok"] for r in rows}


def test_a_well_behaved_server_passes_and_every_kind_of_client_shows_up():
    run = _run()
    c = run["load"]["counts"]
    assert sum(c.values()) == 60 and c.get("error", 0) == 0
    assert c["completed"] > 0 and c["disconnected"] > 0 and c["aborted"] > 0
    assert sum(1 for r in run["load"]["results"] if r.get("finite") is True) > 0
    rows = soak.checks(run, log_text="Decode batch ...\n[t] KV cache pool is full. Retract requests. #retracted_reqs: 3, "
                                     "#new_tokens_gained: 640, #new_token_ratio: 0.7000 -> 1.0000\n")
    assert all(r["ok"] for r in rows), rows
    statuses = {b["input"]: b["status"] for b in run["bad_inputs"]}
    assert statuses == {"prompt longer than the context": 400, "empty prompt": 400, "max_new_tokens 0": 200,
                        "log-probabilities with the top 5": 200}
    lc = soak.log_counts("[t] server_args={'disable_hicache_load': False, 'enable_retract': True}\n"
                         "[t] KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_tokens_gained: 9\n"
                         "[t] Testing retraction. #retracted_reqs: 2, #new_tokens_gained: 4\n")
    assert (lc["retractions"], lc["retracted_requests"], lc["hicache_lines"]) == (2, 5, 0)
    # Without a retraction in the log the soak has not exercised it: that check fails.
    assert not _ok(soak.checks(run, log_text="Decode batch ...\n"))["retraction exercised: SGLang retracted decode requests"]


@pytest.mark.parametrize("fault, check", [
    ("nan", "every log-probability finite"),
    ("drift", "probes give the same tokens before and after the load"),
    ("error", "no request failed with a server error"),
    ("leak", "KV pool: as many free tokens after the load as before, none in use"),
    ("short", "every completed request got the tokens it asked for (fewer only at end of sequence)"),
    ("nan_stop", "every completed request got the tokens it asked for (fewer only at end of sequence)"),
    ("self_abort", "no request aborted by the server that its client did not abort"),
])
def test_each_planted_fault_fails_its_check(fault, check):
    ok = _ok(soak.checks(_run(fault)))
    assert ok[check] is False
    assert sum(1 for v in ok.values() if not v) >= 1


def test_the_pool_is_read_before_and_after_and_an_unread_pool_fails():
    run = _run(requests=5, disconnect_frac=0.0, abort_frac=0.0)
    assert run["pool_before"] == run["pool_after"] == {"max_total_num_tokens": POOL, "num_used_tokens": 0,
                                                        "num_running_reqs": 0, "num_waiting_reqs": 0,
                                                        "free_tokens": POOL, "flushed": True}
    check = "KV pool: as many free tokens after the load as before, none in use"
    assert _ok(soak.checks(run))[check] is True
    for missing in ({"error": "/v1/loads: HTTP 404"}, None):
        assert _ok(soak.checks(dict(run, pool_after=missing)))[check] is False
    assert soak.pool_state("http://127.0.0.1:9", settle_s=0)["error"].startswith("/v1/loads: HTTP 0")


def test_a_server_that_stops_after_the_load_still_gets_its_run_written_and_checked():
    """The readings after the load fail against a server that has gone; the run keeps the load's counts, names each
    failed reading, and the checks fail on the probes, the health, the bad inputs and the pool."""
    srv = _standin()
    base = f"http://127.0.0.1:{srv.server_port}"
    args = dict(requests=10, concurrency=4, min_len=10, max_len=200, output_len=5, shared_frac=0.0,
                disconnect_frac=0.0, abort_frac=0.0, logprob_frac=0.0, seed=1, time_limit=60.0, abort_within_s=0.1)
    real_load = soak.load

    def load_then_stop(*a, **kw):
        out = real_load(*a, **kw)
        srv.shutdown()
        srv.server_close()
        return out

    soak.load = load_then_stop
    seen = []
    try:
        run = soak.soak_run(base, args, CONTEXT, probe_output_len=4, settle_s=0,
                            on_step=lambda r: seen.append(sorted(r)))
    finally:
        soak.load = real_load
    # What has been read is handed out after the load and after each later reading (the CLI writes it each time).
    assert "load" in seen[0] and "probes_after" not in seen[0] and len(seen) == 6
    assert run["warm_up"] == 200
    assert run["load"]["counts"].get("completed") == 10
    assert run["probes_after"] is None and "probes_after" in run["errors_after"]
    assert [b["status"] for b in run["bad_inputs"]] == [0, 0, 0, 0]  # no answer: each is a failing row
    ok = _ok(soak.checks(run))
    assert ok["probes give the same tokens before and after the load"] is False
    assert ok["healthy after the load"] is False
    assert not any(v for k, v in ok.items() if k.startswith("bad input"))
    assert ok["KV pool: as many free tokens after the load as before, none in use"] is False
    # A run whose bad inputs were never sent (their reading failed) fails that row too.
    no_bad = dict(run, bad_inputs=None, errors_after=dict(run["errors_after"], bad_inputs="OSError: gone"))
    assert _ok(soak.checks(no_bad))["bad inputs: each answered, server healthy"] is False


def test_a_leak_or_a_traceback_in_the_servers_log_fails():
    run = _run(requests=5, disconnect_frac=0.0, abort_frac=0.0)
    for text in ("... token_to_kv_pool memory leak detected! available 10 ...", "Traceback (most recent call last):"):
        assert _ok(soak.checks(run, log_text=text))["server log: no traceback, no pool leak SGLang reports"] is False


def test_sampled_and_long_requests_are_sent_and_counted():
    """A fraction of the requests sampled (temperature 0.8) and a fraction asking for the long output,
    as planned and sent; every completed one got exactly what it asked for."""
    sent = []
    real_stream = soak.stream_one

    def spy(base, body, **kw):
        sent.append(body)
        return real_stream(base, body, **kw)

    soak.stream_one = spy
    try:
        run = _run(requests=40, sampled_frac=0.5, long_frac=0.25, long_output_len=57, disconnect_frac=0.0,
                   abort_frac=0.0)
    finally:
        soak.stream_one = real_stream
    k = run["load"]["kinds"]
    sampled = [b for b in sent if b["sampling_params"]["temperature"] == 0.8]
    long_ = [b for b in sent if b["sampling_params"]["max_new_tokens"] == 57]
    assert k["sampled"] == len(sampled) and 10 <= len(sampled) <= 30
    assert not any({"top_p", "top_k"} & set(b["sampling_params"]) for b in sent)  # renormalization: FlashInfer's
    assert not any("ignore_eos" in b["sampling_params"] for b in sent)  # SGLang then reserves all of the output
    assert k["long"] == len(long_) and 3 <= len(long_) <= 18  # output_len 40: only the long ones ask for 57
    assert k["logprob"] == sum(1 for b in sent if b.get("return_logprob"))
    done = [r for r in run["load"]["results"] if r["outcome"] == "completed"]
    assert len(done) == 40 and all(r["tokens"] == r["asked"] for r in done)
    assert sum(r["asked"] == 57 for r in done) == len(long_)
    assert _ok(soak.checks(run))["every completed request got the tokens it asked for (fewer only at end of sequence)"] is True


def test_a_request_that_stops_at_end_of_sequence_is_not_short():
    """The load does not set ignore_eos (so that SGLang reserves only part of the output and retracts): a request
    that stops at an end-of-sequence token (finish reason ``stop``) with fewer tokens passes; one finished by length
    short of what it asked for fails (the ``short`` fault above)."""
    run = _run("eos", requests=30, disconnect_frac=0.0, abort_frac=0.0)
    done = [r for r in run["load"]["results"] if r["outcome"] == "completed"]
    stopped = [r for r in done if r["finish"] == "stop"]
    assert stopped and all(r["tokens"] < r["asked"] for r in stopped)
    assert _ok(soak.checks(run))["every completed request got the tokens it asked for (fewer only at end of sequence)"]


def test_bad_load_arguments_are_named():
    with pytest.raises(ValueError, match="abort_frac"):
        soak.load("http://127.0.0.1:9", requests=1, concurrency=1, min_len=1, max_len=2, output_len=1, shared_frac=0,
                  disconnect_frac=0, abort_frac=2, logprob_frac=0, seed=0, time_limit=1)
    with pytest.raises(ValueError, match="min_len"):
        soak.load("http://127.0.0.1:9", requests=1, concurrency=1, min_len=5, max_len=2, output_len=1, shared_frac=0,
                  disconnect_frac=0, abort_frac=0, logprob_frac=0, seed=0, time_limit=1)
    with pytest.raises(ValueError, match="long_frac"):
        soak.load("http://127.0.0.1:9", requests=1, concurrency=1, min_len=1, max_len=2, output_len=1, shared_frac=0,
                  disconnect_frac=0, abort_frac=0, logprob_frac=0, seed=0, time_limit=1, long_frac=-0.1)
    with pytest.raises(ValueError, match="long_output_len"):
        soak.load("http://127.0.0.1:9", requests=1, concurrency=1, min_len=1, max_len=2, output_len=1, shared_frac=0,
                  disconnect_frac=0, abort_frac=0, logprob_frac=0, seed=0, time_limit=1, long_output_len=0)


# --- the sampled top-k rows: the trace plugin's records through check_trace and oracle_check -------------------

_TOOL_PATH = Path(__file__).resolve().parents[1] / "tests" / "test_sglang_one_batch.py"
_tspec = importlib.util.spec_from_file_location("_soak_one_batch_tests", _TOOL_PATH)
one_batch_tests = importlib.util.module_from_spec(_tspec)
_tspec.loader.exec_module(one_batch_tests)
tool = one_batch_tests.tool


def _trace(fault=None):
    """``trace_summary``'s result for one sampled target-verify batch (two requests, 2 draft tokens) as the trace
    plugin saves it, with its oracle call on request 0's FP4 pages, and ``fault`` planted in what the server held:
    ``"skipped_store"`` (the store left the slot of the row's best key unwritten: that page holds zeros there, while
    the scorer saw the key), ``"stale_schedule"`` (the rows were scored with the other request's key count, as a
    schedule kept after the batch shrank would: keys past it never considered)."""
    rec = one_batch_tests._oracle_record()
    call = rec["oracle_calls"][0]
    if fault == "skipped_store":  # FP4 page: payload plane (64 keys x 64 bytes of E2M1), then the scale plane
        best = int(call["topk"][0, 0])  # the row's best key, as a KV slot
        page = int((call["block_table"][0] == best // 64).nonzero()[0])
        call["pages"][page, (best % 64) * 64: (best % 64 + 1) * 64] = 0
    if fault == "stale_schedule":
        cache, rows, q, w = one_batch_tests._oracle_request(2902)
        for r in range(2):
            s = one_batch_tests._served(cache, rows[0], q, w, 2401)  # the other request's length
            call["topk"][r] = -1
            call["topk"][r, : s.numel()] = s
    return {"records": 1, "valid": {}, "oracle": tool.oracle_check([rec], draft_tokens=2)}


@pytest.mark.parametrize("fault", [None, "skipped_store", "stale_schedule"])
def test_the_oracle_row_fails_a_skipped_store_and_a_stale_schedule(fault):
    run = _run(requests=3, disconnect_frac=0.0, abort_frac=0.0)
    trace = _trace(fault)
    trace["valid"] = {"DECODE": {"calls": 3, "rows": 12, "stale": 0, "count": 0, "duplicate": 0, "out_of_range": 0,
                                 "missing_rows": 0}}
    ok = _ok(soak.checks(run, trace=trace))
    check = "sampled rows = fp64 oracle top-k on the server's pages (within the bound)"
    assert ok[check] is (fault is None), trace["oracle"]
    assert ok["sampled top-k rows valid (count, range, no duplicates)"] is True


def test_invalid_sampled_rows_or_no_sampled_rows_fail():
    run = _run(requests=3, disconnect_frac=0.0, abort_frac=0.0)
    check = "sampled top-k rows valid (count, range, no duplicates)"
    good = {"calls": 3, "rows": 12, "stale": 0, "count": 0, "duplicate": 0, "out_of_range": 0, "missing_rows": 0}
    trace = {"records": 1, "oracle": {}, "valid": {"DECODE": good}}
    assert _ok(soak.checks(run, trace=trace))[check] is True
    for bad in ({"duplicate": 1}, {"out_of_range": 2}, {"count": 1}):
        assert _ok(soak.checks(run, trace=dict(trace, valid={"DECODE": dict(good, **bad)})))[check] is False
    assert _ok(soak.checks(run, trace={"records": 0, "valid": {}, "oracle": {}}))[check] is False
    assert _ok(soak.checks(run, trace={"records": 0, "valid": {}, "oracle": {}}))[
        "sampled rows = fp64 oracle top-k on the server's pages (within the bound)"] is False


def test_the_docs_table_reads_every_value_from_the_run(tmp_path):
    run = _run(requests=20, disconnect_frac=0.2, abort_frac=0.2)
    log = ("x\nKV cache pool is full. Retract requests. #retracted_reqs: 3, #new_tokens_gained: 9\n"
           "Testing retraction. #retracted_reqs: 1, #new_tokens_gained: 2\n")
    rows = dict(soak.summary_rows({"FP4": run}, {"FP4": log}, {"FP4": soak.checks(run, log)}))
    c = run["load"]["counts"]
    assert rows["requests sent"] == (20,) and rows["completed"] == (c.get("completed", 0),)
    assert rows["disconnected by the client (prefill or decode)"] == (c.get("disconnected", 0),)
    assert rows["decode requests SGLang retracted (times it retracted)"] == ("4 (2)",)
    assert rows["KV pool after the load (after /flush_cache)"] == (f"{POOL:,} free of {POOL:,}",)
    assert rows["probes identical before and after"] == ("yes",)
    rows_checked = soak.checks(run, log)
    failed = [r["check"] for r in rows_checked if not r["ok"]]
    assert rows["checks passed"] == (f"{len(rows_checked) - len(failed)} of {len(rows_checked)}",)
    assert rows["checks failed"] == ("; ".join(failed) or "none",)
    k = run["load"]["kinds"]
    assert rows["of them sampled / long outputs / with log-probabilities / behind a shared prefix"] == (
        f"{k['sampled']} / {k['long']} / {k['logprob']} / {k['shared_prefix']}",)
    assert rows["KV pool before the load (after /flush_cache)"] == rows["KV pool after the load (after /flush_cache)"]
    cache = run["load"]["cache"]
    assert rows["prefix tokens from the cache / of them loaded back from host memory (requests)"] == (
        f"{cache['prefix_tokens']:,} / {cache['from_host']:,} ({cache['requests_from_host']})",)
    assert rows["finished requests SGLang had retracted"] == (cache["requests_retracted"],)
    assert rows["requests refused (HTTP 4xx)"] == (c.get("refused", 0),)
    labels = [r[0] for r in soak.summary_rows({"FP4": run}, {"FP4": log}, {"FP4": soak.checks(run, log)})]
    assert labels.index("requests refused (HTTP 4xx)") == labels.index("server errors") + 1


def test_hicache_reload_is_counted_and_a_hicache_server_that_never_reloads_fails():
    """On a server that says it runs HiCache, the load sums SGLang's ``cached_tokens_details`` host tokens and the
    check passes only when some prefix came back from host memory; a server without HiCache gets no such row."""
    check = "HiCache exercised: prefix tokens evicted to host memory and loaded back"
    run = _run(hicache=True, shared_frac=1.0, disconnect_frac=0.0, abort_frac=0.0)
    results = [r for r in run["load"]["results"] if r["outcome"] == "completed"]
    cache = run["load"]["cache"]
    assert cache["from_host"] == sum(r["cached_host"] for r in results) > 0
    assert cache["requests_from_host"] == sum(1 for r in results if r["cached_host"]) == cache["from_host"] // 64
    assert cache["prefix_tokens"] == sum(r["cached"] for r in results) >= cache["from_host"]
    assert cache["requests_retracted"] == sum(1 for r in results if r["retractions"]) > 0
    assert _ok(soak.checks(run))[check] is True
    assert _ok(soak.checks(_run("no_reload", hicache=True, shared_frac=1.0)))[check] is False
    assert check not in _ok(soak.checks(_run(shared_frac=1.0)))
    assert soak.hicache_on({"launch_command": "python -m sglang.launch_server --enable-hierarchical-cache"})
    assert not soak.hicache_on({"memory": {"enable_hierarchical_cache": False}, "launch_command": "x"})


# --- what a deployer running the load against their own server meets first -------------------------------------

def test_a_prompt_the_server_refuses_is_counted_apart_and_fails_its_check():
    # Prompts past the stand-in's context: SGLang answers such a prompt with HTTP 400, which is not a server error.
    run = _run(requests=30, min_len=CONTEXT + 1, max_len=CONTEXT + 50, shared_frac=0.0, disconnect_frac=0.0,
               abort_frac=0.0)
    counts = run["load"]["counts"]
    assert counts.get("refused") == 30 and counts.get("error", 0) == 0, counts
    ok = _ok(soak.checks(run))
    assert ok["no request of the load refused (HTTP 4xx)"] is False
    assert ok["no request failed with a server error"] is True
    assert ok["the load ran: requests sent and completed"] is False
    assert "exceeds" in run["load"]["refusals"][0]


def test_a_load_that_sent_nothing_fails():
    run = _run(time_limit=-1.0)
    assert set(run["load"]["counts"]) == {"not sent (time limit)"}
    assert _ok(soak.checks(run))["the load ran: requests sent and completed"] is False


def _cli(*argv):
    import subprocess
    import sys
    return subprocess.run([sys.executable, str(_PATH), *argv], capture_output=True, text=True, timeout=120)


def test_load_refuses_before_sending_anything(tmp_path):
    srv = _standin()
    base = f"http://127.0.0.1:{srv.server_port}"
    try:
        out = str(tmp_path / "run.json")
        cases = [
            (["--out", str(tmp_path / "no" / "run.json")], "--out: the folder"),
            (["--out", out, "--time-limit", "0"], "--time-limit: expected seconds > 0"),
            (["--out", out, "--max-len", str(CONTEXT + 1)], f"the server takes prompts of at most {CONTEXT}"),
        ]
        for extra, message in cases:
            r = _cli("load", "--url", base, *extra)
            assert r.returncode == 2 and message in r.stderr, (extra, r.stderr)
    finally:
        srv.shutdown()
    r = _cli("load", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "run.json"))
    assert r.returncode == 2 and "--url: no answer from http://127.0.0.1:9" in r.stderr, r.stderr
    assert not (tmp_path / "run.json").exists()


def test_check_names_a_missing_file_and_says_what_it_did_not_check(tmp_path):
    r = _cli("check", str(tmp_path / "none.json"))
    assert r.returncode == 2 and "run: no file" in r.stderr, r.stderr
    run = _run()
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    r = _cli("check", str(path), "--trace", str(tmp_path / "no_trace"))
    assert r.returncode == 2 and "--trace: no folder" in r.stderr, r.stderr
    r = _cli("check", str(path))
    rows = soak.checks(run)
    assert r.returncode == (0 if all(x["ok"] for x in rows) else 1)
    assert r.stdout.strip().splitlines()[-1] == (
        f"{sum(x['ok'] for x in rows)} of {len(rows)} checks passed; not checked: the server log's (--log) and "
        "the top-k rows' (--trace)")
    assert _cli("--help").returncode == 0


def test_a_load_without_aborts_or_disconnects_fails_their_check():
    check = "clients disconnected and requests aborted during the load"
    assert _ok(soak.checks(_run()))[check] is True
    assert _ok(soak.checks(_run(requests=20, abort_frac=0.0)))[check] is False
    assert _ok(soak.checks(_run(requests=20, disconnect_frac=0.0, abort_frac=0.0)))[check] is False


def test_more_mistakes_are_refused_before_anything_is_sent(tmp_path):
    # Nothing listens on port 9: a refusal that names an option, not the URL, came before any request.
    for extra, message in ((["--max-len", "50"], "--max-len (max_len): expected at least --min-len (min_len) = 100"),
                           (["--concurrency", "0"], "--concurrency (concurrency): expected at least 1"),
                           (["--abort-frac", "2"], "--abort-frac (abort_frac): expected a fraction in 0..1"),
                           (["--requests", "0"], "--requests (requests): expected at least 1")):
        r = _cli("load", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "run.json"), *extra)
        assert r.returncode == 2 and message in r.stderr, (extra, r.stderr)
    r = _cli("load", "--url", "http://127.0.0.1:9", "--out", str(tmp_path))
    assert r.returncode == 2 and "is a folder" in r.stderr, r.stderr


def test_check_reads_a_gzipped_log_and_table_names_a_missing_file(tmp_path):
    import gzip
    run = _run(requests=20)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    text = "x\nTraceback (most recent call last):\n  boom\n"
    with gzip.open(tmp_path / "server.log.gz", "wt") as f:
        f.write(text)
    (tmp_path / "server.log").write_text(text)
    for log in ("server.log", "server.log.gz"):
        r = _cli("check", str(path), "--log", str(tmp_path / log))
        assert r.returncode == 1 and "server log: no traceback, no pool leak SGLang reports" in r.stdout
        line = next(x for x in r.stdout.splitlines() if x.startswith("server log: no traceback"))
        assert " FAIL " in line and "'tracebacks': 1" in line, line
    r = _cli("check", str(path), "--json", str(tmp_path / "no" / "c.json"))
    assert r.returncode == 2 and "--json: the folder" in r.stderr, r.stderr
    r = _cli("table", f"FP4={path},{tmp_path / 'none.json'},{tmp_path / 'server.log'}")
    assert r.returncode == 2 and "FP4's CHECKS.json: no file" in r.stderr, r.stderr


def test_a_load_cut_before_its_readings_fails_those_rows_and_the_cli_still_writes_them(tmp_path):
    """A load killed by a time limit leaves the JSON ``load`` wrote right after sending, without the readings after
    it: the probe and health rows fail, saying why, and ``check`` still prints and writes every row (exit 1)."""
    run = _run(requests=5, disconnect_frac=0.0, abort_frac=0.0)
    cut = {k: v for k, v in run.items() if k not in ("probes_after", "healthy_after", "pool_after", "bad_inputs")}
    rows = {r["check"]: r for r in soak.checks(cut)}
    assert rows["probes give the same tokens before and after the load"]["ok"] is False
    assert "not read after the load" in rows["probes give the same tokens before and after the load"]["detail"]
    assert rows["healthy after the load"]["ok"] is False and "not read" in rows["healthy after the load"]["detail"]
    assert rows["KV pool: as many free tokens after the load as before, none in use"]["ok"] is False
    assert _ok(soak.checks(run))["probes give the same tokens before and after the load"] is True
    path, out = tmp_path / "cut.json", tmp_path / "checks.json"
    path.write_text(json.dumps(cut))
    r = _cli("check", str(path), "--json", str(out))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert {x["check"]: x["ok"] for x in json.loads(out.read_text())}["healthy after the load"] is False


def test_no_oracle_leaves_only_the_oracle_row_out_and_says_so(tmp_path):
    run = _run(requests=3, disconnect_frac=0.0, abort_frac=0.0)
    oracle_row = "sampled rows = fp64 oracle top-k on the server's pages (within the bound)"
    valid = {"DECODE": {"calls": 3, "rows": 12, "stale": 0, "count": 0, "duplicate": 0, "out_of_range": 0,
                        "missing_rows": 0}}
    trace = {"records": 1, "valid": valid, "oracle": {}}
    assert _ok(soak.checks(run, trace=trace))[oracle_row] is False  # no oracle rows recorded: fails by default
    ok = _ok(soak.checks(run, trace=trace, with_oracle=False))
    assert oracle_row not in ok and ok["sampled top-k rows valid (count, range, no duplicates)"] is True
    # A failing oracle row is left out too, but the rows' validity still fails an invalid row.
    bad = dict(trace, valid={"DECODE": dict(valid["DECODE"], duplicate=1)})
    assert _ok(soak.checks(run, trace=bad, with_oracle=False))[
        "sampled top-k rows valid (count, range, no duplicates)"] is False
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    tdir = tmp_path / "trace"
    tdir.mkdir()
    r = _cli("check", str(path), "--trace", str(tdir), "--no-oracle")
    assert oracle_row not in r.stdout
    assert r.stdout.strip().splitlines()[-1].endswith(
        "not checked: the server log's (--log) and the fp64 oracle's (--no-oracle)"), r.stdout


def test_expect_hicache_checks_the_reload_whatever_the_server_info_says():
    check = "HiCache exercised: prefix tokens evicted to host memory and loaded back"
    run = _run(shared_frac=1.0, disconnect_frac=0.0, abort_frac=0.0)  # no HiCache: nothing loaded back
    run["info_before"] = {}  # a server whose /get_server_info said nothing
    assert check not in _ok(soak.checks(run))
    assert _ok(soak.checks(run, expect_hicache=True))[check] is False
    hc = _run(hicache=True, shared_frac=1.0, disconnect_frac=0.0, abort_frac=0.0)
    hc["info_before"] = {}
    assert _ok(soak.checks(hc, expect_hicache=True))[check] is True


def _script_functions(*names: str) -> str:
    """The named shell functions of scripts/sglang_gpu_check.sh, as text (each from ``name() {`` to its ``}``)."""
    text = (ROOT / "scripts" / "sglang_gpu_check.sh").read_text()
    out = []
    for name in names:
        m = re.search(rf"^{name}\(\) {{.*?^}}$", text, re.S | re.M)
        assert m, name
        out.append(m.group(0))
    return "\n".join(out)


@pytest.mark.parametrize("tag, want", [
    ("soak", []), ("soak_hicache", ["--expect-hicache"]), ("soak_v32-layers", ["--no-oracle"]),
    ("soak_hicache_v32-layers", ["--no-oracle", "--expect-hicache"]),
])
def test_the_gpu_script_checks_a_run_by_what_its_tag_says(tmp_path, tag, want):
    """The script's soak_check, run with ``soak.py`` stood in by a command that prints its arguments: the oracle's
    row is left out exactly where the soak step recorded no oracle layer (a size whose logits keep SGLang's
    dummy-weight scale), and the HiCache row is required where the step started HiCache."""
    stub = tmp_path / "py"
    stub.write_text("#!/bin/sh\nshift\necho \"$@\"\n")  # drops the script path, prints the rest
    stub.chmod(0o755)
    body = _script_functions("index_scale", "soak_check")
    cmd = (f"{body}\nPY={stub}; OUTDIR={tmp_path}; WORK={tmp_path}; mkdir -p {tmp_path}/soak; "
           f"pack_trace() {{ :; }}; soak_check {tag} fp4; cat {tmp_path}/table.txt")
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30)
    args = r.stdout.split()
    assert args[:2] == ["check", f"{tmp_path}/{tag}_fp4.json"], r.stdout + r.stderr
    assert [a for a in args if a in ("--no-oracle", "--expect-hicache")] == want
    # The soak step records the oracle layer exactly where soak_check keeps its row.
    assert ("--no-oracle" in want) == (tag.endswith("v32-layers"))


def test_the_gpu_script_gives_the_fp8_block_quantized_sizes_tritons_gemms():
    body = _script_functions("size_flags")
    for size, want in (("tiny", ""), ("tiny-interleaved", ""), ("v32-layers", "--fp8-gemm-backend triton")):
        r = subprocess.run(["bash", "-c", f"{body}\nsize_flags {size}"], capture_output=True, text=True, timeout=30)
        assert r.stdout.strip() == want, (size, r.stdout)
