"""FP4 encoder variants for the diagnostics: other scale-rounding rules on the same byte format, or 16-element groups.
"""

from __future__ import annotations

import torch

from .. import format as fmt

__all__ = [
    "SCALE_RULES",
    "fp4_keys_variant",
]


#: FP4 encoder variants measured by the diagnostics (``fp4_keys_variant``).
SCALE_RULES = ("ceil", "ocp", "mse", "group16")


def fp4_keys_variant(keys: torch.Tensor, rule: str) -> torch.Tensor:
    """Keys through an MXFP4 encoder variant, decoded (fp32 ``[N, 128]``); for the study's findings.

    - ``"ceil"``: the format's encoder (docs/format.md, ``format.quantize_index_k``):
      scale exponent ``e = ceil(log2(amax / 6))``, nothing clipped.
    - ``"ocp"``: the OCP MX v1.0 rule ``e = floor(log2(amax)) - 2`` (one less
      than ``"ceil"`` when ``amax > 6 * 2**(e - 1)`` lies in ``(1.5, 2) * 2**m``);
      elements above ``6 * 2**e`` saturate to 6. Same bytes, same decoder.
    - ``"mse"``: per group the better of ``e`` and ``e - 1`` (saturating) by
      squared error. Same bytes, same decoder.
    - ``"group16"``: 16-element groups with their own UE8M0 scale (72 bytes per
      token: a different format, for comparison only).

    Every variant reuses ``format.quantize_index_k`` (no rounding logic of its
    own): the ``e - 1`` encoding is ``quantize_index_k`` of the group clamped to
    ``+-6 * 2**(e - 1)`` -- whose amax is then exactly ``6 * 2**(e - 1)``, so the
    encoder picks ``e - 1`` and its saturating rounding gives the same codes as
    rounding the unclamped group; 16-element groups are two keys, each with the
    other half of every group zeroed (zeros do not change a group's amax and
    decode to 0).

    Args:
        keys: ``[N, 128]`` float index keys.
        rule: one of ``SCALE_RULES``.

    Raises:
        ValueError: unknown rule (or bad keys, as ``format.quantize_index_k``).
    """
    if rule not in SCALE_RULES:
        raise ValueError(f"rule: expected one of {SCALE_RULES}, got {rule!r}")
    x = keys.to(torch.float32)
    n = x.shape[0]
    if rule == "group16":
        groups = x.reshape(n, fmt.NUM_GROUPS, 2, fmt.GROUP_SIZE // 2)
        halves = []
        for half in range(2):
            part = torch.zeros_like(groups)
            part[:, :, half] = groups[:, :, half]
            halves.append(fmt.dequantize_index_k(*fmt.quantize_index_k(part.reshape(n, -1))))
        return halves[0] + halves[1]
    payload, scales = fmt.quantize_index_k(x)
    base = fmt.dequantize_index_k(payload, scales)
    if rule == "ceil":
        return base
    e = scales.to(torch.int32) - fmt.UE8M0_BIAS  # [N, 4]
    limit = torch.ldexp(torch.full(e.shape, fmt.E2M1_MAX, device=x.device), (e - 1).to(torch.float32))
    g = x.reshape(n, fmt.NUM_GROUPS, fmt.GROUP_SIZE)
    clipped = torch.maximum(torch.minimum(g, limit[..., None]), -limit[..., None]).reshape(n, -1)
    lower = fmt.dequantize_index_k(*fmt.quantize_index_k(clipped)).reshape(n, fmt.NUM_GROUPS, -1)
    base_g = base.reshape(n, fmt.NUM_GROUPS, -1)
    can_lower = e > fmt.UE8M0_MIN_CODE - fmt.UE8M0_BIAS  # e - 1 must stay a stored code
    if rule == "ocp":
        amax = g.abs().amax(dim=-1)
        _, exponent = torch.frexp(amax)  # amax = m * 2**exponent, m in [0.5, 1): floor(log2 amax) = exponent - 1
        use_lower = can_lower & (amax > 0) & (exponent - 1 - 2 < e)
    else:
        err_base = ((base_g - g) ** 2).sum(dim=-1)
        err_lower = ((lower - g) ** 2).sum(dim=-1)
        use_lower = can_lower & (err_lower < err_base)
    return torch.where(use_lower[..., None], lower, base_g).reshape(n, -1)
