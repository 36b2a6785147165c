"""Paged FP4 scorer for decode and target verify (docs/design.md, The paged scorer).

``logits[r, j] = sum_h weights[r, h] * relu(q[r, h] . k_j)`` for the keys
``j < len(r)`` of row ``r``'s request, read straight out of the paged MXFP4
index-key cache through the block table; columns ``len(r) <= j < width`` are
written ``-inf`` (so a plain top-k over the row is correct without lengths).

Method (``impl``). ``"folded"``: each group's UE8M0 scale is folded into e4m3
bytes made from the E2M1 nibbles with integer ops, relative to the key's largest
group scale, so one K = 128 FP8 MMA covers the key and ``2**(s_max - 127)`` is
applied once per key after relu and the head sum (``relu(c x) = c relu(x)`` for
``c > 0``); exact while a key's group scales lie within 2**11 of its largest
(docs/design.md, The paged scorer). ``"scaled"``: Triton's ``tl.dot_scaled``
reads the E2M1 codes and UE8M0 scales natively. ``"wgmma"``: the Hopper CUDA
kernel (``ops/sm90.py``) with the folded numerics, fold on the index key, accumulating in f16
(its error bound: docs/design.md, Hopper numerics). In the Triton formulations products are
exact and accumulate in fp32.

Work is split over a persistent grid by the CTA schedule (``ops/schedule.py``): program
``i`` walks the (request, key block) tiles from ``schedule[i]`` to
``schedule[i + 1]``; one tile scores all ``next_n`` rows of a request against
``block_kv`` keys, so each key is read once per request.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from ..pool import PAGE_SIZE, check_cache
from ._common import (MAX_NEXT_N, MMA_DTYPES, check_finite_queries, check_index_queries, check_int32, fp8_mma_available,
                      scale_row_jit, select_mma, select_mma_for, to_logits_dtype)

__all__ = [
    "DEFAULT_BLOCK_KV", "WGMMA_BLOCK_KV", "IMPLS", "MAX_NEXT_N", "SUPPORTED_HEADS", "TritonLauncher", "TritonTuning",
    "default_block_kv", "paged_logits", "paged_scorer", "fp8_mma_available", "resolved_impl",
]

#: Keys per tile of the Triton scorers (four pages), measured best for "folded" on H200 among 64, 128,
#: 256 and 512 (the Triton sweep of experiments/perf_probe.py). The CTA schedule must be planned with the
#: value the call uses.
DEFAULT_BLOCK_KV = 256
#: Keys per tile of the Hopper wgmma kernel's schedule (one page): 1-3 % slower than 256-key
#: tiles on long rows where measured side by side, 1.6x faster at batch 1 x 4K (docs/perf-notes.md,
#: "The warp-specialised CTA").
WGMMA_BLOCK_KV = 64


def default_block_kv(device: torch.device | str, impl: str | None = None) -> int:
    """Keys per schedule tile the scorer is tuned for on ``device``.

    ``WGMMA_BLOCK_KV`` (64) for the Hopper kernel, ``DEFAULT_BLOCK_KV`` (256)
    for the Triton scorers. ``impl`` ``None`` or ``"auto"``: the device's
    default, the Hopper kernel where ``ops.sm90.available`` (resolved once per
    device: this runs on every serving step). Plan the schedule and call
    ``paged_logits`` with the same value (``paged_logits`` uses this one when
    ``block_kv`` is not given). With ``"auto"`` it is per device, not per call:
    a call the Hopper kernel declines (bf16 queries, ``next_n * H * 128`` over
    32 KB) runs the Triton scorer on 64-key tiles, correct but slower than on
    its tuned 256.
    """
    if impl == "wgmma":
        return WGMMA_BLOCK_KV
    if impl not in (None, "auto"):
        return DEFAULT_BLOCK_KV
    device = torch.device(device)
    if device.type != "cuda":
        return DEFAULT_BLOCK_KV
    return _cuda_block_kv(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_block_kv(index: int) -> int:
    from . import sm90

    return WGMMA_BLOCK_KV if sm90.available(torch.device("cuda", index)) else DEFAULT_BLOCK_KV
#: Index head counts the scorer supports (powers of two; 32 and 64 are the DSA models').
SUPPORTED_HEADS = (16, 32, 64, 128)


# Folded decode (impl "folded"): each group's UE8M0 scale is folded into the
# e4m3 bytes relative to the key's largest group scale s_max, so one K = 128
# FP8 MMA covers the whole key and 2**(s_max - 127) is applied once per key
# after the head sum. For a group with A = s_g - s_max + 12 >= 1 the e4m3 byte
# of E2M1 magnitude x (x = 0..7) is LUT_A[x] = e4m3(E2M1(x) * 2**(A - 6)) = E2M1(x) * 2**(s_g - s_max + 6):
#   LUT_A[0] = 0, LUT_A[1] = A << 3, LUT_A[x >= 2] = (x << 2) + (A << 3)
# -- every entry normal and exact. A group more than 2**11 below its key's
# largest group (A < 1) is flushed to zero: its terms are below 2**-11 of the
# key's largest and below FP4's own rounding error of that largest group.
_FOLD_BIAS = 12
# Elementwise on bytes (4 packed per 32-bit register, any layout): from a payload
# byte (two E2M1 codes) and its group's A (0 = flushed) make the two e4m3 bytes
# LUT_A[code] | sign, with SWAR integer ops on all four bytes at once.
def _fold_ptx_half(codes: str, sign: str, out: str) -> str:
    """PTX for one nibble of each of four packed bytes: ``m`` = its 3-bit magnitudes."""
    return f"""{codes}
