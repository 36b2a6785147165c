"""DCP layout: the owner rule and per-rank page math.

Global slot ``s`` lives on rank ``s % W`` at local slot ``s // W``; these functions map slots, block tables and
context lengths between the global slot space and each rank's local one (SGLang 0.5.23's
``transform_index_page_table_dcp`` and ``layers/dcp/layout.py``). Nothing here imports SGLang.
"""

from __future__ import annotations

import torch

from ..pool import PAGE_SIZE

__all__ = [
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
]


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
