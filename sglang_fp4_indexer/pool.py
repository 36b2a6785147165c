"""Page math, plane views and capacity accounting for the FP4 index-key cache.

Layout (docs/format.md): one ``uint8`` buffer per layer of shape
``[num_pages, page_size * 68]``. The first ``page_size * 64`` bytes of a page
are its payload plane (row-major by row), the last ``page_size * 4`` bytes its
scale plane. Token slot ``s`` lives on page ``s // page_size`` at row
``s % page_size``. Every access to the scale plane maps the row through
``scale_row`` (identity in the NVIDIA layout).

Nothing here imports SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .format import PAYLOAD_BYTES, SCALE_BYTES, TOKEN_BYTES

__all__ = [
    "PAGE_SIZE",
    "FP4_INDEX_BYTES_PER_TOKEN",
    "FP8_INDEX_BYTES_PER_TOKEN",
    "DEEPSEEK_V32_FP8_MLA_KV_BYTES",
    "DEEPSEEK_V32_NUM_LAYERS",
    "page_bytes",
    "scale_row",
    "slot_to_page_row",
    "check_cache",
    "allocate_index_k_cache",
    "payload_plane",
    "scale_plane",
    "read_index_k",
    "copy_slots",
    "Capacity",
    "capacity",
]

#: Tokens per page of the index-key cache (SGLang's DSA index page).
PAGE_SIZE = 64
#: Bytes per token per layer of the FP4 index-key cache: 64 payload + 4 scale.
FP4_INDEX_BYTES_PER_TOKEN = TOKEN_BYTES
#: Bytes per token per layer of SGLang's FP8 index-key cache: 128 e4m3 + fp32 scale.
FP8_INDEX_BYTES_PER_TOKEN = 128 + 4
#: DeepSeek-V3.2 MLA KV bytes per token per layer with SGLang's FP8 KV cache
#: (FlashMLA FP8 layout: 512 e4m3 latent + 4 fp32 tile scales + 64 bf16 RoPE dims).
DEEPSEEK_V32_FP8_MLA_KV_BYTES = 512 + 4 * 4 + 64 * 2
#: Layers of DeepSeek-V3.2 (each holds an index-key cache).
DEEPSEEK_V32_NUM_LAYERS = 61


def page_bytes(page_size: int = PAGE_SIZE) -> int:
    """Bytes of one page of the FP4 index-key cache: ``page_size * 68``.

    Raises:
        ValueError: ``page_size`` is not a positive int.
    """
    if not isinstance(page_size, int) or page_size <= 0:
        raise ValueError(f"page_size: expected a positive int, got {page_size!r}")
    return page_size * TOKEN_BYTES


def scale_row(row, page_size: int = PAGE_SIZE):
    """Row of the scale plane that holds the scales of the token at ``row`` of its page.

    The single mapping every scale-plane access goes through (docs/format.md).
    Identity in the NVIDIA layout; a layout with a transposed scale plane changes
    only this function. Works on Python ints, torch tensors and Triton values
    (it is plain arithmetic so kernels can inline the same expression).

    Args:
        row: token row within its page, ``0 <= row < page_size``.
        page_size: tokens per page.
    """
    return row


def slot_to_page_row(slots: torch.Tensor, page_size: int = PAGE_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """Split token slots into ``(page, row)``: ``page = s // page_size``, ``row = s % page_size``.

    Args:
        slots: integer tensor of non-negative slots.

    Returns:
        Two int64 tensors shaped like ``slots``.

    Raises:
        ValueError: non-integer ``slots`` or a negative slot.
    """
    if slots.dtype.is_floating_point or slots.dtype == torch.bool:
        raise ValueError(f"slots: expected an integer tensor, got {slots.dtype}")
    s = slots.to(torch.int64)
    if s.numel() and int(s.min()) < 0:
        raise ValueError("slots: negative slot; only non-negative slots map to a page")
    return s // page_size, s % page_size


def check_cache(cache: torch.Tensor, page_size: int = PAGE_SIZE, name: str = "cache") -> None:
    """Validate a layer's FP4 index-key cache buffer.

    Raises:
        ValueError: not uint8, not 2-D, last dim not ``page_size * 68``, or not contiguous.
    """
    if not isinstance(cache, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(cache).__name__}")
    if cache.dtype != torch.uint8:
        raise ValueError(f"{name}: expected uint8, got {cache.dtype}")
    expected = page_bytes(page_size)
    if cache.dim() != 2 or cache.shape[1] != expected:
        raise ValueError(
            f"{name}: expected shape [num_pages, {expected}] (page_size {page_size} x "
            f"{TOKEN_BYTES} bytes), got {list(cache.shape)}"
        )
    if not cache.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous buffer")


def allocate_index_k_cache(
    num_pages: int, page_size: int = PAGE_SIZE, device: torch.device | str | None = None
) -> torch.Tensor:
    """Allocate one layer's FP4 index-key cache, zero-filled.

    Returns:
        uint8 ``[num_pages, page_size * 68]``. Zero scale bytes are never stored
        by the writer, so an unwritten slot is detectable (``ue8m0_to_float`` raises).

    Raises:
        ValueError: ``num_pages`` negative or ``page_size`` not positive.
    """
    if not isinstance(num_pages, int) or num_pages < 0:
        raise ValueError(f"num_pages: expected a non-negative int, got {num_pages!r}")
    return torch.zeros((num_pages, page_bytes(page_size)), dtype=torch.uint8, device=device)


def payload_plane(cache: torch.Tensor, page_size: int = PAGE_SIZE) -> torch.Tensor:
    """View of the payload plane: uint8 ``[num_pages, page_size, 64]`` (no copy).

    Raises:
        ValueError: as ``check_cache``.
    """
    check_cache(cache, page_size)
    return cache[:, : page_size * PAYLOAD_BYTES].view(cache.shape[0], page_size, PAYLOAD_BYTES)


def scale_plane(cache: torch.Tensor, page_size: int = PAGE_SIZE) -> torch.Tensor:
    """View of the scale plane: uint8 ``[num_pages, page_size, 4]`` indexed by *scale row*.

    The token at page row ``r`` has its scales at ``scale_plane(...)[page, scale_row(r)]``.

    Raises:
        ValueError: as ``check_cache``.
    """
    check_cache(cache, page_size)
    return cache[:, page_size * PAYLOAD_BYTES :].view(cache.shape[0], page_size, SCALE_BYTES)


def read_index_k(
    cache: torch.Tensor, slots: torch.Tensor, page_size: int = PAGE_SIZE
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read the planes of the tokens at ``slots`` (torch gather, for oracles and tests).

    Args:
        cache: uint8 ``[num_pages, page_size * 68]``.
        slots: integer ``[N]`` slots, ``0 <= s < num_pages * page_size``.

    Returns:
        ``(payload uint8 [N, 64], scales uint8 [N, 4])``.

    Raises:
        ValueError: bad cache, or a slot out of range.
    """
    check_cache(cache, page_size)
    page, row = slot_to_page_row(slots.reshape(-1), page_size)
    if page.numel() and int(page.max()) >= cache.shape[0]:
        raise ValueError(
            f"slots: slot {int(slots.max())} is past the cache's {cache.shape[0] * page_size} slots"
        )
    payload = payload_plane(cache, page_size)[page, row]
    scales = scale_plane(cache, page_size)[page, scale_row(row, page_size)]
    return payload, scales


