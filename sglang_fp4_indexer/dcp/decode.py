"""Sharded decode and target verify: local top-k, candidate exchange, merge into the exact global top-k.

Each rank scores its local keys with the paged scorer, packs its local top-k as (score, global position)
candidates (``pack_candidates``), the ranks' candidates are all-gathered, and every rank merges them into the
same global top-k (``merge_candidates``: score descending, then position ascending).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..pool import PAGE_SIZE
from .layout import (
    _all_gather,
    _check_group,
    _check_int_tensor,
    _check_positive,
    _expanded_lens,
    check_block_table_layout,
    check_world,
    local_block_table,
    local_context_lens,
)

__all__ = [
    "PAD_KEY",
    "LOCAL_TOPK_CHUNK_BYTES",
    "local_topk_chunk_rows",
    "pack_candidates",
    "unpack_candidates",
    "merge_candidates",
    "CandidateBuffers",
    "DecodeTopK",
    "sharded_decode_topk",
    "scatter_topk_logits",
]


#: Packed candidate that sorts below every real one (an empty top-k slot): int64 min.
PAD_KEY = -(2**63)
_LOW = 2**32  # the position lives in the low 32 bits of a packed candidate
_POS_LIMIT = 2**32 - 1
#: Bytes the sharded decode top-k's packing may hold at once beyond the local logits (its row chunks are
#: sized to it): 33 bytes per local column and row -- 17 for the packing (int64 keys, fp32 and int32
#: scratch, a bool mask) and 16 for ``torch.topk``'s workspace over the chunk (int64 values and indices of
#: a sort). On an H200 the peak was 25.7 bytes per element (256 rows x 40960 columns, 96-row chunks:
#: 101 MB beyond the logits) when only the 17 were counted.
LOCAL_TOPK_CHUNK_BYTES = 64 << 20
_PACK_BYTES_PER_ELEMENT = 33

def pack_candidates(scores: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Pack (score, position) pairs into int64 keys whose integer order is the top-k order.

    ``key = ordered(score) * 2**32 + (2**32 - 1 - position)``, where
    ``ordered`` maps fp32 to int32 monotonically (the sign-magnitude to two's
    complement flip: ``bits`` if ``bits >= 0`` else ``bits ^ 0x7FFFFFFF``, after
    ``score + 0.0`` turns ``-0.0`` into ``+0.0``). A larger key is a higher score,
    and at equal scores a lower position; distinct positions give distinct keys,
    so ``torch.topk`` on keys is deterministic. ``-inf`` scores stay valid
    (above ``PAD_KEY``); NaN scores are not ordered meaningfully (logits of
    finite inputs are never NaN). Exact: both fields are kept bit for bit.

    Args:
        scores: fp32 tensor.
        positions: int tensor of the same shape or one that broadcasts to it (e.g. ``[1, width]``
            when the position depends on the column only), ``0 <= position < 2**32 - 1``.
        valid: optional bool mask of the same shape or broadcasting to it; invalid entries become ``PAD_KEY``.

    Returns:
        int64 tensor of the shape of ``scores`` (built in place: one int64 result plus an int32
        scratch of that shape).

    Raises:
        TypeError, ValueError: wrong dtypes or shapes.
    """
    if not isinstance(scores, torch.Tensor) or scores.dtype != torch.float32:
        raise ValueError(f"scores: expected a float32 tensor, got {getattr(scores, 'dtype', type(scores).__name__)}")
    _check_int_tensor("positions", positions)
    if not _broadcasts_to(positions, scores.shape):
        raise ValueError(f"positions: expected shape {list(scores.shape)} (or one broadcasting to it), "
                         f"got {list(positions.shape)}")
    if valid is not None and (valid.dtype != torch.bool or not _broadcasts_to(valid, scores.shape)):
        raise ValueError(f"valid: expected a bool tensor of shape {list(scores.shape)} (or one broadcasting to it)")
    bits = (scores + 0.0).view(torch.int32)
    keys = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(torch.int64)
    del bits
    keys.mul_(_LOW).add_(_POS_LIMIT - positions.to(torch.int64))
    if valid is not None:
        keys.masked_fill_(~valid, PAD_KEY)
    return keys


def _broadcasts_to(t: torch.Tensor, shape) -> bool:
    try:
        return torch.broadcast_shapes(t.shape, shape) == tuple(shape)
    except RuntimeError:
        return False


