"""A running SGLang server from the outside: launch it, post to it, run SGLang's serving benchmark, read its log.

What ``sglang-fp4-indexer ab`` and the repository's in-server harness (``scripts/sglang_bench.py``,
``scripts/sglang_one_batch.py``) share, kept once so that a deployer's A/B and the repository's measurements run
the same code. Nothing here imports SGLang: the server and SGLang's benchmark client run as subprocesses
(``python -m sglang.launch_server``, ``python -m sglang.benchmark.serving``), spoken to over HTTP with the
standard library.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time

__all__ = [
    "SERVING_FIELDS",
    "VERSION_PACKAGES",
    "post_json",
    "get_json",
    "launched_server",
    "launch_command",
    "bench_serving_command",
    "serving_table",
    "read_jsonl",
    "kv_pool_tokens",
    "peak_running_requests",
    "versions",
    "gpu_description",
    "client_error",
]

#: bench_serving result fields the serving table shows: (field, heading, format).
SERVING_FIELDS = (("completed", "requests done", "{:.0f}"), ("output_throughput", "output tok/s", "{:.1f}"),
                  ("median_tpot_ms", "median TPOT ms", "{:.2f}"), ("median_ttft_ms", "median TTFT ms", "{:.0f}"),
                  ("accept_length", "accepted length", "{:.2f}"))

#: Distributions whose versions describe a serving stack (``versions``), in this order.
VERSION_PACKAGES = ("sglang", "sglang-kernel", "sgl-flash-mla", "torch", "triton", "transformers", "deep-gemm",
                    "sgl-deep-gemm", "sglang-fp4-indexer")


def _fetch(req, timeout: float) -> tuple[bytes | None, dict | None]:
    """``(body, None)`` of an HTTP request (``urllib.request.Request`` or URL), or ``(None, {"error": why})``."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read(), None
    except urllib.error.HTTPError as e:
        return None, {"error": f"HTTP {e.code}: {e.read()[:500].decode(errors='replace')}"}
    except OSError as e:
        return None, {"error": f"{type(e).__name__}: {e}"}


def post_json(url: str, body: dict, timeout: float) -> dict:
    """POST ``body`` as JSON to ``url``; the answer as a dict (``{"text": ...}`` when it is not JSON, e.g. an
    empty 200), or ``{"error": ...}`` when the request fails (HTTP error, refused, timed out). Never raises."""
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    raw, failed = _fetch(req, timeout)
    if failed:
        return failed
    try:
        return json.loads(raw)
    except ValueError:
        return {"text": raw.decode(errors="replace")}


