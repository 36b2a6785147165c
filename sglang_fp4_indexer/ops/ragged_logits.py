"""Ragged FP4 scorer for prefill / chunked extend: each query token scores its own key window.

``logits[t, j] = sum_h weights[t, h] * relu(q[t, h] . k_j)`` for
``ks[t] <= j < ke[t]`` and ``-inf`` at every other column, over a flat key
buffer (``ops.gather.gather_index_k``). This is the FP4 form of SGLang's FP8
``fp8_mqa_logits`` step in ``Indexer._get_topk_ragged``.

Method (two launches):

1. ``prepare_keys`` decodes the flat MXFP4 planes once into MMA operands
   (``S x 128`` values): the E2M1 nibble ``c`` becomes the e4m3 byte
   ``sign << 7 | (c & 7) << 2``, which is exactly ``E2M1(c) * 2**-6`` (docs/format.md). In the ``"grouped"`` mode with FP8 MMA this runs on packed int32
   words -- ``lo = w & 0x0F0F0F0F``, ``hi = (w >> 4) & 0x0F0F0F0F``, then
   ``((x & 0x08080808) << 4) | ((x & 0x07070707) << 2)`` gives four e4m3 bytes
   (even elements from ``lo``, odd from ``hi``). Within each 32-element group
   the 16 even elements are stored first, then the 16 odd ones (the order the
   packed decode produces); the scorer reads the queries in the same order, so
   each dot product is unchanged. Decoding once per call, not once per query
   block, takes the decode out of the compute-bound loop.
2. The scorer tiles (``BLOCK_M`` query tokens x ``BLOCK_N`` keys); all
   ``BLOCK_M * H`` (token, head) query vectors form the MMA's N dimension.
   ``"grouped"``: one MMA per 32-element group, the group's fp32 partial
   product scaled by its UE8M0 factor ``2**(code - 127)`` built from the
   code's bits (no ``exp2``), accumulated; the constant ``2**6`` is applied
   after relu and the head sum (``relu(c x) = c relu(x)``, ``c > 0``). Exact
   products, fp32 accumulation, for every key. ``"folded"``: the group scales
   are folded into the operand relative to the key's largest group scale
   ``m`` (value ``E2M1 * 2**(6 - d)``, ``d = m - code``), one K = 128 MMA per
   tile, and the key's ``2**(m - 133)`` applied after relu and the head sum --
   a quarter of the fp32 scaling work. The folded value is rounded to nearest
   even on the e4m3 grid (whatever the MMA type, so every type gives the same
   operands): exact while ``d <= 14`` for every nonzero element (e4m3
   subnormals step by ``2**-9``); beyond, an error of at most
   ``2**(m - 127 - 16)`` per element (half a step), and every element of a
   group with ``d >= 19`` rounds to 0. Quantized keys have ``d <= 14`` unless
   one group is over 16384 times smaller than another in the same key
   (all-zero groups are exact at any ``d``).

Key tiles wholly outside every window of a query block are not scored (only
filled with ``-inf``, or left untouched with ``clean_logits=False``).

``impl="deepgemm"`` (the default where DeepGEMM is installed, as it is beside
SGLang on NVIDIA GPUs): prefill is compute-bound, so after the one decode of
step 1 (``"folded"``, in element order) the keys are exactly SGLang's FP8
index-key form -- e4m3 values with one fp32 scale per key, ``2**(m - 133)`` --
and DeepGEMM's ``fp8_mqa_logits``, the FP8 ragged scorer SGLang's indexer
already runs, scores them at the FP8 MMA rate. Same numerics as ``"folded"``
(both multiply the same e4m3 operands on FP8 tensor cores); ``"triton"`` keeps
the portable kernel of step 2.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

import torch
import triton
import triton.language as tl

from ..format import INDEX_HEAD_DIM, PAYLOAD_BYTES, SCALE_BYTES
from . import deepgemm
from ._common import (
    MMA_DTYPES,
    check_finite_queries,
    check_index_queries,
    check_int32,
    fp8_mma_available,
    interpreting,
    select_mma,
    to_logits_dtype,
)

__all__ = [
    "MODES",
    "IMPLS",
    "deepgemm_reason",
    "FOLD_EXACT_SPREAD",
    "PreparedKeys",
    "prepare_keys",
    "ragged_logits",
    "rows_per_chunk",
    "iter_ragged_logits",
    "fp8_mma_available",
]

#: Scoring formulations (see the module docstring).
MODES = ("grouped", "folded")
#: Scorer back ends (``impl``), besides ``"auto"`` (module docstring).
IMPLS = ("triton", "deepgemm")
#: Index heads DeepGEMM's ragged scorer takes.
_DEEPGEMM_HEADS = (32, 64)
#: Largest spread ``d`` (in powers of two) between a key's largest group scale
#: and another group's scale for which the e4m3 fold is exact.
FOLD_EXACT_SPREAD = 14
_FOLD_ZERO_SPREAD = 40
_BLOCK_S = 64
# Keys per program of the element-order decode (DeepGEMM's input): smaller blocks, more programs (a 4 K-key
# prefill is 256 of them), since that decode sits on the prefill's critical path.
_BLOCK_S_ELEMENT_ORDER = 16
# Default tile: BLOCK_M * H = 256 (token, head) columns; BLOCK_N keys: 128 for "folded"
# and 64 for "grouped" (whose second [BLOCK_N, 256] fp32 partial product would
# otherwise spill registers at 8 warps: ptxas, sm_90a, triton 3.8).
_DEFAULT_BLOCK_N = {"folded": 128, "grouped": 64}
_DEFAULT_NQ = 256


class PreparedKeys(NamedTuple):
    """Keys decoded for the scorer by ``prepare_keys``.

    Attributes:
        values: ``[S, 128]`` in the MMA input dtype (float8_e4m3fn, fp16, bf16 or
            fp32); within each 32-element group the even elements come first,
            then the odd ones. ``"grouped"``: ``E2M1 * 2**-6``; ``"folded"``:
            ``E2M1 * 2**(6 - d)`` rounded to the e4m3 grid.
        key_factor: fp32 ``[S]``: ``"folded"``: ``2**(m - 133)`` with ``m`` the key's
            largest scale code; ``None`` for ``"grouped"``.
        scales: uint8 ``[S, 4]`` the UE8M0 codes (read by ``"grouped"``).
        mode: ``"grouped"`` or ``"folded"``.
        mma: the MMA input type name (``"fp8"``, ``"fp16"``, ``"bf16"``, ``"fp32"``).
    """

    values: torch.Tensor
    key_factor: torch.Tensor | None
    scales: torch.Tensor
    mode: str
    mma: str


@triton.jit
def _e2m1_to_e4m3_bits(x):
    """E2M1 codes (any int type, one per element, or four per int32 word) -> e4m3 bits, same packing."""
    return ((x & 0x08080808) << 4) | ((x & 0x07070707) << 2)


@triton.jit
def _round_to_e4m3_grid(v):
    """Round fp32 ``v`` to nearest-even on the e4m3 grid where it is subnormal.

    Below ``2**-6`` e4m3 steps by ``2**-9``: ``(a + 2**23) - 2**23`` rounds
    ``a = |v| * 2**9`` (< 8) to the nearest integer, ties to even, in fp32
    round-to-nearest arithmetic. Larger folded values (at most two significant
    bits, at most 384) are already on the grid. Done here rather than by the
    fp8 conversion because Triton's interpreter rounds subnormal ties differently.
    """
    a = tl.abs(v) * 512.0
    r = ((a + 8388608.0) - 8388608.0) * 0.001953125
    return tl.where(tl.abs(v) < 0.015625, tl.where(v < 0, -r, r), v)


@triton.jit
def _prepare_packed_kernel(payload_ptr, out_ptr, S, BLOCK_S: tl.constexpr):
    """Grouped mode, e4m3 operands: decode on int32 words (4 codes each way per word)."""
    offs_s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    ok = offs_s < S
    w = tl.arange(0, 16)  # payload word w holds elements 8w .. 8w + 7 (group w // 4)
    words = tl.load(payload_ptr + offs_s[:, None].to(tl.int64) * 16 + w[None, :], mask=ok[:, None], other=0)
    e_lo = _e2m1_to_e4m3_bits(words & 0x0F0F0F0F)  # elements 8w, 8w+2, 8w+4, 8w+6
    e_hi = _e2m1_to_e4m3_bits((words >> 4) & 0x0F0F0F0F)  # elements 8w+1, 8w+3, ...
    dst = (w // 4) * 8 + (w % 4)  # output word: group's even half, then its odd half
    base = out_ptr + offs_s[:, None].to(tl.int64) * 32
    tl.store(base + dst[None, :], e_lo, mask=ok[:, None])
    tl.store(base + dst[None, :] + 4, e_hi, mask=ok[:, None])


@triton.jit
def _prepare_kernel(
    payload_ptr, scales_ptr, out_ptr, kf_ptr, S, BLOCK_S: tl.constexpr, FOLD: tl.constexpr, OUT_FP32: tl.constexpr,
    ELEMENT_ORDER: tl.constexpr = False,
):
    """Per-element decode into any operand dtype, optionally folding the group scales."""
    offs_s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    ok = offs_s < S
    i = tl.arange(0, 64)  # payload byte i: elements 2i (low nibble), 2i + 1 (high nibble)
    byte = tl.load(payload_ptr + offs_s[:, None].to(tl.int64) * 64 + i[None, :], mask=ok[:, None], other=0)
    byte = byte.to(tl.int32)
    lo = _e2m1_to_e4m3_bits(byte & 0x0F).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
    hi = _e2m1_to_e4m3_bits(byte >> 4).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
    if FOLD:
        srow = scales_ptr + offs_s.to(tl.int64) * 4
        code = tl.load(srow[:, None] + i[None, :] // 16, mask=ok[:, None], other=127).to(tl.int32)
        m = tl.maximum(
            tl.maximum(tl.load(srow, mask=ok, other=127), tl.load(srow + 1, mask=ok, other=127)),
            tl.maximum(tl.load(srow + 2, mask=ok, other=127), tl.load(srow + 3, mask=ok, other=127)),
        ).to(tl.int32)
        d = m[:, None] - code
        # 2 ** (12 - d) from its bits (biased exponent 139 - d >= 99); 0 past the cut-off.
        fold = tl.where(d <= 40, ((139 - d) << 23).to(tl.float32, bitcast=True), 0.0)
        lo = _round_to_e4m3_grid(lo * fold)
        hi = _round_to_e4m3_grid(hi * fold)
        kf = (m << 23).to(tl.float32, bitcast=True) * 0.015625  # 2 ** (m - 133), exact
        tl.store(kf_ptr + offs_s, kf, mask=ok)
    if not OUT_FP32:  # exact: every value is on the e4m3 grid
        lo = lo.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
        hi = hi.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
    base = out_ptr + offs_s[:, None].to(tl.int64) * 128
    if ELEMENT_ORDER:  # elements 2i, 2i + 1: one contiguous [BLOCK_S, 128] store
        j = tl.arange(0, 128)
        tl.store(base + j[None, :], tl.interleave(lo, hi), mask=ok[:, None])
    else:
        dst = (i // 16) * 32 + (i % 16)  # group's even half, then its odd half
        tl.store(base + dst[None, :], lo, mask=ok[:, None])
        tl.store(base + dst[None, :] + 16, hi, mask=ok[:, None])


def _check_planes(payload, scales):
    for name, t, width in (("payload", payload, PAYLOAD_BYTES), ("scales", scales, SCALE_BYTES)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.uint8 or t.dim() != 2 or t.shape[1] != width:
            raise ValueError(f"{name}: expected uint8 [S, {width}], got {t.dtype} {list(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor")
    if payload.shape[0] != scales.shape[0]:
        raise ValueError(f"payload and scales: row counts differ ({payload.shape[0]} vs {scales.shape[0]})")
    if payload.device != scales.device:
        raise ValueError(f"scales: on {scales.device}, but payload is on {payload.device}")


def prepare_keys(
    payload: torch.Tensor, scales: torch.Tensor, *, mode: str = "folded", mma: str = "fp8", element_order: bool = False
) -> PreparedKeys:
    """Decode flat MXFP4 index keys into the scorer's MMA operands (one launch).

    Args:
        payload: uint8 ``[S, 64]`` contiguous (``gather_index_k``).
        scales: uint8 ``[S, 4]`` contiguous.
        mode: ``"grouped"`` (exact for every key) or ``"folded"`` (see the
            module docstring for when it is exact).
        mma: operand type ``"fp8"``, ``"fp16"``, ``"bf16"`` or ``"fp32"``.
        element_order: store the 128 values in element order (for a scorer that
            reads the queries as they are, e.g. DeepGEMM) instead of each group's
            even elements then its odd ones. With ``"folded"`` and ``"fp8"`` the
            result is SGLang's FP8 index-key form: ``values * key_factor`` is the key.

    Returns:
        ``PreparedKeys``.

    Raises:
        TypeError / ValueError: bad planes, unknown ``mode`` or ``mma``.
    """
    _check_planes(payload, scales)
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if mma not in MMA_DTYPES:
        raise ValueError(f"mma: expected one of {tuple(MMA_DTYPES)}, got {mma!r}")
    n = payload.shape[0]
    values = torch.empty((n, INDEX_HEAD_DIM), dtype=MMA_DTYPES[mma], device=payload.device)
    fold = mode == "folded"
    key_factor = torch.empty((n,), dtype=torch.float32, device=payload.device) if fold else None
    if n:
        grid = (triton.cdiv(n, _BLOCK_S),)
        if not fold and mma == "fp8" and payload.data_ptr() % 4 == 0 and not element_order:
            _prepare_packed_kernel[grid](payload.view(torch.int32), values.view(torch.int32), n, BLOCK_S=_BLOCK_S)
        else:
            kf = key_factor if fold else values  # unused without FOLD
            block_s = _BLOCK_S_ELEMENT_ORDER if element_order else _BLOCK_S
            _prepare_kernel[(triton.cdiv(n, block_s),)](
                payload, scales, values, kf, n, BLOCK_S=block_s, FOLD=fold, OUT_FP32=mma == "fp32",
                ELEMENT_ORDER=bool(element_order),
            )
    return PreparedKeys(values, key_factor, scales, mode, mma)


@triton.jit
def _group_factor(sc_ptr, cols, col_ok, g: tl.constexpr):
    """fp32 [BLOCK_N] ``2 ** (code - 127)`` of group ``g`` of each key, from the code's bits."""
    code = tl.load(sc_ptr + cols.to(tl.int64) * 4 + g, mask=col_ok, other=127).to(tl.int32)
    return (code << 23).to(tl.float32, bitcast=True)