def copy_slots(
    cache: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    page_size: int = PAGE_SIZE,
    *,
    check: bool = True,
) -> None:
    """Copy whole tokens (payload and scale planes) from ``src_slots`` to ``dst_slots`` in place.

    The FP4 counterpart of SGLang's ``IndexKeyCache.move``: token-granular, so
    the other rows of a page are untouched. Scale rows go through ``scale_row``.
    All sources are read before any destination is written (torch advanced
    indexing), as in SGLang's move; where two pairs name the same destination,
    which source lands there is unspecified (as in SGLang's).

    Args:
        cache: uint8 ``[num_pages, page_size * 68]`` one layer's FP4 cache.
        dst_slots, src_slots: integer ``[N]`` slots on the cache's device.
        check: ``True``: validate the slots on the host (a sync) and raise on
            a slot outside ``0 <= s < num_pages * page_size``. ``False`` (the
            serving path: no host sync, capturable in a CUDA graph): a pair
            with either slot outside that range is skipped on the device --
            nothing is read or written for it -- and every other pair is copied.

    Raises:
        ValueError: bad cache, mismatched lengths, a non-integer slot tensor;
            with ``check`` also a slot out of range.
    """
    check_cache(cache, page_size)
    dst = dst_slots.reshape(-1)
    src = src_slots.reshape(-1)
    if dst.shape[0] != src.shape[0]:
        raise ValueError(f"dst_slots, src_slots: lengths differ ({dst.shape[0]} vs {src.shape[0]})")
    for name, t in (("dst_slots", dst), ("src_slots", src)):
        if t.dtype.is_floating_point or t.dtype == torch.bool or t.dtype.is_complex:
            raise ValueError(f"{name}: expected an integer tensor, got {t.dtype}")
    if dst.numel() == 0:
        return
    if check:
        dst_page, dst_row = slot_to_page_row(dst, page_size)
        src_page, src_row = slot_to_page_row(src, page_size)
        if max(int(dst_page.max()), int(src_page.max())) >= cache.shape[0]:
            raise ValueError(f"slots: a slot is past the cache's {cache.shape[0] * page_size} slots")
    else:
        dst, src = _in_range_pairs(dst.to(torch.int64), src.to(torch.int64), cache.shape[0] * page_size)
        dst_page, dst_row = dst // page_size, dst % page_size
        src_page, src_row = src // page_size, src % page_size
    payload = payload_plane(cache, page_size)
    scales = scale_plane(cache, page_size)
    payload[dst_page, dst_row] = payload[src_page, src_row]
    scales[dst_page, scale_row(dst_row, page_size)] = scales[src_page, scale_row(src_row, page_size)]


