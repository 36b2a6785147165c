"""The benchmark's scorer shapes: the full grid, the quick (serving) set, the CPU set, and parsing.

A scorer shape is ``(H, batch, context, next_n)``: ``batch`` requests, each
with ``context`` tokens in the cache (the request's length including its
``next_n`` query tokens, i.e. ``context_lens = [context] * batch``: row ``i``
of a request sees ``context - next_n + i + 1`` keys, as in
``reference.expand_context_lens``), ``next_n`` query rows per request and
``H`` index heads. Written ``HxBATCHxCONTEXTxNEXT_N`` on the command line,
with ``K`` for 1024 (``64x8x128Kx1``), optionally ``@WIDTH``: the logits
buffer's columns, as in a live server, where SGLang's CUDA graphs size the
logits for the model's whole context (``64x64x4Kx1@160K``: 163 840 columns,
DeepSeek-V3.2's context, for 4 K-token requests). Without it the width is the
block table's capacity, ``ceil(context / 64) * 64``.
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
    "SERVING_WIDTH",
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
    width: int = 0  # logits columns; 0: the block table's capacity (module docstring)

    def __post_init__(self) -> None:
        for name in ("heads", "batch", "context", "next_n"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if self.context < self.next_n:
            raise ValueError(f"context: {self.context} tokens cannot hold next_n = {self.next_n} query tokens")
        if not isinstance(self.width, int) or isinstance(self.width, bool) or self.width < 0:
            raise ValueError(f"width: expected an int >= 0, got {self.width!r}")
        if self.width and self.width < self.context:
            raise ValueError(f"width: {self.width} logits columns cannot hold a context of {self.context} keys")

    @property
    def rows(self) -> int:
        """Query rows of the call: ``batch * next_n``."""
        return self.batch * self.next_n

    @property
    def spec(self) -> str:
        """The command-line form, ``HxBATCHxCONTEXTxNEXT_N[@WIDTH]`` (multiples of 1024 with ``K``)."""
        return f"{self.heads}x{self.batch}x{_k(self.context)}x{self.next_n}" + (f"@{_k(self.width)}" if self.width else "")

    @property
    def label(self) -> str:
        """Human label, e.g. ``H64 8x128K n1`` (``... w160K`` with a set width)."""
        return f"H{self.heads} {self.batch}x{_k(self.context)} n{self.next_n}" + (f" w{_k(self.width)}" if self.width else "")


def _k(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def full_grid() -> list[ScorerShape]:
    """The full grid: H 64 and 32 x batch 1/8/32/64 x context 4K/32K/128K x next_n 1 and 4 (48 shapes)."""
    return [
        ScorerShape(h, b, c, n)
        for h, n, b, c in itertools.product(FULL_HEADS, FULL_NEXT_N, FULL_BATCHES, FULL_CONTEXTS)
    ]


#: The logits width of a live DeepSeek-V3.2 server's CUDA graphs: its whole context (163 840 columns).
SERVING_WIDTH = 163840

#: The default set: what a live server runs, every logits buffer SERVING_WIDTH wide -- decode
#: (next_n 1) at batch 1 to 128, target verify with one and three draft tokens (next_n 2 and 4), H 64
#: (DeepSeek-V3.2) and H 32 (GLM-5.x).
QUICK_SHAPES: tuple[ScorerShape, ...] = tuple(
    ScorerShape(h, b, c, n, SERVING_WIDTH)
    for h, b, c, n in (
        (64, 1, 4096, 1), (64, 1, 131072, 1), (64, 8, 131072, 1), (64, 32, 32768, 1), (64, 32, 131072, 1),
        (64, 128, 8192, 1), (64, 64, 4096, 1),
        (64, 8, 131072, 2), (64, 32, 32768, 2), (64, 128, 8192, 2),
        (64, 8, 131072, 4),
        (32, 8, 131072, 1), (32, 8, 131072, 2), (32, 8, 131072, 4),
    )
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

_SPEC = re.compile(r"^(\d+)x(\d+)x(\d+)([kK]?)x(\d+)(?:@(\d+)([kK]?))?$")


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
                f"shapes: {item!r} is neither HxBATCHxCONTEXTxNEXT_N[@WIDTH] (e.g. 64x8x128Kx1 or 64x64x4Kx1@160K) "
                f"nor one of {sorted(SHAPE_SETS)}"
            )
        heads, batch, ctx, kilo, next_n, width, wkilo = m.groups()
        context = int(ctx) * (1024 if kilo else 1)
        width = int(width) * (1024 if wkilo else 1) if width else 0
        shapes.append(ScorerShape(int(heads), int(batch), context, int(next_n), width))
    if not shapes:
        raise ValueError("shapes: expected at least one shape")
    return list(dict.fromkeys(shapes))
