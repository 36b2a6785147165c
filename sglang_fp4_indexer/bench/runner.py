"""One benchmark run: copy bandwidth, every scorer on every shape, the store op and the planner.

``run_benchmark(config)`` returns a JSON-ready report (``report.py`` renders
it). For each shape it builds the inputs once (``inputs.py``; as many cache
copies as L2 rotation needs), computes the reference for the checked rows
(``checks.expected_logits``), then for each scorer: prepare (outside the
timing), time (``timing.time_calls``), check every rotation set's output
(``checks.check_logits``), on CUDA measure its host time per eager call
(``timing.time_host``, as its serving caller makes it), and derive the ratios: percent of its own format's
HBM floor (FP4 68 B/key, FP8 132 B/key, + 4 B/logit), percent of the roofline floor on CUDA (the
larger of that and the tensor-core floor: the call's FLOPs over the dense FP8 GEMM rate measured in
the same run, ``timing.fp8_mma_rate``; which one binds is recorded), and the speed-up of the
first "ours" scorer over each other scorer (``t_other / t_ours``).

A scorer that raises while being prepared, timed or checked is recorded as
``error: ...`` and the run goes on; a failed check is recorded as such. The
report's ``failures`` counts both. A scorer that cannot score a shape at all
(``Scorer.shape_reason``: a peer built for other next_n or head counts) is
recorded ``unavailable`` in that row, with its ``reason``, and is no failure.
"""

from __future__ import annotations

import datetime
import gc
import platform
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..pool import PAGE_SIZE
from .checks import CheckResult, check_logits, expected_logits
from .floor import (
    BF16_KEY_BYTES,
    binding_floor,
    fp4_scorer_bytes,
    fp8_scorer_bytes,
    floor_seconds,
    percent_of_floor,
    scorer_bytes,
    scorer_flops,
    store_bytes,
    visible_keys,
)
from .inputs import build_scorer_inputs
from .scorers import Scorer
from .shapes import ScorerShape
from .timing import (
    CPU_TIMING_NOTE,
    MMA_SIZE,
    copy_bandwidth,
    fp8_mma_rate,
    l2_cache_bytes,
    rotation_sets,
    time_calls,
    time_host,
)

__all__ = [
    "BenchConfig",
    "PLANNER_TARGET_S",
    "GPU_STORE_TOKENS",
    "CPU_STORE_TOKENS",
    "PLANNER_BATCH",
    "run_benchmark",
    "bench_store",
    "bench_planner",
]

#: The planner's target per call at batch 64 (a small share of a decode step).
PLANNER_TARGET_S = 5e-6
#: Tokens of the store-op row (64 K) and its CPU stand-in.
GPU_STORE_TOKENS = 65536
CPU_STORE_TOKENS = 256
#: Batch of the planner row.
PLANNER_BATCH = 64
#: Largest context of the planner row's random lengths.
PLANNER_MAX_CONTEXT = 131072


@dataclass
class BenchConfig:
    """What one run measures.

    Attributes:
        device: where the ops run (``cpu`` means the Triton interpreter).
        shapes: scorer shapes.
        scorers: scorers, ours first (``scorers.make_scorers``).
        seed: input seed.
        store_tokens: tokens of the store-op row (``None``: skip it).
        planner_batch: batch of the planner row (``None``: skip it).
        copy_bytes: size of the bandwidth copy (``None``: 1 GiB on CUDA, 64 MiB on the CPU).
        command: the command line, for the record.
    """

    device: torch.device
    shapes: list[ScorerShape]
    scorers: list[Scorer]
    seed: int = 0
    store_tokens: int | None = GPU_STORE_TOKENS
    planner_batch: int | None = PLANNER_BATCH
    copy_bytes: int | None = None
    command: str = ""
    extra_meta: dict = field(default_factory=dict)


def _error(exc: BaseException) -> str:
    return f"error: {type(exc).__name__}: {exc}".splitlines()[0][:300]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _meta(config: BenchConfig, bandwidth: float, samples: list[float], l2: int | None,
          mma: tuple[float | None, list[float]] = (None, [])) -> dict:
    import triton

    dev = config.device
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": config.command,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU ({platform.processor() or platform.machine()}), Triton interpreter",
        "device_type": dev.type,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "timing": "CUDA graphs, median of replays" if dev.type == "cuda" else f"wall clock: {CPU_TIMING_NOTE}",
        "copy_bandwidth_bytes_per_s": bandwidth,
        "copy_bandwidth_samples": samples,
        "fp8_mma_flops_per_s": mma[0],
        "fp8_mma_samples": mma[1],
        "fp8_mma_gemm": f"{MMA_SIZE} x {MMA_SIZE} x {MMA_SIZE} e4m3 -> bf16, torch._scaled_mm" if mma[0] else None,
        "l2_bytes": l2,
        "page_size": PAGE_SIZE,
    }
    if dev.type == "cuda":
        meta["sm_count"] = torch.cuda.get_device_properties(dev).multi_processor_count
    meta.update(config.extra_meta)
    return meta


