"""Helpers shared by the Triton ops: interpreter detection, the jit form of
``pool.scale_row``, and the choice of MMA input type.

Nothing here is public API; the ops re-export what they document.
"""

from __future__ import annotations

import os
import types

import torch
import triton
import triton.language as tl

from ..format import INDEX_HEAD_DIM
from ..pool import scale_row

__all__ = [
    "MAX_NEXT_N",
    "interpreting", "scale_row_jit", "scale_row_is_identity", "fp8_mma_available", "select_mma", "select_mma_for",
    "MMA_DTYPES",
    "check_index_queries", "check_int32", "check_finite_queries", "to_logits_dtype",
]

#: Most query rows per request one scorer call takes (target verify with up to 7 draft tokens).
MAX_NEXT_N = 8


def interpreting() -> bool:
    """Whether Triton kernels run under the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


# pool.scale_row is plain arithmetic; compiled as a Triton function it is the one
# row mapping the kernels use for the scale plane, so changing pool.scale_row
# changes every kernel too (docs/format.md). Triton's interpreter wants
# triton.language among a jit function's globals, hence the copy with ``tl`` added
# (pool itself imports no Triton).
scale_row_jit = triton.jit(
    types.FunctionType(scale_row.__code__, {**scale_row.__globals__, "tl": tl}, "scale_row", scale_row.__defaults__)
)


def scale_row_is_identity(page_size: int) -> bool:
    """Whether ``pool.scale_row`` maps every row of a ``page_size`` page to itself (the NVIDIA layout).

    The CUDA kernels address the scale plane at the token's own row; where this
    is False (a layout with another row mapping) their callers run the Triton
    kernels, which call ``scale_row`` (docs/format.md).
    """
    return all(scale_row(r, page_size) == r for r in range(page_size))


def fp8_mma_available(device: torch.device) -> bool:
    """Whether FP8 (e4m3 x e4m3) MMA is used on ``device``.

    True on CUDA devices of compute capability 8.9 or newer (Ada, Hopper,
    Blackwell) and on the CPU under the interpreter (which emulates fp8 dots
    exactly, so CPU tests exercise the FP8 code path); False elsewhere.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 9)
    return device.type == "cpu"


#: MMA input type name -> torch dtype of both dot operands.
MMA_DTYPES = {
    "fp8": torch.float8_e4m3fn,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
}


def select_mma(mma: str, q: torch.Tensor) -> str:
    """Resolve the MMA input type for queries ``q``; every choice multiplies exactly (``select_mma_for`` of
    ``q``'s dtype and device).

    Raises:
        ValueError: as ``select_mma_for``.
    """
    return select_mma_for(mma, q.dtype, q.device)


def select_mma_for(mma: str, q_dtype: torch.dtype, device: torch.device) -> str:
    """Resolve the MMA input type for index queries of ``q_dtype`` on ``device``; every choice multiplies exactly.

    ``"auto"``: ``"fp8"`` for e4m3 queries where ``fp8_mma_available``, else
    ``"fp16"`` (e4m3 values and decoded E2M1 keys are exact in fp16); for bf16
    queries: ``"bf16"`` on a GPU, ``"fp32"`` on the CPU (the interpreter's bf16
    dot is unreliable in triton 3.8).

    Raises:
        ValueError: unknown ``mma``, or ``"fp8"``/``"fp16"`` with non-e4m3 queries
            (bf16 queries are not exact in those types).
    """
    if mma != "auto" and mma not in MMA_DTYPES:
        raise ValueError(f"mma: expected 'auto', 'fp8', 'fp16', 'bf16' or 'fp32', got {mma!r}")
    is_fp8 = q_dtype == torch.float8_e4m3fn
    if mma in ("fp8", "fp16") and not is_fp8:
        raise ValueError(f"mma: {mma!r} needs q in float8_e4m3fn (bf16 queries are not exact in it)")
    if mma != "auto":
        return mma
    if is_fp8:
        return "fp8" if fp8_mma_available(device) else "fp16"
    return "fp32" if torch.device(device).type == "cpu" else "bf16"