def _in_range_pairs(dst: torch.Tensor, src: torch.Tensor, num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dst, src)`` int64 with every pair that has a slot outside ``[0, num_slots)`` replaced, on the device.

    A replaced pair becomes a copy of the first in-range pair (the same source to
    the same destination again: the scatter writes identical bytes twice), or,
    when no pair is in range, slot 0 onto itself (all sources are read before
    any write, so it writes the bytes slot 0 already holds). Either way it reads
    and writes in bounds and changes nothing. No host sync.
    """
    ok = (dst >= 0) & (dst < num_slots) & (src >= 0) & (src < num_slots)
    # The first in-range pair (0 when there is none), as a [1] index: index_select, not a Python scalar.
    first = torch.argmax(ok.to(torch.int8)).reshape(1)
    any_ok = ok.index_select(0, first)
    fill_dst = torch.where(any_ok, dst.index_select(0, first), 0)
    fill_src = torch.where(any_ok, src.index_select(0, first), 0)
    return torch.where(ok, dst, fill_dst), torch.where(ok, src, fill_src)


@dataclass(frozen=True)
class Capacity:
    """KV tokens that fit in a memory budget with the FP8 and with the FP4 index cache."""

    bytes_per_token_fp8: int
    bytes_per_token_fp4: int
    tokens_fp8: int
    tokens_fp4: int

    @property
    def gain(self) -> float:
        """Relative extra tokens with FP4: ``tokens_fp4 / tokens_fp8 - 1``."""
        return self.tokens_fp4 / self.tokens_fp8 - 1.0 if self.tokens_fp8 else float("inf")


def capacity(
    memory_bytes: int,
    kv_bytes_per_token_per_layer: int = DEEPSEEK_V32_FP8_MLA_KV_BYTES,
    num_layers: int = DEEPSEEK_V32_NUM_LAYERS,
    index_bytes_fp8: int = FP8_INDEX_BYTES_PER_TOKEN,
    index_bytes_fp4: int = FP4_INDEX_BYTES_PER_TOKEN,
    num_index_layers: int | None = None,
) -> Capacity:
    """Tokens that fit in ``memory_bytes`` of KV pool with the FP8 vs the FP4 index cache.

    Every layer stores, per token, its MLA KV bytes plus its index-key bytes;
    ``tokens = memory_bytes // (num_layers * (kv + index))``. For DeepSeek-V3.2
    with FP8 MLA KV (656 B) this gives (656 + 132) / (656 + 68) - 1 = +8.8 % tokens.

    Args:
        memory_bytes: bytes available to the KV pool.
        kv_bytes_per_token_per_layer: MLA KV bytes per token per layer.
        num_layers: layers holding KV and index caches.
        index_bytes_fp8, index_bytes_fp4: index bytes per token per layer.
        num_index_layers: layers that hold an index-key cache (default
            ``num_layers``; fewer when some layers reuse another layer's top-k).

    Raises:
        ValueError: a negative budget or a non-positive per-token size or layer
            count, or ``num_index_layers`` outside ``0 .. num_layers``.
    """
    if memory_bytes < 0:
        raise ValueError(f"memory_bytes: expected >= 0, got {memory_bytes}")
    if num_layers <= 0:
        raise ValueError(f"num_layers: expected > 0, got {num_layers}")
    if kv_bytes_per_token_per_layer < 0 or index_bytes_fp8 <= 0 or index_bytes_fp4 <= 0:
        raise ValueError("bytes per token: expected kv >= 0 and index sizes > 0")
    if num_index_layers is None:
        num_index_layers = num_layers
    if not 0 <= num_index_layers <= num_layers:
        raise ValueError(f"num_index_layers: expected 0 .. {num_layers}, got {num_index_layers}")
    per_fp8 = num_layers * kv_bytes_per_token_per_layer + num_index_layers * index_bytes_fp8
    per_fp4 = num_layers * kv_bytes_per_token_per_layer + num_index_layers * index_bytes_fp4
    return Capacity(per_fp8, per_fp4, int(memory_bytes) // per_fp8, int(memory_bytes) // per_fp4)