def _scorer_row(shape: ScorerShape, bandwidth: float, mma_rate: float | None = None) -> dict:
    fp4, fp8 = fp4_scorer_bytes(shape), fp8_scorer_bytes(shape)
    flops = scorer_flops(shape)
    return {
        "flops": flops,
        "tensor_core_floor_s": flops / mma_rate if mma_rate else None,
        "spec": shape.spec,
        "label": shape.label,
        "heads": shape.heads,
        "batch": shape.batch,
        "context": shape.context,
        "next_n": shape.next_n,
        "visible_keys": visible_keys(shape),
        "fp4_bytes": fp4,
        "fp8_bytes": fp8,
        "fp4_floor_s": floor_seconds(fp4, bandwidth),
        "fp8_floor_s": floor_seconds(fp8, bandwidth),
        "results": {},
    }


def _run_scorer(scorer: Scorer, inputs, expected, l2, bandwidth: float, device, mma_rate: float | None = None) -> dict:
    shape = inputs.shape
    result: dict = {"status": "error", "key_bytes": scorer.key_bytes}
    run = None
    try:
        prepared = scorer.prepare(inputs, l2)
        if scorer.ran:
            result["impl"] = scorer.ran  # the formulation that ran (ours: "auto" resolved)
        result["sets"] = prepared.sets
        result["case_bytes"] = prepared.case_bytes
        run = time_calls(prepared.fn, device, prepared.sets)
        _sync(device)
        result["seconds"] = run.timing.seconds
        result["timing"] = run.timing.to_dict()
        if device.type == "cuda":  # host time per eager call, as its serving caller makes it
            host = time_host(prepared.host_fn or prepared.fn, device, prepared.sets)
            result["host_s"] = host.seconds
            result["host_timing"] = host.to_dict()
        floor = floor_seconds(scorer_bytes(shape, scorer.key_bytes), bandwidth)
        result["floor_s"] = floor
        result["pct_floor"] = percent_of_floor(run.timing.seconds, floor)
        if mma_rate:  # the roofline: the larger of the HBM floor and the tensor cores' time for the FLOPs
            roof, binds = binding_floor(floor, scorer_flops(shape) / mma_rate)
            result.update(roofline_s=roof, binds=binds, pct_roofline=percent_of_floor(run.timing.seconds, roof))
        check = check_logits(run.outputs, expected, prepared.rel, writes_all=prepared.writes_all, floor=prepared.floor)
    except Exception as exc:  # recorded, the run goes on
        result["status"] = _error(exc)
        try:
            _sync(device)
        except Exception:
            pass
        return result
    finally:
        del run
    result["check"] = check.to_dict()
    result["status"] = "ok" if check.ok else "check failed"
    return result