def check_index_queries(q, weights, rows_name: str = "rows", heads_ok=None, heads_expected: str = "") -> tuple[int, int]:
    """Validate index queries and head weights shared by the scorers.

    Args:
        q: ``[rows, H, 128]`` float8_e4m3fn or bf16, last dim contiguous.
        weights: fp32 ``[rows, H]``, head dim contiguous.
        rows_name: how the error messages name the row dimension.
        heads_ok: optional predicate on the head count, checked before ``weights``;
            ``heads_expected`` says what it accepts.

    Returns:
        ``(rows, H)``.

    Raises:
        ValueError: a wrong type, dtype, shape or stride, naming the argument.
    """
    if not isinstance(q, torch.Tensor) or q.dim() != 3 or q.shape[2] != INDEX_HEAD_DIM:
        raise ValueError(f"q: expected [{rows_name}, H, {INDEX_HEAD_DIM}], got {getattr(q, 'shape', type(q).__name__)}")
    if q.dtype not in (torch.float8_e4m3fn, torch.bfloat16):
        raise ValueError(f"q: expected float8_e4m3fn or bfloat16, got {q.dtype}")
    if q.stride(2) != 1:
        raise ValueError("q: the last (128-element) dimension must be contiguous")
    rows, heads = q.shape[0], q.shape[1]
    if heads_ok is not None and not heads_ok(heads):
        raise ValueError(f"q: {heads} index heads; expected {heads_expected}")
    if not isinstance(weights, torch.Tensor) or weights.dtype != torch.float32 or tuple(weights.shape) != (rows, heads):
        raise ValueError(
            f"weights: expected float32 [{rows}, {heads}], got {getattr(weights, 'dtype', None)} "
            f"{list(getattr(weights, 'shape', []))}"
        )
    if weights.stride(1) != 1:
        raise ValueError("weights: the head dimension must be contiguous")
    return rows, heads


def check_int32(t, name: str, shape_ok, expected_shape: str, *, row_strided: bool = False) -> None:
    """Validate an int32 index tensor of an op (page table, lengths, windows); each error says what is wrong.

    Args:
        t: the argument.
        name: its name in the messages.
        shape_ok: predicate on ``tuple(t.shape)``.
        expected_shape: what ``shape_ok`` accepts, for the message (e.g. ``"[B, max_pages]"``).
        row_strided: also accept a 2-D tensor whose rows are contiguous at any row stride
            (``t.stride(1) == 1``, e.g. every ``next_n``-th row of a table): for kernels
            that address rows through ``t.stride(0)``.

    Raises:
        TypeError: ``t`` is not a tensor.
        ValueError: ``t`` is not int32, has another shape, or is not contiguous (its rows, with
            ``row_strided``) (in that order).
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise ValueError(f"{name}: expected int32, got {t.dtype}")
    if not shape_ok(tuple(t.shape)):
        raise ValueError(f"{name}: expected shape {expected_shape}, got {list(t.shape)}")
    if row_strided and t.dim() == 2 and (t.shape[1] <= 1 or t.stride(1) == 1):
        return
    if row_strided and not t.is_contiguous():
        raise ValueError(
            f"{name}: expected contiguous rows (column stride 1), got shape {list(t.shape)} with strides "
            f"{list(t.stride())} (pass .contiguous())"
        )
    if not t.is_contiguous():
        raise ValueError(
            f"{name}: expected a contiguous tensor, got shape {list(t.shape)} with strides {list(t.stride())} "
            "(pass .contiguous())"
        )


def check_finite_queries(q: torch.Tensor, weights: torch.Tensor) -> None:
    """Refuse index queries or head weights holding NaN or Inf (reads them on the host: a sync).

    Raises:
        ValueError: naming ``q`` or ``weights``.
    """
    for name, t in (("q", q), ("weights", weights)):
        if t.numel() and not bool(torch.isfinite(t.float()).all()):
            raise ValueError(f"{name}: holds NaN or Inf")


@triton.jit
def to_logits_dtype(x, out_ptr):
    """fp32 -> the output's dtype, round to nearest even. bf16 is rounded on the
    bits (the CPU interpreter's bf16 cast truncates); -inf and finite values only."""
    if out_ptr.dtype.element_ty == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(out_ptr.dtype.element_ty)
