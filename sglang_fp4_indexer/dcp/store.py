"""The sharded store: each rank writes only the index keys of the slots it owns.
"""

from __future__ import annotations

import torch

from ..pool import PAGE_SIZE
from .layout import local_store_slots

__all__ = [
    "store_index_k_sharded",
]


def store_index_k_sharded(
    k: torch.Tensor,
    local_cache: torch.Tensor,
    slots: torch.Tensor,
    world_size: int,
    rank: int,
    *,
    page_size: int = PAGE_SIZE,
    check_slots: bool = True,
) -> None:
    """Quantize and store the index keys rank ``rank`` owns into its local FP4 cache.

    Token ``i`` with global slot ``s = slots[i]`` is written when ``s % W ==
    rank``, at local slot ``s // W``, by ``ops.quantize.store_index_k`` (payload
    row and scale row ``pool.scale_row(row)``, bit-exact with
    ``format.quantize_index_k``); other tokens and ``s < 0`` are skipped. No
    host sync with ``check_slots=False`` (graph-capturable).

    Args:
        k: ``[N, 128]`` bf16/fp16/fp32 index keys.
        local_cache: uint8 ``[local_pages, page_size * 68]`` this rank's layer cache.
        slots: int32/int64 ``[N]`` global (widened) slots.
        world_size, rank: DCP width and this rank.
        page_size: tokens per page.
        check_slots: as ``store_index_k`` (raise on a local slot past the cache).

    Raises:
        TypeError, ValueError: as ``store_index_k`` and ``local_store_slots``.
    """
    from ..ops.quantize import store_index_k

    local = local_store_slots(slots.reshape(-1), world_size, rank)
    store_index_k(k, local_cache, local.contiguous(), page_size, check_slots=check_slots)