def bench_store(device: torch.device, tokens: int, l2: int | None, bandwidth: float, seed: int = 0) -> dict:
    """Time ``ops.quantize.store_index_k`` on ``tokens`` bf16 keys against its floor; check it bit for bit.

    Keys ``N(0, 1) * exp(N(0, 1))`` per token (a spread of group scales), slots
    covering whole pages in a shuffled page order, ``check_slots=False`` (the
    capturable path). Check: every rotation set's cache, read back at the
    slots, equals ``format.quantize_index_k`` of the keys exactly.

    Returns:
        A JSON-ready dict: ``status``, ``seconds``, ``floor_s``, ``pct_floor``, ``check``, ...
    """
    from ..format import quantize_index_k
    from ..pool import allocate_index_k_cache, read_index_k

    row: dict = {"tokens": tokens, "bytes": store_bytes(tokens), "status": "error"}
    row["floor_s"] = floor_seconds(row["bytes"], bandwidth)
    try:
        from ..ops.quantize import store_index_k
    except Exception as exc:
        row["status"] = f"unavailable: {type(exc).__name__}: {exc}"
        return row
    try:
        g = torch.Generator(device=device).manual_seed(seed + 1)
        num_pages = -(-tokens // PAGE_SIZE)
        k = (torch.randn(tokens, 128, generator=g, device=device)
             * torch.exp(torch.randn(tokens, 1, generator=g, device=device))).to(torch.bfloat16)
        pages = torch.randperm(num_pages, generator=g, device=device)
        slots = (pages[:, None] * PAGE_SIZE + torch.arange(PAGE_SIZE, device=device)[None, :]).reshape(-1)[:tokens]
        slots = slots.to(torch.int64).contiguous()
        sets = rotation_sets(tokens * (BF16_KEY_BYTES + 68), l2)
        ks = [k] + [k.clone() for _ in range(sets - 1)]
        caches = [allocate_index_k_cache(num_pages, device=device) for _ in range(sets)]

        def fn(s: int) -> torch.Tensor:
            store_index_k(ks[s], caches[s], slots, PAGE_SIZE, check_slots=False)
            return caches[s]

        from ..ops.quantize import store_launcher

        row["kernel"] = store_launcher(k.device, k.dtype, slots.dtype).kernel_for(k, caches[0])

        run = time_calls(fn, device, sets)
        _sync(device)
        row.update(seconds=run.timing.seconds, timing=run.timing.to_dict(), sets=sets)
        row["pct_floor"] = percent_of_floor(run.timing.seconds, row["floor_s"])
        want_p, want_s = quantize_index_k(k)
        bad = [s for s in range(sets)
               if not all(torch.equal(a, b) for a, b in zip(read_index_k(caches[s], slots), (want_p, want_s)))]
        check = CheckResult(not bad, f"set {bad[0]}: stored bytes differ from format.quantize_index_k" if bad
                            else f"all {tokens} tokens bit-exact vs format.quantize_index_k, {sets} set(s)",
                            rows_checked=tokens, sets_checked=sets)
        row["check"] = check.to_dict()
        row["status"] = "ok" if check.ok else "check failed"
    except Exception as exc:
        row["status"] = _error(exc)
    return row


def bench_planner(device: torch.device, batch: int, seed: int = 0) -> dict:
    """Time ``ops.schedule.plan_paged_schedule_into`` at ``batch`` requests; check it against the oracle.

    Lengths uniform in ``[1, PLANNER_MAX_CONTEXT]``; ``block_kv`` the scorer's
    default, ``num_ctas`` ``ops.grid.default_num_ctas``. Check: equal to
    ``reference.paged_schedule_reference`` exactly. Target: 5 us (``PLANNER_TARGET_S``).

    Returns:
        A JSON-ready dict: ``status``, ``seconds``, ``target_s``, ``check``, ...
    """
    row: dict = {"batch": batch, "target_s": PLANNER_TARGET_S, "status": "error"}
    try:
        from ..ops.paged_logits import default_block_kv
        from ..ops.schedule import plan_paged_schedule_into
        from ..reference import paged_schedule_reference
        from ..ops.grid import default_num_ctas

        g = torch.Generator(device=device).manual_seed(seed + 2)
        lens = torch.randint(1, PLANNER_MAX_CONTEXT + 1, (batch,), generator=g, device=device, dtype=torch.int32)
        num_ctas = default_num_ctas(device)
        block_kv = default_block_kv(device)
        out = torch.full((num_ctas + 1, 2), -1, dtype=torch.int32, device=device)
        row.update(block_kv=block_kv, num_ctas=num_ctas)
        from ..ops.schedule import planner_for

        row["kernel"] = planner_for(lens.device, block_kv).kernel_for(lens)

        def fn(s: int) -> torch.Tensor:
            return plan_paged_schedule_into(lens, block_kv, out)

        run = time_calls(fn, device, 1)
        _sync(device)
        row.update(seconds=run.timing.seconds, timing=run.timing.to_dict())
        want = paged_schedule_reference(lens, block_kv, num_ctas)
        ok = torch.equal(out.cpu(), want.cpu())
        row["check"] = CheckResult(
            ok, "equal to reference.paged_schedule_reference" if ok else "schedule differs from reference.paged_schedule_reference",
            rows_checked=batch, sets_checked=1,
        ).to_dict()
        row["status"] = "ok" if ok else "check failed"
    except Exception as exc:
        row["status"] = _error(exc)
    return row


def run_benchmark(
    config: BenchConfig,
    log: Callable[[str], None] = lambda line: None,
    on_progress: Callable[[dict], None] | None = None,
) -> dict:
    """Run everything ``config`` asks for and return the report (module docstring).

    Args:
        config: what to run.
        log: called with one progress line per measurement.
        on_progress: called with the report so far after each shape and each op row
            (e.g. to save partial JSON, so a run cut short by a time limit still leaves numbers).

    Returns:
        JSON-ready dict with ``meta``, ``scorers``, ``rows``, ``store``, ``planner``, ``failures``.
    """
    dev = config.device
    bandwidth, samples = copy_bandwidth(dev, config.copy_bytes)
    l2 = l2_cache_bytes(dev)
    log(f"copy bandwidth {bandwidth / 1e12:.3f} TB/s (read + write); L2 {l2 / 2**20:.0f} MiB" if l2
        else f"copy bandwidth {bandwidth / 1e9:.2f} GB/s ({CPU_TIMING_NOTE})")
    mma_error = None
    try:
        mma = fp8_mma_rate(dev)
    except RuntimeError as exc:  # e.g. a torch whose _scaled_mm refuses these operands: no TC floor, said so
        mma, mma_error = (None, []), _error(exc)
        log(f"dense FP8 GEMM rate not measured ({mma_error}): no tensor-core floor in this run")
    if mma[0]:
        log(f"dense FP8 GEMM {mma[0] / 1e12:.0f} TFLOP/s ({MMA_SIZE}^3, torch._scaled_mm): the tensor-core floor")
    report: dict = {"meta": _meta(config, bandwidth, samples, l2, mma), "scorers": [], "rows": [], "failures": 0}
    if mma_error:
        report["meta"]["fp8_mma_error"] = mma_error
    available = {}
    for sc in config.scorers:
        reason = sc.unavailable_reason(dev)
        available[sc.name] = reason is None
        report["scorers"].append({
            "name": sc.name, "label": sc.label, "key_bytes": sc.key_bytes,
            "status": "available" if reason is None else f"unavailable: {reason}",
        })
        if reason is not None:
            log(f"{sc.name}: unavailable: {reason}")

    for idx, shape in enumerate(config.shapes, 1):
        row = _scorer_row(shape, bandwidth, mma[0])
        report["rows"].append(row)
        sets = rotation_sets(fp4_scorer_bytes(shape), l2)
        try:
            inputs = build_scorer_inputs(shape, dev, sets, config.seed)
            expected = expected_logits(inputs)
        except Exception as exc:
            for sc in config.scorers:
                row["results"][sc.name] = {"status": _error(exc)}
            report["failures"] += 1
            log(f"[{idx}/{len(config.shapes)}] {shape.label}: inputs failed: {exc}")
            _free(dev)
            if on_progress is not None:
                on_progress(report)
            continue
        for sc in config.scorers:
            if not available[sc.name]:
                row["results"][sc.name] = {"status": "unavailable"}
                continue
            why = sc.shape_reason(shape)
            if why is not None:  # a peer that cannot score this shape: its cell is n/a, not a failure
                row["results"][sc.name] = {"status": "unavailable", "reason": why}
                log(f"[{idx}/{len(config.shapes)}] {shape.label} {sc.name}: unavailable at this shape: {why}")
                continue
            res = _run_scorer(sc, inputs, expected, l2, bandwidth, dev, mma[0])
            row["results"][sc.name] = res
            if res["status"] != "ok":
                report["failures"] += 1
            t = f"{res['seconds'] * 1e6:.1f} us" if "seconds" in res else "-"
            if "host_s" in res:
                t += f", host {res['host_s'] * 1e6:.1f} us per eager call"
            log(f"[{idx}/{len(config.shapes)}] {shape.label} {sc.name}: {t} ({res['status']})")
            _free(dev)
        ours = next((r for n, r in row["results"].items() if n.startswith("ours") and r.get("status") == "ok"), None)
        for name, res in row["results"].items():
            if ours is not None and "seconds" in res and res["status"] == "ok":
                res["speedup_of_ours"] = res["seconds"] / ours["seconds"]
        del inputs, expected
        _free(dev)
        if on_progress is not None:
            on_progress(report)

    if config.store_tokens:
        report["store"] = bench_store(dev, config.store_tokens, l2, bandwidth, config.seed)
        report["failures"] += report["store"]["status"] not in ("ok",) and not report["store"]["status"].startswith("unavailable")
        log(f"store_index_k {config.store_tokens} tokens: {report['store'].get('seconds', float('nan')) * 1e6:.1f} us ({report['store']['status']})")
        _free(dev)
    if config.planner_batch:
        report["planner"] = bench_planner(dev, config.planner_batch, config.seed)
        report["failures"] += report["planner"]["status"] != "ok"
        log(f"planner batch {config.planner_batch}: {report['planner'].get('seconds', float('nan')) * 1e6:.2f} us ({report['planner']['status']})")
    report["failures"] = int(report["failures"])
    if on_progress is not None:
        on_progress(report)
    return report
