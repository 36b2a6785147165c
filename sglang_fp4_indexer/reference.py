"""Torch oracles for the indexer scorers, top-k, and the FP8 peer format.

These are the independent references the Triton kernels are tested against.
They are written for clarity, not speed: keys are decoded with the exact
``format.dequantize_index_k`` and scored in fp64, then rounded once to fp32.

Semantics follow SGLang's FP8 paged MQA logits (DeepGEMM ``fp8_paged_mqa_logits``):
``logits[r, j] = sum_h weights[r, h] * relu(q[r, h] . k_j)`` for the keys
``j < len(r)`` of the row's request, read through its block table. Columns at
or past ``len(r)`` are ``-inf`` (this project writes them).
"""

from __future__ import annotations

import torch

from .format import INDEX_HEAD_DIM, dequantize_index_k
from .pool import PAGE_SIZE, check_cache, read_index_k

__all__ = [
    "FP8_E4M3_MAX",
    "expand_context_lens",
    "paged_slots",
    "paged_logits_reference",
    "paged_schedule_reference",
    "gather_index_k_reference",
    "ragged_logits_reference",
    "logits_from_keys",
    "topk_reference",
    "fp8_quantize_rows",
    "fp8_dequantize_rows",
]

#: Largest finite float8_e4m3fn value.
FP8_E4M3_MAX = 448.0


