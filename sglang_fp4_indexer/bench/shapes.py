"""The benchmark's scorer shapes: the full grid of issue 3, the quick subset, the CPU set, and parsing.

A scorer shape is ``(H, batch, context, next_n)``: ``batch`` requests, each
with ``context`` tokens in the cache (the request's length including its
``next_n`` query tokens, i.e. ``context_lens = [context] * batch``: row ``i``
of a request sees ``context - next_n + i + 1`` keys, as in
``reference.expand_context_lens``), ``next_n`` query rows per request and
``H`` index heads. Written ``HxBATCHxCONTEXTxNEXT_N`` on the command line,
with ``K`` for 1024 (``64x8x128Kx1``).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

__all__ = [
    "ScorerShape",
    "FULL_HEADS",
    "FULL_BATCHES",
    "FULL_CONTEXTS",
    "FULL_NEXT_N",
    "full_grid",
    "QUICK_SHAPES",
    "CPU_SHAPES",
    "SHAPE_SETS",
    "parse_shapes",
]

#: Index heads of the DSA models (DeepSeek-V3.2: 64, GLM-5.x: 32).
FULL_HEADS = (64, 32)
#: Decode batch sizes of the full grid.
FULL_BATCHES = (1, 8, 32, 64)
#: Context lengths of the full grid (4 K, 32 K, 128 K tokens).
FULL_CONTEXTS = (4096, 32768, 131072)
#: Query rows per request: decode and target verify with three draft tokens.
FULL_NEXT_N = (1, 4)


@dataclass(frozen=True, order=True)
class ScorerShape:
    """One scorer call's geometry (see the module docstring).

    Raises:
        ValueError: a field that is not a positive int, or ``context < next_n``
            (the last row must see at least one key).
    """

    heads: int
    batch: int
    context: int
    next_n: int

    def __post_init__(self) -> None:
        for name in ("heads", "batch", "context", "next_n"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if self.context < self.next_n:
            raise ValueError(f"context: {self.context} tokens cannot hold next_n = {self.next_n} query tokens")

    @property
    def rows(self) -> int:
        """Query rows of the call: ``batch * next_n``."""
        return self.batch * self.next_n

    @property
    def spec(self) -> str:
        """The command-line form, ``HxBATCHxCONTEXTxNEXT_N`` (contexts that are multiples of 1024 with ``K``)."""
        ctx = f"{self.context // 1024}K" if self.context % 1024 == 0 else str(self.context)
        return f"{self.heads}x{self.batch}x{ctx}x{self.next_n}"

    @property
    def label(self) -> str:
        """Human label, e.g. ``H64 8x128K n1``."""
        ctx = f"{self.context // 1024}K" if self.context % 1024 == 0 else str(self.context)
        return f"H{self.heads} {self.batch}x{ctx} n{self.next_n}"


def full_grid() -> list[ScorerShape]:
    """Issue 3's grid: H 64 and 32 x batch 1/8/32/64 x context 4K/32K/128K x next_n 1 and 4 (48 shapes)."""
    return [
        ScorerShape(h, b, c, n)
        for h, n, b, c in itertools.product(FULL_HEADS, FULL_NEXT_N, FULL_BATCHES, FULL_CONTEXTS)
    ]


#: A first look: the shapes of issue 3's targets (H 64, next_n 1: 1 x 4K, 8 x 128K,
#: 32 x 32K, 32 x 128K), plus next_n 4 and H 32 at 8 x 128K.
QUICK_SHAPES: tuple[ScorerShape, ...] = (
    ScorerShape(64, 1, 4096, 1),
    ScorerShape(64, 8, 32768, 1),
    ScorerShape(64, 8, 131072, 1),
    ScorerShape(64, 32, 32768, 1),
    ScorerShape(64, 32, 131072, 1),
    ScorerShape(64, 8, 131072, 4),
    ScorerShape(32, 8, 131072, 1),
)

#: Tiny shapes for the CPU interpreter (a functional run, not a speed figure).
CPU_SHAPES: tuple[ScorerShape, ...] = (
    ScorerShape(32, 2, 192, 1),
    ScorerShape(64, 1, 128, 2),
)

#: Named shape sets accepted by ``parse_shapes``.
SHAPE_SETS = {
    "quick": lambda: list(QUICK_SHAPES),
    "full": full_grid,
    "cpu": lambda: list(CPU_SHAPES),
}

_SPEC = re.compile(r"^(\d+)x(\d+)x(\d+)([kK]?)x(\d+)$")


def parse_shapes(text: str) -> list[ScorerShape]:
    """Parse a comma-separated list of shape specs and set names.

    Each item is ``HxBATCHxCONTEXTxNEXT_N`` (``CONTEXT`` may end in ``K`` for
    x1024, e.g. ``64x8x128Kx1``) or a set name (``quick``, ``full``, ``cpu``).
    Duplicates are dropped; the order of first appearance is kept.

    Raises:
        ValueError: an item that is neither (the message names it and the form),
            a shape with a non-positive field, or an empty list.
    """
    if not isinstance(text, str):
        raise TypeError(f"shapes: expected a string, got {type(text).__name__}")
    shapes: list[ScorerShape] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if item.lower() in SHAPE_SETS:
            shapes.extend(SHAPE_SETS[item.lower()]())
            continue
        m = _SPEC.match(item)
        if m is None:
            raise ValueError(
                f"shapes: {item!r} is neither HxBATCHxCONTEXTxNEXT_N (e.g. 64x8x128Kx1) nor one of {sorted(SHAPE_SETS)}"
            )
        heads, batch, ctx, kilo, next_n = m.groups()
        context = int(ctx) * (1024 if kilo else 1)
        shapes.append(ScorerShape(int(heads), int(batch), context, int(next_n)))
    if not shapes:
        raise ValueError("shapes: expected at least one shape")
    return list(dict.fromkeys(shapes))