and.b32 m, m, 0x07070707;
shr.b32 y, m, 1;
shr.b32 c, m, 2;
or.b32 y, y, c;
not.b32 c, y;
and.b32 c, c, m;
and.b32 c, c, 0x01010101;
or.b32 nz, m, y;
and.b32 nz, nz, la;
and.b32 nz, nz, 0x01010101;
mul.lo.u32 nz, nz, 255;
shl.b32 t, m, 2;
add.u32 t, t, a8;
shl.b32 c, c, 2;
xor.b32 t, t, c;
{sign}
or.b32 t, t, s;
and.b32 {out}, t, nz;
"""


# $2: four payload bytes; $3: their groups' A (0 = flushed). For each byte and
# nibble: t = (m << 2) + (A << 3), bit 2 cleared where m == 1 (x = 1 is 0.5: mantissa
# 0 one binade down), zeroed where m == 0 or A == 0, sign to bit 7. $0: low nibbles
# (even elements), $1: high nibbles (odd elements).
_FOLD_ASM = tl.constexpr(
    "{\n.reg .b32 a8, m, y, c, nz, la, t, s;\n"
    "shl.b32 a8, $3, 3;\nshr.b32 la, $3, 1;\nor.b32 la, la, $3;\nshr.b32 y, la, 2;\n"
    "or.b32 la, la, y;\nand.b32 la, la, 0x01010101;\n"
    + _fold_ptx_half("mov.b32 m, $2;", "and.b32 s, $2, 0x08080808;\nshl.b32 s, s, 4;", "$0")
    + _fold_ptx_half("shr.b32 m, $2, 4;", "and.b32 s, $2, 0x80808080;", "$1")
    + "}\n"
)


@triton.jit
def _folded_keys(cache_ptr, payload_base, scale_base, ok, BLOCK_KV: tl.constexpr, ASM: tl.constexpr):
    """Decode BLOCK_KV keys to e4m3 [BLOCK_KV, 128] with group scales folded in; also 2**(s_max - 127) per key.

    Columns in element order. With ASM (NVIDIA) the bytes are made by inline
    PTX on four packed bytes at a time, elementwise so that it is correct for
    any register layout; without it (the portable path the CPU interpreter
    runs) by the same arithmetic in Triton integer ops.
    """
    offs_g = tl.arange(0, 4)
    codes = tl.load(cache_ptr + scale_base[:, None] + offs_g[None, :], mask=ok[:, None], other=127).to(tl.int32)
    s_max = tl.max(codes, axis=1)
    a = codes - s_max[:, None] + 12  # [BLOCK_KV, 4]
    live = a >= 1
    offs_c = tl.arange(0, 16)
    packed = tl.load(
        cache_ptr + payload_base[:, None, None] + offs_g[None, :, None] * 16 + offs_c[None, None, :],
        mask=ok[:, None, None], other=0,
    )  # [BLOCK_KV, 4, 16] uint8
    if ASM:
        a_bytes = tl.broadcast_to(tl.where(live, a, 0).to(tl.uint8)[:, :, None], (BLOCK_KV, 4, 16))
        e_lo, e_hi = tl.inline_asm_elementwise(
            _FOLD_ASM, "=r,=r,r,r", [packed, a_bytes], dtype=(tl.uint8, tl.uint8), is_pure=True, pack=4,
        )
        k_bits = tl.reshape(tl.join(e_lo, e_hi), (BLOCK_KV, 128))
    else:
        step = (a << 3).to(tl.uint8)[:, :, None]
        keep = live[:, :, None]
        lo = packed & 0x0F
        hi = packed >> 4
        m_lo = lo & 0x07
        m_hi = hi & 0x07
        e_lo = tl.where(m_lo == 0, 0, tl.where(m_lo == 1, 0, m_lo << 2) + step)
        e_hi = tl.where(m_hi == 0, 0, tl.where(m_hi == 1, 0, m_hi << 2) + step)
        e_lo = tl.where(keep, e_lo | ((lo & 0x08) << 4), 0).to(tl.uint8)
        e_hi = tl.where(keep, e_hi | ((hi & 0x08) << 4), 0).to(tl.uint8)
        k_bits = tl.reshape(tl.join(e_lo, e_hi), (BLOCK_KV, 128))
    factor = (s_max << 23).to(tl.float32, bitcast=True)  # 2 ** (s_max - 127), exact
    return k_bits.to(tl.float8e4nv, bitcast=True), factor


@triton.jit
def _nan_to_zero(x):
    """Index queries with their NaN elements read as 0 (``paged_logits``, ``check=False``).

    On the bits, so every backend agrees (e4m3's NaN is the magnitude byte
    0x7F, which the CPU interpreter would read as 480 and a GPU's FP8 MMA as
    NaN; bf16's NaNs are the magnitudes above 0x7F80).
    """
    if x.dtype == tl.float8e4nv:
        bits = x.to(tl.uint8, bitcast=True)
        return tl.where((bits & 0x7F) == 0x7F, 0, bits).to(tl.uint8).to(tl.float8e4nv, bitcast=True)
    else:
        bits = x.to(tl.uint16, bitcast=True)
        return tl.where((bits & 0x7FFF) > 0x7F80, 0, bits).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _paged_logits_kernel(
    q_ptr,
    w_ptr,
    cache_ptr,
    bt_ptr,
    lens_ptr,
    sched_ptr,
    out_ptr,
    num_requests,
    num_pages,
    max_pages,
    width,
    stride_q_row,
    stride_q_head,
    stride_w_row,
    stride_bt,
    stride_out,
    LENS_PER_ROW: tl.constexpr,
    NEXT_N: tl.constexpr,
    NEXT_N_PAD: tl.constexpr,
    H: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    DOT_MODE: tl.constexpr,
    IMPL: tl.constexpr,
    ASM: tl.constexpr,
    CLEAN: tl.constexpr,
):
    NH: tl.constexpr = NEXT_N_PAD * H
    PAGE_BYTES: tl.constexpr = PAGE * 68
    pid = tl.program_id(0)
    # Clamped at 0: a corrupt or foreign schedule entry never makes a row or key index negative.
    b_first = tl.maximum(tl.load(sched_ptr + pid * 2), 0)
    blk_first = tl.maximum(tl.load(sched_ptr + pid * 2 + 1), 0)
    b_last = tl.load(sched_ptr + pid * 2 + 2)
    blk_last = tl.load(sched_ptr + pid * 2 + 3)

    offs_i = tl.arange(0, NEXT_N_PAD)
    offs_kv = tl.arange(0, BLOCK_KV)
    offs_n = tl.arange(0, NH)  # combined (row-in-request, head) index n = i * H + h
    n_row = offs_n // H
    n_head = offs_n % H
    n_ok = n_row < NEXT_N
    offs_d = tl.arange(0, 128)
    offs_p = tl.arange(0, 64)
    offs_g = tl.arange(0, 4)
    neg_inf = tl.full((BLOCK_KV, NEXT_N_PAD), float("-inf"), tl.float32)

    # Requests b_first .. b_last (b_last only up to key block blk_last, exclusive).
    for b in range(b_first, tl.minimum(b_last + 1, num_requests)):
        # Visible keys of each of the request's next_n rows.
        if LENS_PER_ROW:
            lens = tl.load(lens_ptr + b * NEXT_N + offs_i, mask=offs_i < NEXT_N, other=0)
        else:
            ctx = tl.load(lens_ptr + b)
            lens = ctx - NEXT_N + 1 + offs_i
        lens = tl.where(offs_i < NEXT_N, tl.maximum(lens, 0), 0)
        max_len = tl.max(lens, axis=0)
        nblocks = tl.maximum(tl.cdiv(max_len, BLOCK_KV), 1)
        blk_start = tl.where(b == b_first, blk_first, 0)
        blk_stop = tl.where(b == b_last, blk_last, nblocks)
        row0 = b * NEXT_N
        q_rows = (row0 + n_row).to(tl.int64)
        out_rows = (row0 + offs_i).to(tl.int64) * stride_out
        row_ok = offs_i[None, :] < NEXT_N
        # The request's index queries and weights stay in registers for all its tiles.
        w = tl.load(w_ptr + q_rows * stride_w_row + n_head, mask=n_ok, other=0.0)
        q_base = q_ptr + q_rows * stride_q_row + n_head * stride_q_head
        q_t = _nan_to_zero(tl.load(q_base[None, :] + offs_d[:, None], mask=n_ok[None, :], other=0.0))

        for blk in range(blk_start, blk_stop):
            kv = blk * BLOCK_KV + offs_kv
            # Keys past the block table's width are not in the request (never read past its row).
            in_req = (kv < max_len) & (kv < max_pages * PAGE)
            page = tl.load(bt_ptr + b * stride_bt + kv // PAGE, mask=in_req, other=0)
            ok = in_req & (page >= 0) & (page < num_pages)
            prow = kv % PAGE
            page_base = page.to(tl.int64) * PAGE_BYTES
            payload_base = page_base + prow * 64
            scale_base = page_base + PAGE * 64 + scale_row_jit(prow, PAGE) * 4  # docs/design.md, The index-key format
            if IMPL == 2:
                k_f8, key_factor = _folded_keys(cache_ptr, payload_base, scale_base, ok, BLOCK_KV, ASM)
                acc = tl.dot(k_f8, q_t)
                unit = 0.015625  # LUT entries hold E2M1 * 2**(s_g - s_max + 6)
            else:  # IMPL 1, "scaled": Triton's MX dot reads E2M1 codes and UE8M0 scales natively (docs/design.md, The paged scorer).
                k_codes = tl.load(cache_ptr + payload_base[:, None] + offs_p[None, :], mask=ok[:, None], other=0)
                k_scales = tl.load(cache_ptr + scale_base[:, None] + offs_g[None, :], mask=ok[:, None], other=127)
                if DOT_MODE >= 2:  # bf16 index queries
                    acc = tl.dot_scaled(k_codes, k_scales, "e2m1", q_t, None, "bf16", fast_math=True)
                else:
                    acc = tl.dot_scaled(k_codes, k_scales, "e2m1", q_t, None, "e4m3", fast_math=True)
                unit = 1.0
            contrib = tl.maximum(acc, 0.0) * w[None, :]
            logits = tl.sum(tl.reshape(contrib, (BLOCK_KV, NEXT_N_PAD, H)), axis=2) * unit
            if IMPL == 2:
                logits = logits * key_factor[:, None]  # relu(c x) = c relu(x) for c > 0
            visible = (kv[:, None] < lens[None, :]) & ok[:, None]
            logits = tl.where(visible, logits, neg_inf)
            store_mask = row_ok & (kv[:, None] < width)
            tl.store(out_ptr + out_rows[None, :] + kv[:, None], to_logits_dtype(logits, out_ptr), mask=store_mask)

        # The request's last tile also writes -inf over the rest of the row (unless clean_logits=False).
        if CLEAN & (blk_stop == nblocks) & (blk_start < blk_stop):
            for c0 in range(nblocks * BLOCK_KV, width, BLOCK_KV):
                cols = c0 + offs_kv
                tl.store(out_ptr + out_rows[None, :] + cols[:, None], to_logits_dtype(neg_inf, out_ptr), mask=row_ok & (cols[:, None] < width))


#: Scorer formulations (``impl``), besides ``"auto"``; values are the Triton kernel's IMPL
#: ("wgmma" is the CUDA C++ Hopper kernel of ``ops/sm90.py``, not a Triton variant).
IMPLS = {"scaled": 1, "folded": 2, "wgmma": 3}
#: MMA input type -> the kernel's DOT_MODE.
_DOT_MODES = {name: i for i, name in enumerate(MMA_DTYPES)}  # fp8 0, fp16 1, bf16 2, fp32 3
_LOGITS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclasses.dataclass(frozen=True)
class TritonTuning:
    """Launch parameters of the Triton paged scorer, for experiments (``paged_scorer(tuning=...)``).

    ``None`` picks the H200-tuned value (docs/perf-notes.md): 4 warps and 1 stage
    when a tile has at most 64 (row, head) columns, else 8 warps and 2 stages;
    ``maxnreg`` (registers per thread) applies on NVIDIA only. The Hopper kernel
    ignores them.

    Raises:
        ValueError: a value that is not a positive int (or None), naming the field.
    """

    num_warps: int | None = None
    num_stages: int | None = None
    maxnreg: int | None = None

    def __post_init__(self):
        for name in ("num_warps", "num_stages", "maxnreg"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name}: expected a positive int or None, got {v!r}")


class TritonLauncher:
    """The Triton paged scorer (``"folded"`` or ``"scaled"``) of one configuration: call it with tensors only.

    Made by ``paged_scorer``; every constexpr and launch parameter is fixed here,
    so a call reads the tensors' sizes and strides and launches
    ``_paged_logits_kernel`` on the schedule's persistent grid.

    Attributes:
        kernel: ``"folded"`` or ``"scaled"``.
        reason: why the Hopper kernel does not score this configuration (``None`` where it was not asked
            for or cannot apply: an explicit Triton ``impl``).
        block_kv, clean_logits: keys per schedule tile; whether the tail to the width is written ``-inf``.
    """

    def __init__(self, impl: str, *, device: torch.device, heads: int, next_n: int, lens_2d: bool, page_size: int,
                 block_kv: int, dot_mode: int, clean_logits: bool, tuning: TritonTuning | None = None,
                 reason: str | None = None):
        tuning = tuning or TritonTuning()
        next_n_pad = triton.next_power_of_2(next_n)
        wide = next_n_pad * heads > 64
        self.kernel, self.reason, self.block_kv, self.clean_logits = impl, reason, block_kv, bool(clean_logits)
        self._kw = dict(
            LENS_PER_ROW=bool(lens_2d), NEXT_N=next_n, NEXT_N_PAD=next_n_pad, H=heads, PAGE=page_size,
            BLOCK_KV=block_kv, DOT_MODE=dot_mode, IMPL=IMPLS[impl],
            ASM=impl == "folded" and device.type == "cuda" and torch.version.hip is None, CLEAN=bool(clean_logits),
            num_warps=tuning.num_warps or (8 if wide else 4), num_stages=tuning.num_stages or (2 if wide else 1),
        )
        if tuning.maxnreg is not None and device.type == "cuda":
            self._kw["maxnreg"] = tuning.maxnreg

    def __call__(self, q, weights, cache, block_table, context_lens, schedule, out):
        """Score into ``out`` and return it (arguments as ``Launcher.__call__`` of ``ops/sm90.py``)."""
        _paged_logits_kernel[(schedule.shape[0] - 1,)](
            q, weights, cache, block_table, context_lens, schedule, out, block_table.shape[0], cache.shape[0],
            block_table.shape[1], out.shape[1], q.stride(0), q.stride(1), weights.stride(0), block_table.stride(0),
            out.stride(0), **self._kw,
        )
        return out


def _device(device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _wgmma_problem(q_dtype, device, next_n, heads, block_kv, page_size, dot_mode) -> str | None:
    """Why the Hopper kernel cannot take this configuration (``None``: it can; its build is tried next)."""
    from . import sm90

    if dot_mode != 0:
        return "it needs e4m3 index queries and FP8 MMA"
    if page_size != PAGE_SIZE or block_kv % PAGE_SIZE:
        return f"it needs {PAGE_SIZE}-token pages and block_kv a multiple of {PAGE_SIZE}"
    return sm90.unavailable_reason(device) or sm90.configuration_problem(q_dtype, next_n, heads)


def paged_scorer(device: torch.device | str, heads: int, next_n: int = 1, *, logits_dtype: torch.dtype = torch.float32,
                 lens_2d: bool = True, page_size: int = PAGE_SIZE, block_kv: int | None = None,
                 clean_logits: bool = False, q_dtype: torch.dtype = torch.float8_e4m3fn, impl: str = "auto",
                 mma: str = "auto", tuning: TritonTuning | None = None):
    """Resolve one configuration of the paged scorer, once, to a ready launcher (plan once, call many times).

    The pattern of FlashInfer's ``plan()`` / ``run()`` and DeepGEMM's cached JIT
    launcher: everything a call would otherwise re-decide -- which kernel
    (``impl``), its build (NVRTC, for the Hopper kernel), its constexprs, grid
    rule and argument layout -- is decided here, once per configuration and
    process (the same launcher is returned for the same arguments); its call takes
    tensors only and launches once: ``launcher(q, weights, cache, block_table,
    context_lens, schedule, out) -> out``. The serving path holds one per
    configuration (``ops.serving.ServingKernels``); ``paged_logits`` validates a
    call and runs the launcher of its configuration.

    Args:
        device: where it runs.
        heads: index heads, one of ``SUPPORTED_HEADS``.
        next_n: query rows per request, 1 .. ``MAX_NEXT_N``.
        logits_dtype: fp32, bf16 or fp16 logits.
        lens_2d: ``context_lens`` per row (``[B, next_n]``, SGLang's form) rather than per request (``[B]``).
        page_size: tokens per page.
        block_kv: keys per schedule tile (default ``default_block_kv(device)``); plan with the same value.
        clean_logits: write ``-inf`` from each request's last page to the width (``paged_logits``).
        q_dtype: index queries' dtype, float8_e4m3fn or bfloat16.
        impl, mma: as ``paged_logits``.
        tuning: Triton launch parameters (``TritonTuning``), for experiments.

    Returns:
        ``sm90.Launcher`` (the Hopper kernel, built and loaded, with the Triton ``"folded"`` launcher of the
        same configuration as its fallback under ``impl="auto"``) or ``TritonLauncher``; either has
        ``kernel`` (the formulation) and ``reason`` (why not the Hopper kernel, ``None`` when it serves).

    Raises:
        ValueError: an unsupported value, naming the argument; ``impl="wgmma"`` where the Hopper kernel cannot
            take the configuration; ``impl="folded"`` without FP8 MMA.
        RuntimeError: ``impl="wgmma"`` and its build or load fails.
    """
    device = _device(device)
    if block_kv is None:
        block_kv = default_block_kv(device)
    try:
        key = (device, heads, next_n, logits_dtype, bool(lens_2d), page_size, block_kv, bool(clean_logits), q_dtype,
               impl, mma, tuning)
        got = _SCORERS.get(key)
    except TypeError:  # an unhashable argument: the checks below name it
        key = got = None
    if got is None:
        got = _resolve_scorer(device, heads, next_n, logits_dtype, lens_2d, page_size, block_kv, clean_logits,
                              q_dtype, impl, mma, tuning)
        if key is not None:
            _SCORERS[key] = got
    return got


#: ``paged_scorer``'s launchers by configuration: each resolved (and, for the Hopper kernel, built) once per process.
_SCORERS: dict = {}


def _resolve_scorer(device, heads, next_n, logits_dtype, lens_2d, page_size, block_kv, clean_logits, q_dtype, impl,
                    mma, tuning):
    """``paged_scorer``'s work for a configuration not resolved yet (arguments as there, ``device`` with its index)."""
    if heads not in SUPPORTED_HEADS:
        raise ValueError(f"heads: {heads!r} index heads; expected one of {SUPPORTED_HEADS}")
    if isinstance(next_n, bool) or not isinstance(next_n, int) or not 1 <= next_n <= MAX_NEXT_N:
        raise ValueError(f"next_n: expected an int in 1 .. {MAX_NEXT_N}, got {next_n!r}")
    if logits_dtype not in _LOGITS_DTYPES:
        raise ValueError(f"logits_dtype: expected float32, bfloat16 or float16, got {logits_dtype}")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size: expected a positive int, got {page_size!r}")
    if isinstance(block_kv, bool) or not isinstance(block_kv, int) or block_kv < 16 or block_kv & (block_kv - 1):
        raise ValueError(f"block_kv: expected a power of two >= 16, got {block_kv!r}")
    if q_dtype not in (torch.float8_e4m3fn, torch.bfloat16):
        raise ValueError(f"q_dtype: expected float8_e4m3fn or bfloat16, got {q_dtype}")
    if impl != "auto" and impl not in IMPLS:
        raise ValueError(f"impl: expected 'auto' or one of {tuple(IMPLS)}, got {impl!r}")
    if tuning is not None and not isinstance(tuning, TritonTuning):
        raise ValueError(f"tuning: expected a TritonTuning or None, got {type(tuning).__name__}")
    dot_mode = _DOT_MODES[select_mma_for(mma, q_dtype, device)]
    why = _wgmma_problem(q_dtype, device, next_n, heads, block_kv, page_size, dot_mode) if impl in ("auto", "wgmma") else None
    if impl == "wgmma" and why is not None:
        raise ValueError(f"impl: 'wgmma' cannot run here: {why}")
    triton_impl = impl if impl in ("folded", "scaled") else "folded" if dot_mode == 0 else "scaled"
    if triton_impl == "folded" and dot_mode != 0:
        raise ValueError("impl: 'folded' needs e4m3 queries and FP8 MMA (mma 'fp8' or 'auto' on such a device)")
    geometry = dict(device=device, heads=heads, next_n=next_n, lens_2d=lens_2d, page_size=page_size,
                    block_kv=block_kv, dot_mode=dot_mode, clean_logits=clean_logits, tuning=tuning)
    fallback = TritonLauncher(triton_impl, reason=why, **geometry)
    if impl not in ("auto", "wgmma") or why is not None:
        return fallback
    from . import sm90

    config = sm90.Config.of_call(next_n, heads, logits_dtype, lens_2d)
    got = sm90.launcher(device, config, block_kv=block_kv, clean_logits=clean_logits,
                        fallback=None if impl == "wgmma" else fallback)
    if not isinstance(got, str):
        return got
    if impl == "wgmma":
        raise RuntimeError(f"impl: 'wgmma' cannot run this call: {got}")
    fallback.reason = got  # this configuration's Hopper build failed (warned once): the Triton kernel scores it
    return fallback


def resolved_impl(q: torch.Tensor, cache: torch.Tensor, next_n: int, block_kv: int | None = None,
                  impl: str = "auto", mma: str = "auto", page_size: int = PAGE_SIZE) -> str:
    """The formulation ``paged_logits`` runs for a call (``impl="auto"`` resolved), one of ``IMPLS``; nothing is
    built (a configuration whose Hopper build fails is then scored by ``"folded"``, warned once).

    Args as ``paged_logits`` (``q`` ``[B * next_n, H, 128]``, ``next_n`` its rows per request).

    Raises:
        ValueError: an ``mma`` that does not fit ``q`` (``select_mma``).
    """
    block_kv = default_block_kv(q.device) if block_kv is None else block_kv
    dot_mode = _DOT_MODES[select_mma(mma, q)]
    if impl not in ("auto", "wgmma"):
        return impl
    from . import sm90

    why = (_wgmma_problem(q.dtype, q.device, next_n, q.shape[1], block_kv, page_size, dot_mode)
           or sm90.supports(q, cache, next_n, q.shape[1]))
    if impl == "wgmma" and why is not None:
        raise ValueError(f"impl: 'wgmma' cannot run here: {why}")
    return "wgmma" if why is None else "folded" if dot_mode == 0 else "scaled"


def _check_inputs(q, weights, cache, block_table, context_lens, page_size):
    check_cache(cache, page_size)
    dev = cache.device
    rows, heads = check_index_queries(
        q, weights, heads_ok=SUPPORTED_HEADS.__contains__, heads_expected=f"one of {SUPPORTED_HEADS}"
    )
    for name, t in (("block_table", block_table), ("context_lens", context_lens)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    check_int32(block_table, "block_table", lambda shape: len(shape) == 2, "[B, max_pages]", row_strided=True)
    batch = block_table.shape[0]
    if (batch == 0) != (rows == 0) or (batch and rows % batch):
        raise ValueError(f"q: rows ({rows}) must be a multiple of the block_table batch ({batch}), both 0 or both positive")
    next_n = rows // batch if batch else 1
    if next_n > MAX_NEXT_N:
        raise ValueError(f"q: next_n = {next_n} rows per request; at most {MAX_NEXT_N} supported")
    check_int32(context_lens, "context_lens", lambda shape: shape in ((batch,), (batch, next_n)),
                f"[{batch}] or [{batch}, {next_n}]")
    for name, t in (("q", q), ("weights", weights), ("block_table", block_table), ("context_lens", context_lens)):
        if t.device != dev:
            raise ValueError(f"{name}: on {t.device}, but the cache is on {dev}")
    return rows, heads, batch, next_n


def paged_logits(
    q: torch.Tensor,
    weights: torch.Tensor,
    cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    width: int | None = None,
    schedule: torch.Tensor | None = None,
    block_kv: int | None = None,
    page_size: int = PAGE_SIZE,
    out: torch.Tensor | None = None,
    logits_dtype: torch.dtype = torch.float32,
    check: bool = True,
    clean_logits: bool = True,
    mma: str = "auto",
    impl: str = "auto",
) -> torch.Tensor:
    """Score index queries against the paged FP4 index-key cache (decode / target verify).

    Rows are ``r = b * next_n + i`` (``next_n = rows // B``); row ``r`` sees the
    first ``len(r)`` keys of request ``b`` (``reference.expand_context_lens``:
    with ``[B]`` lengths, ``ctx - next_n + i + 1``), key ``j`` at slot
    ``block_table[b, j // page_size] * page_size + j % page_size``.

    Args:
        q: ``[B * next_n, H, 128]`` float8_e4m3fn (bf16 accepted) index queries,
            last dim contiguous; ``H`` in ``SUPPORTED_HEADS``.
        weights: fp32 ``[B * next_n, H]`` head weights (q scale folded in).
        cache: uint8 ``[num_pages, page_size * 68]`` one layer's FP4 index-key cache.
        block_table: int32 ``[B, max_pages]`` page indices; its rows contiguous, at any
            row stride (e.g. ``table[::next_n]``, every request's first row of
            SGLang's per-row table: both kernels address rows through ``stride(0)``).
        context_lens: int32 ``[B]`` or ``[B, next_n]``.
        width: logits columns (default ``max_pages * page_size``); keys past
            ``width`` are not scored.
        schedule: int32 ``[num_ctas + 1, 2]`` CTA schedule from
            ``ops.schedule.plan_paged_schedule(context_lens, block_kv, num_ctas)``;
            planned here when ``None`` (one extra small launch).
        block_kv: keys per tile; must equal the value the schedule was planned with
            (default ``default_block_kv(q.device)``).
        out: optional ``[rows, width]`` output of ``logits_dtype`` (row stride free,
            columns contiguous).
        logits_dtype: fp32 (default), bf16 or fp16 logits. The sum is formed in
            fp32 and rounded once on store; bf16/fp16 halve the bytes written
            (the accuracy cost is measured by ``sglang-fp4-indexer accuracy``).
        check: validate lengths and page indices against the cache, q and
            weights for NaN/Inf, and a given schedule against the lengths and
            ``block_kv`` (reads them on the host: a sync). With ``check=False``
            (the serving path, CUDA graphs) keys on out-of-range pages (a page
            index outside the cache, or a key past the block table's
            ``max_pages * page_size``) are masked by the kernel, never read out
            of bounds, and their columns are written ``-inf``; schedule entries
            are clamped to request and key-block indices ``>= 0`` (a corrupt
            entry writes nothing outside ``out``); a stale schedule leaves
            columns unwritten (the caller re-plans before each call, as the
            plugin does); a NaN element of q is read as 0 (its products drop out
            of that head's score), a NaN in weights gives a NaN logit.
        clean_logits: write ``-inf`` at every column from the end of a request's
            last page to ``width`` (default). ``False`` leaves those columns
            untouched (like DeepGEMM's ``clean_logits=False``, which SGLang
            uses): columns ``len(r) <= j`` within the request's last page are
            still ``-inf``, and the caller masks the rest by length (SGLang's
            top-k does). In a CUDA graph sized for the model's context (163 840
            columns for DeepSeek-V3.2) this saves writing the whole tail on every
            call.
        mma: MMA input type. ``"auto"``: ``"fp8"`` when q is e4m3 and
            ``fp8_mma_available``, else ``"fp16"`` (both e4m3 operands are exact
            in fp16); for bf16 q ``"bf16"`` on a GPU and ``"fp32"`` under the CPU
            interpreter (whose bf16 dot is unreliable in triton 3.8). Every mode
            multiplies exactly and accumulates in fp32.
        impl: ``"auto"`` (default): ``"wgmma"`` where it runs (below), else
            ``"folded"`` where FP8 MMA runs (e4m3 q), else ``"scaled"``.
            ``"wgmma"``: the CUDA C++ Hopper kernel (``ops/sm90.py``, built by
            NVRTC at first use): the decoded keys as wgmma's register operand
            with the fold on the key (a key's largest group at 2**-3 x E2M1,
            docs/format.md), f16 accumulators, pages streamed by bulk copies,
            the head sum as an f16 wgmma (logits within
            ``sm90.logit_error_bound`` with ``sm90.logit_error_floor``);
            needs compute capability 9.0, ``cuda-bindings``, e4m3 q with
            ``next_n * H * 128 <= 32768`` bytes, 16-byte aligned q rows and
            cache, 64-token pages and ``block_kv`` a multiple of 64 (the
            Triton knobs below do not apply to it). Each configuration
            (next_n, heads, logits dtype, lengths form) is built at its first
            call; with ``"auto"`` one whose build, load or launch fails is
            warned about once and scored by ``"folded"`` from then on.
            Launch parameters of the Triton formulations are fixed per
            configuration (``TritonTuning``: experiments pass their own to
            ``paged_scorer``).
            ``"scaled"``: Triton's ``tl.dot_scaled`` reading the E2M1 codes and
            UE8M0 scales natively (on Hopper Triton upcasts them to bf16);
            ``"folded"``: group scales folded into the e4m3 bytes relative to
            the key's largest group (SWAR PTX on NVIDIA, integer ops
            elsewhere), one K = 128 FP8 MMA per tile; exact while a key's group
            scales lie within 2**11 of its largest, smaller groups flushed to 0.

    Returns:
        ``[rows, width]`` of ``logits_dtype``: the logits; ``-inf`` at columns ``>= len(r)``
        (with ``clean_logits=False`` only up to the end of the request's last page).

    Raises:
        TypeError: an argument is not a tensor.
        RuntimeError: ``impl="wgmma"`` given explicitly and its build, load or launch fails.
        ValueError: wrong dtype, shape, device or contiguity of any argument; with
            ``check=True`` also a row length over ``width`` or the block table, a
            page index outside the cache, NaN/Inf in q or weights, or a
            schedule that does not match ``context_lens`` and ``block_kv``.
    """
    rows, heads, batch, next_n = _check_inputs(q, weights, cache, block_table, context_lens, page_size)
    max_pages = block_table.shape[1]
    if width is None:
        width = max_pages * page_size
    if not isinstance(width, int) or width < 1:
        raise ValueError(f"width: expected a positive int, got {width!r}")
    if block_kv is None:
        block_kv = default_block_kv(q.device)
    if not isinstance(block_kv, int) or block_kv < 16 or block_kv & (block_kv - 1):
        raise ValueError(f"block_kv: expected a power of two >= 16, got {block_kv!r}")
    select_mma(mma, q)
    if impl != "auto" and impl not in IMPLS:
        raise ValueError(f"impl: expected 'auto' or one of {tuple(IMPLS)}, got {impl!r}")
    if impl == "wgmma":
        resolved_impl(q, cache, next_n, block_kv, impl, mma, page_size)  # raises where the kernel cannot take q
    if check:
        from ..reference import expand_context_lens

        lens = expand_context_lens(context_lens, next_n)
        longest = int(lens.max()) if lens.numel() else 0
        if longest > width:
            raise ValueError(f"context_lens: a row sees {longest} keys, more than width {width}")
        if longest > max_pages * page_size:
            raise ValueError(
                f"context_lens: a row sees {longest} keys, more than block_table's {max_pages} pages hold"
            )
        per_req = lens.max(dim=1).values
        needed = (per_req + page_size - 1) // page_size
        cols = torch.arange(max_pages, device=block_table.device)
        used = cols[None, :] < needed[:, None]
        if bool(used.any()):
            pages = block_table[used]
            if int(pages.min()) < 0 or int(pages.max()) >= cache.shape[0]:
                raise ValueError(f"block_table: a page index in use lies outside the cache's {cache.shape[0]} pages")
    if check:
        check_finite_queries(q, weights)
    if schedule is not None and not isinstance(schedule, torch.Tensor):
        raise TypeError(f"schedule: expected a torch.Tensor, got {type(schedule).__name__}")
    if schedule is not None and check and schedule.dtype == torch.int32 and schedule.dim() == 2 and schedule.shape[0] >= 2:
        from .schedule import plan_paged_schedule

        want = plan_paged_schedule(context_lens, block_kv, schedule.shape[0] - 1)
        if not torch.equal(schedule.to(want.device), want):
            raise ValueError(
                "schedule: does not match context_lens and block_kv (stale, or planned with another block_kv); "
                "re-plan it with ops.schedule.plan_paged_schedule_into(context_lens, block_kv, schedule)"
            )
    if schedule is None:
        from .schedule import plan_paged_schedule
        from .grid import default_num_ctas

        schedule = plan_paged_schedule(context_lens, block_kv, default_num_ctas(q.device))
    if schedule.dtype != torch.int32 or schedule.dim() != 2 or schedule.shape[1] != 2 or schedule.shape[0] < 2:
        raise ValueError(f"schedule: expected int32 [num_ctas + 1, 2], got {schedule.dtype} {list(schedule.shape)}")
    if schedule.device != q.device or not schedule.is_contiguous():
        raise ValueError("schedule: expected a contiguous tensor on the cache's device")
    if logits_dtype not in _LOGITS_DTYPES:
        raise ValueError(f"logits_dtype: expected float32, bfloat16 or float16, got {logits_dtype}")
    if out is None:
        out = torch.empty((rows, width), dtype=logits_dtype, device=q.device)
    elif out.dtype != logits_dtype or tuple(out.shape) != (rows, width) or out.stride(1) != 1 or out.device != q.device:
        raise ValueError(
            f"out: expected {logits_dtype} [{rows}, {width}] with contiguous columns on {q.device}, "
            f"got {out.dtype} {list(out.shape)} on {out.device}"
        )
    if rows == 0:
        return out
    launcher = paged_scorer(q.device, heads, next_n, logits_dtype=logits_dtype, lens_2d=context_lens.dim() == 2,
                            page_size=page_size, block_kv=block_kv, clean_logits=clean_logits, q_dtype=q.dtype,
                            impl=impl, mma=mma)
    if impl != "wgmma":
        return launcher(q, weights, cache, block_table, context_lens, schedule, out)
    try:
        return launcher(q, weights, cache, block_table, context_lens, schedule, out)
    except RuntimeError as e:  # an explicit impl="wgmma" has no fallback: its failed launch raises
        raise RuntimeError(f"impl: 'wgmma' cannot run this call: {e}") from e
