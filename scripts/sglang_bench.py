"""SGLang's own benchmarks with the plugin loaded as a server loads it, and the decode profile as a table.

* ``one-batch ARGS...``: ``python -m sglang.bench_one_batch ARGS...`` (SGLang's
  ``sglang.benchmark.one_batch.cli_main``) after SGLang's ``load_plugins()``, which
  SGLang's servers call in every process but ``bench_one_batch`` does not; with
  ``--enable-fp4-indexer`` in ARGS the FP4 indexer serves, without it the plugin
  passes every call through. Its results go where ``--result-filename`` says.
  ``--indexer-host-time OUT.json`` (this script's option) also writes the host
  time per indexer decode call (median, percentiles and every call's time), eager calls only (run with
  ``--disable-cuda-graph``):
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
* ``timeline TRACE.json.gz [WALL.json ...] --steps N [--layers L] [--json OUT]``: the same traces on the GPU's timeline
  (``timeline``): per cycle the busy time (union of kernel intervals: kernels on SGLang's two streams counted
  once), the span, each category's time alone (the indexer's exposed part), a layer's time, and with ``--layers``
  the cycle projected to 61 layers; per shape FP8 and FP4 as median [min-max] over traces, and FP8 / FP4; with
  the serving-profile wall records (``--wall-s``), the wall time per cycle a streaming client saw.
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
# The serving helpers shared with sglang-fp4-indexer ab (the package's ``serving`` module imports no SGLang).
from sglang_fp4_indexer.serving import (  # noqa: E402,F401
    SERVING_FIELDS, bench_serving_command, launch_command, launched_server, post_json, read_jsonl, serving_table)

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


#: The indexer scorer's own kernels (FP4: the plugin's; FP8: DeepGEMM's paged MQA logits), not its schedule
#: planner: one launch per indexed layer and forward, the anchors by which ``timeline`` cuts a trace into layers.
SCORER_KERNELS = r"fp4_paged_logits|paged_mqa_logits"
#: Their schedule planners (the plugin's; DeepGEMM's metadata kernel), one per forward: not layer anchors.
SCHEDULE_KERNELS = r"plan_paged_schedule|metadata"


def gpu_intervals(trace: dict) -> list[tuple[float, float, str, str]]:
    """Every GPU kernel, copy and memset of a torch-profiler trace (``load_trace``'s object) as
    ``(start µs, end µs, category, name)``, sorted by start; the category as ``profile_table`` gives it."""
    out = []
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        t0, name = float(e.get("ts", 0.0)), e.get("name", "?")
        cat = categorize(name) if e["cat"] == "kernel" else "copies"
        out.append((t0, t0 + float(e.get("dur", 0.0)), cat, name))
    out.sort()
    return out


def union_time(intervals, lo: float = float("-inf"), hi: float = float("inf")) -> float:
    """Microseconds during which at least one of ``intervals`` (``(start, end, ...)`` tuples, sorted by start)
    runs, counting only the part inside ``[lo, hi)``: the GPU's busy time, overlapping kernels counted once."""
    total, cur_s, cur_e = 0.0, None, None
    for iv in intervals:
        s, e = max(iv[0], lo), min(iv[1], hi)
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _spread(values: list[float]) -> dict:
    """``{"median", "min", "max"}`` of ``values`` (not empty)."""
    import statistics

    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _quartiles(values: list[float]) -> dict:
    import statistics

    if len(values) < 2:
        return {"n": len(values), "median": values[0] if values else None, "q1": None, "q3": None}
    q1, med, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {"n": len(values), "median": med, "q1": q1, "q3": q3}


def wall_stats(record: dict) -> dict:
    """The wall time per cycle a streaming client saw (``profile_decode``'s ``wall_path`` record).

    Per request, the intervals between consecutive chunks inside the timed window (the first chunk of the window
    starts the first interval, so a window's edge is never counted as an interval), pooled over the requests:
    ``ms_per_cycle`` (``n``, ``median``, ``q1``, ``q3``, milliseconds) and ``tokens_per_cycle`` (the mean increase
    of SGLang's ``completion_tokens`` per chunk: with MTP the accepted length plus one, ``None`` where the chunks
    did not carry it).

    Raises:
        ValueError: the record holds no two chunks of one request (nothing to time).
    """
    intervals, tokens = [], []
    for chunks in record["requests"]:
        for (t_a, n_a), (t_b, n_b) in zip(chunks, chunks[1:]):
            intervals.append(1e3 * (t_b - t_a))
            if n_a is not None and n_b is not None:
                tokens.append(n_b - n_a)
    if not intervals:
        raise ValueError(f"wall record of {record.get('batch')} x {record.get('input_len')}: no two chunks of one "
                         f"request in the {record.get('window_s', 0):.1f} s window")
    return {"ms_per_cycle": _quartiles(intervals),
            "tokens_per_cycle": sum(tokens) / len(tokens) if tokens else None}


def timeline(path: str, steps: int, layers: int | None = None, full_depth: int = 61) -> dict:
    """Where a decode (or MTP verify) cycle's time goes on the GPU's timeline, never summing kernels that overlap.

    SGLang runs the indexer on a second stream beside the query projection, so kernel times add up to more than
    the step takes. From the trace's GPU intervals (``gpu_intervals``), per cycle (``steps`` cycles in a trace):
    ``span`` (first kernel's start to last kernel's end: the GPU's wall time, host gaps between kernels included),
    ``busy`` (the union of kernel intervals), ``idle`` (span - busy) and, per category, ``alone`` (the time when
    that category's kernels and no others run: for the indexer logits, its exposed part). Per layer: the windows
    between consecutive starts of the scorer kernel (``SCORER_KERNELS``, one per indexed layer and forward), with
    the quartiles of their span and busy time; most windows are layer to layer inside a forward, the rest (across
    forwards and draft passes) are longer, so the median is a layer's time. With ``layers`` (the served model's
    decoder layers), the cycle at ``full_depth`` layers is projected as measured + (full_depth - layers) x the
    median layer busy time (and span): a projection, labelled so in the result.

    Raises:
        ValueError: ``steps`` < 1, ``layers`` outside 1..``full_depth``, or the trace holds no GPU kernel.
    """
    if steps < 1:
        raise ValueError(f"steps: expected >= 1, got {steps}")
    if layers is not None and not 1 <= layers <= full_depth:
        raise ValueError(f"layers: expected 1..{full_depth}, got {layers}")
    trace, _ = load_trace(path)
    ivs = gpu_intervals(trace)
    if not ivs:
        raise ValueError(f"{path}: no GPU kernel events (was the profile taken with GPU activities?)")
    span = max(iv[1] for iv in ivs) - ivs[0][0]
    busy = union_time(ivs)
    # Sweep over start and end points: the categories running between two consecutive points.
    points = sorted([(iv[0], 1, iv[2]) for iv in ivs] + [(iv[1], -1, iv[2]) for iv in ivs])
    running: dict[str, int] = {}
    alone: dict[str, float] = {}
    last = points[0][0]
    for t, delta, cat in points:
        if t > last:
            active = [c for c, n in running.items() if n > 0]
            if len(active) == 1:
                alone[active[0]] = alone.get(active[0], 0.0) + (t - last)
            last = t
        running[cat] = running.get(cat, 0) + delta
    starts = [iv[0] for iv in ivs if re.search(SCORER_KERNELS, iv[3], re.I) and not re.search(SCHEDULE_KERNELS, iv[3], re.I)]
    windows = list(zip(starts, starts[1:]))
    layer_span = _quartiles([b - a for a, b in windows])
    layer_busy = _quartiles([union_time(ivs, a, b) for a, b in windows])
    out = {"steps": steps, "span_us_per_step": span / steps, "busy_us_per_step": busy / steps,
           "idle_us_per_step": (span - busy) / steps,
           "alone_us_per_step": {k: v / steps for k, v in sorted(alone.items(), key=lambda kv: -kv[1])},
           "indexer_exposed_us_per_step": alone.get("indexer logits", 0.0) / steps,
           "scorer_launches_per_step": len(starts) / steps, "layer_span_us": layer_span, "layer_busy_us": layer_busy}
    if layers is not None and layer_busy["median"] is not None:
        extra = full_depth - layers
        out["projection"] = {
            "what": f"projected to {full_depth} layers: measured at {layers} + {extra} x the median layer",
            "layers_measured": layers, "full_depth": full_depth,
            "busy_us_per_step": out["busy_us_per_step"] + extra * layer_busy["median"],
            "span_us_per_step": out["span_us_per_step"] + extra * layer_span["median"]}
    return out


#: A serving-profile trace's file name: format, batch, input length and, with --repeats, the repeat.
_TRACE_NAME = re.compile(r"^(fp8|fp4)_(\d+)x(\d+)(?:_r(\d+))?\.trace\.json\.gz$")

#: The per-cycle quantities ``timeline_summary`` aggregates: (key in the summary, how it is read off ``timeline``).
_SUMMARY_FIELDS = (
    ("busy_us", lambda t: t["busy_us_per_step"]),
    ("span_us", lambda t: t["span_us_per_step"]),
    ("indexer_exposed_us", lambda t: t["indexer_exposed_us_per_step"]),
    ("layer_busy_us", lambda t: t["layer_busy_us"]["median"]),
    ("layer_span_us", lambda t: t["layer_span_us"]["median"]),
    ("projected_busy_us", lambda t: t.get("projection", {}).get("busy_us_per_step")),
    ("projected_span_us", lambda t: t.get("projection", {}).get("span_us_per_step")),
)


#: A serving-profile wall record's file name (``--wall-s``): format, batch, input length.
_WALL_NAME = re.compile(r"^(fp8|fp4)_(\d+)x(\d+)\.wall\.json$")


def timeline_summary(paths: list[str], steps: int, layers: int | None = None, full_depth: int = 61,
                     walls: list[str] | None = None) -> dict:
    """``timeline`` for every trace, grouped by shape and format, with the spread over traces and FP8 / FP4.

    Args:
        paths: serving-profile traces named ``FMT_BATCHxINPUT[_rK].trace.json.gz``; the folder a trace lies in
            names its run (e.g. one server of a run order), kept in each row as ``run``.
        steps, layers, full_depth: as ``timeline``.
        walls: serving-profile wall records ``FMT_BATCHxINPUT.wall.json`` (``wall_stats``), one per server and
            shape: per shape and format ``wall_ms_per_cycle`` (median, minimum and maximum over the servers of
            each server's median interval between streamed chunks) and ``tokens_per_cycle`` (their mean), and
            the FP8 / FP4 ratio of the wall medians in ``fp8_over_fp4``.

    Returns:
        dict: ``rows`` (one per trace: run, format, batch, input, repeat and the ``_SUMMARY_FIELDS`` values) and
        ``shapes`` (per ``BATCHxINPUT``: per format the median, minimum and maximum of each field over its traces
        and the number of traces; and ``fp8_over_fp4``, the ratio of the medians, > 1 where FP4 is faster).

    Raises:
        ValueError: a file name does not read as ``FMT_BATCHxINPUT[_rK].trace.json.gz`` (a wall record's as
            ``FMT_BATCHxINPUT.wall.json``); as ``timeline`` and ``wall_stats``.
    """
    rows = []
    for path in paths:
        m = _TRACE_NAME.match(os.path.basename(path))
        if not m:
            raise ValueError(f"{path}: expected a name FMT_BATCHxINPUT[_rK].trace.json.gz (FMT fp8 or fp4)")
        t = timeline(path, steps, layers, full_depth)
        row = {"run": os.path.basename(os.path.dirname(os.path.abspath(path))), "format": m[1], "batch": int(m[2]),
               "input": int(m[3]), "repeat": int(m[4] or 1), "path": path}
        row.update({k: get(t) for k, get in _SUMMARY_FIELDS})
        rows.append(row)
    shapes: dict[str, dict] = {}
    for row in rows:
        shapes.setdefault(f"{row['batch']}x{row['input']}", {}).setdefault(row["format"], []).append(row)
    out = {}
    for shape, per_fmt in sorted(shapes.items()):
        agg = {}
        for fmt, rs in per_fmt.items():
            agg[fmt] = {"traces": len(rs), "runs": sorted({r["run"] for r in rs})}
            for key, _ in _SUMMARY_FIELDS:
                vals = [r[key] for r in rs if r[key] is not None]
                if vals:
                    agg[fmt][key] = _spread(vals)
        if "fp8" in agg and "fp4" in agg:
            agg["fp8_over_fp4"] = {key: agg["fp8"][key]["median"] / agg["fp4"][key]["median"]
                                   for key, _ in _SUMMARY_FIELDS
                                   if key in agg["fp8"] and key in agg["fp4"] and agg["fp4"][key]["median"]}
        out[shape] = agg
    wall_rows = []
    for path in walls or []:
        m = _WALL_NAME.match(os.path.basename(path))
        if not m:
            raise ValueError(f"{path}: expected a name FMT_BATCHxINPUT.wall.json (FMT fp8 or fp4)")
        with open(path) as f:
            st = wall_stats(json.load(f))
        wall_rows.append({"run": os.path.basename(os.path.dirname(os.path.abspath(path))), "format": m[1],
                          "batch": int(m[2]), "input": int(m[3]), "path": path,
                          "ms_per_cycle": st["ms_per_cycle"], "tokens_per_cycle": st["tokens_per_cycle"]})
    for shape in sorted({f"{r['batch']}x{r['input']}" for r in wall_rows}):
        agg = out.setdefault(shape, {})
        for fmt in ("fp8", "fp4"):
            rs = [r for r in wall_rows if f"{r['batch']}x{r['input']}" == shape and r["format"] == fmt]
            if not rs:
                continue
            meds = [r["ms_per_cycle"]["median"] for r in rs]
            toks = [r["tokens_per_cycle"] for r in rs if r["tokens_per_cycle"] is not None]
            agg.setdefault(fmt, {"traces": 0, "runs": []})
            agg[fmt]["wall_servers"] = len(rs)
            agg[fmt]["wall_ms_per_cycle"] = _spread(meds)
            agg[fmt]["tokens_per_cycle"] = sum(toks) / len(toks) if toks else None
        if "wall_ms_per_cycle" in agg.get("fp8", {}) and "wall_ms_per_cycle" in agg.get("fp4", {}):
            agg.setdefault("fp8_over_fp4", {})["wall_ms_per_cycle"] = (
                agg["fp8"]["wall_ms_per_cycle"]["median"] / agg["fp4"]["wall_ms_per_cycle"]["median"])
    return {"steps": steps, "layers": layers, "full_depth": full_depth, "rows": rows, "wall_rows": wall_rows,
            "shapes": out}


def print_timeline_summary(summary: dict) -> None:
    """The summary of ``timeline_summary`` as a table: per shape and field, FP8 and FP4 as median [min-max] over
    their traces, and FP8 / FP4."""
    print(f"GPU timeline per cycle (µs; median [min-max] over traces; busy = union of kernel intervals, span = first "
          f"kernel start to last end; {summary['layers']} layers measured, projected rows labelled)")
    for shape, agg in summary["shapes"].items():
        counts = ", ".join(f"{f} {agg[f]['traces']} traces in {len(agg[f]['runs'])} runs" for f in ("fp8", "fp4")
                           if f in agg)
        print(f"{shape}: {counts}")
        for key, _ in _SUMMARY_FIELDS:
            cells = []
            for fmt in ("fp8", "fp4"):
                v = agg.get(fmt, {}).get(key)
                cells.append(f"{v['median']:9.1f} [{v['min']:.1f}-{v['max']:.1f}]" if v else f"{'-':>9}")
            ratio = agg.get("fp8_over_fp4", {}).get(key)
            print(f"  {key:<20}" + "".join(f"{c:>30}" for c in cells) + (f"   {ratio:.3f}x" if ratio else ""))
        if any("wall_ms_per_cycle" in agg.get(f, {}) for f in ("fp8", "fp4")):
            cells = []
            for fmt in ("fp8", "fp4"):
                v = agg.get(fmt, {}).get("wall_ms_per_cycle")
                cells.append(f"{v['median']:9.3f} [{v['min']:.3f}-{v['max']:.3f}]" if v else f"{'-':>9}")
            ratio = agg.get("fp8_over_fp4", {}).get("wall_ms_per_cycle")
            print(f"  {'wall_ms_per_cycle':<20}" + "".join(f"{c:>30}" for c in cells)
                  + (f"   {ratio:.3f}x" if ratio else "") + "   (client, between streamed chunks; per server median)")
            toks = [agg.get(f, {}).get("tokens_per_cycle") for f in ("fp8", "fp4")]
            print(f"  {'tokens_per_cycle':<20}" + "".join(f"{(f'{t:.2f}' if t is not None else '-'):>30}" for t in toks))


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


def host_time_record(seconds: list[float]) -> dict:
    """What ``--indexer-host-time`` writes: ``host_time_summary`` and every call's host time in call order
    (``samples_us``, µs), so that a spread can be read again from the raw file.

    Raises:
        ValueError: as ``host_time_summary``.
    """
    return dict(host_time_summary(seconds), samples_us=[t * 1e6 for t in seconds])


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
            json.dump(host_time_record(times), f)
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
    cmd = launch_command(opts.model, opts.port, server_args, fp4=opts.fp4)
    client_env = dict(os.environ)
    if importlib.util.find_spec("datasets") is None:
        # SGLang's benchmark client imports Hugging Face datasets, which random-ids prompts never call:
        # scripts/bench_standins/datasets stands in for it where it is not installed (the GPU machine).
        standins = os.path.join(SCRIPTS, "bench_standins")
        client_env["PYTHONPATH"] = os.pathsep.join(x for x in (os.environ.get("PYTHONPATH"), standins) if x)
    with launched_server(cmd, opts.port, opts.out + ".server.log", opts.ready_timeout) as base:
        for il in opts.input_lens:
            subprocess.run(bench_serving_command(base, input_len=il, output_len=opts.output_len, prompts=opts.prompts,
                                                 concurrency=opts.concurrency, output_file=opts.out),
                           check=True, env=client_env)
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
                   activities: tuple[str, ...] = ("CPU", "GPU"), repeats: int = 1,
                   wall_s: float = 0.0, wall_path: str | None = None) -> str | list[str]:
    """Profile ``steps`` decode batches of a running server while ``batch`` requests of ``input_len`` random
    token ids decode together; returns the trace's path (``repeats`` > 1: the list of the traces' paths).

    The requests stream from threads; once every one of them has streamed a token past its first (its prefill
    done, so the batches that follow are decode batches of all of them), ``/start_profile`` (``profile_body``)
    is posted and the DECODE trace awaited. With ``repeats`` > 1 that is done ``repeats`` times, one after the
    other while the same requests keep decoding (one prefill for all of them), the k-th trace under the prefix
    ``PREFIX_rk``. Whatever happens, the requests are then aborted (``/abort_request``, all of them), so none of
    them joins a later shape's batches.

    With ``wall_s`` > 0 and a ``wall_path``, before the first profile the client times ``wall_s`` seconds of the
    streamed chunks (SGLang streams one chunk per request and decode batch, or MTP verify cycle, at its default
    stream interval 1): each chunk's arrival (``time.monotonic``, seconds) and SGLang's ``completion_tokens`` so
    far, per request, written to ``wall_path`` as JSON (``wall_stats`` reads it): the wall time per cycle as a
    client sees it, host and scheduler included, with no profiler running.

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
    arrivals: list[list[tuple[float, int | None]]] = [[] for _ in range(batch)]
    timing = threading.Event()  # set while the wall window is open: only then are chunk arrivals kept
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
                    if timing.is_set():
                        meta = chunk.get("meta_info") if isinstance(chunk, dict) else None
                        arrivals[i].append((time.monotonic(),
                                            meta.get("completion_tokens") if isinstance(meta, dict) else None))
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

    if repeats < 1:
        raise ValueError(f"repeats: expected >= 1, got {repeats}")
    prefixes = [prefix] if repeats == 1 else [f"{prefix}_r{k + 1}" for k in range(repeats)]
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(batch)]
    for t in threads:
        t.start()
    deadline = time.time() + timeout
    paths = []
    try:
        while min(tokens) < 2:
            check("not all requests decoding", deadline)
            time.sleep(0.2)
        if wall_s > 0 and wall_path:
            t0 = time.monotonic()
            timing.set()
            while time.monotonic() < t0 + wall_s:
                check("no wall time", deadline)
                time.sleep(0.05)
            timing.clear()
            t1 = time.monotonic()
            record = {"batch": batch, "input_len": input_len, "window_s": t1 - t0,
                      "requests": [[(t - t0, n) for t, n in list(a) if t0 <= t <= t1] for a in arrivals]}
            with open(wall_path, "w") as f:
                json.dump(record, f)
        for name in prefixes:
            pattern = os.path.join(out_dir, f"{name}-*DECODE.trace.json.gz")
            before = set(glob.glob(pattern))
            answer = post_json(base + "/start_profile", profile_body(out_dir, steps, name, activities), 60.0)
            if "error" in answer:
                raise RuntimeError(f"{batch} x {input_len}: /start_profile: {answer['error']}")
            while not (new := set(glob.glob(pattern)) - before):
                check(f"no decode trace in {out_dir}", deadline)
                time.sleep(0.5)
            # The next profile may start only once this one is written (SGLang refuses one while another runs).
            paths.append(_whole_trace(sorted(new)[0], lambda what: check(what, deadline), batch, input_len))
    finally:
        stop.set()
        post_json(base + "/abort_request", {"abort_all": True}, 60.0)  # SGLang's AbortReq; never raises
    return paths[0] if repeats == 1 else paths


def _whole_trace(path: str, check, batch: int, input_len: int) -> str:
    """Wait until ``path`` (a trace SGLang is writing) reads whole; returns it. ``check(what)`` raises once the
    caller's deadline has passed or a request failed; ``TraceUnreadable`` as ``profile_decode`` says."""
    import time

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
            check(f"{path} not complete")
            time.sleep(1.0)
        except ValueError as e:  # complete, yet not JSON even after load_trace's repairs: no use waiting
            raise TraceUnreadable(path, f"{batch} x {input_len}: the decode trace is not JSON: {e}") from None


