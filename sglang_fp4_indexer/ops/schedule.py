"""CTA-schedule planner: a Triton kernel that splits a paged scorer call over a persistent grid.

The schedule (the op API contract) is an int32 tensor
``[num_ctas + 1, 2]``, shape- and dtype-compatible with DeepGEMM's
``get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms)`` so SGLang's
existing publish paths (``resolve_paged_mqa_logits_metadata_fn()``) can hold it.

Tiles are ``(request b, key block blk)`` for ``b`` in ``0 .. B-1`` and ``blk``
in ``0 .. num_key_blocks(max_len_b, block_kv) - 1``, flattened b-major; ``T``
tiles in all. CTA ``i`` processes the flat tiles
``[floor(i * T / num_ctas), floor((i + 1) * T / num_ctas))``; ``schedule[i]``
is the ``(b, blk)`` of its first tile, or ``(B, 0)`` when that index is ``T``;
``schedule[num_ctas] = (B, 0)``. One tile scores all ``next_n`` query rows of
request ``b`` against keys ``[blk * block_kv, (blk + 1) * block_kv)``.

The planner reads ``context_lens`` on the device and writes the schedule in
place with one kernel launch: no host synchronisation and no allocation, so it
can be captured in a CUDA graph and re-run before each replay. The torch
oracle is ``reference.paged_schedule_reference``.

Method: a two-pass prefix sum over the requests (chunks of ``BLOCK_B`` with
``tl.cumsum`` and a running offset), then for every CTA boundary ``s`` the
request is the number of inclusive prefixes ``<= s`` and the key block is
``s`` minus the largest such prefix. Each program handles ``BLOCK_C``
boundaries, so any ``B`` and any ``num_ctas`` work.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path

import torch
import triton
import triton.language as tl

from ..pool import PAGE_SIZE
from ._common import interpreting

__all__ = [
    "Planner",
    "planner_for",
    "num_key_blocks",
    "check_block_kv",
    "plan_paged_schedule",
    "plan_paged_schedule_into",
]

# Boundaries per program and requests per chunk of the scan.
_BLOCK_C = 64
_MAX_BLOCK_B = 128
#: Most requests the CUDA planner takes (its inclusive prefix, 8 bytes each, and its static
#: shared memory fit the 48 KB a launch gets without opting in).
CUDA_PLANNER_MAX_BATCH = 6000
_CUDA_PLANNER_SOURCE = Path(__file__).with_name("cuda") / "plan_schedule.cu"


def _cuda_planner(device: torch.device):
    """The NVRTC-built planner kernel for ``device``, or None where it cannot run (then Triton plans).

    Built once per device (``ops.nvrtc.load``); a failed build is warned about once and remembered.
    """
    from . import nvrtc

    if torch.version.hip is not None or nvrtc.bindings_missing():
        return None
    return nvrtc.load(device, _planner_spec())


@functools.lru_cache(maxsize=None)
def _planner_spec():
    """The ``ops.nvrtc.KernelSpec`` of the CUDA planner (one object: looked up on every plan)."""
    from . import nvrtc

    return nvrtc.KernelSpec(_CUDA_PLANNER_SOURCE.read_text(), "plan_schedule.cu", "plan_paged_schedule", (), 0,
                            "the CUDA planner", "planning with Triton")


def num_key_blocks(max_len, block_kv: int):
    """Key blocks (tiles) of one request: ``max(1, cdiv(max_len, block_kv))``.

    Every request gets at least one tile, even with no visible key, so the
    scorer writes its row's ``-inf`` fill. ``max_len`` is ``context_lens[b]``
    for ``[B]`` lengths or ``context_lens[b].max()`` for ``[B, next_n]``
    lengths. A negative length counts as 0.

    Args:
        max_len: int, or an integer torch tensor (elementwise).
        block_kv: keys per tile, a positive int.

    Returns:
        int, or an int64 tensor shaped like ``max_len``.

    Raises:
        ValueError: ``block_kv`` is not a positive int.
    """
    if not isinstance(block_kv, int) or isinstance(block_kv, bool) or block_kv <= 0:
        raise ValueError(f"block_kv: expected a positive int, got {block_kv!r}")
    if isinstance(max_len, torch.Tensor):
        n = max_len.to(torch.int64).clamp_min(0)
        return ((n + block_kv - 1) // block_kv).clamp_min(1)
    return max(1, -(-max(int(max_len), 0) // block_kv))


def check_block_kv(block_kv, page_size: int = PAGE_SIZE) -> int:
    """Validate ``block_kv``: a positive multiple of the page size.

    The paged scorer reads whole pages per tile, so a tile boundary must be a
    page boundary.

    Raises:
        ValueError: ``block_kv`` is not an int, not positive, or not a multiple
            of ``page_size``.
    """
    if not isinstance(block_kv, int) or isinstance(block_kv, bool):
        raise ValueError(f"block_kv: expected an int, got {type(block_kv).__name__}")
    if block_kv <= 0 or block_kv % page_size:
        raise ValueError(
            f"block_kv: expected a positive multiple of the page size {page_size}, got {block_kv}"
        )
    return block_kv


def _check_context_lens(context_lens) -> None:
    if not isinstance(context_lens, torch.Tensor):
        raise TypeError(f"context_lens: expected a torch.Tensor, got {type(context_lens).__name__}")
    if context_lens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"context_lens: expected int32 (or int64), got {context_lens.dtype}")
    if context_lens.dim() not in (1, 2):
        raise ValueError(
            f"context_lens: expected [B] or [B, next_n], got shape {list(context_lens.shape)}"
        )
    if context_lens.dim() == 2 and context_lens.shape[1] < 1:
        raise ValueError(f"context_lens: next_n must be >= 1, got shape {list(context_lens.shape)}")
    if context_lens.device.type == "cpu" and not interpreting():
        raise ValueError(
            "context_lens: on the CPU the Triton planner runs only under TRITON_INTERPRET=1; "
            "use reference.paged_schedule_reference there"
        )


def _check_out(out, context_lens: torch.Tensor) -> int:
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out: expected a torch.Tensor, got {type(out).__name__}")
    if out.dtype != torch.int32:
        raise ValueError(f"out: expected int32, got {out.dtype}")
    if out.dim() != 2 or out.shape[1] != 2 or out.shape[0] < 2:
        raise ValueError(f"out: expected shape [num_ctas + 1, 2] with num_ctas >= 1, got {list(out.shape)}")
    if not out.is_contiguous():
        raise ValueError("out: expected a contiguous tensor")
    if out.device != context_lens.device:
        raise ValueError(f"out: expected device {context_lens.device}, got {out.device}")
    return out.shape[0] - 1


@triton.jit
def _key_blocks(lens_ptr, stride_b, stride_n, B, next_n, block_kv, offs_b, NEXT_N_P2: tl.constexpr):
    """int64 [BLOCK_B] tiles per request (0 past B): max(1, cdiv(max(max_len, 0), block_kv))."""
    offs_n = tl.arange(0, NEXT_N_P2)
    bmask = offs_b < B
    mask = bmask[:, None] & (offs_n[None, :] < next_n)
    ptrs = lens_ptr + offs_b[:, None].to(tl.int64) * stride_b + offs_n[None, :] * stride_n
    lens = tl.load(ptrs, mask=mask, other=0).to(tl.int64)
    max_len = tl.maximum(tl.max(lens, axis=1), 0)
    nb = tl.maximum((max_len + block_kv - 1) // block_kv, 1)
    return tl.where(bmask, nb, 0)


@triton.jit
def _plan_kernel(
    lens_ptr,
    stride_b,
    stride_n,
    B,
    next_n,
    block_kv,
    out_ptr,
    num_ctas,
    NEXT_N_P2: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    arange_b = tl.arange(0, BLOCK_B)
    # Pass 1: T, the total number of tiles.
    total = tl.full((), 0, tl.int64)
    for start in range(0, B, BLOCK_B):
        nb = _key_blocks(lens_ptr, stride_b, stride_n, B, next_n, block_kv, start + arange_b, NEXT_N_P2)
        total += tl.sum(nb, axis=0)
    # This program's CTA boundaries i and their first flat tile s = floor(i * T / num_ctas).
    offs_c = pid * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = offs_c <= num_ctas
    s = (offs_c.to(tl.int64) * total) // num_ctas
    # Pass 2: request of s = #{b : incl_prefix[b] <= s}; its first tile = the largest such prefix.
    count = tl.zeros((BLOCK_C,), tl.int64)
    base = tl.zeros((BLOCK_C,), tl.int64)
    running = tl.full((), 0, tl.int64)
    for start in range(0, B, BLOCK_B):
        offs_b = start + arange_b
        nb = _key_blocks(lens_ptr, stride_b, stride_n, B, next_n, block_kv, offs_b, NEXT_N_P2)
        incl = tl.cumsum(nb, axis=0) + running
        hit = (incl[None, :] <= s[:, None]) & (offs_b < B)[None, :]
        count += tl.sum(hit.to(tl.int64), axis=1)
        base = tl.maximum(base, tl.max(tl.where(hit, incl[None, :], 0), axis=1))
        running += tl.sum(nb, axis=0)
    blk = s - base
    row = out_ptr + offs_c.to(tl.int64) * 2
    tl.store(row, count.to(tl.int32), mask=cmask)
    tl.store(row + 1, blk.to(tl.int32), mask=cmask)


class Planner:
    """The CTA planner of one device and tile, resolved once: ``planner(context_lens, out) -> out``.

    Decided here, not per call: the CUDA planner (``cuda/plan_schedule.cu``, built
    and loaded by NVRTC) on NVIDIA devices where it builds, else the Triton
    kernel (``reason`` says why); the CUDA planner's packed argument block. A call
    reads the lengths' pointer, shape and strides and launches once (the Triton
    kernel above ``CUDA_PLANNER_MAX_BATCH`` requests or for int64 lengths). The
    serving path holds one (``ops.serving.ServingKernels``);
    ``plan_paged_schedule_into`` validates a call and runs one.

    Args:
        device: where it plans.
        block_kv: keys per tile, a positive multiple of the page size (64).

    Attributes:
        kernel: ``"cuda"`` or ``"triton"``.
        reason: why the Triton kernel plans (``None`` with the CUDA planner).

    Raises:
        ValueError: ``block_kv`` not a positive multiple of 64.
    """

    def __init__(self, device: torch.device | str, block_kv: int):
        from . import nvrtc

        self.block_kv = check_block_kv(block_kv)
        device = torch.device(device)
        self._fn = None
        if device.type != "cuda" or torch.version.hip is not None:
            self.reason = "not an NVIDIA CUDA device"
        else:
            self.reason = nvrtc.bindings_missing()
            if self.reason is None:
                self._fn = _cuda_planner(device)
                self.reason = None if self._fn is not None else nvrtc.failure(device, _planner_spec())
        self.kernel = "triton" if self._fn is None else "cuda"
        if self._fn is not None:
            self._index = nvrtc._index(device)
            self._args = nvrtc.ArgBlock("PqqiiiPi")

    def kernel_for(self, context_lens: torch.Tensor) -> str:
        """The kernel a call with these lengths takes: ``"cuda"`` where this planner has the CUDA kernel, the
        lengths are int32 and at most ``CUDA_PLANNER_MAX_BATCH`` requests, else ``"triton"``."""
        ok = context_lens.dtype == torch.int32 and context_lens.shape[0] <= CUDA_PLANNER_MAX_BATCH
        return "cuda" if self._fn is not None and ok else "triton"

    def __call__(self, context_lens: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Plan ``context_lens`` (int32 or int64 ``[B]`` or ``[B, next_n]``) into ``out`` (int32 contiguous
        ``[num_ctas + 1, 2]``, same device), as ``plan_paged_schedule_into`` validates them; returns ``out``."""
        batch = context_lens.shape[0]
        strides = context_lens.stride()
        if context_lens.dim() == 1:
            next_n, stride_b, stride_n = 1, strides[0], 0
        else:
            next_n, stride_b, stride_n = context_lens.shape[1], strides[0], strides[1]
        num_ctas = out.shape[0] - 1
        if self.kernel_for(context_lens) == "cuda":
            params = self._args.pack(context_lens.data_ptr(), stride_b, stride_n, batch, next_n, self.block_kv,
                                     out.data_ptr(), num_ctas)
            self._fn.launch_packed(self._index, 1, 1024, 8 * max(batch, 1), params)
            return out
        block_b = min(_MAX_BLOCK_B, triton.next_power_of_2(max(batch, 1)))
        grid = (triton.cdiv(num_ctas + 1, _BLOCK_C),)
        device_ctx = torch.cuda.device(context_lens.device) if context_lens.is_cuda else contextlib.nullcontext()
        with device_ctx:
            _plan_kernel[grid](
                context_lens,
                stride_b,
                stride_n,
                batch,
                next_n,
                self.block_kv,
                out,
                num_ctas,
                NEXT_N_P2=triton.next_power_of_2(next_n),
                BLOCK_B=block_b,
                BLOCK_C=_BLOCK_C,
            )
        return out


