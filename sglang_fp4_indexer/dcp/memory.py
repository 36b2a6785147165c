"""DCP memory: the two modes, per-rank index bytes per token and the capacity they leave.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ..pool import (
    DEEPSEEK_V32_FP8_MLA_KV_BYTES,
    DEEPSEEK_V32_NUM_LAYERS,
    FP4_INDEX_BYTES_PER_TOKEN,
    FP8_INDEX_BYTES_PER_TOKEN,
    capacity,
)
from .layout import check_world

__all__ = [
    "REPLICATED",
    "SHARDED",
    "MODES",
    "bytes_per_token",
    "DcpCapacity",
    "dcp_capacity",
]


#: Every rank keeps the whole FP4 index (68 B per token per layer).
REPLICATED = "replicated"
#: Each rank keeps the index keys of the slots it owns (68 / W B per token per layer).
SHARDED = "sharded"
#: The DCP modes of the FP4 index-key cache.
MODES = (REPLICATED, SHARDED)
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
