"""MXFP4 index-key format: the exact torch reference encoder and decoder.

This module is the contract of docs/format.md. One index key is 128
values; it is stored as 64 payload bytes (E2M1 codes, two per byte) and four
UE8M0 scale bytes (one per group of 32 elements): 68 bytes in all.

Method: OCP Microscaling Formats (MX) v1.0 -- E2M1 elements with a shared
power-of-two (E8M0) scale per 32-element block -- with the scale exponent
rounded *up* (``ceil(log2(amax / 6))``) so that no element is clipped, as in
DeepSeek's and SGLang's FP4 indexer caches.

Everything here is plain vectorised torch and runs on any device. The Triton
store op (``ops/quantize.py``) must agree with ``quantize_index_k`` bit for bit.
"""

from __future__ import annotations

import torch

__all__ = [
    "INDEX_HEAD_DIM",
    "GROUP_SIZE",
    "NUM_GROUPS",
    "PAYLOAD_BYTES",
    "SCALE_BYTES",
    "TOKEN_BYTES",
    "UE8M0_BIAS",
    "UE8M0_MIN_CODE",
    "UE8M0_MAX_CODE",
    "E2M1_MAX",
    "E2M1_MAGNITUDES",
    "e2m1_table",
    "ue8m0_to_float",
    "e2m1_to_float",
    "e2m1_to_e4m3_byte",
    "quantize_index_k",
    "dequantize_index_k",
    "unpack_e2m1",
]

#: Elements of one index key (``index_head_dim``).
INDEX_HEAD_DIM = 128
#: Elements sharing one UE8M0 scale.
GROUP_SIZE = 32
#: Groups (and scale bytes) per index key.
NUM_GROUPS = INDEX_HEAD_DIM // GROUP_SIZE
#: Payload bytes per key: two E2M1 codes per byte.
PAYLOAD_BYTES = INDEX_HEAD_DIM // 2
#: Scale bytes per key: one UE8M0 code per group.
SCALE_BYTES = NUM_GROUPS
#: Bytes per token per layer across both planes.
TOKEN_BYTES = PAYLOAD_BYTES + SCALE_BYTES
#: UE8M0 value is ``2 ** (code - UE8M0_BIAS)``.
UE8M0_BIAS = 127
#: Smallest and largest UE8M0 codes ever stored (0 and 255 never are).
UE8M0_MIN_CODE = 1
UE8M0_MAX_CODE = 254
#: Largest E2M1 magnitude.
E2M1_MAX = 6.0
#: E2M1 magnitudes for the 3-bit codes 0..7 (bits 2..1 exponent, bit 0 mantissa).
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

# Decision points between neighbouring magnitudes, and whether a value exactly
# on the point goes *up* (the upper code has an even mantissa) or stays down.
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIE_GOES_UP = (False, True, False, True, False, True, False)

_MIN_EXP = UE8M0_MIN_CODE - UE8M0_BIAS  # -126
_MAX_EXP = UE8M0_MAX_CODE - UE8M0_BIAS  # 127


def e2m1_table(device: torch.device | str | None = None) -> torch.Tensor:
    """All 16 E2M1 values, indexed by the 4-bit code.

    Returns:
        fp32 ``[16]``; code ``c`` decodes to ``(-1 if c & 8 else 1) * E2M1_MAGNITUDES[c & 7]``
        (code 8, ``-0``, decodes to ``-0.0``).
    """
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    """Decode E2M1 codes (any integer tensor with values 0..15) to fp32, exactly.

    Raises:
        ValueError: if ``codes`` is not an integer tensor or holds a value outside 0..15.
    """
    if codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise ValueError(f"codes: expected an integer tensor, got {codes.dtype}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) > 15):
        raise ValueError("codes: E2M1 codes must lie in 0..15")
    return e2m1_table(codes.device)[codes.long()]


def ue8m0_to_float(codes: torch.Tensor) -> torch.Tensor:
    """Decode UE8M0 scale codes to fp32 powers of two: ``2 ** (code - 127)``, exactly.

    Args:
        codes: integer tensor of stored scale codes (1..254).

    Raises:
        ValueError: if ``codes`` is not an integer tensor, or holds 0 or 255
            (never stored: a cache holding them is corrupt or unwritten).
    """
    if codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise ValueError(f"codes: expected an integer tensor, got {codes.dtype}")
    c = codes.to(torch.int32)
    if c.numel() and (int(c.min()) < UE8M0_MIN_CODE or int(c.max()) > UE8M0_MAX_CODE):
        raise ValueError(
            "codes: UE8M0 scale codes must lie in 1..254 (0 and 255 are never stored; "
            "the cache slot is unwritten or corrupt)"
        )
    # ldexp on fp64 is exact for these exponents; the fp32 cast is exact (all normal).
    one = torch.ones_like(c, dtype=torch.float64)
    return torch.ldexp(one, (c - UE8M0_BIAS).to(torch.float64)).to(torch.float32)


def e2m1_to_e4m3_byte(codes: torch.Tensor) -> torch.Tensor:
    """Map E2M1 codes to the e4m3 byte ``sign << 7 | (code & 7) << 2``.

    Read as ``float8_e4m3fn`` the byte equals ``E2M1(code) * 2**-6`` exactly for
    all 16 codes (docs/format.md). This is what the Hopper scorer computes with
    integer ops on packed words.

    Args:
        codes: integer tensor, values 0..15.

    Returns:
        uint8 tensor of the same shape.
    """
    c = codes.to(torch.int32)
    return (((c & 8) << 4) | ((c & 7) << 2)).to(torch.uint8)


def unpack_e2m1(payload: torch.Tensor) -> torch.Tensor:
    """Split packed payload bytes into E2M1 codes, element order restored.

    Args:
        payload: uint8 ``[N, 64]``; byte ``i`` holds element ``2i`` (low nibble)
            and ``2i + 1`` (high nibble).

    Returns:
        uint8 ``[N, 128]`` codes 0..15.
    """
    lo = payload & 0x0F
    hi = payload >> 4
    return torch.stack([lo, hi], dim=-1).reshape(*payload.shape[:-1], payload.shape[-1] * 2)


def _check_keys(k: torch.Tensor) -> None:
    if not isinstance(k, torch.Tensor):
        raise TypeError(f"k: expected a torch.Tensor, got {type(k).__name__}")
    if k.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"k: expected bfloat16, float16 or float32, got {k.dtype}")
    if k.dim() != 2 or k.shape[1] != INDEX_HEAD_DIM:
        raise ValueError(f"k: expected shape [N, {INDEX_HEAD_DIM}], got {list(k.shape)}")


