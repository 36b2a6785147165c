"""Accuracy measures of indexer logits against exact logits (shared by ``demo`` and ``accuracy``).

All functions take logits as ``[rows, width]`` tensors on any device and
compute in fp64. Top-k positions come from ``reference.topk_reference``
(``-1`` marks a slot without a candidate). Nothing here imports Triton or SGLang.
"""

from __future__ import annotations

import torch

__all__ = [
    "topk_recall_rows",
    "topk_recall",
    "relative_logit_error",
    "relative_l2_error_rows",
    "average_ranks",
    "spearman_rows",
    "percentile",
]


def _check_lengths(lengths: torch.Tensor, rows: int, width: int) -> list[int]:
    if lengths.dtype.is_floating_point or lengths.dim() != 1 or lengths.shape[0] != rows:
        raise ValueError(f"lengths: expected an integer tensor [{rows}], got {lengths.dtype} {list(lengths.shape)}")
    lens = [int(n) for n in lengths.tolist()]
    if any(n < 0 or n > width for n in lens):
        raise ValueError(f"lengths: every length must lie in [0, {width}]")
    return lens


def topk_recall_rows(topk: torch.Tensor, exact_topk: torch.Tensor) -> torch.Tensor:
    """Per-row recall: ``|set(topk[r]) & set(exact_topk[r])| / |set(exact_topk[r])|`` (``-1`` ignored).

    Vectorised: the exact top-k of each row is marked in a boolean ``[rows, P]``
    table (``P`` = largest position + 1) and the other top-k is looked up in it.
    Positions within a row must be distinct (as ``topk_reference`` returns them).

    Args:
        topk, exact_topk: int ``[rows, k]`` positions (``-1`` = no candidate).

    Returns:
        fp64 ``[rows]`` on the inputs' device; ``nan`` for a row whose exact
        top-k is empty.

    Raises:
        ValueError: shapes differ or are not 2-D.
    """
    if topk.shape != exact_topk.shape or topk.dim() != 2:
        raise ValueError(f"topk, exact_topk: expected equal [rows, k] shapes, got {list(topk.shape)} "
                         f"and {list(exact_topk.shape)}")
    rows = topk.shape[0]
    if rows == 0:
        return torch.zeros(0, dtype=torch.float64, device=topk.device)
    top = int(torch.maximum(topk.max(), exact_topk.max())) + 1 if topk.numel() else 1
    marked = torch.zeros((rows, max(top, 1) + 1), dtype=torch.bool, device=topk.device)
    want = exact_topk.to(torch.int64)
    got = topk.to(torch.int64)
    dump = marked.shape[1] - 1  # -1 entries go to a column nobody reads as a hit
    marked.scatter_(1, torch.where(want >= 0, want, dump), True)
    marked[:, dump] = False
    hits = (torch.gather(marked, 1, torch.where(got >= 0, got, dump)) & (got >= 0)).sum(dim=1)
    count = (want >= 0).sum(dim=1)
    return torch.where(count > 0, hits.to(torch.float64) / count.clamp_min(1).to(torch.float64),
                       torch.full_like(hits, float("nan"), dtype=torch.float64))


def topk_recall(topk: torch.Tensor, exact_topk: torch.Tensor) -> float:
    """Mean over rows of ``topk_recall_rows`` (rows with an empty exact top-k skipped; 1.0 if none is left).

    Raises:
        ValueError: shapes differ.
    """
    rec = topk_recall_rows(topk, exact_topk)
    rec = rec[~torch.isnan(rec)]
    return float(rec.mean()) if rec.numel() else 1.0


