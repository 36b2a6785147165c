"""Decode context parallelism (DCP) for the FP4 index-key cache.

Under SGLang's decode context parallelism (``attn_dcp_size = W > 1``) a
request's MLA KV is spread over ``W`` ranks by the *owner rule*: global slot
``s`` lives on rank ``s % W`` at local slot ``s // W`` (SGLang 0.5.23,
``transform_index_page_table_dcp`` and ``layers/dcp/layout.py``). The
allocator pages by ``64 * W`` global slots (``allocation_sizing``:
``page_size * attn_dcp_size``), so a request's position ``j`` lands on rank
``j % W`` and each logical page of ``64 * W`` tokens is ``W`` consecutive
64-token index pages (global page ``W * P + t``, ``t < W``) whose owned slots
fill exactly one 64-token local page ``P`` on every rank.

Two modes:

- **replicated**: every rank keeps the whole FP4 index (68 B per token per
  layer) in SGLang's widened global slot space; the numerics are the
  single-GPU ones. ``bytes_per_token`` / ``dcp_capacity`` give the memory.
- **sharded**: rank ``r`` stores only the index keys of the slots it owns
  (``store_index_k_sharded``), 68 / W bytes per token per layer.

  * Decode / target verify (``sharded_decode_topk``): each rank scores its
    local keys with ``ops.paged_logits.paged_logits`` (a local block table and
    local lengths derived from the global ones), keeps its local top-k as
    (score, global position) pairs packed into one int64 each
    (``pack_candidates``), the ``W`` candidate sets are exchanged with one
    all-gather on the given process group, and every rank merges them into
    the same global top-k (``merge_candidates``). The total order is score
    descending, then position ascending, so the result equals the exact top-k
    of the unsharded logits with ties broken by position (lower wins), the
    order of ``reference.topk_reference``: any key of the global top-k is in
    its owner's local top-k under the same total order.
  * Prefill / extend (``stage_index_k``): each rank gathers its share of the
    batch's keys out of its local paged cache (``ops.gather.gather_index_k``:
    payload rows and scale rows at ``pool.scale_row``), the shares are
    all-gathered and de-interleaved to global order into flat planes, which
    ``ops.ragged_logits.ragged_logits`` scores (``sharded_ragged_logits``).
    The staged planes equal the single-process ``gather_index_k`` byte for byte.

The candidate buffers (``CandidateBuffers``) and the staging buffers
(``StagingBuffers``) are allocated once, sized by a batch bound, and reused
(address-stable: safe under CUDA-graph capture and replay for decode).

Nothing here imports SGLang. Every scale-plane access goes through
``pool.scale_row`` inside the ops this module calls (``store_index_k`` on
write, ``gather_index_k`` on read); this module never indexes a plane itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

import torch

from .format import PAYLOAD_BYTES, TOKEN_BYTES
from .pool import (
    DEEPSEEK_V32_FP8_MLA_KV_BYTES,
    DEEPSEEK_V32_NUM_LAYERS,
    FP4_INDEX_BYTES_PER_TOKEN,
    FP8_INDEX_BYTES_PER_TOKEN,
    PAGE_SIZE,
    capacity,
)

__all__ = [
    "REPLICATED",
    "SHARDED",
    "MODES",
    "PAD_KEY",
    "LOCAL_TOPK_CHUNK_BYTES",
    "local_topk_chunk_rows",
    "check_world",
    "owner_rank",
    "local_slot",
    "local_store_slots",
    "owned_local_slots",
    "local_num_slots",
    "local_block_table",
    "check_block_table_layout",
    "dcp_block_table",
    "local_context_lens",
    "bytes_per_token",
    "DcpCapacity",
    "dcp_capacity",
    "store_index_k_sharded",
    "pack_candidates",
    "unpack_candidates",
    "merge_candidates",
    "CandidateBuffers",
    "DecodeTopK",
    "sharded_decode_topk",
    "scatter_topk_logits",
    "StagingBuffers",
    "stage_index_k",
    "sharded_ragged_logits",
]

#: Every rank keeps the whole FP4 index (68 B per token per layer).
REPLICATED = "replicated"
#: Each rank keeps the index keys of the slots it owns (68 / W B per token per layer).
SHARDED = "sharded"
#: The DCP modes of the FP4 index-key cache.
MODES = (REPLICATED, SHARDED)

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


# ---------------------------------------------------------------------------
# The owner rule and per-rank page math
# ---------------------------------------------------------------------------


def check_world(world_size: int, rank: int | None = None) -> None:
    """Validate a DCP width and, optionally, a rank in it.

    Raises:
        ValueError: ``world_size`` is not an int >= 1, or ``rank`` not in ``0 .. world_size - 1``.
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size: expected an int >= 1, got {world_size!r}")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size):
        raise ValueError(f"rank: expected an int in 0 .. {world_size - 1}, got {rank!r}")