def unpack_candidates(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of ``pack_candidates``: ``(positions int32, scores fp32)``; ``PAD_KEY`` gives ``(-1, -inf)``.

    Raises:
        ValueError: ``keys`` is not int64.
    """
    if not isinstance(keys, torch.Tensor) or keys.dtype != torch.int64:
        raise ValueError(f"keys: expected an int64 tensor, got {getattr(keys, 'dtype', type(keys).__name__)}")
    pad = keys == PAD_KEY
    ordered = torch.div(keys, _LOW, rounding_mode="floor")
    positions = _POS_LIMIT - (keys - ordered * _LOW)
    ordered = ordered.to(torch.int32)
    bits = torch.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF)
    scores = bits.view(torch.float32)
    positions = torch.where(pad, torch.full_like(positions, -1), positions).to(torch.int32)
    scores = torch.where(pad, torch.full_like(scores, float("-inf")), scores)
    return positions, scores


def merge_candidates(gathered: torch.Tensor, topk: int) -> torch.Tensor:
    """Global top-k of ``W`` ranks' packed candidates, best first (the same on every rank).

    Args:
        gathered: int64 ``[W, rows, k]`` packed candidates (``PAD_KEY`` for empty slots).
        topk: keys to keep (``<= W * k``).

    Returns:
        int64 ``[rows, topk]`` packed keys, descending (``unpack_candidates`` them).

    Raises:
        ValueError: bad dtype, rank or ``topk``.
    """
    if not isinstance(gathered, torch.Tensor) or gathered.dtype != torch.int64 or gathered.dim() != 3:
        raise ValueError(f"gathered: expected int64 [W, rows, k], got {getattr(gathered, 'shape', gathered)}")
    w, rows, k = gathered.shape
    if not isinstance(topk, int) or not 1 <= topk <= w * k:
        raise ValueError(f"topk: expected an int in 1 .. {w * k}, got {topk!r}")
    flat = gathered.permute(1, 0, 2).reshape(rows, w * k)
    return torch.topk(flat, topk, dim=1, sorted=True).values


class DecodeTopK(NamedTuple):
    """The merged global top-k of one decode / verify call.

    Attributes:
        positions: int32 ``[rows, topk]`` global key positions, best first; ``-1`` past a row's keys.
        scores: fp32 ``[rows, topk]`` their logits; ``-inf`` where ``positions`` is ``-1``.
    """

    positions: torch.Tensor
    scores: torch.Tensor


class CandidateBuffers:
    """Preallocated exchange buffers of the sharded decode top-k (address-stable).

    Holds ``local`` (int64 ``[max_rows * topk]``, this rank's packed local top-k)
    and ``gathered`` (int64 ``[W * max_rows * topk]``, every rank's). A call with
    ``rows <= max_rows`` uses their leading parts, so the addresses a CUDA graph
    captured stay valid on replay. Size them with the scheduler's bound on
    query rows (``max_running_requests * next_n``): ``8 * topk * (W + 1)``
    bytes per row.

    Args:
        max_rows: most query rows of one call.
        topk: keys kept per row (SGLang's ``index_topk``).
        world_size: DCP width ``W``.
        device: where the buffers live.

    Raises:
        ValueError: non-positive ``max_rows`` or ``topk``, or a bad ``world_size``.
    """

    def __init__(self, max_rows: int, topk: int, world_size: int, device: torch.device | str | None = None):
        check_world(world_size)
        _check_positive(max_rows=max_rows, topk=topk)
        self.max_rows = max_rows
        self.topk = topk
        self.world_size = world_size
        self.local = torch.empty(max_rows * topk, dtype=torch.int64, device=device)
        self.gathered = torch.empty(world_size * max_rows * topk, dtype=torch.int64, device=device)

    @property
    def device(self) -> torch.device:
        """Device of the buffers."""
        return self.local.device

    def views(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(local [rows, topk], gathered flat [W * rows * topk])`` leading views.

        Raises:
            ValueError: ``rows`` over ``max_rows`` (the buffers were sized below the batch bound).
        """
        if not 0 <= rows <= self.max_rows:
            raise ValueError(
                f"rows: {rows} query rows, but the candidate buffers were sized for {self.max_rows} "
                "(size them with the scheduler's batch bound)"
            )
        n = rows * self.topk
        return self.local[:n].view(rows, self.topk), self.gathered[: self.world_size * n]


def sharded_decode_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    local_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    topk: int,
    world_size: int,
    rank: int,
    group=None,
    buffers: CandidateBuffers,
    page_size: int = PAGE_SIZE,
    check: bool = True,
    **scorer_kwargs,
) -> DecodeTopK:
    """Global top-k of decode / target-verify rows over a sharded FP4 index (one all-gather).

    1. Local scoring: ``ops.paged_logits.paged_logits(q, weights, local_cache,
       local_block_table(block_table), local_context_lens(...))``: this rank's
       keys only (local key ``i`` = global position ``i * W + rank``).
    2. Local top-k: the ``min(topk, local width)`` best local keys under the
       order (score descending, position ascending), packed with their global
       positions (``pack_candidates``) into ``buffers.local`` (``PAD_KEY`` fill),
       in row chunks whose packing temporaries stay within ``LOCAL_TOPK_CHUNK_BYTES``
       (``local_topk_chunk_rows``), so the memory beyond the local logits is bounded
       whatever the batch and context.
    3. Exchange: one all-gather of the packed candidates on ``group`` into
       ``buffers.gathered``.
    4. Merge: ``merge_candidates``: the exact global top-k, identical on every
       rank, equal to ``reference.topk_reference`` of the unsharded logits
       (ties to the lower position).

    No host sync with ``check=False`` (graph-capturable: fixed shapes per row
    count, preallocated exchange buffers, an in-graph collective).

    Args:
        q: ``[B * next_n, H, 128]`` float8_e4m3fn (bf16 accepted) index queries.
        weights: fp32 ``[B * next_n, H]`` head weights.
        local_cache: uint8 ``[local_pages, page_size * 68]`` this rank's layer cache.
        block_table: int32/int64 ``[B, max_pages]`` global index pages (SGLang's
            ``real_page_table``) in the DCP logical-page layout.
        context_lens: int ``[B]`` or ``[B, next_n]`` global key counts
            (``reference.expand_context_lens`` semantics).
        topk: keys per row (``index_topk``); ``buffers.topk`` must equal it.
        world_size, rank: DCP width and this rank; ``group`` must match them.
        group: ``torch.distributed`` process group of the DCP ranks (SGLang's
            ``get_parallel().dcp_group.device_group``); None = the default group.
        buffers: ``CandidateBuffers`` for ``W`` ranks and ``topk`` keys.
        page_size: tokens per page.
        check: validate the block-table layout, the group and the scorer inputs (host syncs).
        **scorer_kwargs: passed to ``paged_logits`` (``impl``, ``mma``, ``block_kv``, ...).

    Returns:
        ``DecodeTopK(positions int32 [rows, topk], scores fp32 [rows, topk])``.

    Raises:
        TypeError, ValueError: bad arguments (as ``paged_logits``), mismatched
            buffers, rows over the buffers' bound, a group of another size, or
            (``check``) a block table outside the DCP layout.
    """
    from ..ops.paged_logits import paged_logits

    check_world(world_size, rank)
    _check_int_tensor("block_table", block_table)
    _check_int_tensor("context_lens", context_lens)
    if not isinstance(buffers, CandidateBuffers):
        raise TypeError(f"buffers: expected CandidateBuffers, got {type(buffers).__name__}")
    if buffers.topk != topk or buffers.world_size != world_size:
        raise ValueError(
            f"buffers: sized for topk {buffers.topk} and W {buffers.world_size}, the call has {topk} and {world_size}"
        )
    if block_table.dim() != 2 or block_table.shape[0] == 0:
        raise ValueError(f"block_table: expected [B, max_pages] with B >= 1, got {list(block_table.shape)}")
    rows = q.shape[0]
    batch = block_table.shape[0]
    if rows % batch:
        raise ValueError(f"q: rows ({rows}) must be a multiple of the block_table batch ({batch})")
    next_n = rows // batch
    local_view, gathered = buffers.views(rows)
    if check:
        _check_group(group, world_size, rank)
        lens_req = _expanded_lens(context_lens, batch, next_n).max(dim=1).values
        check_block_table_layout(block_table, lens_req, world_size, page_size)
    table = local_block_table(block_table, world_size)
    lens = local_context_lens(context_lens, world_size, rank, next_n=next_n, batch=batch)
    width = table.shape[1] * page_size
    logits = paged_logits(
        q, weights, local_cache, table, lens, width=width, page_size=page_size, check=check, **scorer_kwargs
    )
    _local_topk_into(local_view, logits, lens.reshape(-1, 1), world_size, rank)
    if world_size > 1:
        _all_gather(gathered, buffers.local[: rows * topk], group)
    else:
        gathered.copy_(buffers.local[: rows * topk])
    merged = merge_candidates(gathered.view(world_size, rows, topk), topk)
    return DecodeTopK(*unpack_candidates(merged))


def local_topk_chunk_rows(rows: int, width: int) -> int:
    """Query rows per chunk of the sharded decode top-k's packing: at most ``LOCAL_TOPK_CHUNK_BYTES`` of
    temporaries (``_PACK_BYTES_PER_ELEMENT`` = 33 bytes per local column and row: the packing and
    ``torch.topk``'s workspace), at least one row, at most ``rows``."""
    return max(1, min(rows, LOCAL_TOPK_CHUNK_BYTES // max(1, width * _PACK_BYTES_PER_ELEMENT)))


def _local_topk_into(local_view: torch.Tensor, logits: torch.Tensor, lens: torch.Tensor, world_size: int,
                     rank: int) -> None:
    """This rank's packed local top-k of ``logits`` (``[rows, width]``, local key ``i`` = global position
    ``i * W + rank``, row ``r`` sees ``lens[r, 0]`` keys) into ``local_view`` (``[rows, topk]``, ``PAD_KEY``
    past ``width``), in row chunks of ``local_topk_chunk_rows`` so that the packing temporaries stay within
    ``LOCAL_TOPK_CHUNK_BYTES`` whatever the batch and context (no host sync; fixed shapes per row count)."""
    rows, width = logits.shape
    topk = local_view.shape[1]
    kk = min(topk, width)
    cols = torch.arange(width, device=logits.device, dtype=torch.int64)
    positions = (cols * world_size + rank)[None, :]
    step = local_topk_chunk_rows(rows, width)
    for start in range(0, rows, step):
        end = min(start + step, rows)
        keys = pack_candidates(logits[start:end].float(), positions, cols[None, :] < lens[start:end])
        local_view[start:end, :kk] = torch.topk(keys, kk, dim=1, sorted=False).values
    if kk < topk:
        local_view[:, kk:] = PAD_KEY


def scatter_topk_logits(
    positions: torch.Tensor, scores: torch.Tensor, width: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Logits rows holding only the selected keys' scores: ``-inf`` elsewhere.

    Any exact top-k over the result (with or without lengths) selects the same
    set as ``positions``: rows with fewer than ``topk`` keys keep them all, the
    rest have exactly ``topk`` finite columns. This lets a caller hand the
    merged sharded top-k to code that takes logits (SGLang's ``topk_transform``).
    ``-1`` positions write nothing (they are redirected to the row's first
    entry with its own score, so scattering stays deterministic). No host sync.

    Args:
        positions: int ``[rows, topk]`` positions ``< width`` (``-1``: none).
        scores: fp32 ``[rows, topk]``.
        width: logits columns.
        out: optional fp32 ``[rows, width]`` to write into (fully overwritten).

    Returns:
        fp32 ``[rows, width]``.

    Raises:
        ValueError: mismatched shapes or dtypes, or a bad ``width`` / ``out``.
    """
    _check_int_tensor("positions", positions)
    if scores.dtype != torch.float32 or scores.shape != positions.shape or positions.dim() != 2:
        raise ValueError(f"scores: expected float32 {list(positions.shape)}, got {scores.dtype} {list(scores.shape)}")
    if not isinstance(width, int) or width < 1:
        raise ValueError(f"width: expected an int >= 1, got {width!r}")
    rows = positions.shape[0]
    if out is None:
        out = torch.empty((rows, width), dtype=torch.float32, device=scores.device)
    elif out.dtype != torch.float32 or tuple(out.shape) != (rows, width):
        raise ValueError(f"out: expected float32 [{rows}, {width}], got {out.dtype} {list(out.shape)}")
    out.fill_(float("-inf"))
    if positions.shape[1] == 0:
        return out
    pos = positions.to(torch.int64)
    ok = pos >= 0
    first_pos = pos[:, :1].clamp_min(0)
    idx = torch.where(ok, pos, first_pos)
    val = torch.where(ok, scores, scores[:, :1])
    out.scatter_(1, idx, val)
    return out