def _first_nonfinite_row(k: torch.Tensor) -> int | None:
    bad = ~torch.isfinite(k).all(dim=1)
    if bool(bad.any()):
        return int(bad.nonzero()[0, 0])
    return None


def quantize_index_k(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize index keys to MXFP4 (docs/format.md), exactly.

    Per group of 32 elements: ``e = ceil(log2(amax / 6))`` clamped to
    ``[-126, 127]`` (``e = -126`` for an all-zero or subnormal group), UE8M0
    code ``e + 127``; each element ``x / 2**e`` is rounded to the nearest E2M1
    magnitude, ties to the even mantissa, saturating at 6, sign kept, ``-0``
    stored as ``+0``. The arithmetic is done in fp64, where every step is exact.

    Args:
        k: ``[N, 128]`` bf16, fp16 or fp32 index keys (any device).

    Returns:
        ``(payload, scales)``: uint8 ``[N, 64]`` (element ``2i`` in the low
        nibble of byte ``i``, ``2i + 1`` in the high nibble) and uint8 ``[N, 4]``
        (UE8M0 code of group ``g`` in byte ``g``).

    Raises:
        TypeError: ``k`` is not a tensor.
        ValueError: wrong dtype or shape, or a NaN/Inf element (the message
            names the first offending row).
    """
    _check_keys(k)
    row = _first_nonfinite_row(k)
    if row is not None:
        raise ValueError(f"k: row {row} holds a NaN or Inf element; index keys must be finite")
    n = k.shape[0]
    x = k.to(torch.float64).reshape(n, NUM_GROUPS, GROUP_SIZE)
    amax = x.abs().amax(dim=-1)  # [N, 4]
    # Smallest e with amax <= 6 * 2**e. Start from the float estimate and fix
    # it up by exact power-of-two comparisons (fp64 holds 6 * 2**127).
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    e = torch.ceil(torch.log2(safe / E2M1_MAX))
    e = torch.where(E2M1_MAX * torch.exp2(e - 1) >= safe, e - 1, e)
    e = torch.where(E2M1_MAX * torch.exp2(e) < safe, e + 1, e)
    e = torch.where(amax > 0, e, torch.full_like(e, _MIN_EXP))
    e = e.clamp(_MIN_EXP, _MAX_EXP)
    y = x / torch.exp2(e).unsqueeze(-1)  # exact: division by a power of two in fp64
    mag = y.abs()
    code = torch.zeros_like(mag, dtype=torch.int32)
    for mid, up in zip(_MIDPOINTS, _TIE_GOES_UP):
        code += (mag >= mid if up else mag > mid).to(torch.int32)
    sign = ((y < 0) & (code > 0)).to(torch.int32) << 3
    codes = (code | sign).reshape(n, INDEX_HEAD_DIM)
    payload = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    scales = (e.to(torch.int32) + UE8M0_BIAS).to(torch.uint8)
    return payload.contiguous(), scales.contiguous()


def dequantize_index_k(payload: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Decode MXFP4 index keys exactly: ``E2M1(code) * 2**(scale_code - 127)``.

    Args:
        payload: uint8 ``[N, 64]`` packed E2M1 codes (layout of ``quantize_index_k``).
        scales: uint8 ``[N, 4]`` UE8M0 codes, one per 32-element group.

    Returns:
        fp32 ``[N, 128]``; every value is exact (a power of two times a small integer).

    Raises:
        ValueError: wrong dtype or shape, mismatched ``N``, or a scale code of 0
            or 255 (never stored).
    """
    if payload.dtype != torch.uint8 or payload.dim() != 2 or payload.shape[1] != PAYLOAD_BYTES:
        raise ValueError(
            f"payload: expected uint8 [N, {PAYLOAD_BYTES}], got {payload.dtype} {list(payload.shape)}"
        )
    if scales.dtype != torch.uint8 or scales.dim() != 2 or scales.shape[1] != SCALE_BYTES:
        raise ValueError(
            f"scales: expected uint8 [N, {SCALE_BYTES}], got {scales.dtype} {list(scales.shape)}"
        )
    if payload.shape[0] != scales.shape[0]:
        raise ValueError(
            f"payload and scales: row counts differ ({payload.shape[0]} vs {scales.shape[0]})"
        )
    n = payload.shape[0]
    values = e2m1_table(payload.device)[unpack_e2m1(payload).long()]  # [N, 128]
    factor = ue8m0_to_float(scales)  # [N, 4]
    out = values.reshape(n, NUM_GROUPS, GROUP_SIZE).to(torch.float64) * factor.to(torch.float64).unsqueeze(-1)
    return out.reshape(n, INDEX_HEAD_DIM).to(torch.float32)