def expand_context_lens(context_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """Per-row visible key counts as int64 ``[B, next_n]``.

    Args:
        context_lens: int ``[B]`` (the request's length including all ``next_n``
            query tokens; row ``i`` sees ``ctx - next_n + i + 1`` keys, as SGLang's
            target-verify path does) or int ``[B, next_n]`` (explicit per row).
        next_n: query rows per request (>= 1).

    Raises:
        ValueError: bad dtype/shape, ``next_n < 1``, or a row length below 0.
    """
    if not isinstance(next_n, int) or next_n < 1:
        raise ValueError(f"next_n: expected an int >= 1, got {next_n!r}")
    if context_lens.dtype.is_floating_point or context_lens.dtype == torch.bool:
        raise ValueError(f"context_lens: expected an integer tensor, got {context_lens.dtype}")
    lens = context_lens.to(torch.int64)
    if lens.dim() == 1:
        offs = torch.arange(next_n, device=lens.device) - next_n + 1
        lens = lens[:, None] + offs[None, :]
    elif lens.dim() == 2:
        if lens.shape[1] != next_n:
            raise ValueError(
                f"context_lens: expected [B] or [B, next_n={next_n}], got {list(context_lens.shape)}"
            )
    else:
        raise ValueError(f"context_lens: expected [B] or [B, next_n], got {list(context_lens.shape)}")
    if lens.numel() and int(lens.min()) < 0:
        raise ValueError("context_lens: a row would see a negative number of keys")
    return lens


def paged_slots(block_table_row: torch.Tensor, length: int, page_size: int = PAGE_SIZE) -> torch.Tensor:
    """Cache slots of keys ``0 .. length-1`` of one request: ``page * page_size + j % page_size``.

    Args:
        block_table_row: int ``[max_pages]`` page indices of the request.
        length: number of keys.

    Raises:
        ValueError: ``length`` needs more pages than the row holds.
    """
    n_pages = (length + page_size - 1) // page_size
    if n_pages > block_table_row.shape[0]:
        raise ValueError(
            f"block_table: a row of {block_table_row.shape[0]} pages cannot hold {length} keys"
        )
    j = torch.arange(length, device=block_table_row.device)
    return block_table_row.to(torch.int64)[j // page_size] * page_size + j % page_size


def logits_from_keys(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``sum_h weights[h] * relu(q[h] . k_j)`` for one row against a key matrix, in fp64.

    Args:
        q: ``[H, 128]`` (any float dtype, float8 included).
        weights: ``[H]``.
        keys: ``[S, 128]``.

    Returns:
        fp64 ``[S]``.
    """
    qf = q.to(torch.float64)
    scores = keys.to(torch.float64) @ qf.t()  # [S, H]
    return torch.relu(scores) @ weights.to(torch.float64)


def paged_logits_reference(
    q: torch.Tensor,
    weights: torch.Tensor,
    cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    width: int | None = None,
    page_size: int = PAGE_SIZE,
) -> torch.Tensor:
    """Oracle of the paged FP4 scorer (decode and target verify).

    Rows are ``r = b * next_n + i`` with ``next_n = rows // B``.

    Args:
        q: ``[B * next_n, H, 128]`` float8_e4m3fn, bf16 or fp32 index queries.
        weights: fp32 ``[B * next_n, H]`` head weights.
        cache: uint8 ``[num_pages, page_size * 68]`` the layer's FP4 index-key cache.
        block_table: int ``[B, max_pages]`` page indices per request.
        context_lens: int ``[B]`` or ``[B, next_n]`` (see ``expand_context_lens``).
        width: logits columns; default ``max_pages * page_size``.

    Returns:
        fp32 ``[B * next_n, width]``; ``-inf`` at columns ``>= len(r)``.

    Raises:
        ValueError: inconsistent shapes, a length beyond ``width`` or the block table.
    """
    check_cache(cache, page_size)
    if q.dim() != 3 or q.shape[2] != INDEX_HEAD_DIM:
        raise ValueError(f"q: expected [rows, H, {INDEX_HEAD_DIM}], got {list(q.shape)}")
    rows, heads = q.shape[0], q.shape[1]
    if weights.shape != (rows, heads):
        raise ValueError(f"weights: expected [{rows}, {heads}], got {list(weights.shape)}")
    batch = block_table.shape[0]
    if batch == 0 or rows % batch:
        raise ValueError(f"q: rows ({rows}) must be a positive multiple of the batch ({batch})")
    next_n = rows // batch
    lens = expand_context_lens(context_lens, next_n).reshape(-1)
    if lens.shape[0] != rows:
        raise ValueError(f"context_lens: describes {lens.shape[0]} rows, q has {rows}")
    if width is None:
        width = block_table.shape[1] * page_size
    out = torch.full((rows, width), float("-inf"), dtype=torch.float32, device=q.device)
    for r in range(rows):
        n = int(lens[r])
        if n > width:
            raise ValueError(f"context_lens: row {r} sees {n} keys, more than width {width}")
        if n == 0:
            continue
        slots = paged_slots(block_table[r // next_n], n, page_size)
        keys = dequantize_index_k(*read_index_k(cache, slots, page_size))
        out[r, :n] = logits_from_keys(q[r], weights[r], keys).to(torch.float32)
    return out


def topk_reference(logits: torch.Tensor, k: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Exact top-k positions per row, best first, ties to the lower position.

    Args:
        logits: fp32 ``[rows, width]``.
        k: positions to keep (>= 1).
        lengths: optional int ``[rows]``: only columns ``< lengths[r]`` compete;
            without it, every column that is not ``-inf`` competes.

    Returns:
        int32 ``[rows, k]``; slots beyond a row's candidates are ``-1``.

    Raises:
        ValueError: ``k < 1`` or ``logits`` not 2-D.
    """
    if k < 1:
        raise ValueError(f"k: expected >= 1, got {k}")
    if logits.dim() != 2:
        raise ValueError(f"logits: expected [rows, width], got {list(logits.shape)}")
    rows, width = logits.shape
    cols = torch.arange(width, device=logits.device)
    if lengths is None:
        valid = logits > float("-inf")
    else:
        valid = cols[None, :] < lengths.to(torch.int64).reshape(-1, 1)
    masked = torch.where(valid, logits.to(torch.float64), torch.full_like(logits, float("-inf"), dtype=torch.float64))
    order = torch.sort(masked, dim=1, descending=True, stable=True).indices
    kk = min(k, width)
    idx = order[:, :kk]
    count = valid.sum(dim=1, keepdim=True)
    idx = torch.where(torch.arange(kk, device=logits.device)[None, :] < count, idx, torch.full_like(idx, -1))
    out = torch.full((rows, k), -1, dtype=torch.int32, device=logits.device)
    out[:, :kk] = idx.to(torch.int32)
    return out


def fp8_quantize_rows(x: torch.Tensor, scale_fmt: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's FP8 index format: e4m3 with one fp32 scale per 128-element row.

    ``scale = amax / 448`` (with ``scale_fmt="ue8m0"`` rounded up to a power of
    two, as DeepSeek-V3.2's ``act_quant`` does), values ``x / scale`` cast to e4m3
    (round to nearest even). All-zero rows use scale 1.

    Args:
        x: ``[..., 128]`` float tensor.
        scale_fmt: ``None`` or ``"ue8m0"``.

    Returns:
        ``(values float8_e4m3fn [..., 128], scales fp32 [...])``.

    Raises:
        ValueError: unknown ``scale_fmt`` or last dim not 128.
    """
    if x.shape[-1] != INDEX_HEAD_DIM:
        raise ValueError(f"x: expected last dim {INDEX_HEAD_DIM}, got {list(x.shape)}")
    if scale_fmt not in (None, "ue8m0"):
        raise ValueError(f"scale_fmt: expected None or 'ue8m0', got {scale_fmt!r}")
    xf = x.to(torch.float32)
    amax = xf.abs().amax(dim=-1).clamp_min(1e-4)
    scale = amax / FP8_E4M3_MAX
    if scale_fmt == "ue8m0":
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    values = (xf / scale.unsqueeze(-1)).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return values, scale


def fp8_dequantize_rows(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Inverse of ``fp8_quantize_rows``: fp32 ``values * scales[..., None]``."""
    return values.to(torch.float32) * scales.unsqueeze(-1)


def paged_schedule_reference(context_lens: torch.Tensor, block_kv: int, num_ctas: int) -> torch.Tensor:
    """Oracle of the CTA schedule planner (``ops.schedule.plan_paged_schedule``).

    Enumerates every tile ``(b, blk)`` explicitly, b-major, with
    ``blk < max(1, ceil(max_len_b / block_kv))`` (``max_len_b`` is
    ``context_lens[b]``, or the row maximum for ``[B, next_n]`` lengths), then
    gives CTA ``i`` the flat tiles ``[i * T // num_ctas, (i + 1) * T // num_ctas)``.

    Args:
        context_lens: int ``[B]`` or ``[B, next_n]``, values >= 0.
        block_kv: keys per tile (> 0).
        num_ctas: CTAs of the persistent grid (>= 1).

    Returns:
        int32 ``[num_ctas + 1, 2]`` on ``context_lens``'s device: row ``i`` is the
        ``(b, blk)`` of CTA ``i``'s first tile, ``(B, 0)`` when that is past the last tile.

    Raises:
        ValueError: bad rank or dtype, a negative length, ``block_kv <= 0`` or ``num_ctas < 1``.
    """
    if context_lens.dtype.is_floating_point or context_lens.dtype == torch.bool:
        raise ValueError(f"context_lens: expected an integer tensor, got {context_lens.dtype}")
    if context_lens.dim() not in (1, 2):
        raise ValueError(f"context_lens: expected [B] or [B, next_n], got {list(context_lens.shape)}")
    if block_kv <= 0:
        raise ValueError(f"block_kv: expected > 0, got {block_kv}")
    if num_ctas < 1:
        raise ValueError(f"num_ctas: expected >= 1, got {num_ctas}")
    lens = context_lens.to(torch.int64).cpu()
    lens = lens if lens.dim() == 2 else lens[:, None]
    if lens.numel() and int(lens.min()) < 0:
        raise ValueError("context_lens: negative length")
    batch = lens.shape[0]
    tiles = []
    for b in range(batch):
        max_len = int(lens[b].max()) if lens.shape[1] else 0
        blk = 0
        while True:
            tiles.append((b, blk))
            blk += 1
            if blk * block_kv >= max_len:
                break
    tiles.append((batch, 0))
    total = len(tiles) - 1
    rows = [tiles[i * total // num_ctas] for i in range(num_ctas + 1)]
    return torch.tensor(rows, dtype=torch.int32).reshape(num_ctas + 1, 2).to(context_lens.device)


def gather_index_k_reference(
    cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int = PAGE_SIZE
) -> tuple[torch.Tensor, torch.Tensor]:
    """Oracle of ``ops.gather.gather_index_k``: a torch gather of each request's keys, concatenated.

    Args:
        cache: uint8 ``[num_pages, page_size * 68]``.
        block_table: int ``[B, max_pages]``.
        seq_lens: int ``[B]`` keys per request (>= 0).

    Returns:
        ``(payload uint8 [sum(seq_lens), 64], scales uint8 [sum(seq_lens), 4])``.

    Raises:
        ValueError: as ``paged_slots`` and ``pool.read_index_k``.
    """
    slots = [paged_slots(block_table[b], int(n), page_size) for b, n in enumerate(seq_lens.tolist())]
    flat = torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int64, device=cache.device)
    return read_index_k(cache, flat, page_size)


def ragged_logits_reference(
    q: torch.Tensor,
    weights: torch.Tensor,
    payload: torch.Tensor,
    scales: torch.Tensor,
    ks: torch.Tensor,
    ke: torch.Tensor,
) -> torch.Tensor:
    """Oracle of the ragged (prefill / extend) scorer ``ops.ragged_logits.ragged_logits``.

    ``logits[t, j] = sum_h weights[t, h] * relu(q[t, h] . k_j)`` for
    ``ks[t] <= j < ke[t]`` and ``-inf`` at every other column (an empty window,
    ``ke[t] <= ks[t]``, gives a row of ``-inf``). Keys are decoded exactly
    (``format.dequantize_index_k``) and scored in fp64, rounded once to fp32.
    The same semantics as SGLang's FP8 ``fp8_mqa_logits`` with clean logits.

    Args:
        q: ``[T, H, 128]`` float8_e4m3fn, bf16 or fp32 index queries.
        weights: ``[T, H]`` head weights.
        payload: uint8 ``[S, 64]`` flat payload plane (``ops.gather.gather_index_k``).
        scales: uint8 ``[S, 4]`` flat scale plane.
        ks, ke: int ``[T]`` window start (inclusive) and end (exclusive) per query token.

    Returns:
        fp32 ``[T, S]``.

    Raises:
        ValueError: inconsistent shapes, or a window outside ``[0, S]``.
    """
    if q.dim() != 3 or q.shape[2] != INDEX_HEAD_DIM:
        raise ValueError(f"q: expected [T, H, {INDEX_HEAD_DIM}], got {list(q.shape)}")
    tokens, heads = q.shape[0], q.shape[1]
    if weights.shape != (tokens, heads):
        raise ValueError(f"weights: expected [{tokens}, {heads}], got {list(weights.shape)}")
    if ks.shape != (tokens,) or ke.shape != (tokens,):
        raise ValueError(f"ks, ke: expected [{tokens}], got {list(ks.shape)} and {list(ke.shape)}")
    keys = dequantize_index_k(payload, scales)  # [S, 128], exact
    width = keys.shape[0]
    out = torch.full((tokens, width), float("-inf"), dtype=torch.float32, device=q.device)
    for t, (lo, hi) in enumerate(zip(ks.tolist(), ke.tolist())):
        if lo < 0 or hi > width:
            raise ValueError(f"ks, ke: token {t} has window [{lo}, {hi}) outside [0, {width}]")
        if hi > lo:
            out[t, lo:hi] = logits_from_keys(q[t], weights[t], keys[lo:hi]).to(torch.float32)
    return out
