"""Uncertainty of the A/B's quality numbers: a binomial standard error and the paired difference FP4 - FP8.

Pure arithmetic on lists of per-item outcomes (1 right, 0 wrong); no SGLang, no torch.
"""

from __future__ import annotations

import math
from typing import Sequence

__all__ = ["binomial_se", "paired_difference"]


def binomial_se(correct: int, n: int) -> float:
    """Standard error of an accuracy ``p = correct / n`` measured on ``n`` independent items:
    ``sqrt(p (1 - p) / n)`` (a fraction, not percent points).

    Raises:
        ValueError: ``n`` < 1, or ``correct`` outside ``0..n``.
    """
    if n < 1:
        raise ValueError(f"n: expected >= 1 items, got {n}")
    if not 0 <= correct <= n:
        raise ValueError(f"correct: expected 0..{n}, got {correct}")
    p = correct / n
    return math.sqrt(p * (1.0 - p) / n)


def paired_difference(fp8: Sequence[int], fp4: Sequence[int]) -> dict:
    """FP4 - FP8 accuracy on the same items, with the paired standard error.

    Args:
        fp8, fp4: per-item outcomes (1 right, 0 wrong; bools accepted), item ``i`` the same prompt in both.

    Returns:
        dict: ``n``, ``diff`` (mean of ``fp4[i] - fp8[i]``, a fraction), ``se`` (standard error of that mean:
        ``sqrt(sum (d_i - diff)^2 / (n - 1) / n)``; None for ``n`` = 1), ``fp4_only`` (items FP4 got and FP8
        did not) and ``fp8_only`` (the other way round).

    Raises:
        ValueError: the two lists differ in length, are empty, or hold a value other than 0 or 1.
    """
    if len(fp8) != len(fp4):
        raise ValueError(f"fp8, fp4: the same items expected, got {len(fp8)} and {len(fp4)} outcomes")
    if not fp8:
        raise ValueError("fp8, fp4: no item")
    for name, xs in (("fp8", fp8), ("fp4", fp4)):
        bad = [x for x in xs if int(x) not in (0, 1) or int(x) != x]
        if bad:
            raise ValueError(f"{name}: outcomes must be 0 or 1, got {bad[0]!r}")
    d = [int(b) - int(a) for a, b in zip(fp8, fp4)]
    n = len(d)
    mean = sum(d) / n
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n) if n > 1 else None
    return {"n": n, "diff": mean, "se": se, "fp4_only": d.count(1), "fp8_only": d.count(-1)}
