"""Shared builders of paged-scorer test cases (random, seeded, any device).

A case is a filled FP4 index-key cache with shuffled pages, a block table, row
lengths, e4m3 index queries and fp32 weights, plus an error bound for the
scorer: ``bound[r, j] = sum_h |w[r,h]| * sum_d |q[r,h,d] * k_j[d]|``, the sum of
the magnitudes of every term of the logit. A float32 sum of n terms is within
``n * 2**-24 * bound`` of the exact value, whatever the order of the additions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

from sglang_fp4_indexer.format import dequantize_index_k, quantize_index_k
from sglang_fp4_indexer.pool import PAGE_SIZE, allocate_index_k_cache, payload_plane, read_index_k, scale_plane
from sglang_fp4_indexer.reference import expand_context_lens, paged_slots


#: The Triton kernels run on the CPU interpreter (``make test`` sets TRITON_INTERPRET=1).
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
#: Where the kernel tests put their tensors: the GPU when there is one and the interpreter is off.
DEVICE = "cuda" if (torch.cuda.is_available() and not INTERPRET) else "cpu"


def kernel_marker(what: str = "needs"):
    """Skip marker for tests that launch a Triton kernel: they need CUDA or TRITON_INTERPRET=1."""
    return pytest.mark.skipif(not INTERPRET and not torch.cuda.is_available(),
                              reason=f"{what} CUDA or TRITON_INTERPRET=1")


@dataclass
class PagedCase:
    q: torch.Tensor
    weights: torch.Tensor
    cache: torch.Tensor
    block_table: torch.Tensor
    context_lens: torch.Tensor
    next_n: int


def make_paged_case(lens, next_n=1, heads=64, extra_pages=3, seed=0, device="cpu", per_row=False, q_dtype=torch.float8_e4m3fn):
    """Build a case; ``lens`` are per-request context lengths (``[B]`` form) or per-row lists."""
    g = torch.Generator().manual_seed(seed)
    if per_row:
        lens_t = torch.tensor(lens, dtype=torch.int32)
        req_len = lens_t.max(dim=1).values
    else:
        lens_t = torch.tensor(lens, dtype=torch.int32)
        req_len = lens_t
    batch = len(lens)
    max_pages = max(1, int((int(req_len.max()) + PAGE_SIZE - 1) // PAGE_SIZE))
    num_pages = batch * max_pages + extra_pages
    perm = torch.randperm(num_pages, generator=g)
    block_table = perm[: batch * max_pages].view(batch, max_pages).to(torch.int32)
    keys = torch.randn(num_pages * PAGE_SIZE, 128, generator=g) * torch.exp(torch.randn(num_pages * PAGE_SIZE, 1, generator=g))
    payload, scales = quantize_index_k(keys)
    cache = allocate_index_k_cache(num_pages)
    payload_plane(cache)[:] = payload.view(num_pages, PAGE_SIZE, 64)
    scale_plane(cache)[:] = scales.view(num_pages, PAGE_SIZE, 4)
    rows = batch * next_n
    q = (torch.randn(rows, heads, 128, generator=g) * 2).to(q_dtype)
    weights = torch.rand(rows, heads, generator=g) * heads**-0.5
    return PagedCase(
        q.to(device), weights.to(device), cache.to(device), block_table.to(device), lens_t.to(device), next_n
    )


def _error_scales(case: PagedCase, width: int, relu: bool) -> torch.Tensor:
    """``sum_h |w| * sum_d |q k|`` (``relu`` False) or ``sum_h |w| relu(s_h)`` per (row, column), fp64
    ``[rows, width]`` (0 past a row's length), from the dequantized keys of each row."""
    lens = expand_context_lens(case.context_lens.cpu(), case.next_n).reshape(-1)
    cache = case.cache.cpu()
    out = torch.zeros(case.q.shape[0], width, dtype=torch.float64)
    for r in range(case.q.shape[0]):
        n = int(lens[r])
        if n == 0:
            continue
        slots = paged_slots(case.block_table[r // case.next_n].cpu(), n)
        k = dequantize_index_k(*read_index_k(cache, slots)).double()
        q = case.q[r].cpu().double()
        scores = torch.relu(k @ q.t()) if relu else k.abs() @ q.abs().t()
        out[r, :n] = scores @ case.weights[r].cpu().double().abs()
    return out


def term_bound(case: PagedCase, width: int) -> torch.Tensor:
    """``sum_h |w| * sum_d |q k|`` per (row, column), fp64 ``[rows, width]`` (0 past a row's length)."""
    return _error_scales(case, width, relu=False)


def relu_bound(case: PagedCase, width: int) -> torch.Tensor:
    """``sum_h |w| relu(s_h)`` per (row, column), ``s_h`` the exact head score, fp64 ``[rows, width]`` (0 past
    a row's length): the scale of a rounding applied to each relu'd head score (the Hopper kernel's head sum)."""
    return _error_scales(case, width, relu=True)


def floor_bound(case: PagedCase, width: int) -> torch.Tensor:
    """The Hopper kernel's ``sm90.logit_error_floor`` per (row, column), fp64 ``[rows, width]`` (0 past a row's
    length): what its decode's rounding of low groups and its f16 subnormals can add."""
    from sglang_fp4_indexer.ops import sm90

    lens = expand_context_lens(case.context_lens.cpu(), case.next_n).reshape(-1)
    cache = case.cache.cpu()
    out = torch.zeros(case.q.shape[0], width, dtype=torch.float64)
    for r in range(case.q.shape[0]):
        n = int(lens[r])
        if n:
            payload, scales = read_index_k(cache, paged_slots(case.block_table[r // case.next_n].cpu(), n))
            out[r, :n] = sm90.logit_error_floor(case.q[r].cpu().float(), case.weights[r].cpu(),
                                                dequantize_index_k(payload, scales), scales)
    return out


def runs_wgmma(heads: int, next_n: int = 1, device: str = "cuda") -> bool:
    """Whether ``paged_logits``'s default (``impl="auto"``) runs the Hopper CUDA kernel for e4m3 queries of
    ``heads`` heads and ``next_n`` rows per request on ``device`` (``ops.paged_logits.resolved_impl``)."""
    from sglang_fp4_indexer.ops.paged_logits import resolved_impl

    if not torch.cuda.is_available() or torch.device(device).type != "cuda":
        return False
    q = torch.empty((next_n, heads, 128), dtype=torch.float8_e4m3fn, device=device)
    return resolved_impl(q, allocate_index_k_cache(1, device=device), next_n) == "wgmma"
