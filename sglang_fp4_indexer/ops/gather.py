"""Gather a batch's FP4 index keys from the paged cache into flat planes (prefill / extend).

SGLang's DSA indexer scores prefill tokens against a flat buffer of the
batch's keys (``Indexer._get_topk_ragged`` -> ``get_k_and_scale``); this op
builds the FP4 form of that buffer: request ``b``'s keys ``0 .. seq_lens[b]-1``
land at flat rows ``sum(seq_lens[:b]) + j``, payload and scale planes apart.

Method: one program per (request, block of ``BLOCK_T`` keys); each key moves
as 16 + 1 int32 words (64 payload bytes, 4 scale bytes), the scale word found
at the page's scale-plane row ``pool.scale_row(row)``. A plain copy: bit-exact.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..format import PAYLOAD_BYTES, SCALE_BYTES
from ..pool import PAGE_SIZE, check_cache
from ._common import scale_row_jit

__all__ = ["gather_index_k"]

_BLOCK_T = 256
# Grid axis 1 (key blocks of one request) is limited to 65535 programs.
_MAX_LEN = 65535 * _BLOCK_T


@triton.jit
def _gather_kernel(
    cache_ptr,  # int32 view of the cache: [num_pages, PAGE * 17]
    bt_ptr,
    lens_ptr,
    starts_ptr,
    payload_ptr,  # int32 view [total_len, 16]
    scales_ptr,  # int32 view [total_len, 1]
    num_pages,
    max_pages,
    stride_bt,
    total_len,
    PAGE: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    b = tl.program_id(0)
    t0 = tl.program_id(1) * BLOCK_T
    n = tl.load(lens_ptr + b)
    if t0 >= n:
        return
    start = tl.load(starts_ptr + b)
    t = t0 + tl.arange(0, BLOCK_T)
    dst = start + t
    ok = (t < n) & (dst >= 0) & (dst < total_len)
    pidx = t // PAGE
    page = tl.load(bt_ptr + b.to(tl.int64) * stride_bt + pidx, mask=ok & (pidx < max_pages), other=-1)
    valid = ok & (page >= 0) & (page < num_pages)
    row = t % PAGE
    page_base = page.to(tl.int64) * (PAGE * 17)
    words = tl.arange(0, 16)
    payload = tl.load(
        cache_ptr + page_base[:, None] + row[:, None] * 16 + words[None, :], mask=valid[:, None], other=0
    )
    tl.store(payload_ptr + dst[:, None].to(tl.int64) * 16 + words[None, :], payload, mask=ok[:, None])
    scale = tl.load(cache_ptr + page_base + PAGE * 16 + scale_row_jit(row, PAGE), mask=valid, other=0)
    tl.store(scales_ptr + dst.to(tl.int64), scale, mask=ok)


def _check_inputs(cache, block_table, seq_lens, total_len, max_len, page_size):
    check_cache(cache, page_size)
    if cache.data_ptr() % 4:
        raise ValueError("cache: expected a 4-byte aligned buffer (it is read as int32 words)")
    for name, t in (("block_table", block_table), ("seq_lens", seq_lens)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name}: expected int32 or int64, got {t.dtype}")
        if t.device != cache.device:
            raise ValueError(f"{name}: on {t.device}, but the cache is on {cache.device}")
    if block_table.dim() != 2 or block_table.stride(1) != 1:
        raise ValueError(
            f"block_table: expected [B, max_pages] with contiguous pages, got shape {list(block_table.shape)}"
        )
    if seq_lens.dim() != 1 or seq_lens.shape[0] != block_table.shape[0]:
        raise ValueError(
            f"seq_lens: expected [B] with B = block_table's {block_table.shape[0]} rows, got {list(seq_lens.shape)}"
        )
    for name, v in (("total_len", total_len), ("max_len", max_len)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{name}: expected an int >= 0, got {v!r}")
    if max_len > _MAX_LEN:
        raise ValueError(f"max_len: at most {_MAX_LEN} keys per request, got {max_len}")


def _check_values(cache, block_table, seq_lens, total_len, max_len, page_size):
    lens = seq_lens.to(torch.int64)
    if lens.numel() == 0:
        if total_len:
            raise ValueError(f"total_len: expected 0 for an empty batch, got {total_len}")
        return
    if int(lens.min()) < 0:
        raise ValueError("seq_lens: a negative length")
    if int(lens.sum()) != total_len:
        raise ValueError(f"total_len: expected sum(seq_lens) = {int(lens.sum())}, got {total_len}")
    if int(lens.max()) > max_len:
        raise ValueError(f"max_len: expected >= max(seq_lens) = {int(lens.max())}, got {max_len}")
    pages_needed = (lens + page_size - 1) // page_size
    if int(pages_needed.max()) > block_table.shape[1]:
        raise ValueError(
            f"block_table: {block_table.shape[1]} pages per row cannot hold {int(lens.max())} keys"
        )
    used = torch.arange(block_table.shape[1], device=lens.device)[None, :] < pages_needed[:, None]
    if bool(used.any()):
        pages = block_table[used]
        if int(pages.min()) < 0 or int(pages.max()) >= cache.shape[0]:
            raise ValueError(f"block_table: a page index in use lies outside the cache's {cache.shape[0]} pages")


def gather_index_k(
    cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    total_len: int,
    max_len: int,
    *,
    page_size: int = PAGE_SIZE,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather every request's FP4 index keys into flat payload and scale planes.

    The FP4 counterpart of SGLang's ``get_k_and_scale(layer_id, seq_len_tensor,
    page_indices, seq_len_sum, max_seq_len)``: request ``b``'s key ``j`` (slot
    ``block_table[b, j // page_size] * page_size + j % page_size``) goes to flat
    row ``sum(seq_lens[:b]) + j``. Scale bytes are read at the page's scale-plane
    row ``pool.scale_row(j % page_size)`` (docs/format.md). Bit-exact copy.

    Args:
        cache: uint8 ``[num_pages, page_size * 68]`` one layer's FP4 index-key
            cache (contiguous, 4-byte aligned).
        block_table: int32/int64 ``[B, max_pages]`` page indices per request
            (SGLang's ``page_indices``).
        seq_lens: int32/int64 ``[B]`` keys per request (``seq_len_tensor``).
        total_len: ``sum(seq_lens)`` as a host int (``seq_len_sum``): rows of the result.
        max_len: ``max(seq_lens)`` (or more) as a host int (``max_seq_len``): sizes the grid.
        page_size: tokens per page.
        check: validate ``seq_lens``, ``total_len``, ``max_len`` and the page
            indices in use on the host (a device sync). With ``check=False`` the
            kernel never reads or writes out of bounds: rows past ``total_len``
            are dropped, keys past ``max_len`` are not gathered (their rows keep
            whatever ``torch.empty`` gave), and keys on a page index outside the
            cache or past the block table's width are written as zero bytes
            (scale code 0 is never stored, so such rows are recognisable).

    Returns:
        ``(payload uint8 [total_len, 64], scales uint8 [total_len, 4])``, contiguous.

    Raises:
        TypeError: a tensor argument is not a tensor.
        ValueError: bad dtype, shape, device or alignment; with ``check=True``
            also negative lengths, ``total_len != sum(seq_lens)``,
            ``max_len < max(seq_lens)``, or a page index in use outside the cache.
    """
    _check_inputs(cache, block_table, seq_lens, total_len, max_len, page_size)
    if check:
        _check_values(cache, block_table, seq_lens, total_len, max_len, page_size)
    payload = torch.empty((total_len, PAYLOAD_BYTES), dtype=torch.uint8, device=cache.device)
    scales = torch.empty((total_len, SCALE_BYTES), dtype=torch.uint8, device=cache.device)
    batch = seq_lens.shape[0]
    if total_len == 0 or batch == 0 or max_len == 0:
        return payload, scales
    lens = seq_lens.to(torch.int64)
    starts = torch.cumsum(lens, 0) - lens
    grid = (batch, triton.cdiv(max_len, _BLOCK_T))
    _gather_kernel[grid](
        cache.view(torch.int32),
        block_table,
        seq_lens,
        starts,
        payload.view(torch.int32),
        scales.view(torch.int32),
        cache.shape[0],
        block_table.shape[1],
        block_table.stride(0),
        total_len,
        PAGE=page_size,
        BLOCK_T=_BLOCK_T,
    )
    return payload, scales
