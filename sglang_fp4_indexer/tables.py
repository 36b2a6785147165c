"""The measured tables ``check --context`` quotes: indexer scorer times on H200 and top-k recall.

``sglang_fp4_indexer/data/h200_tables.json`` ships inside the package. It is
made by ``scripts/update_check_tables.py BENCH_JSON ACCURACY_JSON`` from a
``sglang-fp4-indexer bench --json`` report measured on an H200 and an
``accuracy.json`` of ``sglang-fp4-indexer accuracy`` (``build_tables``); nothing
in it is estimated. ``check`` looks up the measured shape nearest the user's
(``nearest_timing``) and the measured context nearest theirs
(``nearest_recall``), and names what it picked.

Timing rows (per scorer call of one layer, microseconds):

- ``fp4_us``: this package's paged FP4 scorer (the report's default ``ours``
  column: ``ours`` or ``ours[auto]``, else the first ``ours[...]`` column);
- ``fp8_us``: DeepGEMM's FP8 scorer as SGLang 0.5.23 calls it on that GPU (the
  ``deepgemm-fp8`` column), ``None`` when the report has no such measurement;
- ``fp8_native_us``: DeepGEMM with its native next_n (``deepgemm-fp8-native``), or ``None``;
- ``fp8_sm90_newer_us``: DeepGEMM's newer SM90 kernel (native next_n up to 4; SGLang 0.5.23 does not call it), from
  the ``deepgemm-fp8-sm90-multicast`` column, or ``None`` where the report has no passing time of it;
- ``fp4_floor_us`` / ``fp8_floor_us``: the HBM floors of the two formats at
  that shape (bytes over the copy bandwidth measured in the same run), a lower
  bound for any scorer of that format, not a measurement of one.

Recall rows: mean top-k recall against exact scoring of ``FP4`` and ``FP8`` per
(workload, context, H).

Model rows (optional, ``model``): what FP4 and FP8 index keys cost a real
model, from one or more ``model-accuracy.json`` of ``sglang-fp4-indexer model-accuracy``
(Gemma 3 270M with sparse attention in its global layers over the stand-in or a
trained indexer, on a CPU or a GPU): per complete (indexer, context, top-k) case, the loss
difference to dense attention of each format and FP4 - FP8, each ``[mean, standard error]`` in
nats per token over the windows, and passkey retrieval counts, each row naming its indexer and
where it ran; a case measured by several files is taken from the first given
(``nearest_model_cost``).

SGLang decode rows (optional, ``sglang``): the decode step inside SGLang's own
``bench_one_batch`` with FP8 and FP4 index keys on the same GPU in the same
run (its ``--fp8-gemm-backend`` and ``--tp-size`` recorded), from its ``--result-filename`` JSONL and the kernel table of a
torch-profiler trace of its decode steps (``scripts/sglang_bench.py
profile-table --json``): per (batch, input length), each format's median
decode step (ms, wall), the sum of kernel times per step (not a step time) and the indexer-logits
kernels' share of it (µs); ``measured_decode`` finds the row of exactly the
shape asked about.

Serving timing rows (optional, ``timing_serving``): the same timing-row fields, measured on another GPU
inside SGLang's own server (``scripts/sglang_bench.py serving-profile``: SGLang's profiler over a few
decode steps of DeepSeek-V3.2's layer sizes, FP8 and FP4 servers on one machine): each format's scorer
kernel time per decode step over the model's indexer layers (``serving_timing_section``); no floors,
no native next_n. ``check`` quotes them for that GPU, as it quotes ``timing`` for its own.

Further kernel-benchmark timing sections (optional, ``timing_more``: a list, one section per GPU, e.g. an H100's
runs at next_n 1, 2 and 4): the same timing-row fields from one or more ``bench --json`` reports of that GPU
(``bench_timing_section``); a shape measured by several reports takes, per column, the median of the passing
times of the newest day's reports that measured it (``runs``: how many). ``check`` quotes them for that GPU where ``timing_serving`` has no
row near the shape asked about.

Verify-cycle rows (optional, ``cycle``): a whole decode step or MTP verify cycle inside SGLang's server on the
GPU's timeline, FP8 against FP4 (``scripts/sglang_bench.py timeline``: the busy time, the union of kernel
intervals, median over traces of both run orders), on one DP-attention + EP8 rank of DeepSeek-V3.2 cut to a
number of layers, with the cycle projected to the full 61 layers from the measured per-layer time
(``verify_cycle_section``); ``measured_cycle`` (``cycle_row`` of any one section) finds the row of exactly the shape and next_n asked about.
Further verify-cycle sections measured on other GPUs or ranks (optional, ``cycle_more``: a list of sections of the
same form, each with its ``gpu`` and its ``rank``, e.g. all 61 layers of a DP-attention + EP32 rank on an H100);
``cycle_sections`` lists them all, ``cycle`` first. A section may also hold KV-limited serving loads measured on
its rank (``loads``, each a ``kv_limited_load``: more requests than FP8's pool holds, output tokens/s of both
formats); ``cycle_load`` finds the one of exactly the per-rank concurrency, context and next_n asked about.
A verify-cycle section of GLM-5's layers (optional, ``cycle_fused``, with its ``model``): there FP4 also changes
SGLang's index path (the unfused index-query path and the plugin's rotation in place of SGLang's fused kernels), so
``check`` quotes it for that path only, never among DeepSeek-V3.2's sections.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from importlib import resources
from pathlib import Path

__all__ = [
    "TABLES_FORMAT",
    "TABLES_RESOURCE",
    "build_tables",
    "load_tables",
    "nearest_timing",
    "timing_is_near",
    "nearest_recall",
    "nearest_model_cost",
    "model_indexers",
    "sglang_decode_section",
    "serving_timing_section",
    "bench_timing_section",
    "measured_decode",
    "verify_cycle_section",
    "measured_cycle",
    "cycle_row",
    "cycle_sections",
    "kv_limited_load",
    "kv_pools",
    "cycle_load",
]

#: ``format`` field of the tables file.
TABLES_FORMAT = "sglang-fp4-indexer check tables 1"
#: The packaged file, relative to the package.
TABLES_RESOURCE = "data/h200_tables.json"
#: Benchmark columns: DeepGEMM FP8 as SGLang calls it, and with its native next_n.
_FP8_COLUMN = "deepgemm-fp8"
_FP8_NATIVE_COLUMN = "deepgemm-fp8-native"
#: DeepGEMM's newer SM90 kernel (native next_n up to 4), which SGLang 0.5.23 does not call.
_FP8_NEWER_COLUMN = "deepgemm-fp8-sm90-multicast"


def _us(seconds) -> float | None:
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not math.isfinite(seconds):
        return None
    return round(seconds * 1e6, 3)


def _ok_us(results: dict, name: str | None) -> float | None:
    res = results.get(name or "", {})
    return _us(res.get("seconds")) if res.get("status") == "ok" else None


def _ours_column(names: list[str]) -> str | None:
    for name in ("ours", "ours[auto]"):
        if name in names:
            return name
    return next((n for n in names if n.startswith("ours")), None)


def _timing(bench: dict, source: str) -> dict:
    try:
        meta, scorers, rows = bench["meta"], bench["scorers"], bench["rows"]
        names = [s["name"] for s in scorers]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{source}: not a 'sglang-fp4-indexer bench --json' report (missing {exc})") from None
    if meta.get("device_type") != "cuda":
        raise ValueError(f"{source}: measured on {meta.get('device', '?')}, not on a GPU; "
                         "the table quotes GPU times only")
    ours = _ours_column(names)
    if ours is None:
        raise ValueError(f"{source}: no column of this package's scorer ('ours'); columns: {names}")
    out = []
    for row in rows:
        try:
            results = row["results"]
            entry = {key: int(row[key]) for key in ("heads", "batch", "context", "next_n")}
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{source}: a scorer row lacks {exc}") from None
        entry["fp4_us"] = _ok_us(results, ours)
        if entry["fp4_us"] is None:
            continue  # no passing measurement of ours at this shape
        entry["fp8_us"] = _ok_us(results, _FP8_COLUMN)
        entry["fp8_native_us"] = _ok_us(results, _FP8_NATIVE_COLUMN)
        entry["fp8_sm90_newer_us"] = _ok_us(results, _FP8_NEWER_COLUMN)
        entry["fp4_floor_us"] = _us(row.get("fp4_floor_s"))
        entry["fp8_floor_us"] = _us(row.get("fp8_floor_s"))
        out.append(entry)
    if not out:
        raise ValueError(f"{source}: no shape where this package's scorer ({ours}) passed its check")
    stack = ", ".join(f"{lib} {meta[lib]}" for lib in ("torch", "triton") if meta.get(lib))
    return {"gpu": meta.get("device", "?"), "date": str(meta.get("date", ""))[:10], "stack": stack, "fp4_column": ours,
            "fp8_measured": any(r["fp8_us"] is not None for r in out), "rows": out}


def _recall(accuracy: dict, source: str) -> dict:
    try:
        cases, topk = accuracy["cases"], int(accuracy["topk"])
        rows = [{"workload": str(c["workload"]), "context": int(c["context"]), "heads": int(c["heads"]),
                 "fp4": float(c["formats"]["FP4"]["recall_mean"]), "fp8": float(c["formats"]["FP8"]["recall_mean"])}
                for c in cases]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{source}: not an accuracy.json of 'sglang-fp4-indexer accuracy' (missing {exc})") from None
    if not rows:
        raise ValueError(f"{source}: no accuracy cases")
    env = accuracy.get("environment") or {}
    return {"device": env.get("gpu") or env.get("device") or accuracy.get("device", "?"), "topk": topk, "rows": rows}


def _model(docs: list[dict], sources: list[str]) -> dict:
    """The ``model`` section from several studies' results (``sources`` names them, in the same order).

    A case (indexer, what a trained indexer was trained on, context, top-k) measured by several is taken from
    the first given; rows are ordered stand-in first, then by context and top-k.

    Raises:
        ValueError: a result that is not a study's or has no complete loss case, or studies of different models.
    """
    def key(r):
        return r["indexer"], r.get("trained_on"), r["context"], r["topk"]

    rows, seen, models = [], set(), set()
    for doc, source in zip(docs, sources):
        own = _model_rows(doc, source)
        models.add(str(doc.get("model", "?")))
        rows += [r for r in own if key(r) not in seen]
        seen |= {key(r) for r in own}
    if len(models) > 1:
        raise ValueError(f"{', '.join(sources)}: studies of different models ({', '.join(sorted(models))})")
    rows.sort(key=lambda r: (r["indexer"] != "stand-in", r["indexer"], r.get("trained_on") or "", r["context"],
                             r["topk"]))
    return {"model": models.pop(), "sources": list(sources), "rows": rows}


def _model_rows(doc: dict, source: str) -> list[dict]:
    """One study's complete (context, top-k) cases as model rows, each naming its indexer, device and source.

    Raises:
        ValueError: not a study's result, or no complete loss case (naming ``source``).
    """
    from .model_study.report import study_device, summarize, trained_on

    try:
        summary = summarize(doc)
        device, on = study_device(doc), trained_on(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{source}: not a model-accuracy.json of 'sglang-fp4-indexer model-accuracy' ({exc})") from None
    indexer = "trained" if doc.get("indexer_kind") == "trained" else "stand-in"
    rows = []
    for ctx, case in sorted(summary["loss"].items()):
        if case["windows"] < int(doc.get("windows") or 0):
            continue  # an interrupted case: not quoted
        for k, row in sorted(case["topk"].items()):
            entry = {"indexer": indexer, **({"trained_on": on} if on else {}), "device": device, "source": source,
                     "context": ctx, "topk": k, "windows": case["windows"],
                     **{f"delta_{f}": list(row["delta"][f]) for f in ("exact", "fp8", "fp4")},
                     "fp4_minus_fp8": list(row["fp4_minus_fp8"]),
                     **{f"recall_{f}": row["recall"][f][0] for f in ("fp8", "fp4") if f in row["recall"]},
                     **({"attention_recall_exact": row["attention_recall"]["exact"][0]}
                        if "attention_recall" in row else {})}
            pk = summary["passkey"].get(ctx)
            if pk and k in pk["topk"]:
                for name, key in (("dense", "dense"), (f"fp8 k={k}", "fp8"), (f"fp4 k={k}", "fp4")):
                    entry[f"passkey_{key}"] = list(pk["variants"][name]["retrieved"])
            rows.append(entry)
    if not rows:
        raise ValueError(f"{source}: no complete loss case")
    return rows


def sglang_decode_section(one_batch: list[dict], profiles: dict, *, gpu: str, date: str, model: str,
                          index_heads: int, kv_cache_dtype: str, fp8_gemm_backend: str, tp_size: int,
                          sources: list[str]) -> dict:
    """The ``sglang`` section: FP8 against FP4 decode steps measured inside SGLang's ``bench_one_batch``.

    Args:
        one_batch: the lines of ``bench_one_batch --result-filename`` (dicts with ``run_name`` ``"fp8"`` or
            ``"fp4"``, ``batch_size``, ``input_len``, ``median_decode_latency`` in seconds); lines of other
            run names (e.g. eager host-time runs) are left out.
        profiles: ``profile-table --json`` results merged: trace path -> ``{"us_per_step": {category: µs},
            "total_us_per_step": µs}``; a path names its run as ``prof_<fp8|fp4>_batch<B>_input<L>_...``
            (``bench_one_batch --profile-prefix``).
        gpu, date, model, kv_cache_dtype: what was measured (recorded, and quoted with the numbers).
        index_heads: the model's index heads (``check`` quotes a row only for a model with as many).
        fp8_gemm_backend, tp_size: the runs' ``--fp8-gemm-backend`` and ``--tp-size`` (``check`` quotes a row
            only for server flags with the same).
        sources: the files read, recorded.

    Returns:
        ``{"gpu", "date", "model", "index_heads", "kv_cache_dtype", "fp8_gemm_backend", "tp_size", "sources",
        "rows": [{"batch", "context",
        "fp8": {"decode_ms", "kernel_us", "indexer_us"}, "fp4": {...}}]}``; a format's ``kernel_us`` /
        ``indexer_us`` are None where no trace of that run was given.

    Raises:
        ValueError: no shape with both an FP8 and an FP4 line.
    """
    steps: dict = {}
    for line in one_batch:
        fmt = line.get("run_name")
        if fmt in ("fp8", "fp4"):
            steps[(int(line["batch_size"]), int(line["input_len"]), fmt)] = float(line["median_decode_latency"])
    kernels: dict = {}
    for path, prof in profiles.items():
        m = re.search(r"prof_(fp8|fp4)_batch(\d+)_input(\d+)_", path)
        if m:
            kernels[(int(m[2]), int(m[3]), m[1])] = (prof["total_us_per_step"],
                                                     prof["us_per_step"].get("indexer logits"))
    rows = []
    for b, il in sorted({(b, il) for b, il, _ in steps}):
        if (b, il, "fp8") not in steps or (b, il, "fp4") not in steps:
            continue
        row = {"batch": b, "context": il}
        for fmt in ("fp8", "fp4"):
            kern, idx = kernels.get((b, il, fmt), (None, None))
            row[fmt] = {"decode_ms": steps[(b, il, fmt)] * 1e3, "kernel_us": kern, "indexer_us": idx}
        rows.append(row)
    if not rows:
        raise ValueError("SGLang one-batch results: no shape measured with both FP8 and FP4 "
                         "(run names 'fp8' and 'fp4')")
    return {"gpu": gpu, "date": date, "model": model, "index_heads": index_heads, "kv_cache_dtype": kv_cache_dtype,
            "fp8_gemm_backend": fp8_gemm_backend, "tp_size": tp_size, "sources": sources, "rows": rows}


#: The scorer kernels of each format in a torch-profiler kernel table (``profile-table --json`` ``top_kernels``).
_SCORER_KERNELS = {"fp4": "fp4_paged_logits", "fp8": "fp8_paged_mqa_logits"}


def serving_timing_section(profiles: dict, *, gpu: str, date: str, stack: str, layers: int, index_heads: int,
                           method: str, sources: list[str]) -> dict:
    """The ``timing_serving`` section: the scorer per layer and decode step, FP4 against FP8, inside SGLang's server.

    Args:
        profiles: ``profile-table --json`` results merged: trace path -> ``{"top_kernels": [[name, µs per
            step], ...], ...}``; a path's file name ``<fp8|fp4>_<B>x<L>.trace.json.gz`` names its run (as
            ``serving-profile`` writes them); other files (e.g. a GPU-only cross-check) are left out.
        gpu, date, stack, method: what was measured where and how (recorded, and quoted with the numbers).
        layers: the indexer layers each decode step ran (the kernel's time per step is divided by it).
        index_heads: the model's index heads.
        sources: the files read, recorded.

    Returns:
        A ``timing``-shaped section (``gpu``, ``date``, ``stack``, ``method``, ``layers``, ``fp4_column`` ``"ours"``,
        ``fp8_measured``, ``sources``, ``rows`` of ``heads``, ``batch``, ``context``, ``next_n`` 1, ``fp4_us``,
        ``fp8_us``, and ``None`` floors and native next_n).

    Raises:
        ValueError: ``layers`` below 1, a run whose kernel table lacks its scorer kernel, two traces of one run, or
            no shape with both formats.
    """
    if layers < 1:
        raise ValueError(f"layers: expected >= 1, got {layers}")
    per: dict = {}
    for path, prof in profiles.items():
        m = re.fullmatch(r"(fp8|fp4)_(\d+)x(\d+)\.trace\.json(?:\.gz)?", Path(path).name)
        if not m:
            continue
        fmt, pattern = m[1], _SCORER_KERNELS[m[1]]
        if (int(m[2]), int(m[3]), fmt) in per:
            raise ValueError(f"{path}: a second {Path(path).name} among the profiles (one trace per run)")
        us = sum(v for name, v in prof["top_kernels"] if pattern in name)
        if not us:
            raise ValueError(f"{path}: no {pattern} kernel among its longest kernels")
        per[(int(m[2]), int(m[3]), fmt)] = us / layers
    rows = [{"heads": index_heads, "batch": b, "context": c, "next_n": 1, "fp4_us": per[(b, c, "fp4")],
             "fp8_us": per[(b, c, "fp8")], "fp8_native_us": None, "fp4_floor_us": None, "fp8_floor_us": None}
            for b, c in sorted({(b, c) for b, c, _ in per}) if (b, c, "fp4") in per and (b, c, "fp8") in per]
    if not rows:
        raise ValueError("serving profiles: no shape profiled with both FP8 and FP4 (fp8_BxL / fp4_BxL traces)")
    return {"gpu": gpu, "date": date, "stack": stack, "method": method, "layers": layers, "fp4_column": "ours",
            "fp8_measured": True, "sources": sources, "rows": rows}


#: The timing-row fields a ``timing_more`` row takes the median of over the reports that measured its shape (µs).
_MEDIAN_FIELDS = ("fp4_us", "fp8_us", "fp8_native_us", "fp8_sm90_newer_us", "fp4_floor_us", "fp8_floor_us")


def bench_timing_section(benches: list[dict], sources: list[str]) -> dict:
    """One ``timing_more`` section: the scorer alone, FP4 against FP8, from ``bench --json`` reports of one GPU.

    Each report is read as ``timing`` is (``_timing``: the shapes where this package's scorer passed its check).
    A shape (heads, batch, context, next_n) measured by several reports takes the reports of the newest date that
    measured it (``meta.date``'s day: an older report may have measured an older kernel) and, per field, the median
    of the values those have (``statistics.median``: of two, their mean; ``None`` where none has one), and records
    how many reports it took as ``runs``; rows keep the order in which the reports first give their shapes.

    Args:
        benches: ``sglang-fp4-indexer bench --json`` reports, each measured on a CUDA device, all on the same GPU
            (``meta.device``).
        sources: a name per report, in the same order (messages, and recorded as ``sources``).

    Returns:
        ``{"gpu", "date", "stack", "method", "fp4_column", "fp8_measured", "sources", "rows"}``: ``date``, ``stack``
        and ``fp4_column`` the reports' distinct values joined with ", "; a row: ``heads``, ``batch``,
        ``context``, ``next_n``, ``fp4_us``, ``fp8_us``, ``fp8_native_us``, ``fp8_sm90_newer_us``,
        ``fp4_floor_us``, ``fp8_floor_us`` (µs per scorer call of one layer) and ``runs``.

    Raises:
        ValueError: no report, not one source per report, reports of different GPUs, or a report ``_timing``
            refuses (naming its source).
    """
    if not benches or len(sources) != len(benches):
        raise ValueError(f"sources: expected one name per bench report ({len(benches)}), got {sources!r}")
    parts = [_timing(bench, source) for bench, source in zip(benches, sources)]
    gpus = list(dict.fromkeys(p["gpu"] for p in parts))
    if len(gpus) > 1:
        raise ValueError(f"{', '.join(sources)}: bench reports of different GPUs ({', '.join(gpus)}); one section "
                         "per GPU")
    shapes: dict[tuple, list[tuple[str, dict]]] = {}
    for part in parts:
        for r in part["rows"]:
            shapes.setdefault(tuple(r[k] for k in ("heads", "batch", "context", "next_n")), []).append((part["date"], r))
    rows = []
    for shape, dated in shapes.items():
        newest = max(day for day, _ in dated)
        measured = [r for day, r in dated if day == newest]
        row = dict(zip(("heads", "batch", "context", "next_n"), shape))
        for field in _MEDIAN_FIELDS:
            values = [r[field] for r in measured if r[field] is not None]
            row[field] = round(statistics.median(values), 4) if values else None
        rows.append({**row, "runs": len(measured)})
    joined = lambda key: ", ".join(dict.fromkeys(p[key] for p in parts if p[key]))  # noqa: E731
    return {"gpu": gpus[0], "date": joined("date"), "stack": joined("stack"),
            "method": "the scorer alone, sglang-fp4-indexer bench under CUDA graphs", "fp4_column": joined("fp4_column"),
            "fp8_measured": any(r["fp8_us"] is not None for r in rows), "sources": list(sources), "rows": rows}


def verify_cycle_section(timelines: list[tuple[dict, int]], *, gpu: str, date: str, stack: str, method: str,
                         sources: list[str], rank: str | None = None, moe_gpus: int | None = None,
                         other_orders: list[tuple[dict, int]] | None = None,
                         other_order_sources: list[str] | None = None, loads: list[dict] | None = None,
                         load_sources: list[str] | None = None, model: str | None = None) -> dict:
    """The ``cycle`` section: per measured shape and next_n, a server's busy time per decode step or verify cycle
    with FP8 and FP4 index keys, at the depth measured and projected to the model's full depth.

    Args:
        timelines: ``(summary, next_n)`` pairs: a ``sglang_bench.py timeline --json`` summary (``layers``,
            ``full_depth``, ``shapes`` with per-format ``busy_us`` and ``projected_busy_us`` medians) and the next_n
            its server verified (1: MTP off).
        gpu, date, stack, method, sources: what was measured where and how (recorded, quoted with the numbers).
        rank: what one GPU of the deployment held, as ``check`` names it (e.g. "DP-attention + EP32 rank"); None:
            not recorded (``check`` then says "DP-attention rank").
        moe_gpus: over how many GPUs the deployment spread the routed experts (its ``--tp-size``, with EP or
            TP for the experts: a rank's expert bytes are the same); None: not recorded (not compared).
        other_orders: ``(summary, next_n)`` pairs of the same shapes measured again with the servers in the other
            run order (e.g. FP4's server first, on another machine), or None; each of their shapes must be a row's.
        other_order_sources: where those came from (recorded as ``other_order_sources``); one per pair.
        loads: ``kv_limited_load`` results measured on the same rank, or None (recorded as ``loads``).
        load_sources: where those came from (recorded as ``load_sources``: per load, its FP8 and FP4 result lines
            and their printed pool lines, then the same three for each of its other run orders); needed with
            ``loads``.
        model: the model whose layers the rank ran, as ``check`` names it (e.g. "GLM-5"); None: DeepSeek-V3.2
            (not recorded).

    Returns:
        ``{"gpu", "date", "stack", "method", "sources", "rows"}`` (and ``rank``, ``moe_gpus``,
        ``other_order_sources``, ``loads``, ``load_sources`` and ``model`` where given); a row: ``batch``, ``context``, ``next_n``, ``layers``, ``full_depth``,
        ``traces`` (per format, fewest), ``fp8_ms`` / ``fp4_ms`` (busy time per cycle at ``layers``), ``fp8_61_ms``
        / ``fp4_61_ms`` (projected to ``full_depth``), and, where another order measured it, ``other_orders``: a
        list of ``{"fp8_ms", "fp4_ms", "traces"}``, one per such summary.

    Raises:
        ValueError: a summary without a layer count, a shape without both formats, a next_n below 1, the same
            shape and next_n twice, an other-order shape no row has (or measured at another depth),
            ``other_order_sources`` not one per ``other_orders`` pair, or ``loads`` without ``load_sources``.
    """
    def busy(agg: dict, shape: str, what: str) -> dict:  # one shape's medians, both formats
        if "fp8" not in agg or "fp4" not in agg:
            raise ValueError(f"{what}: {shape} lacks FP8 or FP4 traces")
        return {"traces": min(agg["fp8"]["traces"], agg["fp4"]["traces"]),
                "fp8_ms": agg["fp8"]["busy_us"]["median"] / 1e3, "fp4_ms": agg["fp4"]["busy_us"]["median"] / 1e3}

    rows: dict[tuple[int, int, int], dict] = {}
    for summary, next_n in timelines:
        if not isinstance(next_n, int) or next_n < 1:
            raise ValueError(f"next_n: expected an int >= 1, got {next_n!r}")
        if not summary.get("layers"):
            raise ValueError("timeline summary: no layer count (made without --layers): nothing to project")
        for shape, agg in sorted(summary["shapes"].items()):
            b, c = (int(x) for x in shape.split("x"))
            medians = busy(agg, shape, "timeline summary")
            if (b, c, next_n) in rows:
                raise ValueError(f"timeline summaries: {shape} at next_n {next_n} twice")
            rows[(b, c, next_n)] = {"batch": b, "context": c, "next_n": next_n, "layers": summary["layers"],
                                    "full_depth": summary["full_depth"], **medians,
                                    "fp8_61_ms": agg["fp8"]["projected_busy_us"]["median"] / 1e3,
                                    "fp4_61_ms": agg["fp4"]["projected_busy_us"]["median"] / 1e3}
    others = list(other_orders or [])
    if len(others) != len(other_order_sources or []):
        raise ValueError(f"other_order_sources: expected one per other_orders summary ({len(others)}), got "
                         f"{other_order_sources!r}")
    for summary, next_n in others:
        for shape, agg in sorted(summary["shapes"].items()):
            b, c = (int(x) for x in shape.split("x"))
            row = rows.get((b, c, next_n))
            if row is None or summary.get("layers") != row["layers"]:
                raise ValueError(f"other_orders: {shape} at next_n {next_n} and {summary.get('layers')} layers is no "
                                 f"row of the first order's summaries")
            m = busy(agg, shape, "other_orders")
            row.setdefault("other_orders", []).append({k: m[k] for k in ("fp8_ms", "fp4_ms", "traces")})
    rows = list(rows.values())
    out = {"gpu": gpu, "date": date, "stack": stack, "method": method, "sources": sources, "rows": rows}
    if rank is not None:
        out["rank"] = rank
    if model is not None:
        out["model"] = model
    if moe_gpus is not None:
        out["moe_gpus"] = moe_gpus
    if others:
        out["other_order_sources"] = list(other_order_sources)
    if loads:
        if not load_sources:
            raise ValueError("load_sources: expected where the loads came from, got none")
        out["loads"], out["load_sources"] = list(loads), list(load_sources)
    return out


def kv_limited_load(fp8: dict, fp4: dict, *, fp8_pool: int, fp4_pool: int, next_n: int, layers: int,
                    full_depth: int, other_orders: list[tuple[dict, dict]] | None = None) -> dict:
    """One KV-limited serving load on a verify-cycle section's rank, as ``check`` quotes it: the same requests sent
    to an FP8 and an FP4 server, more at once than FP8's pool holds.

    Args:
        fp8, fp4: SGLang's ``bench_serving`` result line of each server (``random_input_len``, ``random_output_len``,
            ``max_concurrency``, ``completed``, ``output_throughput`` in tokens/s).
        fp8_pool, fp4_pool: the KV tokens each server's pool held (SGLang's "KV Cache is allocated" log line).
        next_n: the rows each request verified (4: MTP 3 steps / 4 draft tokens; 1: MTP off).
        layers, full_depth: the layers the rank ran and the model's.
        other_orders: ``(fp8, fp4)`` result lines of the same load run again with the servers in the other order
            (the FP4 server first), on pools of the same sizes; None or empty for one order only.

    Returns:
        ``{"context", "output_len", "concurrency", "completed", "next_n", "layers", "full_depth", "fp8_requests",
        "fp4_requests", "fp8_tok_s", "fp4_tok_s"}``; ``*_requests``: how many such requests (prompt and whole output,
        which SGLang reserves at admission when the output ignores EOS, as ``bench_serving``'s do) each pool holds;
        with ``other_orders``, also ``"other_orders": [{"fp8_tok_s", "fp4_tok_s"}, ...]``.

    Raises:
        ValueError: two lines of different loads (an other order's included), a request not completed, a
            non-positive pool, next_n or layer count, or a load FP8's pool holds whole (not KV-limited).
    """
    keys = ("random_input_len", "random_output_len", "max_concurrency", "completed")
    pairs = [("", fp8, fp4)] + [(f"other_orders[{i}]: ", a, b) for i, (a, b) in enumerate(other_orders or [])]
    for where, a, b in pairs:
        for line in (a, b):
            if any(line.get(k) != fp8.get(k) for k in keys):
                raise ValueError(f"kv_limited_load: {where}the FP8 and FP4 lines differ in {keys}: "
                                 f"{[a.get(k) for k in keys]} against {[b.get(k) for k in keys]}"
                                 + (f" (the first pair's: {[fp8.get(k) for k in keys]})" if where else ""))
    _require_positive(fp8_pool=fp8_pool, fp4_pool=fp4_pool, next_n=next_n, layers=layers, full_depth=full_depth)
    context, output_len, concurrency = fp8["random_input_len"], fp8["random_output_len"], fp8["max_concurrency"]
    if fp8["completed"] < concurrency:
        raise ValueError(f"kv_limited_load: {fp8['completed']} requests completed, fewer than the concurrency "
                         f"{concurrency}")
    per_request = context + output_len
    held = (fp8_pool // per_request, fp4_pool // per_request)
    if held[0] >= concurrency:
        raise ValueError(f"kv_limited_load: FP8's pool of {fp8_pool} tokens holds all {concurrency} requests of "
                         f"{per_request} tokens: not KV-limited")
    out = {"context": context, "output_len": output_len, "concurrency": concurrency, "completed": fp8["completed"],
           "next_n": next_n, "layers": layers, "full_depth": full_depth, "fp8_requests": held[0],
           "fp4_requests": held[1], "fp8_tok_s": fp8["output_throughput"], "fp4_tok_s": fp4["output_throughput"]}
    if other_orders:
        out["other_orders"] = [{"fp8_tok_s": a["output_throughput"], "fp4_tok_s": b["output_throughput"]}
                               for a, b in other_orders]
    return out


def kv_pools(printed: str) -> tuple[int, int]:
    """The KV tokens of an FP8 and an FP4 server's pools from their start-up lines as printed one after the other,
    in either order, each server's under its own ``## command ...`` heading (as the raw files under
    benchmarks/results/ keep them): SGLang's "KV Cache is allocated. ... #tokens: N" lines, the first of a block
    being the target model's; the FP4 server's block holds the plugin's "FP4 indexer active" line, the FP8
    server's does not.

    Returns:
        ``(fp8_tokens, fp4_tokens)``.

    Raises:
        ValueError: not exactly one block with a pool line and the "FP4 indexer active" line and one with a pool
            line without it.
    """
    from .serving import kv_pool_tokens  # SGLang's pool line, read as the serving harness reads a server's log

    found: dict[bool, list[int]] = {False: [], True: []}
    for block in re.split(r"^## ", printed, flags=re.M):
        pool = kv_pool_tokens(block)
        if pool["kv_cache_tokens"] is not None:
            found[pool["fp4_indexer_active"] is not None].append(pool["kv_cache_tokens"])
    if len(found[False]) != 1 or len(found[True]) != 1:
        raise ValueError(f"kv_pools: expected one FP8 and one FP4 server's pool line, each under its '## ' heading "
                         f"(the FP4 server's with 'FP4 indexer active'), found {len(found[False])} FP8 and "
                         f"{len(found[True])} FP4")
    return found[False][0], found[True][0]


def cycle_load(section: dict | None, batch: int, context: int, next_n: int) -> dict | None:
    """The KV-limited load of one verify-cycle section measured at exactly ``batch`` requests per rank at once
    (its concurrency), ``context`` tokens and ``next_n``, or None (also for no section or no loads).

    Raises:
        ValueError: a non-positive ``batch``, ``context`` or ``next_n``.
    """
    _require_positive(batch=batch, context=context, next_n=next_n)
    loads = (section or {}).get("loads") or []
    return next((x for x in loads if (x["concurrency"], x["context"], x["next_n"]) == (batch, context, next_n)), None)


def _require_positive(**values) -> None:
    """Raise ValueError naming the first of ``values`` that is not a positive int."""
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")


def cycle_sections(tables: dict) -> list[dict]:
    """Every verify-cycle section of ``tables``: ``cycle`` first, then each of ``cycle_more``; empty without them."""
    first = [tables["cycle"]] if tables.get("cycle") else []
    return first + list(tables.get("cycle_more") or [])


def measured_cycle(tables: dict, batch: int, context: int, next_n: int) -> dict | None:
    """The ``cycle`` section's row measured at exactly ``batch`` x ``context`` and ``next_n``, or None (a cycle's
    time mixes the indexer with every other kernel: quoted only where it was measured); ``cycle_row`` of that section.

    Raises:
        ValueError: a non-positive ``batch``, ``context`` or ``next_n``.
    """
    return cycle_row(tables.get("cycle"), batch, context, next_n)


def cycle_row(section: dict | None, batch: int, context: int, next_n: int) -> dict | None:
    """The row of one verify-cycle section (any of ``cycle_sections``) measured at exactly ``batch`` x ``context``
    and ``next_n``, or None (also for no section).

    Raises:
        ValueError: a non-positive ``batch``, ``context`` or ``next_n``.
    """
    _require_positive(batch=batch, context=context, next_n=next_n)
    rows = (section or {}).get("rows") or []
    return next((r for r in rows if (r["batch"], r["context"], r["next_n"]) == (batch, context, next_n)), None)


def measured_decode(tables: dict, batch: int, context: int) -> dict | None:
    """The ``sglang`` section's row measured at exactly ``batch`` requests of ``context`` tokens, or None.

    No nearest row: a decode step's time mixes the indexer with every other kernel, so it is quoted only at
    the shape it was measured at.

    Raises:
        ValueError: a non-positive ``batch`` or ``context``.
    """
    for name, value in (("batch", batch), ("context", context)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")
    rows = (tables.get("sglang") or {}).get("rows") or []
    return next((r for r in rows if r["batch"] == batch and r["context"] == context), None)


def build_tables(bench: dict, accuracy: dict, *, bench_source: str = "bench report",
                 accuracy_source: str = "accuracy.json", model_accuracy: dict | list[dict] | None = None,
                 model_source: str | list[str] = "model-accuracy.json", sglang: dict | None = None,
                 timing_serving: dict | None = None, cycle: dict | None = None,
                 cycle_more: list[dict] | None = None, cycle_fused: dict | None = None,
                 timing_more: list[dict] | None = None) -> dict:
    """The tables file's content from a GPU benchmark report and an accuracy result.

    Args:
        bench: a ``sglang-fp4-indexer bench --json`` report (``meta``, ``scorers``,
            ``rows`` with per-scorer ``results``), measured on a CUDA device.
        accuracy: an ``accuracy.json`` (``topk``, ``cases`` with ``formats``
            ``FP4``/``FP8`` ``recall_mean``).
        bench_source, accuracy_source, model_source: names for messages and the record (``model_source``: one
            per ``model_accuracy`` result, in the same order).
        model_accuracy: a ``model-accuracy.json`` (the real-model study) or a list of them (a case measured by
            several is taken from the first), or None (no ``model`` section).
        sglang: a ``sglang_decode_section`` result, or None (no ``sglang`` section).
        timing_serving: a ``serving_timing_section`` result, or None (no ``timing_serving`` section).
        cycle: a ``verify_cycle_section`` result, or None (no ``cycle`` section).
        cycle_more: further ``verify_cycle_section`` results (other GPUs or ranks), or None; needs ``cycle``.
        cycle_fused: a ``verify_cycle_section`` result of a model whose index path FP4 changes (GLM-5.x's, where
            SGLang fuses the index-query kernel with its interleaved RoPE and FP4 takes SGLang's unfused path with
            the plugin's rotation), with its ``model``; or None (no ``cycle_fused`` section).
        timing_more: ``bench_timing_section`` results, one per GPU (kernel-benchmark rows of other GPUs, e.g. an
            H100's at next_n 1, 2 and 4), or None (no ``timing_more`` section); their sources are recorded last.

    Returns:
        ``{"format", "timing": {...}, "recall": {...}, "sources": [...]}`` (module docstring).

    Raises:
        ValueError: a report of the wrong kind or without usable rows, naming the source; ``cycle_more`` without
            ``cycle``; ``cycle_fused`` without its ``model``; two ``timing_more`` sections of one GPU.
    """
    if cycle_more and cycle is None:
        raise ValueError("cycle_more: further verify-cycle sections need a first one (cycle)")
    out = {"format": TABLES_FORMAT, "timing": _timing(bench, bench_source),
           "recall": _recall(accuracy, accuracy_source), "sources": [bench_source, accuracy_source]}
    if model_accuracy is not None:
        docs = [model_accuracy] if isinstance(model_accuracy, dict) else list(model_accuracy)
        names = [model_source] if isinstance(model_source, str) else list(model_source)
        if not docs or len(names) != len(docs):
            raise ValueError(f"model_source: expected one name per model_accuracy result ({len(docs)}), got {names!r}")
        out["model"] = _model(docs, names)
        out["sources"].extend(names)
    if sglang is not None:
        out["sglang"] = sglang
        out["sources"].extend(sglang["sources"])
    if timing_serving is not None:
        out["timing_serving"] = timing_serving
        out["sources"].extend(timing_serving["sources"])
    if cycle is not None:
        out["cycle"] = cycle
        out["sources"].extend(cycle["sources"] + cycle.get("other_order_sources", []) + cycle.get("load_sources", []))
    if cycle_more:
        out["cycle_more"] = list(cycle_more)
        for sec in cycle_more:
            out["sources"].extend(sec["sources"] + sec.get("other_order_sources", []) + sec.get("load_sources", []))
    if cycle_fused is not None:
        if not cycle_fused.get("model"):
            raise ValueError("cycle_fused: expected the model it measured (verify_cycle_section's model)")
        out["cycle_fused"] = cycle_fused
        out["sources"].extend(cycle_fused["sources"] + cycle_fused.get("other_order_sources", []))
    if timing_more:
        gpus = [sec["gpu"] for sec in timing_more]
        if len(set(gpus)) < len(gpus):
            raise ValueError(f"timing_more: expected one section per GPU, got {', '.join(gpus)}")
        out["timing_more"] = list(timing_more)
        for sec in timing_more:
            out["sources"].extend(sec["sources"])
    return out


def load_tables(path: str | Path | None = None) -> dict:
    """Read a tables file (default: the one packaged with ``sglang_fp4_indexer``).

    Raises:
        ValueError: the file is missing, not JSON or not a tables file.
    """
    try:
        text = (Path(path).read_text() if path is not None
                else resources.files("sglang_fp4_indexer").joinpath(TABLES_RESOURCE).read_text())
        data = json.loads(text)
    except (OSError, ValueError) as exc:
        raise ValueError(f"measured tables ({path or TABLES_RESOURCE}): cannot be read ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != TABLES_FORMAT:
        raise ValueError(f"measured tables ({path or TABLES_RESOURCE}): not a {TABLES_FORMAT!r} file")
    return data


def _log_gap(a: int, b: int) -> float:
    return abs(math.log2(a) - math.log2(b))


def nearest_timing(tables: dict, heads: int, batch: int, context: int, next_n: int) -> dict:
    """The measured timing row nearest a shape.

    The scorer's time is mostly the bytes it reads, so the distance is the sum
    of ``|log2|`` gaps in index heads, keys read (``batch * context``) and
    next_n, plus half the gap in batch (how those keys split into requests);
    the smallest wins (ties: more heads, then the larger shape).

    Args:
        tables: from ``load_tables``.
        heads, batch, context, next_n: the shape asked about (positive ints).

    Returns:
        The row (``heads``, ``batch``, ``context``, ``next_n``, ``fp4_us``, ``fp8_us``, ...).

    Raises:
        ValueError: a non-positive argument, or a table without timing rows.
    """
    for name, value in (("heads", heads), ("batch", batch), ("context", context), ("next_n", next_n)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")
    rows = tables["timing"]["rows"]
    if not rows:
        raise ValueError("measured tables: no timing rows")
    return min(rows, key=lambda r: (_log_gap(r["heads"], heads) + _log_gap(r["batch"] * r["context"], batch * context)
                                    + _log_gap(r["next_n"], next_n) + 0.5 * _log_gap(r["batch"], batch),
                                    -r["heads"], -r["batch"] * r["context"] * r["next_n"]))


#: How far a measured timing row may be from a shape and still stand for it (``timing_is_near``): keys read
#: (batch x context) within 2x and batch within 4x, as ``|log2|`` gaps. Beyond that the scorer's time changes
#: with the CTA schedule and occupancy more than with the bytes it reads.
NEAR_KEYS_LOG2, NEAR_BATCH_LOG2 = 1.0, 2.0


def timing_is_near(row: dict, heads: int, batch: int, context: int) -> bool:
    """Whether a timing row (``nearest_timing``'s) is close enough to quote for ``heads`` x ``batch`` x ``context``:
    the same index heads, keys read within ``NEAR_KEYS_LOG2`` and batch within ``NEAR_BATCH_LOG2`` (``|log2|`` gaps)."""
    return (row["heads"] == heads
            and _log_gap(row["batch"] * row["context"], batch * context) <= NEAR_KEYS_LOG2
            and _log_gap(row["batch"], batch) <= NEAR_BATCH_LOG2)


def nearest_recall(tables: dict, heads: int, context: int) -> list[dict]:
    """The recall rows (one per workload) at the measured context nearest ``context``.

    Same index-head count preferred (else the nearest); context by ``|log2|``
    gap (ties: the longer context).

    Returns:
        Rows ``{"workload", "context", "heads", "fp4", "fp8"}`` in the table's workload order.

    Raises:
        ValueError: a non-positive argument, or a table without recall rows.
    """
    for name, value in (("heads", heads), ("context", context)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")
    rows = tables["recall"]["rows"]
    if not rows:
        raise ValueError("measured tables: no recall rows")
    best_heads = min({r["heads"] for r in rows}, key=lambda h: (_log_gap(h, heads), -h))
    same = [r for r in rows if r["heads"] == best_heads]
    best_context = min({r["context"] for r in same}, key=lambda c: (_log_gap(c, context), -c))
    return [r for r in same if r["context"] == best_context]


def model_indexers(tables: dict) -> list[tuple[str, str | None]]:
    """The indexers the tables' real-model rows were measured with, as ``(indexer, trained_on)`` pairs in the rows'
    order, the stand-in first: ``[("stand-in", None), ("trained", "12 x 8192 tokens")]`` (``[]``: no model section)."""
    rows = (tables.get("model") or {}).get("rows") or []
    return list(dict.fromkeys((r.get("indexer", "stand-in"), r.get("trained_on")) for r in rows))


def nearest_model_cost(tables: dict, context: int, topk: int, indexer: str = "stand-in",
                       trained_on: str | None = None) -> dict | None:
    """The real-model study's row nearest a request length for one indexer, or None when there is none.

    Rule: among the rows of ``indexer``, the measured context nearest ``context`` by
    ``|log2|`` gap (ties: the longer), then at that context the row with the model's
    ``topk`` if measured, else the measured top-k nearest it by ``|log2|`` gap (ties: the larger).

    Args:
        indexer, trained_on: ``"stand-in"`` (``trained_on`` None) or ``"trained"`` with what it was trained on
            (``model_indexers`` lists the pairs measured); rows written before rows named their indexer are the
            stand-in's.

    Returns:
        ``{"indexer", "trained_on" (a trained indexer's training text, e.g. ``"12 x 8192 tokens"``), "device",
        "source", "context", "topk", "windows", "attention_recall_exact" (how much of the layer's attention top-k
        the indexer's exact selection holds, where measured), "delta_exact" | "delta_fp8" |
        "delta_fp4" | "fp4_minus_fp8": [mean, standard error], "recall_fp8", "recall_fp4", "passkey_dense" |
        ..._fp8 | ..._fp4: [retrieved, prompts] (when measured)}``.

    Raises:
        ValueError: a non-positive argument.
    """
    for name, value in (("context", context), ("topk", topk)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")
    rows = [r for r in (tables.get("model") or {}).get("rows") or []
            if (r.get("indexer", "stand-in"), r.get("trained_on")) == (indexer, trained_on)]
    if not rows:
        return None
    best = min({r["context"] for r in rows}, key=lambda c: (_log_gap(c, context), -c))
    same = [r for r in rows if r["context"] == best]
    return min(same, key=lambda r: (_log_gap(r["topk"], topk), -r["topk"]))
