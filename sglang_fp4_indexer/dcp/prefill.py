"""Sharded prefill and extend: staging the batch's keys from every rank into flat planes in global order, then the
ragged scorer. The staged planes equal the single-process ``gather_index_k`` byte for byte.
"""

from __future__ import annotations

import torch

from ..format import PAYLOAD_BYTES, TOKEN_BYTES
from ..pool import PAGE_SIZE
from .layout import (
    _all_gather,
    _check_group,
    _check_int_tensor,
    _check_positive,
    _host_lens,
    check_block_table_layout,
    check_world,
    local_block_table,
)

__all__ = [
    "StagingBuffers",
    "stage_index_k",
    "sharded_ragged_logits",
]


class StagingBuffers:
    """Preallocated buffers of the sharded prefill staging.

    ``gathered`` (uint8 ``[W * segment, 68]``: every rank's share, rank-major),
    ``payload`` (uint8 ``[max_keys, 64]``) and ``scales`` (uint8 ``[max_keys, 4]``):
    the flat planes in global order. ``segment = ceil(max_keys / W) + max_requests``
    bounds one rank's share (``sum_b ceil(len_b / W)``). About ``2 * 68`` bytes per
    key of ``max_keys``; ``reserve`` grows them (before a call, never inside a
    CUDA graph) and never shrinks.

    Args:
        max_keys: most keys (sum of the requests' lengths) of one call.
        max_requests: most requests of one call.
        world_size: DCP width ``W``.
        device: where the buffers live.

    Raises:
        ValueError: a non-positive bound or a bad ``world_size``.
    """

    def __init__(self, max_keys: int, max_requests: int, world_size: int, device: torch.device | str | None = None):
        check_world(world_size)
        _check_positive(max_keys=max_keys, max_requests=max_requests)
        self.world_size = world_size
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        self.max_keys = 0
        self.max_requests = 0
        self.reserve(max_keys, max_requests)

    def _segment(self, keys: int, requests: int) -> int:
        return (keys + self.world_size - 1) // self.world_size + requests

    def reserve(self, max_keys: int, max_requests: int) -> bool:
        """Grow the buffers to hold ``max_keys`` keys of ``max_requests`` requests.

        Returns:
            True if the buffers were reallocated (their addresses changed).
        """
        if max_keys <= self.max_keys and max_requests <= self.max_requests:
            return False
        self.max_keys = max(max_keys, self.max_keys)
        self.max_requests = max(max_requests, self.max_requests)
        seg = self._segment(self.max_keys, self.max_requests)
        self.gathered = torch.empty((self.world_size * seg, TOKEN_BYTES), dtype=torch.uint8, device=self._device)
        self.payload = torch.empty((self.max_keys, PAYLOAD_BYTES), dtype=torch.uint8, device=self._device)
        self.scales = torch.empty((self.max_keys, TOKEN_BYTES - PAYLOAD_BYTES), dtype=torch.uint8, device=self._device)
        return True

    @property
    def device(self) -> torch.device:
        """Device of the buffers."""
        return self._device