@triton.jit
def _ragged_logits_kernel(
    q_ptr,
    w_ptr,
    kv_ptr,
    kf_ptr,
    sc_ptr,
    ks_ptr,
    ke_ptr,
    out_ptr,
    T,
    S,
    stride_qt,
    stride_qh,
    stride_wt,
    stride_ot,
    num_splits,
    H: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FOLD: tl.constexpr,
    IEEE: tl.constexpr,
    CLEAN: tl.constexpr,
):
    NQ: tl.constexpr = BLOCK_M * H
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    op_ty = kv_ptr.dtype.element_ty

    # Windows of this query block, clamped to [0, S].
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < T
    ks = tl.maximum(tl.load(ks_ptr + offs_m, mask=m_ok, other=0), 0)
    ke = tl.minimum(tl.load(ke_ptr + offs_m, mask=m_ok, other=0), S)
    live = m_ok & (ke > ks)
    lo = tl.min(tl.where(live, ks, S), axis=0)
    hi = tl.max(tl.where(live, ke, 0), axis=0)
    lo_al = tl.where(hi > lo, (lo // BLOCK_N) * BLOCK_N, 0)
    hi_al = tl.where(hi > lo, tl.cdiv(hi, BLOCK_N) * BLOCK_N, 0)

    # Queries as the MMA's B operand: column n = (token n // H, head n % H), rows in
    # the prepared keys' element order (per group: even elements, then odd).
    offs_n = tl.arange(0, NQ)
    t_n = pid_m * BLOCK_M + offs_n // H
    n_ok = t_n < T
    q_col = q_ptr + t_n.to(tl.int64) * stride_qt + (offs_n % H) * stride_qh
    w = tl.load(w_ptr + t_n.to(tl.int64) * stride_wt + offs_n % H, mask=n_ok, other=0.0)
    p32 = tl.arange(0, 32)
    elem32 = tl.where(p32 < 16, 2 * p32, 2 * (p32 - 16) + 1)
    if FOLD:
        p128 = tl.arange(0, 128)
        elem128 = (p128 // 32) * 32 + tl.where(p128 % 32 < 16, 2 * (p128 % 32), 2 * (p128 % 32 - 16) + 1)
        q_all = tl.load(q_col[None, :] + elem128[:, None], mask=n_ok[None, :], other=0.0).to(op_ty)
        q0 = q_all
        q1 = q_all
        q2 = q_all
        q3 = q_all
    else:
        q0 = tl.load(q_col[None, :] + elem32[:, None], mask=n_ok[None, :], other=0.0).to(op_ty)
        q1 = tl.load(q_col[None, :] + 32 + elem32[:, None], mask=n_ok[None, :], other=0.0).to(op_ty)
        q2 = tl.load(q_col[None, :] + 64 + elem32[:, None], mask=n_ok[None, :], other=0.0).to(op_ty)
        q3 = tl.load(q_col[None, :] + 96 + elem32[:, None], mask=n_ok[None, :], other=0.0).to(op_ty)

    out_rows = out_ptr + offs_m.to(tl.int64) * stride_ot
    neg_inf = tl.full((BLOCK_N, BLOCK_M), float("-inf"), tl.float32)
    arange_n = tl.arange(0, BLOCK_N)

    # Tiles of the windows' union, split evenly over the num_splits programs of this block.
    per_split = tl.cdiv((hi_al - lo_al) // BLOCK_N, num_splits) * BLOCK_N
    c_start = lo_al + pid_s * per_split
    c_end = tl.minimum(hi_al, c_start + per_split)
    for c0 in range(c_start, c_end, BLOCK_N):
        cols = c0 + arange_n
        col_ok = cols < S
        store_mask = col_ok[:, None] & m_ok[None, :]
        touched = tl.max(tl.where(live & (ke > c0) & (ks < c0 + BLOCK_N), 1, 0), axis=0)
        if touched > 0:
            k_row = kv_ptr + cols[:, None].to(tl.int64) * 128
            if FOLD:
                k = tl.load(k_row + tl.arange(0, 128)[None, :], mask=col_ok[:, None], other=0.0)
                if IEEE:
                    acc = tl.dot(k, q0, input_precision="ieee")
                else:
                    acc = tl.dot(k, q0)
            else:
                k = tl.load(k_row + p32[None, :], mask=col_ok[:, None], other=0.0)
                if IEEE:
                    acc = tl.dot(k, q0, input_precision="ieee") * _group_factor(sc_ptr, cols, col_ok, 0)[:, None]
                    k = tl.load(k_row + 32 + p32[None, :], mask=col_ok[:, None], other=0.0)
                    acc += tl.dot(k, q1, input_precision="ieee") * _group_factor(sc_ptr, cols, col_ok, 1)[:, None]
                    k = tl.load(k_row + 64 + p32[None, :], mask=col_ok[:, None], other=0.0)
                    acc += tl.dot(k, q2, input_precision="ieee") * _group_factor(sc_ptr, cols, col_ok, 2)[:, None]
                    k = tl.load(k_row + 96 + p32[None, :], mask=col_ok[:, None], other=0.0)
                    acc += tl.dot(k, q3, input_precision="ieee") * _group_factor(sc_ptr, cols, col_ok, 3)[:, None]
                else:
                    acc = tl.dot(k, q0) * _group_factor(sc_ptr, cols, col_ok, 0)[:, None]
                    k = tl.load(k_row + 32 + p32[None, :], mask=col_ok[:, None], other=0.0)
                    acc += tl.dot(k, q1) * _group_factor(sc_ptr, cols, col_ok, 1)[:, None]
                    k = tl.load(k_row + 64 + p32[None, :], mask=col_ok[:, None], other=0.0)
                    acc += tl.dot(k, q2) * _group_factor(sc_ptr, cols, col_ok, 2)[:, None]
                    k = tl.load(k_row + 96 + p32[None, :], mask=col_ok[:, None], other=0.0)
                    acc += tl.dot(k, q3) * _group_factor(sc_ptr, cols, col_ok, 3)[:, None]
            contrib = tl.maximum(acc, 0.0) * w[None, :]
            logits = tl.sum(tl.reshape(contrib, (BLOCK_N, BLOCK_M, H)), axis=2)
            if FOLD:
                logits = logits * tl.load(kf_ptr + cols, mask=col_ok, other=0.0)[:, None]
            else:
                logits = logits * 64.0
            inside = (cols[:, None] >= ks[None, :]) & (cols[:, None] < ke[None, :])
            logits = tl.where(inside, logits, neg_inf)
            tl.store(out_rows[None, :] + cols[:, None], to_logits_dtype(logits, out_ptr), mask=store_mask)
        else:
            if CLEAN:
                tl.store(out_rows[None, :] + cols[:, None], neg_inf, mask=store_mask)

    if CLEAN:
        # -inf over the columns outside the union, split the same way over [0, S).
        fill_per = tl.cdiv(tl.cdiv(S, BLOCK_N), num_splits) * BLOCK_N
        f_start = pid_s * fill_per
        f_end = tl.minimum(f_start + fill_per, S)
        for c0 in range(f_start, tl.minimum(f_end, lo_al), BLOCK_N):
            cols = c0 + arange_n
            tl.store(out_rows[None, :] + cols[:, None], neg_inf, mask=(cols < S)[:, None] & m_ok[None, :])
        for c0 in range(tl.maximum(f_start, hi_al), f_end, BLOCK_N):
            cols = c0 + arange_n
            tl.store(out_rows[None, :] + cols[:, None], neg_inf, mask=(cols < S)[:, None] & m_ok[None, :])


def _check_queries(q, weights, ks, ke, device):
    tokens, heads = check_index_queries(
        q, weights, "T", heads_ok=lambda h: h >= 1 and not h & (h - 1), heads_expected="a power of two"
    )
    for name, t in (("ks", ks), ("ke", ke)):
        check_int32(t, name, lambda shape: shape == (tokens,), f"[{tokens}]")
    for name, t in (("q", q), ("weights", weights), ("ks", ks), ("ke", ke)):
        if t.device != device:
            raise ValueError(f"{name}: on {t.device}, but the keys are on {device}")
    if device.type == "cpu" and not interpreting():
        raise ValueError("q: on the CPU the Triton scorer runs only under TRITON_INTERPRET=1")
    return tokens, heads


def _block_sizes(heads: int, mode: str, block_m: int | None, block_n: int | None) -> tuple[int, int]:
    if block_m is None:
        block_m = max(1, _DEFAULT_NQ // heads)
    if block_n is None:
        block_n = _DEFAULT_BLOCK_N[mode]
    for name, v, least in (("block_m", block_m, 1), ("block_n", block_n, 16)):
        if not isinstance(v, int) or v < least or v & (v - 1):
            raise ValueError(f"{name}: expected a power of two >= {least}, got {v!r}")
    if block_m * heads < 16:
        raise ValueError(f"block_m: block_m * H must be >= 16 (an MMA dimension), got {block_m} * {heads}")
    return block_m, block_n


def _score(q, weights, keys: PreparedKeys, ks, ke, out, clean_logits, block_m, block_n, num_splits):
    """Launch the scorer on prepared keys into ``out`` [T, S] (validated by the caller)."""
    tokens, heads = q.shape[0], q.shape[1]
    width = keys.values.shape[0]
    if tokens == 0 or width == 0:
        return out
    q_blocks = triton.cdiv(tokens, block_m)
    if num_splits is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 1
        num_splits = max(1, min(triton.cdiv(2 * sms, q_blocks), triton.cdiv(width, block_n)))
    fold = keys.mode == "folded"
    kf = keys.key_factor if fold else weights  # unused without FOLD
    _ragged_logits_kernel[(q_blocks, num_splits)](
        q,
        weights,
        keys.values,
        kf,
        keys.scales,
        ks,
        ke,
        out,
        tokens,
        width,
        q.stride(0),
        q.stride(1),
        weights.stride(0),
        out.stride(0),
        num_splits,
        H=heads,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        FOLD=fold,
        IEEE=keys.mma == "fp32",
        CLEAN=clean_logits,
        num_warps=8 if block_m * heads * block_n >= 64 * 256 else 4,
    )
    return out


_LOGITS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def deepgemm_reason(q: torch.Tensor, heads: int) -> str | None:
    """Why DeepGEMM's ragged scorer cannot take these index queries (``None``: it can).

    It needs an NVIDIA GPU of compute capability 9.x or 10.x, e4m3 queries, 32 or
    64 heads, and the ``deep_gemm`` package (installed beside SGLang) with a
    ragged scorer that writes absolute columns (``ops.deepgemm.api``: sgl-deep-gemm
    0.2.3's; 0.2.5's writes only compressed logits, and the reason is warned about once).
    """
    if q.device.type != "cuda" or torch.version.hip is not None:
        return "not an NVIDIA CUDA device"
    if torch.cuda.get_device_capability(q.device)[0] not in (9, 10):
        return "DeepGEMM's ragged scorer runs on compute capability 9.x and 10.x"
    if q.dtype != torch.float8_e4m3fn:
        return "index queries are not float8_e4m3fn"
    if heads not in _DEEPGEMM_HEADS:
        return f"{heads} heads (DeepGEMM takes {_DEEPGEMM_HEADS})"
    return deepgemm.api().ragged_problem


def _setup(q, weights, payload, scales, ks, ke, mode, mma, check, block_m, block_n, num_splits, logits_dtype,
           impl="triton"):
    """Validate the arguments shared by ``ragged_logits`` and ``iter_ragged_logits``; resolve the options."""
    if impl not in ("auto", *IMPLS):
        raise ValueError(f"impl: expected 'auto' or one of {IMPLS}, got {impl!r}")
    if logits_dtype not in _LOGITS_DTYPES:
        raise ValueError(f"logits_dtype: expected float32, bfloat16 or float16, got {logits_dtype}")
    _check_planes(payload, scales)
    tokens, heads = _check_queries(q, weights, ks, ke, payload.device)
    width = payload.shape[0]
    mma = select_mma(mma, q)
    if mode == "auto":
        mode = "folded" if mma == "fp8" else "grouped"
    if mode not in MODES:
        raise ValueError(f"mode: expected 'auto' or one of {MODES}, got {mode!r}")
    block_m, block_n = _block_sizes(heads, mode, block_m, block_n)
    if num_splits is not None and (not isinstance(num_splits, int) or isinstance(num_splits, bool) or num_splits < 1):
        raise ValueError(f"num_splits: expected an int >= 1, got {num_splits!r}")
    if check and tokens and (int(ks.min()) < 0 or int(ke.max()) > width):
        raise ValueError(f"ks, ke: windows must lie in [0, {width}]")
    if check:
        check_finite_queries(q, weights)
    if impl != "triton":
        why = deepgemm_reason(q, heads)
        if impl == "deepgemm" and why:
            raise ValueError(f"impl: 'deepgemm' cannot run here: {why}")
        impl = "triton" if why else "deepgemm"
    return tokens, width, mode, mma, block_m, block_n, impl


@triton.jit
def _clamp_windows_kernel(ks_ptr, ke_ptr, ks_out, ke_out, T, S, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < T
    lo = tl.minimum(tl.maximum(tl.load(ks_ptr + offs, mask=ok, other=0), 0), S)
    hi = tl.minimum(tl.maximum(tl.load(ke_ptr + offs, mask=ok, other=0), lo), S)
    tl.store(ks_out + offs, lo, mask=ok)
    tl.store(ke_out + offs, hi, mask=ok)


def _clamped_windows(ks, ke, width: int):
    """``ks`` and ``ke`` clamped to ``0 <= ks <= ke <= width`` on the device, in one launch (no sync)."""
    lo, hi = torch.empty_like(ks), torch.empty_like(ke)
    if ks.numel():
        _clamp_windows_kernel[(triton.cdiv(ks.numel(), 1024),)](ks, ke, lo, hi, ks.numel(), width, BLOCK=1024)
    return lo, hi


def _deepgemm_keys(payload, scales) -> PreparedKeys:
    """The folded decode in element order: SGLang's FP8 index-key form (e4m3 values, fp32 scale per key)."""
    return prepare_keys(payload, scales, mode="folded", mma="fp8", element_order=True)


def _deepgemm_score(q, weights, keys: PreparedKeys, ks, ke, clean_logits, logits_dtype):
    """DeepGEMM's ragged scorer (``ops.deepgemm.api().ragged``: ``fp8_mqa_logits`` or its ``fp8_fp4`` form) on
    prepared keys: ``[T, S]`` logits (a view with a padded row stride).

    Windows are clamped to ``[0, S]`` on the device first (no sync), so no
    argument can make it read or write out of bounds.
    """
    width = keys.values.shape[0]
    ks, ke = _clamped_windows(ks, ke, width)
    q = q.contiguous()
    if weights.stride(1) != 1:
        weights = weights.contiguous()
    return deepgemm.api().ragged(q, (keys.values, keys.key_factor), weights, ks, ke, clean_logits, logits_dtype)


def ragged_logits(
    q: torch.Tensor,
    weights: torch.Tensor,
    payload: torch.Tensor,
    scales: torch.Tensor,
    ks: torch.Tensor,
    ke: torch.Tensor,
    *,
    clean_logits: bool = True,
    out: torch.Tensor | None = None,
    mode: str = "auto",
    mma: str = "auto",
    check: bool = True,
    block_m: int | None = None,
    block_n: int | None = None,
    num_splits: int | None = None,
    logits_dtype: torch.dtype = torch.float32,
    impl: str = "auto",
) -> torch.Tensor:
    """Score each query token against its own window of the flat FP4 keys (prefill / extend).

    ``logits[t, j] = sum_h weights[t, h] * relu(q[t, h] . k_j)`` for
    ``ks[t] <= j < ke[t]``; every other column is ``-inf`` (an empty window,
    ``ke[t] <= ks[t]``, gives a row of ``-inf``). Same semantics as
    ``reference.ragged_logits_reference`` and SGLang's ``fp8_mqa_logits``.

    Args:
        q: ``[T, H, 128]`` float8_e4m3fn (bf16 accepted) index queries, last dim
            contiguous, ``H`` a power of two (32 and 64 for the DSA models).
        weights: fp32 ``[T, H]`` head weights (q scale folded in), heads contiguous.
        payload: uint8 ``[S, 64]`` flat payload plane (``ops.gather.gather_index_k``).
        scales: uint8 ``[S, 4]`` flat scale plane.
        ks, ke: int32 ``[T]`` window start (inclusive) and end (exclusive) in the
            flat keys.
        clean_logits: write ``-inf`` at every column outside the windows (default).
            With ``False`` (like SGLang's ``clean_logits=False``), key tiles
            outside every window of a query block are left untouched; columns
            outside a token's window inside a scored tile are still ``-inf``.
        out: optional ``[T, S]`` output of ``logits_dtype``, columns contiguous (reused buffer).
        mode: ``"auto"`` (``"folded"`` with FP8 MMA, else ``"grouped"``),
            ``"grouped"`` or ``"folded"``: see the module docstring.
        mma: ``"auto"``, ``"fp8"``, ``"fp16"``, ``"bf16"`` or ``"fp32"``
            (``_common.select_mma``): FP8 MMA on compute capability >= 8.9 and
            under the interpreter, a portable fp16/bf16 MMA elsewhere.
        check: validate the windows, and q and weights for NaN/Inf, on the host
            (a sync). With ``False`` the kernel clamps each window to ``[0, S]``
            and never reads or writes out of bounds.
        block_m, block_n: query tokens and keys per tile (powers of two; defaults
            ``256 // H``, and 128 keys ``"folded"`` / 64 ``"grouped"``), for tuning.
        num_splits: programs per query block over the key range (default: enough
            to give every SM two programs).
        logits_dtype: fp32 (default), bf16 or fp16 logits: the sum is formed in
            fp32 and rounded once on store (round to nearest even), as in
            ``ops.paged_logits.paged_logits``; bf16/fp16 halve the bytes written.
        impl: ``"auto"`` (default): ``"deepgemm"`` where ``deepgemm_reason`` is
            ``None``, else ``"triton"``. ``"deepgemm"``: the keys decoded once to
            e4m3 + one fp32 scale per key (the ``"folded"`` numerics; ``mode``,
            ``mma`` and the tile options do not apply) and scored by DeepGEMM's
            ``fp8_mqa_logits`` (module docstring); with ``out`` given the logits
            are copied into it. ``"triton"``: this module's kernel.

    Returns:
        ``[T, S]`` of ``logits_dtype`` (``out`` when given; with ``"deepgemm"``
        otherwise a view whose row stride is DeepGEMM's padded one).

    Raises:
        TypeError / ValueError: bad dtype, shape, device or contiguity of any
            argument, a bad option, ``impl="deepgemm"`` where it cannot run, or
            (``check=True``) a window outside ``[0, S]`` or NaN/Inf in q or weights.
    """
    tokens, width, mode, mma, block_m, block_n, impl = _setup(
        q, weights, payload, scales, ks, ke, mode, mma, check, block_m, block_n, num_splits, logits_dtype, impl
    )
    if out is not None and (out.dtype != logits_dtype or tuple(out.shape) != (tokens, width) or out.stride(1) != 1):
        raise ValueError(
            f"out: expected {logits_dtype} [{tokens}, {width}] with contiguous columns, got {out.dtype} "
            f"{list(out.shape)}"
        )
    if out is not None and out.device != q.device:
        raise ValueError(f"out: on {out.device}, but q is on {q.device}")
    if impl == "deepgemm":
        if tokens == 0 or width == 0:
            return out if out is not None else torch.empty((tokens, width), dtype=logits_dtype, device=q.device)
        logits = _deepgemm_score(q, weights, _deepgemm_keys(payload, scales), ks, ke, clean_logits, logits_dtype)
        if out is None:
            return logits
        return out.copy_(logits)
    if out is None:
        out = torch.empty((tokens, width), dtype=logits_dtype, device=q.device)
    keys = prepare_keys(payload, scales, mode=mode, mma=mma)
    return _score(q, weights, keys, ks, ke, out, clean_logits, block_m, block_n, num_splits)


def rows_per_chunk(num_rows: int, num_cols: int, budget_bytes: int) -> int:
    """Query rows per chunk so that one fp32 ``[rows, num_cols]`` logits chunk fits ``budget_bytes``.

    The rule of SGLang's MQA-logits budget (``mqa_logits_rows_per_chunk``):
    ``max(1, budget_bytes // (4 * num_cols))``, at most ``num_rows`` (and 1 for
    an empty problem). A single row may exceed the budget when ``4 * num_cols`` does.

    Raises:
        ValueError: a negative size or a non-positive budget.
    """
    if num_rows < 0 or num_cols < 0:
        raise ValueError(f"num_rows, num_cols: expected >= 0, got {num_rows}, {num_cols}")
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes: expected > 0, got {budget_bytes}")
    rows = max(1, budget_bytes // max(4 * num_cols, 1))
    return max(1, min(rows, num_rows))


def iter_ragged_logits(
    q: torch.Tensor,
    weights: torch.Tensor,
    payload: torch.Tensor,
    scales: torch.Tensor,
    ks: torch.Tensor,
    ke: torch.Tensor,
    *,
    budget_bytes: int,
    clean_logits: bool = True,
    mode: str = "auto",
    mma: str = "auto",
    check: bool = True,
    block_m: int | None = None,
    block_n: int | None = None,
    num_splits: int | None = None,
    logits_dtype: torch.dtype = torch.float32,
    impl: str = "auto",
) -> Iterator[tuple[int, int, torch.Tensor]]:
    """``ragged_logits`` in row chunks whose logits fit a byte budget.

    Decodes the keys once, allocates one ``[rows_per_chunk, S]`` buffer of
    ``logits_dtype`` (``rows_per_chunk(T, S, budget_bytes)``, which budgets 4 bytes per logit) and yields ``(start, end, logits)``
    for consecutive query rows ``[start, end)``; ``logits`` is a view of that
    buffer, ``[end - start, S]``, valid until the next iteration (consume it,
    e.g. take the top-k, before advancing). Arguments as ``ragged_logits``.

    Raises:
        As ``ragged_logits`` and ``rows_per_chunk`` (raised at the first ``next``).
    """
    tokens, width, mode, mma, block_m, block_n, impl = _setup(
        q, weights, payload, scales, ks, ke, mode, mma, check, block_m, block_n, num_splits, logits_dtype, impl
    )
    rows = rows_per_chunk(tokens, width, budget_bytes)
    if impl == "deepgemm":  # DeepGEMM allocates each chunk's logits itself
        keys = _deepgemm_keys(payload, scales)
        for start in range(0, tokens, rows):
            end = min(start + rows, tokens)
            yield start, end, _deepgemm_score(q[start:end], weights[start:end], keys, ks[start:end], ke[start:end],
                                              clean_logits, logits_dtype)
        return
    keys = prepare_keys(payload, scales, mode=mode, mma=mma)
    buf = torch.empty((rows, width), dtype=logits_dtype, device=q.device)
    for start in range(0, tokens, rows):
        end = min(start + rows, tokens)
        chunk = buf[: end - start]
        _score(q[start:end], weights[start:end], keys, ks[start:end], ke[start:end], chunk, clean_logits, block_m, block_n, num_splits)
        yield start, end, chunk