def relative_logit_error(logits: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """Max and mean of ``|logits - exact| / max_j |exact[r, j]|`` (per-row normalisation), in fp64.

    Normalising by the row's largest exact logit rather than element-wise keeps
    the measure finite where a logit is near zero (relu and signed head weights
    make that common) and matches what top-k sees: an error is large when it is
    large next to the row's leading scores.

    Args:
        logits, exact: ``[rows, width]`` finite logits.

    Returns:
        ``(max, mean)`` as Python floats.
    """
    ref = exact.to(torch.float64)
    denom = ref.abs().amax(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    err = (logits.to(torch.float64) - ref).abs() / denom
    return float(err.max()), float(err.mean())


def relative_l2_error_rows(logits: torch.Tensor, exact: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Per-row ``||logits[r, :n] - exact[r, :n]||_2 / ||exact[r, :n]||_2`` with ``n = lengths[r]``, in fp64.

    Args:
        logits, exact: ``[rows, width]`` (columns ``>= lengths[r]`` are ignored).
        lengths: int ``[rows]`` visible keys per row (0..width).

    Returns:
        fp64 ``[rows]``; ``nan`` for an empty row or an all-zero exact row.

    Raises:
        ValueError: shapes disagree or a length is out of range.
    """
    if logits.shape != exact.shape or logits.dim() != 2:
        raise ValueError(f"logits, exact: expected equal [rows, width] shapes, got {list(logits.shape)} "
                         f"and {list(exact.shape)}")
    _check_lengths(lengths, logits.shape[0], logits.shape[1])
    cols = torch.arange(logits.shape[1], device=logits.device)
    visible = cols[None, :] < lengths.to(logits.device)[:, None]
    ref = torch.where(visible, exact.to(torch.float64), 0.0)
    diff = torch.where(visible, logits.to(torch.float64) - exact.to(torch.float64), 0.0)
    num, den = diff.norm(dim=1), ref.norm(dim=1)
    return torch.where(den > 0, num / den.clamp_min(torch.finfo(torch.float64).tiny),
                       torch.full_like(den, float("nan")))


def average_ranks(x: torch.Tensor) -> torch.Tensor:
    """Ranks ``1 .. n`` of a 1-D tensor, tied values sharing their average rank (fp64).

    The ranking ``scipy.stats.rankdata(method="average")`` computes, in torch.

    Raises:
        ValueError: ``x`` is not 1-D.
    """
    if x.dim() != 1:
        raise ValueError(f"x: expected a 1-D tensor, got {list(x.shape)}")
    values, order = torch.sort(x.to(torch.float64), stable=True)
    _, inverse, counts = torch.unique_consecutive(values, return_inverse=True, return_counts=True)
    end = torch.cumsum(counts, 0).to(torch.float64)  # 1-based rank of each tie group's last member
    group_rank = end - (counts.to(torch.float64) - 1) / 2
    ranks = torch.empty_like(values)
    ranks[order] = group_rank[inverse]
    return ranks


def spearman_rows(logits: torch.Tensor, exact: torch.Tensor, lengths: torch.Tensor,
                  exact_ranks: list[torch.Tensor] | None = None) -> torch.Tensor:
    """Per-row Spearman rank correlation of ``logits[r, :n]`` with ``exact[r, :n]``, ``n = lengths[r]``.

    Pearson correlation of the average ranks (``average_ranks``), which is what
    ``scipy.stats.spearmanr`` returns, ties included.

    Args:
        logits, exact: ``[rows, width]``.
        lengths: int ``[rows]`` visible keys per row.
        exact_ranks: optional ``[average_ranks(exact[r, :n]) for each row]``, to
            rank the exact logits once when several formats are compared with them.

    Returns:
        fp64 ``[rows]``; ``nan`` for a row with fewer than 2 keys or constant ranks.

    Raises:
        ValueError: shapes disagree or a length is out of range.
    """
    if logits.shape != exact.shape or logits.dim() != 2:
        raise ValueError(f"logits, exact: expected equal [rows, width] shapes, got {list(logits.shape)} "
                         f"and {list(exact.shape)}")
    lens = _check_lengths(lengths, logits.shape[0], logits.shape[1])
    out = torch.full((len(lens),), float("nan"), dtype=torch.float64, device=logits.device)
    for r, n in enumerate(lens):
        if n < 2:
            continue
        a = average_ranks(logits[r, :n])
        b = average_ranks(exact[r, :n]) if exact_ranks is None else exact_ranks[r].to(torch.float64)
        a = a - a.mean()
        b = b - b.mean()
        den = a.norm() * b.norm()
        if float(den) > 0:
            out[r] = (a @ b) / den
    return out


def percentile(values: torch.Tensor, q: float) -> float:
    """The ``q``-th percentile (0..100) of a 1-D tensor, linear interpolation between order statistics.

    The definition of ``numpy.percentile``'s default (``method="linear"``):
    position ``(n - 1) * q / 100`` in the sorted values.

    Raises:
        ValueError: empty input or ``q`` outside [0, 100].
    """
    if not 0 <= q <= 100:
        raise ValueError(f"q: expected 0..100, got {q}")
    v = torch.sort(values.reshape(-1).to(torch.float64)).values
    if v.numel() == 0:
        raise ValueError("values: empty")
    pos = (v.numel() - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, v.numel() - 1)
    return float(v[lo] + (v[hi] - v[lo]) * (pos - lo))