def stage_index_k(
    local_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_cpu,
    *,
    world_size: int,
    rank: int,
    group=None,
    buffers: StagingBuffers,
    page_size: int = PAGE_SIZE,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage a prefill batch's FP4 index keys from the sharded caches into flat planes, in global order.

    Request ``b``'s key ``j`` (global position ``j < seq_lens[b]``) lands at
    flat row ``sum(seq_lens[:b]) + j``, exactly as ``ops.gather.gather_index_k``
    lays out the unsharded cache. Method:

    1. Each rank gathers its share with ``ops.gather.gather_index_k`` from its
       local cache (``local_block_table``), ``ceil(len_b / W)`` local keys per
       request (the largest share; a rank with fewer keys reads one spare slot
       of the request's own local page, never used), payload rows and scale
       rows through ``pool.scale_row``.
    2. The shares (``[segment, 68]``: payload then scales) are all-gathered on
       ``group`` into ``buffers.gathered``.
    3. De-interleave: flat row of ``(b, j)`` <- share of rank ``j % W``, row
       ``start_b + j // W``; written into ``buffers.payload`` / ``buffers.scales``.

    Args:
        local_cache: uint8 ``[local_pages, page_size * 68]`` this rank's layer cache.
        block_table: int32/int64 ``[B, max_pages]`` global index pages, DCP layout.
        seq_lens: int32/int64 ``[B]`` keys per request (on the cache's device).
        seq_lens_cpu: the same lengths on the host (tensor or list of ints).
        world_size, rank: DCP width and this rank; ``group`` must match them.
        group: ``torch.distributed`` process group of the DCP ranks (None: default group).
        buffers: ``StagingBuffers`` for ``W`` ranks with room for the batch.
        page_size: tokens per page.
        check: validate lengths, pages and layout (host syncs).

    Returns:
        ``(payload uint8 [total, 64], scales uint8 [total, 4])``: leading views of
        ``buffers.payload`` / ``buffers.scales``, ``total = sum(seq_lens)``.

    Raises:
        TypeError, ValueError: bad arguments, a group of another size, a batch
            over the buffers' room (``StagingBuffers.reserve`` first), or
            (``check``) lengths that disagree with ``seq_lens_cpu`` or a block
            table outside the DCP layout.
    """
    from ..ops.gather import gather_index_k

    check_world(world_size, rank)
    if not isinstance(buffers, StagingBuffers) or buffers.world_size != world_size:
        raise ValueError("buffers: expected StagingBuffers for this DCP width")
    _check_int_tensor("block_table", block_table)
    _check_int_tensor("seq_lens", seq_lens)
    lens = _host_lens(seq_lens_cpu)
    if seq_lens.dim() != 1 or seq_lens.shape[0] != len(lens) or block_table.dim() != 2 or block_table.shape[0] != len(lens):
        raise ValueError(
            f"seq_lens, seq_lens_cpu, block_table: expected {len(lens)} requests each, got "
            f"{list(seq_lens.shape)} and {list(block_table.shape)}"
        )
    total = sum(lens)
    share = [(n + world_size - 1) // world_size for n in lens]
    segment = sum(share)
    if total > buffers.max_keys or len(lens) > buffers.max_requests:
        raise ValueError(
            f"buffers: the batch has {total} keys in {len(lens)} requests, the staging buffers hold "
            f"{buffers.max_keys} keys in {buffers.max_requests} requests (call reserve first)"
        )
    if check:
        _check_group(group, world_size, rank)
        if seq_lens.tolist() != lens:
            raise ValueError("seq_lens: device lengths differ from seq_lens_cpu")
        check_block_table_layout(block_table, seq_lens, world_size, page_size)
    payload_out = buffers.payload[:total]
    scales_out = buffers.scales[:total]
    if total == 0:
        return payload_out, scales_out
    device = local_cache.device
    share_dev = torch.div(seq_lens.to(torch.int64) + world_size - 1, world_size, rounding_mode="floor")
    table = local_block_table(block_table, world_size)
    payload, scales = gather_index_k(
        local_cache, table, share_dev, segment, max(share), page_size=page_size, check=check
    )
    gathered = buffers.gathered[: world_size * segment]
    mine = torch.cat([payload, scales], dim=1)  # [segment, 68]: one collective for both planes
    if world_size > 1:
        _all_gather(gathered.view(-1), mine.view(-1), group)
    else:
        gathered.copy_(mine)
    lens_dev = seq_lens.to(device=device, dtype=torch.int64)
    req = torch.repeat_interleave(torch.arange(len(lens), device=device), lens_dev, output_size=total)
    starts = torch.cumsum(lens_dev, 0) - lens_dev
    share_starts = torch.cumsum(share_dev, 0) - share_dev
    j = torch.arange(total, device=device, dtype=torch.int64) - starts[req]
    src = (j % world_size) * segment + share_starts[req] + torch.div(j, world_size, rounding_mode="floor")
    torch.index_select(gathered[:, :PAYLOAD_BYTES], 0, src, out=payload_out)
    torch.index_select(gathered[:, PAYLOAD_BYTES:], 0, src, out=scales_out)
    return payload_out, scales_out


def sharded_ragged_logits(
    q: torch.Tensor,
    weights: torch.Tensor,
    local_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_cpu,
    ks: torch.Tensor,
    ke: torch.Tensor,
    *,
    world_size: int,
    rank: int,
    group=None,
    buffers: StagingBuffers,
    page_size: int = PAGE_SIZE,
    check: bool = True,
    **scorer_kwargs,
) -> torch.Tensor:
    """Prefill / extend logits over a sharded FP4 index: ``stage_index_k`` then ``ops.ragged_logits.ragged_logits``.

    Same result as ``ragged_logits`` on the planes ``ops.gather.gather_index_k``
    gives for the unsharded cache: ``logits[t, j]`` for ``ks[t] <= j < ke[t]``
    (flat key rows of the batch), ``-inf`` elsewhere.

    Args:
        q, weights, ks, ke: as ``ragged_logits`` (``[T, H, 128]``, ``[T, H]``, int ``[T]``).
        local_cache, block_table, seq_lens, seq_lens_cpu, world_size, rank, group,
        buffers, page_size, check: as ``stage_index_k``.
        **scorer_kwargs: passed to ``ragged_logits`` (``mode``, ``mma``, ``clean_logits``, ...).

    Returns:
        fp32 ``[T, sum(seq_lens)]``.

    Raises:
        TypeError, ValueError: as ``stage_index_k`` and ``ragged_logits``.
    """
    from ..ops.ragged_logits import ragged_logits

    payload, scales = stage_index_k(
        local_cache, block_table, seq_lens, seq_lens_cpu, world_size=world_size, rank=rank,
        group=group, buffers=buffers, page_size=page_size, check=check,
    )
    return ragged_logits(q, weights, payload, scales, ks, ke, check=check, **scorer_kwargs)
