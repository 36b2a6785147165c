"""argparse ``type=`` validators shared by the ``sglang-fp4-indexer`` subcommands.

One helper per kind of value, so that a bad value is refused while the
command line is parsed -- before any slow work -- with argparse's own error
line naming the option (``error: argument --context: expected an integer >= 1,
got '-5'``; exit code 2). Each factory returns a callable for ``type=``; its
``__name__`` is what argparse prints for the value's kind.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable

__all__ = ["MAX_MEMORY_GIB", "integer", "number", "int_list", "memory_gib"]

#: Largest memory budget accepted, in GiB (1 PiB): beyond any GPU; token counts stay readable.
MAX_MEMORY_GIB = 2**20


def _bounds(minimum, maximum, exclusive_minimum: bool) -> str:
    low = "" if minimum is None else f"{'>' if exclusive_minimum else '>='} {minimum:g}"
    high = "" if maximum is None else f"<= {maximum:,.0f}" if maximum >= 1e5 and float(maximum).is_integer() else f"<= {maximum:g}"
    return " and ".join(part for part in (low, high) if part)


def integer(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """A ``type=`` for an integer option in ``[minimum, maximum]`` (either bound optional).

    Returns:
        ``parse(text) -> int``.

    The returned callable raises ``argparse.ArgumentTypeError`` (argparse turns
    it into ``error: argument --OPT: expected an integer >= 1, got '-5'``) for
    text that is not a base-10 integer or lies outside the bounds.
    """
    want = "an integer" + (f" {_bounds(minimum, maximum, False)}" if minimum is not None or maximum is not None else "")

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        return value

    parse.__name__ = "integer"
    return parse


def number(minimum: float | None = None, maximum: float | None = None, *,
           exclusive_minimum: bool = False) -> Callable[[str], float]:
    """A ``type=`` for a finite real-number option within the bounds (``inf`` and ``nan`` refused).

    Args:
        minimum: smallest value allowed (``None``: no lower bound).
        maximum: largest value allowed (``None``: no upper bound).
        exclusive_minimum: ``minimum`` itself is refused (``> minimum``).

    Returns:
        ``parse(text) -> float``, which raises ``argparse.ArgumentTypeError``
        for text that is not a number, is not finite, or lies outside the bounds.
    """
    bounds = _bounds(minimum, maximum, exclusive_minimum)
    want = "a finite number" + (f" {bounds}" if bounds else "")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        low_bad = minimum is not None and (value <= minimum if exclusive_minimum else value < minimum)
        if not math.isfinite(value) or low_bad or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def int_list(minimum: int | None = None) -> Callable[[str], list[int]]:
    """A ``type=`` for a comma-separated list of integers, each ``>= minimum``.

    Returns:
        ``parse(text) -> list[int]`` (empty items between commas are skipped),
        which raises ``argparse.ArgumentTypeError`` for an empty list, an item
        that is not an integer, or one below ``minimum``.
    """
    item = integer(minimum)
    want = "comma-separated integers" + ("" if minimum is None else f" >= {minimum}")

    def parse(text: str) -> list[int]:
        parts = [part.strip() for part in text.split(",") if part.strip()]
        if not parts:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        try:
            return [item(part) for part in parts]
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None

    parse.__name__ = "integer list"
    return parse


def memory_gib() -> Callable[[str], float]:
    """A ``type=`` for a memory budget in GiB: a finite number ``> 0`` and ``<= MAX_MEMORY_GIB``."""
    return number(0, MAX_MEMORY_GIB, exclusive_minimum=True)