def _check_int_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: expected int32 or int64, got {t.dtype}")


def _check_positive(**values) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {v!r}")


def owner_rank(slots: torch.Tensor, world_size: int) -> torch.Tensor:
    """Rank that owns each global slot: ``s % W`` (SGLang's DCP owner rule).

    Args:
        slots: int32/int64 global (widened) slots, any shape, ``s >= 0``.
        world_size: DCP width ``W``.

    Returns:
        Tensor of the same shape and dtype.

    Raises:
        TypeError, ValueError: not an integer tensor, or a bad ``world_size``.
    """
    check_world(world_size)
    _check_int_tensor("slots", slots)
    return torch.remainder(slots, world_size)


def local_slot(slots: torch.Tensor, world_size: int) -> torch.Tensor:
    """Slot of each global slot in its owner's local cache: ``s // W``.

    Args:
        slots: int32/int64 global slots, any shape, ``s >= 0``.
        world_size: DCP width ``W``.

    Raises:
        TypeError, ValueError: not an integer tensor, or a bad ``world_size``.
    """
    check_world(world_size)
    _check_int_tensor("slots", slots)
    return torch.div(slots, world_size, rounding_mode="floor")


def local_store_slots(slots: torch.Tensor, world_size: int, rank: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Slots for rank ``rank``'s store: ``s // W`` where ``s % W == rank``, ``-1`` elsewhere.

    ``-1`` (and any negative input slot) is skipped by ``ops.quantize.store_index_k``,
    so a rank writes exactly the tokens it owns. No host sync (graph-capturable).

    Args:
        slots: int32/int64 ``[N]`` global slots (negative: padding, kept ``-1``).
        world_size, rank: DCP width and this rank.
        out: optional tensor like ``slots`` to write into.

    Returns:
        Tensor like ``slots``.

    Raises:
        TypeError, ValueError: bad tensor, ``world_size`` or ``rank``.
    """
    check_world(world_size, rank)
    _check_int_tensor("slots", slots)
    owned = (slots >= 0) & (torch.remainder(slots, world_size) == rank)
    local = torch.div(slots, world_size, rounding_mode="floor")
    result = torch.where(owned, local, torch.full_like(slots, -1))
    if out is None:
        return result
    return out.copy_(result)


def owned_local_slots(slots: torch.Tensor, world_size: int, rank: int) -> torch.Tensor:
    """Local slots of the global ``slots`` that rank ``rank`` owns, in order (a host sync: boolean selection).

    For whole-page runs (SGLang's retract / offload indices) this equals
    SGLang's ``maybe_dcp_kernel_indices``: ``slots[rank::W] // W``.

    Args:
        slots: int32/int64 ``[N]`` global slots (negative entries are dropped).
        world_size, rank: DCP width and this rank.

    Returns:
        Tensor of ``slots``'s dtype, ``[M]`` with ``M`` the owned count.

    Raises:
        TypeError, ValueError: bad tensor, ``world_size`` or ``rank``.
    """
    check_world(world_size, rank)
    _check_int_tensor("slots", slots)
    flat = slots.reshape(-1)
    owned = (flat >= 0) & (torch.remainder(flat, world_size) == rank)
    return torch.div(flat[owned], world_size, rounding_mode="floor")


def local_num_slots(global_slots: int, world_size: int, rank: int = 0) -> int:
    """Local slots rank ``rank`` needs to hold every owned slot of ``[0, global_slots)``.

    ``ceil((global_slots - rank) / W)``; rank 0 needs the most.

    Raises:
        ValueError: negative ``global_slots`` or a bad ``world_size`` / ``rank``.
    """
    check_world(world_size, rank)
    if not isinstance(global_slots, int) or global_slots < 0:
        raise ValueError(f"global_slots: expected an int >= 0, got {global_slots!r}")
    return max(0, (global_slots - rank + world_size - 1) // world_size)


def local_block_table(block_table: torch.Tensor, world_size: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Local page table of every rank: ``block_table[:, ::W] // W`` (int32).

    With SGLang's DCP allocator (logical pages of ``64 * W`` slots) global
    pages ``W * m .. W * m + W - 1`` of a request are ``W * P + t``: its
    local keys ``64 m .. 64 m + 63`` (positions ``j = i * W + rank``) are the
    rows of local page ``P = block_table[b, W * m] // W`` on every rank
    (``check_block_table_layout`` verifies the layout). Negative entries stay
    negative (the scorer masks them). No host sync.

    Args:
        block_table: int32/int64 ``[B, max_pages]`` global 64-token index pages.
        world_size: DCP width ``W``.
        out: optional int32 ``[B, ceil(max_pages / W)]`` to write into.

    Returns:
        int32 ``[B, ceil(max_pages / W)]``, contiguous.

    Raises:
        TypeError, ValueError: bad tensor, rank or ``out`` shape.
    """
    check_world(world_size)
    _check_int_tensor("block_table", block_table)
    if block_table.dim() != 2:
        raise ValueError(f"block_table: expected [B, max_pages], got {list(block_table.shape)}")
    firsts = block_table[:, ::world_size]
    if out is None:
        return torch.div(firsts, world_size, rounding_mode="floor").to(torch.int32).contiguous()
    if out.dtype != torch.int32 or tuple(out.shape) != tuple(firsts.shape):
        raise ValueError(f"out: expected int32 {list(firsts.shape)}, got {out.dtype} {list(out.shape)}")
    return out.copy_(torch.div(firsts, world_size, rounding_mode="floor"))


def check_block_table_layout(
    block_table: torch.Tensor, seq_lens: torch.Tensor, world_size: int, page_size: int = PAGE_SIZE
) -> None:
    """Check that each request's pages follow SGLang's DCP logical-page layout (host sync).

    For every page ``p < ceil(len / page_size)`` in use: ``block_table[b, p] ==
    block_table[b, p - p % W] + p % W`` and ``block_table[b, p - p % W] % W == 0``.
    Only under this layout is ``local_block_table`` the owner rule's local table.

    Args:
        block_table: int ``[B, max_pages]`` global index pages.
        seq_lens: int ``[B]`` keys per request.
        world_size: DCP width ``W``.

    Raises:
        ValueError: a request's pages break the layout (the message names it),
            or the table is too narrow for its length.
    """
    check_world(world_size)
    _check_int_tensor("block_table", block_table)
    _check_int_tensor("seq_lens", seq_lens)
    bt = block_table.to(torch.int64).cpu()
    for b, n in enumerate(seq_lens.reshape(-1).tolist()):
        pages = (int(n) + page_size - 1) // page_size
        if pages > bt.shape[1]:
            raise ValueError(f"block_table: request {b} needs {pages} pages, the table has {bt.shape[1]}")
        if pages == 0:
            continue
        p = torch.arange(pages)
        first = bt[b, p - p % world_size]
        if bool((first % world_size != 0).any()) or not torch.equal(bt[b, :pages], first + p % world_size):
            raise ValueError(
                f"block_table: request {b}'s pages {bt[b, :pages].tolist()} are not whole DCP logical pages "
                f"(runs of {world_size} consecutive pages starting at a multiple of {world_size})"
            )


def dcp_block_table(
    seq_lens,
    world_size: int,
    *,
    page_size: int = PAGE_SIZE,
    spare_logical_pages: int = 0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, int]:
    """A block table in SGLang's DCP layout, for tests and benchmarks (host, no SGLang).

    Each request gets ``ceil(len / (page_size * W))`` logical pages (at least
    one) drawn in random order from ``sum + spare_logical_pages`` logical pages;
    logical page ``P`` is the global index pages ``W * P .. W * P + W - 1``.
    Unused entries are ``-1``.

    Args:
        seq_lens: keys per request (ints >= 0).
        world_size: DCP width ``W``.
        page_size: tokens per index page.
        spare_logical_pages: logical pages left unallocated (the caches get them too).
        generator: torch generator for the page order (None: identity order).

    Returns:
        ``(block_table int32 [B, max_pages], global_pages)``: the table and the
        number of global index pages of the slot space (``W * logical pages``);
        every rank's local cache needs ``global_pages // W`` pages.

    Raises:
        ValueError: a bad ``world_size`` or negative length.
    """
    check_world(world_size)
    lens = _host_lens(seq_lens)
    span = page_size * world_size
    logical = [max(1, (n + span - 1) // span) for n in lens]
    total = sum(logical) + int(spare_logical_pages)
    order = torch.randperm(total, generator=generator) if generator is not None else torch.arange(total)
    width = max([world_size * n for n in logical], default=world_size)
    table = torch.full((len(lens), width), -1, dtype=torch.int32)
    t = torch.arange(world_size, dtype=torch.int32)
    used = 0
    for b, n in enumerate(logical):
        pages = order[used : used + n].to(torch.int32)
        used += n
        table[b, : world_size * n] = (world_size * pages[:, None] + t[None, :]).reshape(-1)
    return table, world_size * total


def _expanded_lens(context_lens: torch.Tensor, batch: int, next_n: int) -> torch.Tensor:
    """int64 ``[B, next_n]`` per-row key counts (``reference.expand_context_lens`` semantics, clamped at 0, no sync)."""
    lens = context_lens.to(torch.int64)
    if lens.dim() == 1:
        if lens.shape[0] != batch:
            raise ValueError(f"context_lens: expected [{batch}] or [{batch}, {next_n}], got {list(context_lens.shape)}")
        offs = torch.arange(next_n, device=lens.device, dtype=torch.int64) - (next_n - 1)
        lens = lens[:, None] + offs[None, :]
    elif lens.dim() != 2 or tuple(lens.shape) != (batch, next_n):
        raise ValueError(f"context_lens: expected [{batch}] or [{batch}, {next_n}], got {list(context_lens.shape)}")
    return lens.clamp_min(0)


def local_context_lens(
    context_lens: torch.Tensor, world_size: int, rank: int, *, next_n: int = 1, batch: int | None = None
) -> torch.Tensor:
    """Keys each query row sees on rank ``rank``: ``(len + W - 1 - rank) // W``.

    A row that sees global positions ``0 .. len - 1`` sees the ones with
    ``j % W == rank``, local keys ``0 .. (len + W - 1 - rank) // W - 1``
    (local key ``i`` is global position ``i * W + rank``). No host sync.

    Args:
        context_lens: int ``[B]`` (row ``i`` of a request sees ``ctx - next_n + i + 1``
            keys, as ``reference.expand_context_lens``) or int ``[B, next_n]``.
        world_size, rank: DCP width and this rank.
        next_n: query rows per request.
        batch: requests ``B`` (default ``context_lens.shape[0]``).

    Returns:
        int32 ``[B, next_n]``, contiguous.

    Raises:
        TypeError, ValueError: bad tensor, shape, ``world_size``, ``rank`` or ``next_n``.
    """
    check_world(world_size, rank)
    _check_int_tensor("context_lens", context_lens)
    if not isinstance(next_n, int) or next_n < 1:
        raise ValueError(f"next_n: expected an int >= 1, got {next_n!r}")
    batch = context_lens.shape[0] if batch is None else batch
    lens = _expanded_lens(context_lens, batch, next_n)
    return torch.div(lens + (world_size - 1 - rank), world_size, rounding_mode="floor").to(torch.int32).contiguous()


# ---------------------------------------------------------------------------
# Memory: per-rank bytes per token and capacity
# ---------------------------------------------------------------------------

_INDEX_BYTES = {"fp8": FP8_INDEX_BYTES_PER_TOKEN, "fp4": FP4_INDEX_BYTES_PER_TOKEN}


def bytes_per_token(
    world_size: int,
    *,
    index: str = "fp4",
    mode: str = REPLICATED,
    kv_bytes: int = DEEPSEEK_V32_FP8_MLA_KV_BYTES,
) -> Fraction:
    """Bytes one rank stores per token per layer under DCP width ``W``, exactly.

    The MLA KV is always sharded (``kv_bytes / W``); the index is either
    replicated (``index_bytes``) or sharded (``index_bytes / W``), with
    ``index_bytes`` 132 (SGLang's FP8) or 68 (MXFP4). DeepSeek-V3.2 with FP8
    MLA KV (656 B) at W = 8: 82 + 132 = 214 (SGLang today), 82 + 68 = 150
    (FP4 replicated), 82 + 8.5 = 90.5 (FP4 sharded).

    Args:
        world_size: DCP width ``W``.
        index: ``"fp8"`` or ``"fp4"``.
        mode: ``"replicated"`` or ``"sharded"``.
        kv_bytes: MLA KV bytes per token per layer (all ranks together).

    Returns:
        ``fractions.Fraction`` bytes (``68 / W`` need not be whole).

    Raises:
        ValueError: bad ``world_size``, ``index``, ``mode`` or negative ``kv_bytes``.
    """
    check_world(world_size)
    if index not in _INDEX_BYTES:
        raise ValueError(f"index: expected 'fp8' or 'fp4', got {index!r}")
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if not isinstance(kv_bytes, int) or kv_bytes < 0:
        raise ValueError(f"kv_bytes: expected an int >= 0, got {kv_bytes!r}")
    idx = _INDEX_BYTES[index]
    return Fraction(kv_bytes, world_size) + (idx if mode == REPLICATED else Fraction(idx, world_size))


@dataclass(frozen=True)
class DcpCapacity:
    """Tokens (of the whole DCP group) that fit when every rank has ``memory_bytes`` of KV pool.

    Attributes:
        world_size: DCP width ``W``.
        tokens_fp8: SGLang today (FP8 index, replicated).
        tokens_fp4_replicated: FP4 index, replicated.
        tokens_fp4_sharded: FP4 index, sharded.
    """

    world_size: int
    tokens_fp8: int
    tokens_fp4_replicated: int
    tokens_fp4_sharded: int

    @property
    def gain_replicated(self) -> float:
        """Relative extra tokens of FP4 replicated over FP8: ``tokens_fp4_replicated / tokens_fp8 - 1``."""
        return self.tokens_fp4_replicated / self.tokens_fp8 - 1.0 if self.tokens_fp8 else float("inf")

    @property
    def gain_sharded(self) -> float:
        """Relative extra tokens of FP4 sharded over FP8: ``tokens_fp4_sharded / tokens_fp8 - 1``."""
        return self.tokens_fp4_sharded / self.tokens_fp8 - 1.0 if self.tokens_fp8 else float("inf")


def dcp_capacity(
    memory_bytes: int,
    world_size: int,
    *,
    kv_bytes: int = DEEPSEEK_V32_FP8_MLA_KV_BYTES,
    num_layers: int = DEEPSEEK_V32_NUM_LAYERS,
    num_index_layers: int | None = None,
) -> DcpCapacity:
    """Tokens that fit in ``memory_bytes`` of KV pool per rank, for the three index layouts.

    A token costs each rank ``num_layers * kv_bytes / W`` plus
    ``num_index_layers * index`` (replicated) or ``num_index_layers * index / W``
    (sharded). Computed exactly with ``pool.capacity`` on ``W``-token units:
    ``tokens = floor(W * memory / (W * per-rank bytes of one token))``.

    Args:
        memory_bytes: KV pool bytes on each rank.
        world_size: DCP width ``W``.
        kv_bytes: MLA KV bytes per token per layer (all ranks together).
        num_layers: layers holding MLA KV.
        num_index_layers: layers holding an index cache (default ``num_layers``).

    Raises:
        ValueError: as ``pool.capacity``, or a bad ``world_size``.
    """
    check_world(world_size)
    w = world_size
    replicated = capacity(
        memory_bytes * w, kv_bytes, num_layers,
        index_bytes_fp8=w * FP8_INDEX_BYTES_PER_TOKEN, index_bytes_fp4=w * FP4_INDEX_BYTES_PER_TOKEN,
        num_index_layers=num_index_layers,
    )
    sharded = capacity(memory_bytes * w, kv_bytes, num_layers, num_index_layers=num_index_layers)
    return DcpCapacity(w, replicated.tokens_fp8, replicated.tokens_fp4, sharded.tokens_fp4)


# ---------------------------------------------------------------------------
# Sharded store
# ---------------------------------------------------------------------------


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
    from .ops.quantize import store_index_k

    local = local_store_slots(slots.reshape(-1), world_size, rank)
    store_index_k(k, local_cache, local.contiguous(), page_size, check_slots=check_slots)


# ---------------------------------------------------------------------------
# Decode: local top-k, candidate exchange, merge
# ---------------------------------------------------------------------------


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


def _all_gather(out: torch.Tensor, inp: torch.Tensor, group) -> None:
    """``torch.distributed`` all-gather of equal-size contiguous 1-D shares into ``out`` (rank-major)."""
    import torch.distributed as dist

    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp, group=group)


def _check_group(group, world_size: int, rank: int) -> None:
    import torch.distributed as dist

    if world_size == 1:
        return
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("group: torch.distributed is not initialised; the sharded DCP paths need a process group")
    size = dist.get_world_size(group)
    me = dist.get_rank(group)
    if size != world_size or me != rank:
        raise ValueError(f"group: has {size} ranks and this process is rank {me}; expected {world_size} and {rank}")


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
    from .ops.paged_logits import paged_logits

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


# ---------------------------------------------------------------------------
# Prefill: staging the batch's keys in global order
# ---------------------------------------------------------------------------


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


def _host_lens(seq_lens_cpu) -> list[int]:
    if isinstance(seq_lens_cpu, torch.Tensor):
        if seq_lens_cpu.dtype.is_floating_point or seq_lens_cpu.dtype == torch.bool:
            raise ValueError(f"seq_lens_cpu: expected integers, got {seq_lens_cpu.dtype}")
        values = seq_lens_cpu.reshape(-1).tolist()
    else:
        values = list(seq_lens_cpu)
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"seq_lens_cpu: expected ints >= 0, got {v!r}")
    return values


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
    from .ops.gather import gather_index_k

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
    from .ops.ragged_logits import ragged_logits

    payload, scales = stage_index_k(
        local_cache, block_table, seq_lens, seq_lens_cpu, world_size=world_size, rank=rank,
        group=group, buffers=buffers, page_size=page_size, check=check,
    )
    return ragged_logits(q, weights, payload, scales, ks, ke, check=check, **scorer_kwargs)
