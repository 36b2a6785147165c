"""HBM floors: the fewest bytes each benchmarked op must move, over the measured copy bandwidth.

Method: a call
cannot run faster than the time to move its compulsory bytes -- each input
read once, each output written once -- at the bandwidth a large
device-to-device copy reaches in the same run (bytes read plus bytes written).

* Paged scorer, FP4 cache: ``68 B`` per visible key per request (every key of
  a request is read once, whatever ``next_n``) plus ``4 B`` per logit written
  (``rows x width`` fp32). The index queries, weights, block table and lengths
  are a few KB and not counted.
* Paged scorer, FP8 cache (DeepGEMM's column): ``132 B`` per key (128 e4m3 +
  one fp32 scale) plus the same ``4 B`` per logit -- ``136 B`` per key at
  ``next_n = 1``.
* Store op (``ops.quantize.store_index_k``): read ``256 B`` of bf16 key and
  write ``68 B`` per token (the slot indices, 4-8 B per token, are not counted).

The planner has no byte floor worth the name (it reads ``4 B`` per request);
it is reported against its absolute target (5 us per call at batch 64) instead.

Tensor-core floor (the roofline's other side): a paged scorer call multiplies every
visible key with each of its request's ``next_n x heads`` index-query rows over the
128-wide head dimension, ``2 x next_n x heads x 128`` FLOPs per visible key, on FP8
tensor cores in both formats (the FP4 cache is decoded to FP8 before the MMA). Over
the dense FP8 GEMM rate measured in the same run (``timing.fp8_mma_rate``) that is the
time the tensor cores need; the roofline floor is the larger of it and the HBM floor,
and ``binding_floor`` names which one binds. At ``next_n = 1`` the HBM floor binds by
far; at ``next_n = 4`` with 64 heads the two meet for FP8 and the tensor cores bind
for FP4.
"""

from __future__ import annotations

from ..format import INDEX_HEAD_DIM
from ..pool import FP4_INDEX_BYTES_PER_TOKEN, FP8_INDEX_BYTES_PER_TOKEN, PAGE_SIZE
from .shapes import ScorerShape

__all__ = [
    "LOGIT_BYTES",
    "BF16_KEY_BYTES",
    "logits_width",
    "table_width",
    "visible_keys",
    "scorer_bytes",
    "fp4_scorer_bytes",
    "fp8_scorer_bytes",
    "store_bytes",
    "floor_seconds",
    "percent_of_floor",
    "scorer_flops",
    "binding_floor",
]

#: Bytes of one fp32 logit.
LOGIT_BYTES = 4
#: Bytes of one bf16 index key (128 x 2).
BF16_KEY_BYTES = INDEX_HEAD_DIM * 2


def table_width(shape: ScorerShape, page_size: int = PAGE_SIZE) -> int:
    """The block table's capacity in keys, ``cdiv(context, page_size) * page_size``: the logits a call
    must write (the columns past it need no write: the top-k masks by length)."""
    return -(-shape.context // page_size) * page_size


def logits_width(shape: ScorerShape, page_size: int = PAGE_SIZE) -> int:
    """Logits columns of a call's buffer: ``shape.width`` when set (a live server's width), else
    ``table_width``."""
    return shape.width or table_width(shape, page_size)


def visible_keys(shape: ScorerShape) -> int:
    """Keys read per call: ``batch * context`` (each request's keys once, shared by its ``next_n`` rows)."""
    return shape.batch * shape.context


def scorer_bytes(shape: ScorerShape, key_bytes: int, page_size: int = PAGE_SIZE) -> int:
    """Compulsory bytes of one paged scorer call: ``key_bytes`` per visible key + 4 per logit written.

    Args:
        shape: the call's geometry.
        key_bytes: cache bytes per key (68 for FP4, 132 for FP8).
        page_size: tokens per page (``table_width``: the logits counted; a wider buffer's tail is not).

    Raises:
        ValueError: ``key_bytes`` not positive.
    """
    if key_bytes <= 0:
        raise ValueError(f"key_bytes: expected > 0, got {key_bytes}")
    return visible_keys(shape) * key_bytes + shape.rows * table_width(shape, page_size) * LOGIT_BYTES


def fp4_scorer_bytes(shape: ScorerShape) -> int:
    """``scorer_bytes`` with the FP4 cache's 68 B per key."""
    return scorer_bytes(shape, FP4_INDEX_BYTES_PER_TOKEN)


def fp8_scorer_bytes(shape: ScorerShape) -> int:
    """``scorer_bytes`` with SGLang's FP8 cache's 132 B per key."""
    return scorer_bytes(shape, FP8_INDEX_BYTES_PER_TOKEN)


def store_bytes(tokens: int, key_bytes: int = BF16_KEY_BYTES) -> int:
    """Compulsory bytes of storing ``tokens`` index keys: read ``key_bytes`` + write 68 per token.

    Raises:
        ValueError: ``tokens`` negative.
    """
    if tokens < 0:
        raise ValueError(f"tokens: expected >= 0, got {tokens}")
    return tokens * (key_bytes + FP4_INDEX_BYTES_PER_TOKEN)


def floor_seconds(nbytes: int, bandwidth: float) -> float:
    """Time to move ``nbytes`` at ``bandwidth`` bytes/s.

    Raises:
        ValueError: ``bandwidth`` not positive.
    """
    if not bandwidth > 0:
        raise ValueError(f"bandwidth: expected > 0 bytes/s, got {bandwidth}")
    return nbytes / bandwidth


def percent_of_floor(seconds: float, floor: float) -> float:
    """``100 * floor / seconds``: how close a measured time comes to its floor (100 = at the floor)."""
    if not seconds > 0:
        raise ValueError(f"seconds: expected > 0, got {seconds}")
    return 100.0 * floor / seconds


def scorer_flops(shape: ScorerShape, head_dim: int = INDEX_HEAD_DIM) -> int:
    """Tensor-core FLOPs of one paged scorer call: ``2 * next_n * heads * head_dim`` per visible key (a
    multiply-add counts 2), the index-query rows of a request times its keys. The weighted ReLU sum over heads
    (CUDA cores, ``heads`` per key and row) is not counted.

    Raises:
        ValueError: ``head_dim`` not positive.
    """
    if head_dim < 1:
        raise ValueError(f"head_dim: expected > 0, got {head_dim}")
    return 2 * shape.next_n * shape.heads * head_dim * visible_keys(shape)


def binding_floor(hbm_s: float, tensor_core_s: float | None) -> tuple[float, str]:
    """The roofline floor of a call and what binds it: ``(max(hbm_s, tensor_core_s), "HBM" | "tensor cores")``;
    ``(hbm_s, "HBM")`` when the tensor-core rate was not measured (``tensor_core_s`` None).

    Raises:
        ValueError: a time that is not positive.
    """
    if not hbm_s > 0 or (tensor_core_s is not None and not tensor_core_s > 0):
        raise ValueError(f"hbm_s, tensor_core_s: expected > 0 seconds, got {hbm_s}, {tensor_core_s}")
    if tensor_core_s is not None and tensor_core_s > hbm_s:
        return tensor_core_s, "tensor cores"
    return hbm_s, "HBM"