def profile_shape(base: str, batch: int, input_len: int, *, name: str, raw: str, out_dir: str,
                  **kwargs) -> str | list[str]:
    """``profile_decode`` for one shape into ``out_dir/NAME.trace.json.gz``; returns that path (with ``repeats``
    > 1 in ``kwargs``: ``out_dir/NAME_rK.trace.json.gz`` for K = 1..repeats, as a list).

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
    # Moved out before the next shape: a later prefill may make SGLang write another trace of this prefix.
    if isinstance(path, str):
        final = os.path.join(out_dir, f"{name}.trace.json.gz")
        shutil.move(path, final)
        return final
    finals = [os.path.join(out_dir, f"{name}_r{k + 1}.trace.json.gz") for k in range(len(path))]
    for src, dst in zip(path, finals):
        shutil.move(src, dst)
    return finals


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
    p.add_argument("--repeats", type=int, default=1,
                   help="traces per shape, one after the other while the same requests decode (names FMT_BxL_rK)")
    p.add_argument("--activities", nargs="+", default=["CPU", "GPU"], choices=["CPU", "GPU"],
                   help="what SGLang's profiler records (the tables read GPU kernels only)")
    p.add_argument("--wall-s", type=float, default=0.0,
                   help="seconds of streamed chunks timed at the client before the first trace, into "
                        "FMT_BATCHxINPUT.wall.json (the wall time per cycle; 0: none)")
    opts, server_args = p.parse_known_args(argv)
    try:
        shapes = parse_shapes(opts.shapes)
    except ValueError as e:
        p.error(str(e))
    if opts.steps < 1:
        p.error(f"--steps: expected >= 1, got {opts.steps}")
    if opts.repeats < 1:
        p.error(f"--repeats: expected >= 1, got {opts.repeats}")
    if opts.wall_s < 0:
        p.error(f"--wall-s: expected >= 0 seconds, got {opts.wall_s}")
    fmt = "fp4" if opts.fp4 else "fp8"
    os.makedirs(opts.out_dir, exist_ok=True)
    raw = os.path.join(opts.out_dir, f"raw_{fmt}")
    cmd = launch_command(opts.model, opts.port, server_args, fp4=opts.fp4)
    rc = 0
    with launched_server(cmd, opts.port, os.path.join(opts.out_dir, f"server_{fmt}.log"), opts.ready_timeout) as base:
        for b, il in shapes:
            name = f"{fmt}_{b}x{il}"
            try:
                profile_shape(base, b, il, name=name, raw=raw, out_dir=opts.out_dir, steps=opts.steps,
                              output_len=opts.output_len, timeout=opts.timeout, repeats=opts.repeats,
                              activities=tuple(opts.activities), wall_s=opts.wall_s,
                              wall_path=os.path.join(opts.out_dir, f"{name}.wall.json"))
            except RuntimeError as e:
                print(f"{name}: {e}", file=sys.stderr)
                rc = 1
                continue
            print(f"{name}: {opts.steps} decode batches profiled, {opts.repeats} time(s)")
    shutil.rmtree(raw, ignore_errors=True)
    return rc


def _serving_table(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="sglang_bench.py serving-table")
    p.add_argument("--fp8", required=True, help="the FP8 serving run's JSONL")
    p.add_argument("--fp4", required=True, help="the FP4 serving run's JSONL")
    p.add_argument("--json")
    opts = p.parse_args(argv)
    runs = []
    for name in (opts.fp8, opts.fp4):
        try:
            runs.append(read_jsonl(name))
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


def _timeline(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="sglang_bench.py timeline")
    p.add_argument("traces", nargs="+", help="serving-profile traces, FMT_BATCHxINPUT[_rK].trace.json.gz, and "
                   "wall records FMT_BATCHxINPUT.wall.json")
    p.add_argument("--steps", type=int, required=True, help="decode (or MTP verify) cycles in each trace")
    p.add_argument("--layers", type=int, help="the served model's decoder layers (projects to --full-depth)")
    p.add_argument("--full-depth", type=int, default=61, help="layers of the model projected to (V3.2: 61)")
    p.add_argument("--json")
    opts = p.parse_args(argv)
    try:
        walls = [t for t in opts.traces if t.endswith(".wall.json")]
        traces = [t for t in opts.traces if not t.endswith(".wall.json")]
        summary = timeline_summary(traces, opts.steps, opts.layers, opts.full_depth, walls)
    except ValueError as e:
        p.error(str(e))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(summary, f, indent=1)
    print_timeline_summary(summary)
    return 0


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("one-batch", "serving", "serving-profile", "serving-table",
                                                "profile-table", "timeline"):
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
    if sys.argv[1] == "timeline":
        return _timeline(sys.argv[2:])
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