@functools.lru_cache(maxsize=None)
def planner_for(device: torch.device, block_kv: int) -> Planner:
    """The ``Planner`` of ``device`` and ``block_kv``, made once per process (``plan_paged_schedule_into`` and the
    benchmark use it; ``device`` with its index on CUDA). Raises as ``Planner``."""
    return Planner(device, block_kv)


def plan_paged_schedule_into(context_lens: torch.Tensor, block_kv: int, out: torch.Tensor) -> torch.Tensor:
    """Write the CTA schedule of a paged scorer call into ``out``, in place.

    One launch on ``context_lens``'s device and current stream: on NVIDIA GPUs
    the CUDA planner (``cuda/plan_schedule.cu``, built by NVRTC; int32 lengths,
    up to ``CUDA_PLANNER_MAX_BATCH`` requests), else the Triton kernel; no host
    synchronisation, no allocation: capturable in a CUDA graph and safe to
    re-run before each replay (the schedule then follows the new lengths).
    Format: see the module docstring (``num_ctas = out.shape[0] - 1``). The
    arguments are validated here; ``Planner`` plans without validating.

    Args:
        context_lens: int32 (or int64) ``[B]`` (the request's length) or
            ``[B, next_n]`` (per query row; the request's tiles cover the
            largest). ``B`` may be 0. Negative lengths are invalid; the kernel
            cannot check them without a sync and counts them as 0.
        block_kv: keys per tile, a positive multiple of the page size (64).
        out: int32 contiguous ``[num_ctas + 1, 2]`` on the same device, ``num_ctas >= 1``.

    Returns:
        ``out``.

    Raises:
        TypeError: ``context_lens`` or ``out`` is not a tensor.
        ValueError: wrong dtype, rank or device; ``block_kv`` not a positive
            multiple of 64; ``out`` of the wrong shape or not contiguous; a CPU
            tensor without ``TRITON_INTERPRET=1``.
    """
    _check_context_lens(context_lens)
    check_block_kv(block_kv)
    _check_out(out, context_lens)
    return planner_for(context_lens.device, block_kv)(context_lens, out)


