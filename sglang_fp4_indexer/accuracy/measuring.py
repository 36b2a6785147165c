"""Scoring one case three ways (exact, FP8, FP4) and measuring each format against the exact logits.

The FP4 logits come from the store op and the paged scorer (``"triton"``), or from the bit-exact torch oracle of
the same format (``"torch"``) where the Triton interpreter would be too slow; the ops are imported when first used.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from .. import format as fmt
from ..demo import FP8_KEY_SCALE_FMT, _device, dense_logits, quantize_queries, request_slots, shuffled_block_table
from ..metrics import average_ranks, percentile, relative_l2_error_rows, spearman_rows, topk_recall_rows
from ..pool import allocate_index_k_cache, read_index_k
from ..reference import fp8_dequantize_rows, fp8_quantize_rows, logits_from_keys, topk_reference
from .inputs import DEFAULT_TOPK, NEEDLE_DEPTHS, StudyInput

__all__ = [
    "LOGITS_DTYPES",
    "FormatMetrics",
    "CaseResult",
    "run_case",
]


#: FP4 logits dtypes measured (the scorer's ``logits_dtype`` option).
LOGITS_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class FormatMetrics:
    """One format's agreement with the exact logits over a case's rows.

    Attributes:
        name: ``"FP8"``, ``"FP4"``, ``"FP4 bf16 logits"``, ``"FP4 fp16 logits"`` or ``"keys exact"``.
        path: what produced the logits (``"triton"``: the project's kernels; ``"torch"``:
            the torch oracle of the format).
        recall_rows: per-row recall of the exact top-k.
        recall_mean, recall_p1, recall_min: mean, 1st percentile (linear
            interpolation, ``metrics.percentile``) and worst row.
        spearman_mean, spearman_min: Spearman rank correlation over visible keys.
        rel_l2_mean, rel_l2_max: relative L2 error of the logits.
        needle_kept, needle_top1: per row (needle workload only): the needle is in
            the top-k / is ranked first; None elsewhere.
    """

    name: str
    path: str
    recall_rows: list[float]
    recall_mean: float
    recall_p1: float
    recall_min: float
    spearman_mean: float
    spearman_min: float
    rel_l2_mean: float
    rel_l2_max: float
    needle_kept: list[bool] | None = None
    needle_top1: list[bool] | None = None


@dataclass
class CaseResult:
    """All measures of one (workload, context, H) case.

    Attributes:
        workload, context, heads, rows, topk: the case (``topk`` before the per-row cap).
        fp4_path: ``"triton"`` or ``"torch"`` (FP4 logits in every dtype).
        formats: ``{name: FormatMetrics}``.
        store_bit_exact: the Triton store op's cache equals ``format.quantize_index_k`` (None: not run).
        triton_vs_oracle: max |Triton FP4 fp32 logits - torch oracle| (None: not run).
        needle_depths: each row's needle depth (needle workload) or None.
        seconds: wall time of the case.
        logits: ``{name: tensor}`` (CPU) when kept (``run_case(keep_logits=True)``), ``exact`` included.
    """

    workload: str
    context: int
    heads: int
    rows: int
    topk: int
    fp4_path: str
    formats: dict[str, FormatMetrics]
    store_bit_exact: bool | None
    triton_vs_oracle: float | None
    needle_depths: list[float] | None
    seconds: float
    logits: dict[str, torch.Tensor] | None = None


def _shared_key_logits(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, lengths: torch.Tensor,
                       exact: bool = False) -> torch.Tensor:
    """Logits of every row against the shared keys ``keys[:len_r]``; ``-inf`` beyond.

    ``exact``: fp64 ``reference.logits_from_keys`` (pass fp64 keys to skip a
    per-row conversion); else fp32 ``demo.dense_logits`` (pass fp32 keys).
    """
    rows, width = q.shape[0], keys.shape[0]
    dtype = torch.float64 if exact else torch.float32
    out = torch.full((rows, width), float("-inf"), dtype=dtype, device=keys.device)
    for r, n in enumerate(lengths.tolist()):
        if exact:
            out[r, :n] = logits_from_keys(q[r], weights[r], keys[:n])
        else:
            out[r, :n] = dense_logits(q[r: r + 1], weights[r: r + 1], keys[None, :n])[0]
    return out


def _case_tensors(inp: StudyInput, context: int, heads: int, topk: int, dev: torch.device):
    """A case on ``dev``: keys (bf16), e4m3 queries and folded weights, lengths, exact logits (fp64), exact top-k."""
    spec = inp.rows[(context, heads)]
    keys = inp.case_keys(context, heads).to(dev)
    q, w, lengths = spec.queries.to(dev), spec.weights.to(dev), spec.lengths.to(dev)
    q8, w8 = quantize_queries(q, w)
    exact = _shared_key_logits(q, w, keys.to(torch.float64), lengths, exact=True)
    return keys, q8, w8, lengths, exact, topk_reference(exact, topk, lengths=lengths)


def _format_metrics(name: str, path: str, logits: torch.Tensor, exact: torch.Tensor, exact_top: torch.Tensor,
                    exact_ranks: list[torch.Tensor], lengths: torch.Tensor, topk: int,
                    needle_positions: torch.Tensor | None) -> FormatMetrics:
    top = topk_reference(logits, topk, lengths=lengths)
    recall = topk_recall_rows(top, exact_top).cpu()
    spear = spearman_rows(logits, exact, lengths, exact_ranks).cpu()
    l2 = relative_l2_error_rows(logits, exact, lengths).cpu()
    kept = top1 = None
    if needle_positions is not None:
        pos = needle_positions.to(top.device)
        kept = (top == pos[:, None]).any(dim=1).cpu().tolist()
        top1 = (top[:, 0] == pos).cpu().tolist()
    return FormatMetrics(name, path, recall.tolist(), float(recall.mean()), percentile(recall, 1.0),
                         float(recall.min()), float(spear.mean()), float(spear.min()), float(l2.mean()),
                         float(l2.max()), kept, top1)


def run_case(inp: StudyInput, context: int, heads: int, *, topk: int = DEFAULT_TOPK,
             device: str | torch.device = "cpu", use_triton: bool = True,
             logits_dtypes: Sequence[str] = tuple(LOGITS_DTYPES), seed: int = 0,
             keep_logits: bool = False) -> CaseResult:
    """Measure one (workload, context, H) case: exact, FP8, FP4 (each logits dtype), keys exact.

    Args:
        inp: the workload's input (must hold rows for ``(context, heads)``).
        topk: top-k (capped per row at its visible keys).
        device: ``"cpu"`` or ``"cuda[:N]"``.
        use_triton: FP4 through the Triton store op and paged scorer (on the CPU
            this needs ``TRITON_INTERPRET=1``); else the torch oracle of the format.
        logits_dtypes: FP4 logits dtypes to measure (names of ``LOGITS_DTYPES``; ``"fp32"`` always).
        seed: page order of the shuffled block table.
        keep_logits: keep every logits tensor (CPU) in the result.

    Raises:
        KeyError: ``inp`` has no rows for the case.
        ValueError: bad options, or the Triton path on the CPU without the interpreter.
    """
    started = time.perf_counter()
    dev = _device(device)
    if topk < 1:
        raise ValueError(f"topk: expected >= 1, got {topk}")
    unknown = [d for d in logits_dtypes if d not in LOGITS_DTYPES]
    if unknown:
        raise ValueError(f"logits_dtypes: unknown {unknown}; expected names from {tuple(LOGITS_DTYPES)}")
    dtypes = ["fp32"] + [d for d in logits_dtypes if d != "fp32"]
    if use_triton and dev.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError("use_triton: on the CPU the Triton kernels need TRITON_INTERPRET=1 "
                         "(set it before importing the ops, or pass --triton-max-context 0)")
    spec = inp.rows[(context, heads)]
    keys, q8, w8, lengths, exact, exact_top = _case_tensors(inp, context, heads, topk, dev)
    logits: dict[str, torch.Tensor] = {}
    paths: dict[str, str] = {}
    logits["FP8"] = _shared_key_logits(q8, w8, fp8_dequantize_rows(*fp8_quantize_rows(keys, FP8_KEY_SCALE_FMT)),
                                       lengths)
    logits["keys exact"] = _shared_key_logits(q8, w8, keys.to(torch.float32), lengths)
    paths["FP8"] = paths["keys exact"] = "torch"
    oracle = _shared_key_logits(q8, w8, fmt.dequantize_index_k(*fmt.quantize_index_k(keys)), lengths)
    store_ok = None
    max_diff = None
    names = {d: "FP4" if d == "fp32" else f"FP4 {d} logits" for d in dtypes}
    scorer = "torch"
    if use_triton:
        from ..ops.paged_logits import paged_logits, resolved_impl
        from ..ops.quantize import store_index_k

        block_table = shuffled_block_table(1, context, seed, device=dev)
        slots = request_slots(block_table, context)
        cache = allocate_index_k_cache(block_table.numel(), device=dev)
        store_index_k(keys, cache, slots)
        payload, scales = read_index_k(cache, slots)
        want_payload, want_scales = fmt.quantize_index_k(keys)
        store_ok = bool(torch.equal(payload, want_payload) and torch.equal(scales, want_scales))
        tables = block_table.expand(spec.rows, -1).contiguous()
        lens32 = lengths.to(torch.int32)
        # the kernel the product's scorer resolves to here: "wgmma" (the Hopper CUDA kernel) or a Triton one
        scorer = "triton" if resolved_impl(q8, cache, 1) != "wgmma" else "hopper"
        for d in dtypes:
            logits[names[d]] = paged_logits(q8, w8, cache, tables, lens32, width=context,
                                            logits_dtype=LOGITS_DTYPES[d])
            paths[names[d]] = scorer
        fin = torch.isfinite(oracle)
        if torch.equal(fin, torch.isfinite(logits["FP4"])):
            max_diff = float((logits["FP4"][fin].to(torch.float64) - oracle[fin].to(torch.float64)).abs().max())
        else:
            max_diff = float("inf")  # the scorer's -inf pattern differs from the row lengths: a bug
    else:
        for d in dtypes:
            # The scorer forms the fp32 sum and rounds it once on store: the same as this cast.
            logits[names[d]] = oracle if d == "fp32" else oracle.to(LOGITS_DTYPES[d])
            paths[names[d]] = "torch"
    order = ["FP8", "FP4"] + [names[d] for d in dtypes if d != "fp32"] + ["keys exact"]
    exact_ranks = [average_ranks(exact[r, :n]) for r, n in enumerate(lengths.tolist())]
    formats = {name: _format_metrics(name, paths[name], logits[name], exact, exact_top, exact_ranks, lengths, topk,
                                     spec.needle_positions) for name in order}
    depths = None
    if spec.needle_positions is not None:
        depths = [NEEDLE_DEPTHS[r % len(NEEDLE_DEPTHS)] for r in range(spec.rows)]
    kept = None
    if keep_logits:
        kept = {name: t.cpu() for name, t in logits.items()}
        kept["exact"] = exact.cpu()
        kept["FP4 torch oracle"] = oracle.cpu()
    return CaseResult(inp.kind, context, heads, spec.rows, topk, scorer, formats,
                      store_ok, max_diff, depths, time.perf_counter() - started, kept)
