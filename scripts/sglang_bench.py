"""SGLang's own benchmarks with the plugin loaded as a server loads it, and the decode profile as a table.

* ``one-batch ARGS...``: ``python -m sglang.bench_one_batch ARGS...`` (SGLang's
  ``sglang.benchmark.one_batch.cli_main``) after SGLang's ``load_plugins()``, which
  SGLang's servers call in every process but ``bench_one_batch`` does not; with
  ``--enable-fp4-indexer`` in ARGS the FP4 indexer serves, without it the plugin
  passes every call through. Its results go where ``--result-filename`` says.
  ``--indexer-host-time OUT.json`` (this script's option) also writes the host
  time per indexer decode call, eager calls only (run with ``--disable-cuda-graph``):
  SGLang runs decode eagerly above its captured batch sizes.
* ``serving --model DIR --out OUT.jsonl [--fp4] [--input-lens N ...] [SGLang server flags]``:
  ``python -m sglang.launch_server`` on localhost (SGLang loads the plugin itself), then
  SGLang's ``python -m sglang.benchmark.serving`` (random token ids, fixed lengths, a
  fixed concurrency) once per input length; its result lines go to OUT.jsonl.
* ``serving-profile --model DIR --out-dir DIR [--fp4] [--shapes BATCH:INPUT ...] [--steps N] [SGLang server
  flags]``: the same server, and per shape BATCH requests of INPUT random token ids decoding together while
  SGLang's own profiler (``/start_profile``) records N decode batches; the traces go to
  ``DIR/FMT_BATCHxINPUT.trace.json.gz`` for ``profile-table``. The server chunks prefill, so any context the
  pool holds can be profiled (``bench_one_batch`` prefills in one pass, which limits it).
* ``serving-table --fp8 FP8.jsonl --fp4 FP4.jsonl [--json OUT]``: the two ``serving`` runs side by side, per
  input length: requests completed, output tokens/s, median TPOT and TTFT, and the accepted length where MTP
  was on (``serving_table``).
* ``profile-table TRACE.json.gz [...] [--json OUT]``: a torch-profiler trace
  (``bench_one_batch --profile``) summed by kernel category (``CATEGORIES``): GPU
  time per decode step in each, and its share.

Run on a GPU machine by ``scripts/sglang_gpu_check.sh e2e``; results and logs
under benchmarks/results/ (docs/benchmarks.md, "Inside SGLang").
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import re
import sys
import zlib

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPTS)
from sglang_one_batch import launched_server, post_json  # noqa: E402 (beside this script; imports no SGLang)

#: Kernel categories of a DSA decode step, first match wins (regular expressions over kernel names).
CATEGORIES = (
    ("indexer logits", r"fp4_paged_logits|paged_mqa_logits|mqa_logits|plan_paged_schedule|paged_logits"),
    ("index-key store", r"store_index_k|store_indexer_cache|index_k_cache|indexer_k|set_index_k"),
    ("MoE", r"moe|expert|topk_softmax|grouped_topk|biased_grouped"),
    ("indexer top-k", r"topk|top_k|radix_select"),
    ("sparse MLA", r"flash_mla|flashmla|sparse_attn|mla"),
    ("GEMMs", r"gemm|cutlass|sm90_xmma|nvjet|cublas|wgmma|fp8_blockwise|matmul"),
    ("norm, RoPE, activation, quant", r"norm|rope|rotary|silu|act_and_mul|quant|fp8"),
)


def categorize(name: str) -> str:
    """The category (``CATEGORIES``) of a kernel name, ``"rest"`` when none matches."""
    low = name.lower()
    for cat, pat in CATEGORIES:
        if re.search(pat, low):
            return cat
    return "rest"


#: JSON escapes; a backslash before any other character is written by Kineto unescaped (a name as it came).
_JSON_ESCAPES = '"\\/bfnrtu'


def load_trace(path: str) -> tuple[dict, list[str]]:
    """A torch-profiler Chrome trace (``.gz`` or not) as JSON, and the repairs its text needed.

    Kineto writes event names as they come, without escaping them, and some numbers as C prints them
    (pytorch/pytorch#33961, pytorch/kineto#336, pytorch/kineto#1459 describe such traces). When the file is
    not JSON as written, these repairs are applied, in this order, and named in the returned list: a NUL byte
    that begins a line read as the space Kineto indents every line with (an FP4 server's traces held such bytes,
    each at a file offset of 4 KiB - 1; why is not known), bytes that are not UTF-8 replaced (U+FFFD), a backslash that starts no JSON escape doubled, a bare ``nan`` / ``inf`` /
    ``-inf`` number (after ``:``, ``[`` or ``,``) read as ``null``, control characters inside strings accepted
    (``json`` ``strict=False``). A double quote left unescaped inside a name cannot be repaired.

    Returns:
        tuple: (the trace's JSON object, the repairs applied: ``[]`` when the file was JSON as written).

    Raises:
        OSError, EOFError, zlib.error: the file is missing, empty, or its gzip stream incomplete (still being
            written).
        ValueError: the repaired text still is not JSON; the message names the file, the error, its line and
            column, and the text around it.
    """
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if not raw:
        raise EOFError(f"{path}: empty")
    try:
        return json.loads(raw), []
    except ValueError:
        pass
    repairs = []
    if b"\n\x00" in raw:
        # Kineto indents every line after the first with spaces; a NUL byte as a line's first byte (each one at a file
        # offset 4 KiB - 1) stands where an indentation space was written: in processes where the plugin's NVRTC
        # build, before it was fixed, overwrote CPython's shared one-byte b" " (docs/benchmarks.md).
        raw = raw.replace(b"\n\x00", b"\n ")
        repairs.append("NUL bytes that began lines read as the indentation space")
    text = raw.decode("utf-8", errors="replace")
    if "\ufffd" in text:
        repairs.append("bytes that are not UTF-8 replaced")
    fixed = re.sub(r"\\(.)", lambda m: m.group(0) if m.group(1) in _JSON_ESCAPES else "\\\\" + m.group(1),
                   text, flags=re.S)
    if fixed != text:
        repairs.append("backslashes that start no JSON escape doubled")
    text = fixed
    fixed = re.sub(r"([:\[,]\s*)-?(?:nan|inf(?:inity)?)\b", r"\1null", text, flags=re.I)
    if fixed != text:
        repairs.append("bare nan / inf numbers read as null")
    text = fixed
    for strict in (True, False):
        try:
            obj = json.loads(text, strict=strict)
        except ValueError as e:
            if strict:
                continue
            pos = getattr(e, "pos", 0)
            raise ValueError(f"{path}: not JSON, also after the repairs {repairs or '(none applied)'}: {e}; "
                             f"around it: {text[max(0, pos - 100):pos + 100]!r}") from None
        if not strict:
            repairs.append("control characters inside strings accepted")
        return obj, repairs


def profile_table(paths: list[str], steps: int) -> dict:
    """GPU kernel time by category in torch-profiler traces (Chrome trace JSON, ``.gz`` or not).

    Args:
        paths: trace files (one per run); each holds ``steps`` decode steps.
        steps: decode steps each trace covers (``bench_one_batch --profile-steps``).

    Returns:
        dict: per trace, ``{category: microseconds per step}``, the total, and the ten longest kernels.

    Raises:
        ValueError: ``steps`` < 1, or a trace holds no GPU kernel event.
    """
    if steps < 1:
        raise ValueError(f"steps: expected >= 1, got {steps}")
    out = {}
    for path in paths:
        trace, repairs = load_trace(path)
        events = trace.get("traceEvents", [])
        per_cat: dict[str, float] = {}
        per_kernel: dict[str, float] = {}
        for e in events:
            if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
                continue
            name, dur = e.get("name", "?"), float(e.get("dur", 0.0))
            cat = categorize(name) if e["cat"] == "kernel" else "copies"
            per_cat[cat] = per_cat.get(cat, 0.0) + dur
            per_kernel[name] = per_kernel.get(name, 0.0) + dur
        if not per_kernel:
            raise ValueError(f"{path}: no GPU kernel events (was the profile taken with GPU activities?)")
        total = sum(per_cat.values())
        out[path] = {"us_per_step": {k: v / steps for k, v in sorted(per_cat.items(), key=lambda kv: -kv[1])},
                     "total_us_per_step": total / steps, "trace_repairs": repairs,
                     "top_kernels": sorted(((k, v / steps) for k, v in per_kernel.items()), key=lambda kv: -kv[1])[:10]}
    return out


def host_time_summary(seconds: list[float]) -> dict:
    """Median, 10th and 90th percentile (µs) and count of host times per call (seconds).

    Raises:
        ValueError: ``seconds`` is empty.
    """
    if not seconds:
        raise ValueError("seconds: no indexer call was timed (did decode run eagerly, --disable-cuda-graph?)")
    xs = sorted(seconds)

    def q(f):
        return xs[min(len(xs) - 1, int(f * len(xs)))] * 1e6

    return {"calls": len(xs), "median_us": q(0.5), "p10_us": q(0.1), "p90_us": q(0.9)}


def _time_paged_calls(store: list[float]) -> None:
    """Wrap SGLang's (already hooked) ``Indexer._get_topk_paged``: host wall time of each eager decode call.

    A measurement wrapper of this script, set after ``load_plugins()`` (so it times the plugin's hook when
    FP4 serves and SGLang's own method when it does not); calls made while a CUDA graph is captured are not
    timed. No synchronisation: the figure is the host's time to issue the call's work.
    """
    import time

    import torch
    from sglang.srt.layers.attention.dsa import dsa_indexer

    installed = dsa_indexer.Indexer._get_topk_paged

    def timed(self, forward_batch, *args, **kwargs):
        if torch.cuda.is_current_stream_capturing() or not forward_batch.forward_mode.is_decode():
            return installed(self, forward_batch, *args, **kwargs)
        t0 = time.perf_counter()
        out = installed(self, forward_batch, *args, **kwargs)
        store.append(time.perf_counter() - t0)
        return out

    dsa_indexer.Indexer._get_topk_paged = timed


def _one_batch(argv: list[str]) -> int:
    from sglang.srt.plugins import load_plugins

    host_out = None
    if "--indexer-host-time" in argv:  # this script's option, not SGLang's
        i = argv.index("--indexer-host-time")
        host_out, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    load_plugins()  # SGLang's own loader (entry point group sglang.srt.plugins), as its servers run it
    from sglang.benchmark import one_batch

    times: list[float] = []
    if host_out:
        _time_paged_calls(times)
    sys.argv = ["sglang.bench_one_batch", *argv]
    one_batch.cli_main()
    if host_out:
        with open(host_out, "w") as f:
            json.dump(host_time_summary(times), f)
    return 0


def _serving(argv: list[str]) -> int:
    """``python -m sglang.launch_server`` on localhost, then ``python -m sglang.benchmark.serving`` per input length."""
    import subprocess

    p = argparse.ArgumentParser(prog="sglang_bench.py serving")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True, help="JSONL: bench_serving's result lines, one per input length")
    p.add_argument("--fp4", action="store_true", help="add --enable-fp4-indexer")
    p.add_argument("--input-lens", type=int, nargs="+", default=[32768, 100000])
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--port", type=int, default=30741)
    p.add_argument("--ready-timeout", type=float, default=600.0)
    opts, server_args = p.parse_known_args(argv)
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", opts.model, "--host", "127.0.0.1",
           "--port", str(opts.port), *server_args] + (["--enable-fp4-indexer"] if opts.fp4 else [])
    client_env = dict(os.environ)
    if importlib.util.find_spec("datasets") is None:
        # SGLang's benchmark client imports Hugging Face datasets, which random-ids prompts never call:
        # scripts/bench_standins/datasets stands in for it where it is not installed (the GPU machine).
        standins = os.path.join(SCRIPTS, "bench_standins")
        client_env["PYTHONPATH"] = os.pathsep.join(x for x in (os.environ.get("PYTHONPATH"), standins) if x)
    with launched_server(cmd, opts.port, opts.out + ".server.log", opts.ready_timeout):
        for il in opts.input_lens:
            subprocess.run([sys.executable, "-m", "sglang.benchmark.serving", "--backend", "sglang", "--host",
                            "127.0.0.1", "--port", str(opts.port), "--dataset-name", "random-ids",
                            "--random-input-len", str(il), "--random-output-len", str(opts.output_len),
                            "--random-range-ratio", "1", "--num-prompts", str(opts.prompts),
                            "--max-concurrency", str(opts.concurrency), "--seed", "0", "--disable-tqdm",
                            "--output-file", opts.out], check=True, env=client_env)
    return 0


def parse_shapes(texts: list[str]) -> list[tuple[int, int]]:
    """``["BATCH:INPUT", ...]`` as ``[(batch, input_len), ...]``.

    Raises:
        ValueError: a text that is not two positive integers joined by ``:``.
    """
    shapes = []
    for t in texts:
        parts = t.split(":")
        if len(parts) != 2 or not all(x.isdigit() and int(x) > 0 for x in parts):
            raise ValueError(f"--shapes: expected BATCH:INPUT with positive integers, got {t!r}")
        shapes.append((int(parts[0]), int(parts[1])))
    return shapes


def stream_body(input_ids: list[int], output_len: int) -> dict:
    """The ``/generate`` body of one profiled request: token ids in, ``output_len`` greedy tokens out (end of
    sequence ignored, so the request decodes until the profile is taken), streamed so the client sees decoding
    start. Fields are SGLang's ``GenerateReqInput``'s."""
    return {"input_ids": input_ids, "stream": True,
            "sampling_params": {"max_new_tokens": output_len, "temperature": 0.0, "ignore_eos": True}}


def profile_body(out_dir: str, steps: int, prefix: str, activities: tuple[str, ...] = ("CPU", "GPU")) -> dict:
    """The ``/start_profile`` body that records the next ``steps`` decode batches (SGLang's ``ProfileReq``:
    ``profile_by_stage`` counts decode batches and stops by itself), the given activities (SGLang's names: CPU
    and GPU by default; the table reads only GPU kernels), without Python stacks, into ``out_dir`` as
    ``PREFIX-<profile id>-TP-0-DECODE.trace.json.gz``."""
    return {"output_dir": out_dir, "num_steps": steps, "activities": list(activities), "profile_by_stage": True,
            "with_stack": False, "record_shapes": False, "profile_prefix": prefix}


#: Seconds a trace file must keep its size while it still cannot be read before it counts as whole but unreadable.
TRACE_SETTLE_S = 10.0


class TraceUnreadable(RuntimeError):
    """A decode trace that SGLang wrote whole but that cannot be read: not JSON after ``load_trace``'s repairs, or
    a gzip stream that stays broken while the file keeps its size for ``TRACE_SETTLE_S``; ``path`` is the file."""

    def __init__(self, path: str, message: str):
        super().__init__(message)
        self.path = path


def profile_decode(base: str, batch: int, input_len: int, *, out_dir: str, prefix: str, steps: int,
                   output_len: int, seed: int = 0, timeout: float = 600.0,
                   activities: tuple[str, ...] = ("CPU", "GPU")) -> str:
    """Profile ``steps`` decode batches of a running server while ``batch`` requests of ``input_len`` random
    token ids decode together; returns the trace's path.

    The requests stream from threads; once every one of them has streamed a token past its first (its prefill
    done, so the batches that follow are decode batches of all of them), ``/start_profile`` (``profile_body``)
    is posted and the DECODE trace awaited. Whatever happens, the requests are then aborted
    (``/abort_request``, all of them), so none of them joins a later shape's batches.

    Raises:
        TraceUnreadable: the trace was written whole but cannot be read (``TraceUnreadable``).
        RuntimeError: a request failed or ended early (an error chunk, a dropped stream), ``/start_profile``
            failed, or decoding or the whole trace did not come within ``timeout`` seconds.
    """
    import glob
    import random
    import threading
    import time
    import urllib.request

    tokens = [0] * batch
    errors: list[str] = []
    stop = threading.Event()

    def run(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        ids = [rng.randrange(1000, 100000) for _ in range(input_len)]
        req = urllib.request.Request(base + "/generate", data=json.dumps(stream_body(ids, output_len)).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                for line in r:
                    if stop.is_set():
                        return
                    if not line.startswith(b"data:"):
                        continue
                    if b"[DONE]" in line:
                        break
                    chunk = json.loads(line[len(b"data:"):])
                    if isinstance(chunk, dict) and "error" in chunk:  # SGLang's stream_results error chunk
                        errors.append(f"request {i}: {json.dumps(chunk['error'])[:300]}")
                        return
                    tokens[i] += 1
            if not stop.is_set():
                errors.append(f"request {i}: the stream ended after {tokens[i]} chunks, before the profile")
        except Exception as e:  # noqa: BLE001 -- any failure of a request thread is reported by the main thread
            if not stop.is_set():
                errors.append(f"request {i}: {type(e).__name__}: {e}")

    def check(what: str, deadline: float) -> None:
        if errors:
            raise RuntimeError(f"{batch} x {input_len}: " + "; ".join(errors))
        if time.time() > deadline:
            raise RuntimeError(f"{batch} x {input_len}: {what} after {timeout:.0f} s")

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(batch)]
    for t in threads:
        t.start()
    deadline = time.time() + timeout
    pattern = os.path.join(out_dir, f"{prefix}-*DECODE.trace.json.gz")
    try:
        while min(tokens) < 2:
            check("not all requests decoding", deadline)
            time.sleep(0.2)
        before = set(glob.glob(pattern))
        answer = post_json(base + "/start_profile", profile_body(out_dir, steps, prefix, activities), 60.0)
        if "error" in answer:
            raise RuntimeError(f"{batch} x {input_len}: /start_profile: {answer['error']}")
        while not (new := set(glob.glob(pattern)) - before):
            check(f"no decode trace in {out_dir}", deadline)
            time.sleep(0.5)
    finally:
        stop.set()
        post_json(base + "/abort_request", {"abort_all": True}, 60.0)  # SGLang's AbortReq; never raises
    path = sorted(new)[0]
    size, since = -1, time.time()
    while True:  # torch gzips the trace after the profile stops: wait while the file is still being written
        try:
            load_trace(path)
            return path
        except (OSError, EOFError, zlib.error) as e:
            now_size = os.path.getsize(path) if os.path.exists(path) else -1
            if now_size != size:
                size, since = now_size, time.time()
            elif size > 0 and time.time() - since >= TRACE_SETTLE_S:  # written, yet its gzip stream stays broken
                raise TraceUnreadable(path, f"{batch} x {input_len}: the decode trace ({size} bytes, unchanged for "
                                            f"{TRACE_SETTLE_S:.0f} s) is not a whole gzip stream: "
                                            f"{type(e).__name__}: {e}") from None
            check(f"{path} not complete", deadline)
            time.sleep(1.0)
        except ValueError as e:  # complete, yet not JSON even after load_trace's repairs: no use waiting
            raise TraceUnreadable(path, f"{batch} x {input_len}: the decode trace is not JSON: {e}") from None


def profile_shape(base: str, batch: int, input_len: int, *, name: str, raw: str, out_dir: str, **kwargs) -> str:
    """``profile_decode`` for one shape into ``out_dir/NAME.trace.json.gz``; returns that path.

    A trace that is whole but unreadable (``TraceUnreadable``) is kept as ``NAME.unreadable.trace.json.gz`` and
    the shape is profiled once more with GPU activity only (the table reads GPU kernels only, and the host-side
    events are the larger part of a trace); that trace is then the shape's, and a line on stderr says so. Should
    it be unreadable too, it is kept as ``NAME.gpu-only.unreadable.trace.json.gz``.

    Raises:
        RuntimeError: as ``profile_decode``; ``TraceUnreadable`` when the GPU-only trace is unreadable too.
    """
    import shutil

    try:
        path = profile_decode(base, batch, input_len, out_dir=raw, prefix=name, **kwargs)
    except TraceUnreadable as e:
        shutil.move(e.path, os.path.join(out_dir, f"{name}.unreadable.trace.json.gz"))
        print(f"{name}: {e}; kept as {name}.unreadable.trace.json.gz, profiled again with GPU activity only",
              file=sys.stderr)
        try:
            path = profile_decode(base, batch, input_len, out_dir=raw, prefix=name,
                                  **dict(kwargs, activities=("GPU",)))
        except TraceUnreadable as again:  # kept too, beside the good traces, so that it comes back to be read
            shutil.move(again.path, os.path.join(out_dir, f"{name}.gpu-only.unreadable.trace.json.gz"))
            raise
    final = os.path.join(out_dir, f"{name}.trace.json.gz")
    # Moved out before the next shape: a later prefill may make SGLang write another trace of this prefix.
    shutil.move(path, final)
    return final


def _serving_profile(argv: list[str]) -> int:
    """``python -m sglang.launch_server`` on localhost, then a decode profile per ``--shapes`` entry."""
    import shutil

    p = argparse.ArgumentParser(prog="sglang_bench.py serving-profile")
    p.add_argument("--model", required=True)
    p.add_argument("--out-dir", required=True, help="where the traces go, as FMT_BATCHxINPUT.trace.json.gz")
    p.add_argument("--fp4", action="store_true", help="add --enable-fp4-indexer")
    p.add_argument("--shapes", nargs="+", default=["1:131072", "8:65536"], help="BATCH:INPUT ...")
    p.add_argument("--steps", type=int, default=5, help="decode batches per trace")
    p.add_argument("--output-len", type=int, default=4096, help="tokens each request may decode (never reached)")
    p.add_argument("--port", type=int, default=30741)
    p.add_argument("--ready-timeout", type=float, default=600.0)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds each shape may take")
    opts, server_args = p.parse_known_args(argv)
    try:
        shapes = parse_shapes(opts.shapes)
    except ValueError as e:
        p.error(str(e))
    if opts.steps < 1:
        p.error(f"--steps: expected >= 1, got {opts.steps}")
    fmt = "fp4" if opts.fp4 else "fp8"
    os.makedirs(opts.out_dir, exist_ok=True)
    raw = os.path.join(opts.out_dir, f"raw_{fmt}")
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", opts.model, "--host", "127.0.0.1",
           "--port", str(opts.port), *server_args] + (["--enable-fp4-indexer"] if opts.fp4 else [])
    rc = 0
    with launched_server(cmd, opts.port, os.path.join(opts.out_dir, f"server_{fmt}.log"), opts.ready_timeout) as base:
        for b, il in shapes:
            name = f"{fmt}_{b}x{il}"
            try:
                profile_shape(base, b, il, name=name, raw=raw, out_dir=opts.out_dir, steps=opts.steps,
                              output_len=opts.output_len, timeout=opts.timeout)
            except RuntimeError as e:
                print(f"{name}: {e}", file=sys.stderr)
                rc = 1
                continue
            print(f"{name}: {opts.steps} decode batches profiled")
    shutil.rmtree(raw, ignore_errors=True)
    return rc


#: bench_serving result fields the serving table shows: (field, heading, format).
SERVING_FIELDS = (("completed", "requests done", "{:.0f}"), ("output_throughput", "output tok/s", "{:.1f}"),
                  ("median_tpot_ms", "median TPOT ms", "{:.2f}"), ("median_ttft_ms", "median TTFT ms", "{:.0f}"),
                  ("accept_length", "accepted length", "{:.2f}"))


def serving_table(fp8: list[dict], fp4: list[dict]) -> list[dict]:
    """FP8 and FP4 ``bench_serving`` result lines paired by input length, output length and concurrency.

    Args:
        fp8, fp4: the result lines of ``python -m sglang.benchmark.serving --output-file`` (dicts with
            ``random_input_len``, ``random_output_len``, ``max_concurrency`` and the metrics of
            ``SERVING_FIELDS``), one list per format.

    Returns:
        One dict per shape both formats ran: ``input_len``, ``output_len``, ``concurrency`` and per field
        ``{"fp8": value, "fp4": value}`` (None where a run does not report it), ``output_ratio`` (FP4 / FP8
        output tokens/s).
    """
    def key(r):
        return (r.get("random_input_len"), r.get("random_output_len"), r.get("max_concurrency"))

    by4 = {key(r): r for r in fp4}
    rows = []
    for r8 in fp8:
        r4 = by4.get(key(r8))
        if r4 is None:
            continue
        il, ol, conc = key(r8)
        row = {"input_len": il, "output_len": ol, "concurrency": conc}
        for field, _, _ in SERVING_FIELDS:
            row[field] = {"fp8": r8.get(field), "fp4": r4.get(field)}
        a, b = r8.get("output_throughput"), r4.get("output_throughput")
        row["output_ratio"] = b / a if a and b else None
        rows.append(row)
    return rows


def _serving_table(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="sglang_bench.py serving-table")
    p.add_argument("--fp8", required=True, help="the FP8 serving run's JSONL")
    p.add_argument("--fp4", required=True, help="the FP4 serving run's JSONL")
    p.add_argument("--json")
    opts = p.parse_args(argv)
    runs = []
    for name in (opts.fp8, opts.fp4):
        try:
            runs.append([json.loads(x) for x in open(name) if x.strip()])
        except (OSError, ValueError) as exc:
            p.error(f"{name}: cannot be read as JSON lines ({exc})")
    rows = serving_table(*runs)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(rows, f, indent=1)
    for row in rows:
        print(f"input {row['input_len']}, output {row['output_len']}, concurrency {row['concurrency']}:")
        for field, head, fmt in SERVING_FIELDS:
            v8, v4 = row[field]["fp8"], row[field]["fp4"]
            if v8 is None and v4 is None:
                continue
            show = lambda v: fmt.format(v) if isinstance(v, (int, float)) else "-"  # noqa: E731
            print(f"  {head:<18} FP8 {show(v8):>10}  FP4 {show(v4):>10}")
        if row["output_ratio"] is not None:
            print(f"  {'FP4 / FP8 output tok/s':<18} {row['output_ratio']:.3f}")
    if not rows:
        print("no input length was served by both runs")
        return 1
    return 0


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("one-batch", "serving", "serving-profile", "serving-table",
                                                "profile-table"):
        print(__doc__)
        return 2
    if sys.argv[1] == "one-batch":
        return _one_batch(sys.argv[2:])
    if sys.argv[1] == "serving":
        return _serving(sys.argv[2:])
    if sys.argv[1] == "serving-table":
        return _serving_table(sys.argv[2:])
    if sys.argv[1] == "serving-profile":
        return _serving_profile(sys.argv[2:])
    p = argparse.ArgumentParser(prog="sglang_bench.py profile-table")
    p.add_argument("traces", nargs="+")
    p.add_argument("--steps", type=int, default=1, help="decode steps in each trace (--profile-steps)")
    p.add_argument("--json")
    opts = p.parse_args(sys.argv[2:])
    res = profile_table(opts.traces, opts.steps)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(res, f, indent=1)
    cats = sorted({c for r in res.values() for c in r["us_per_step"]})
    print(f"{'us per decode step':<32}" + "".join(f"{p.split('/')[-1][:28]:>30}" for p in res))
    for c in cats + ["total"]:
        vals = [r["total_us_per_step"] if c == "total" else r["us_per_step"].get(c, 0.0) for r in res.values()]
        tots = [r["total_us_per_step"] for r in res.values()]
        print(f"{c:<32}" + "".join(f"{v:>20.1f} ({100 * v / t:4.1f} %)" for v, t in zip(vals, tots)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