def plan_paged_schedule(context_lens: torch.Tensor, block_kv: int, num_sms: int) -> torch.Tensor:
    """Plan the CTA schedule of a paged scorer call into a new buffer.

    Same call contract as SGLang's ``resolve_paged_mqa_logits_metadata_fn()()``
    and DeepGEMM's ``get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms)``.
    Allocates its result; inside a CUDA graph use ``plan_paged_schedule_into``
    (or ``schedule_buffer.ScheduleBuffer``) with a buffer allocated before capture.

    Args:
        context_lens: int32 ``[B]`` or ``[B, next_n]`` (see ``plan_paged_schedule_into``).
        block_kv: keys per tile, a positive multiple of 64.
        num_sms: CTAs of the persistent grid, an int >= 1 (usually the SM count).

    Returns:
        int32 ``[num_sms + 1, 2]`` on ``context_lens``'s device.

    Raises:
        ValueError / TypeError: as ``plan_paged_schedule_into``, or ``num_sms`` < 1.
    """
    if not isinstance(num_sms, int) or isinstance(num_sms, bool) or num_sms < 1:
        raise ValueError(f"num_sms: expected an int >= 1, got {num_sms!r}")
    _check_context_lens(context_lens)
    out = torch.empty((num_sms + 1, 2), dtype=torch.int32, device=context_lens.device)
    return plan_paged_schedule_into(context_lens, block_kv, out)