def client_error(output: str, limit: int = 300) -> str:
    """The line of a failed SGLang client's output (a benchmark, GSM8K or an import, stdout and stderr together)
    that says why: the last line naming an error, an exception or a server not ready, else the last line, else
    "no output"; at most ``limit`` characters."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()] or ["no output"]
    why = next((ln for ln in reversed(lines) if "rror" in ln or "xception" in ln or "not ready" in ln), lines[-1])
    return why[:limit]


def get_json(url: str, timeout: float) -> dict:
    """GET ``url``; the JSON object it answers, or ``{"error": ...}`` (request failed, or not a JSON object).
    Never raises."""
    raw, failed = _fetch(url, timeout)
    if failed:
        return failed
    try:
        out = json.loads(raw)
    except ValueError:
        return {"error": f"not JSON: {raw[:200].decode(errors='replace')!r}"}
    return out if isinstance(out, dict) else {"error": f"not a JSON object: {str(out)[:200]}"}


@contextlib.contextmanager
def launched_server(cmd: list[str], port: int, log_path: str, ready_timeout: float):
    """Run ``cmd`` (a ``launch_server`` command line) with its output in ``log_path``; yield its base URL
    (``http://127.0.0.1:PORT``) once ``/health`` answers 200, and terminate it on leaving.

    Raises:
        RuntimeError: the server exits (with the last error line of its log, ``client_error``), or ``/health``
            does not answer within ``ready_timeout`` seconds.
    """
    import urllib.request

    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.time() + ready_timeout
            while True:
                if proc.poll() is not None:
                    log.flush()
                    with open(log_path, errors="replace") as f:
                        why = client_error(f.read())
                    raise RuntimeError(f"launch_server exited with {proc.returncode}: {why} (log: {log_path})")
                try:
                    with urllib.request.urlopen(base + "/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.time() > deadline:
                    raise RuntimeError(f"launch_server not healthy after {ready_timeout:.0f} s (log: {log_path})")
                time.sleep(2)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def launch_command(model: str | None, port: int, server_flags: list[str], *, fp4: bool,
                   python: str = sys.executable) -> list[str]:
    """``python -m sglang.launch_server`` on 127.0.0.1:``port`` with the deployer's flags, plus
    ``--enable-fp4-indexer`` when ``fp4`` (FP8: the flags as given, the plugin not asked).

    Args:
        model: the model path (``--model-path``), or None when the flags (e.g. ``--config``) name it.
        server_flags: SGLang server flags, e.g. ``["--tp-size", "8", "--config", "serve.yaml"]``.

    Raises:
        ValueError: ``server_flags`` set ``--host``/``--port`` (the command picks them) or
            ``--enable-fp4-indexer`` (the command adds it to one arm only), or ``--no-enable-fp4-indexer`` with
            ``fp4`` (the FP8 arm may carry it, to override a config file that turns FP4 on), also abbreviated
            (SGLang's argparse parser takes any unique prefix: ``--enable-fp4`` is ``--enable-fp4-indexer``).
    """
    reserved = ("--host", "--port", "--enable-fp4-indexer", "--no-enable-fp4-indexer")
    for flag in server_flags:
        name = flag.split("=", 1)[0]
        full = next((r for r in reserved if len(name) > 3 and r != name and r.startswith(name)), None)
        if full is not None:
            raise ValueError(f"server flags: {name} abbreviates {full} (SGLang's parser takes a flag's prefix), "
                             "which the command sets itself; drop it")
        if name in ("--host", "--port"):
            raise ValueError(f"server flags: {name} is set by the command (it serves on 127.0.0.1 and --port); "
                             f"drop {flag}")
        if name == "--enable-fp4-indexer":
            raise ValueError(f"server flags: {name} is the A/B's own switch (added to the FP4 arm only); drop it")
        if name == "--no-enable-fp4-indexer" and fp4:
            raise ValueError(f"server flags: {name} would turn FP4 off in the FP4 arm too (the A/B adds "
                             "--enable-fp4-indexer to that arm only); drop it")
    cmd = [python, "-m", "sglang.launch_server"]
    if model is not None:
        cmd += ["--model-path", model]
    return cmd + ["--host", "127.0.0.1", "--port", str(port), *server_flags] + (["--enable-fp4-indexer"] if fp4 else [])


def bench_serving_command(base_url: str, *, input_len: int, output_len: int, prompts: int, concurrency: int,
                          output_file: str, seed: int = 0, dataset: str = "random-ids",
                          tokenizer: str | None = None, warmup_requests: int = 1, flush_cache: bool = False,
                          python: str = sys.executable) -> list[str]:
    """SGLang's serving benchmark (``python -m sglang.benchmark.serving``) against ``base_url``: ``prompts``
    requests of ``input_len`` random token ids each (fixed lengths: range ratio 1) asking ``output_len`` tokens,
    ``concurrency`` at a time, seeded; its result line is appended to ``output_file`` (JSON lines).

    Args:
        warmup_requests: requests SGLang's benchmark sends before the measured ones (``--warmup-requests``: copies
            of the first prompt, at most 32 tokens asked each, ``concurrency`` at a time; 0 sends none). Default 1,
            SGLang's own default.
        flush_cache: ``--flush-cache``: SGLang's benchmark POSTs ``/flush_cache`` after the warm-up, so the
            measured requests reuse no prefix the warm-up left in the server's cache.

    Raises:
        ValueError: a length, count or concurrency below 1, or ``warmup_requests`` below 0 (named).
    """
    for name, value in (("input_len", input_len), ("output_len", output_len), ("prompts", prompts),
                        ("concurrency", concurrency)):
        if value < 1:
            raise ValueError(f"{name}: expected >= 1, got {value}")
    if warmup_requests < 0:
        raise ValueError(f"warmup_requests: expected >= 0, got {warmup_requests}")
    cmd = [python, "-m", "sglang.benchmark.serving", "--backend", "sglang", "--base-url", base_url,
           "--dataset-name", dataset, "--random-input-len", str(input_len), "--random-output-len", str(output_len),
           "--random-range-ratio", "1", "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
           "--seed", str(seed), "--warmup-requests", str(warmup_requests), "--disable-tqdm",
           "--output-file", output_file]
    return cmd + (["--flush-cache"] if flush_cache else []) + (["--tokenizer", tokenizer] if tokenizer else [])


def serving_table(fp8: list[dict], fp4: list[dict], fields: tuple = SERVING_FIELDS) -> list[dict]:
    """FP8 and FP4 ``bench_serving`` result lines paired by input length, output length and concurrency.

    Args:
        fp8, fp4: the result lines of ``python -m sglang.benchmark.serving --output-file`` (dicts with
            ``random_input_len``, ``random_output_len``, ``max_concurrency`` and the metrics of
            ``fields``), one list per format.
        fields: ``(field, heading, format)`` triples of the metrics to pair (default ``SERVING_FIELDS``).

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
        for field, _, _ in fields:
            row[field] = {"fp8": r8.get(field), "fp4": r4.get(field)}
        a, b = r8.get("output_throughput"), r4.get("output_throughput")
        row["output_ratio"] = b / a if a and b else None
        rows.append(row)
    return rows


def read_jsonl(path: str) -> list[dict]:
    """The JSON objects of a JSON-lines file (blank lines skipped).

    Raises:
        OSError: the file cannot be read. ValueError: a line is not JSON (the message names file and line).
    """
    out = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError as e:
                    raise ValueError(f"{path}:{i}: not JSON ({e})") from None
    return out


_KV_ALLOCATED = re.compile(r"KV Cache is allocated\. dtype: ([^,]+), #tokens: (\d+)")
_MAX_TOTAL = re.compile(r"max_total_num_tokens=(\d+)")
_FP4_ACTIVE = re.compile(r"FP4 indexer active: (.*)$")


def kv_pool_tokens(log_text: str) -> dict:
    """The KV pool a server's log reports: SGLang's ``KV Cache is allocated. dtype: D, #tokens: N`` (the first
    such line: the target model's pool; a draft model's follows) and ``max_total_num_tokens=N`` (the scheduler's
    figure), and the plugin's ``FP4 indexer active: ...`` line.

    Returns:
        dict: ``kv_cache_tokens`` and ``kv_cache_dtype`` (None when no such line), ``max_total_num_tokens``
        (int or None), ``fp4_indexer_active`` (the line's text after the colon, or None).
    """
    alloc = _KV_ALLOCATED.search(log_text)
    total = _MAX_TOTAL.search(log_text)
    active = next((m.group(1).strip() for m in map(_FP4_ACTIVE.search, log_text.splitlines()) if m), None)
    return {"kv_cache_tokens": int(alloc.group(2)) if alloc else None,
            "kv_cache_dtype": alloc.group(1).strip() if alloc else None,
            "max_total_num_tokens": int(total.group(1)) if total else None,
            "fp4_indexer_active": active}


_RUNNING = re.compile(r"#running-req: (\d+)")
_DP_RANK = re.compile(r"^\[[^\]]* DP(\d+)\b")


def running_peaks(log_text: str) -> dict:
    """The most requests each scheduler of a server ran at once: per DP rank (the `` DPn`` in the bracket SGLang
    opens each scheduler's log line with; the key None for lines without one) the largest ``#running-req: N`` of
    its prefill and decode batch lines (requests admitted to the KV pool; those queued are ``#queue-req``).
    Under DP attention every rank schedules its own batches: the ranks' peaks need not fall at the same time, so
    their sum is no count of requests running at once."""
    peaks: dict = {}
    for line in log_text.splitlines():
        m = _RUNNING.search(line)
        if m:
            dp = _DP_RANK.match(line)
            rank = int(dp.group(1)) if dp else None
            peaks[rank] = max(peaks.get(rank, 0), int(m.group(1)))
    return peaks


def peak_running_requests(log_text: str) -> int | None:
    """The most requests one scheduler of a server ran at once (``running_peaks``: under DP attention, the busiest
    rank's); None when the log has no batch line."""
    peaks = running_peaks(log_text)
    return max(peaks.values()) if peaks else None


def versions(packages: tuple[str, ...] = VERSION_PACKAGES) -> dict:
    """Installed versions of ``packages`` (distribution names; those not installed left out), and DeepGEMM's
    own ``__version__`` where its module imports (``deep_gemm (import)``)."""
    import importlib.metadata as md

    out = {}
    for name in packages:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    try:
        import deep_gemm

        out.setdefault("deep_gemm (import)", getattr(deep_gemm, "__version__", "?"))
    except Exception:  # noqa: BLE001 -- absent or broken: the version is simply not known
        pass
    return out


def gpu_description(run=subprocess.run) -> dict:
    """This machine's GPUs and driver from ``nvidia-smi`` (``name``, ``driver``, ``count``, ``memory_mib``), or
    ``{"error": why}`` when nvidia-smi is missing or fails. ``run`` is ``subprocess.run`` (a parameter for tests)."""
    try:
        p = run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return {"error": "nvidia-smi not found: no NVIDIA driver on this machine"}
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": f"nvidia-smi: {type(e).__name__}: {e}"}
    if p.returncode != 0:
        return {"error": f"nvidia-smi exited with {p.returncode}: {p.stderr.strip()[:200]}"}
    rows = [[c.strip() for c in line.split(",")] for line in p.stdout.strip().splitlines() if line.strip()]
    if not rows or any(len(r) != 3 for r in rows):
        return {"error": f"nvidia-smi: unexpected output {p.stdout[:200]!r}"}
    names = sorted({r[0] for r in rows})
    return {"name": ", ".join(names), "driver": rows[0][1], "count": len(rows),
            "memory_mib": int(rows[0][2]) if rows[0][2].isdigit() else rows[0][2]}
