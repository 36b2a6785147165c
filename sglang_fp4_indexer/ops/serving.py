"""Which kernels serve a deployment, and why (no SGLang here).

The serving path picks, per device, the Hopper CUDA C++ scorer (``ops/sm90.py``)
or the Triton scorers (``ops/paged_logits.py``), and the CUDA or Triton store op
(``ops/quantize.py``) and CTA planner (``ops/schedule.py``). ``verify_request_form``
says whether target verify is handed to the scorer one page-table row per request
(``[B, next_n]`` lengths) or in SGLang's per-row form (``[B * next_n, 1]``);
``describe`` writes the one text the plugin's "FP4 indexer active" line carries.
"""

from __future__ import annotations

import torch

from . import sm90
from .paged_logits import MAX_NEXT_N

__all__ = ["hopper_reason", "verify_request_form", "describe"]


def hopper_reason(device: torch.device | str) -> str | None:
    """Why the Hopper scorer does not serve on ``device`` (None: it does, unless one build fails).

    ``ops.sm90.unavailable_reason``: not an NVIDIA CUDA device, a compute
    capability other than 9.0, or ``cuda-bindings`` missing.
    """
    return sm90.unavailable_reason(device)


def verify_request_form(device: torch.device | str, heads: int, next_n: int) -> bool:
    """Whether target verify with ``next_n`` rows per request is scored in the request form ``[B, next_n]``.

    Where the Hopper scorer serves: only when it takes all ``next_n`` rows in
    one tile (``next_n * heads * 128 <= sm90.MAX_Q_BYTES``); above that SGLang's
    per-row form stays, which the Hopper kernel runs as ``next_n`` 1 on the
    schedule planned for it. Where the Triton scorers serve: ``2 <= next_n <=
    MAX_NEXT_N`` (they read each key once per request in that form).

    Args:
        device: the serving device.
        heads: index heads (a ``SUPPORTED_HEADS`` value).
        next_n: query rows per request (draft tokens + 1).
    """
    if not 2 <= next_n <= MAX_NEXT_N:
        return False
    if hopper_reason(device) is None:
        return sm90.query_tile_problem(next_n, heads) is None
    return True


def _store_and_planner(device: torch.device) -> str:
    from . import nvrtc

    if device.type != "cuda" or torch.version.hip is not None:
        return "store and CTA planner: Triton kernels (not an NVIDIA CUDA device)"
    why = nvrtc.bindings_missing()
    if why:
        return f"store and CTA planner: Triton kernels ({why})"
    return "store and CTA planner: CUDA kernels"


def _hopper_build_problem(device: torch.device, next_n: int, heads: int) -> str | None:
    """Why the Hopper build serving uses for ``next_n`` rows of ``heads`` (fp32 logits, SGLang's 2-D lengths)
    cannot run on ``device`` (``sm90.serving_unavailable``; a configuration the kernel has no build for says so)."""
    try:
        config = sm90.Config.of_call(next_n, heads, torch.float32, True)
    except ValueError as e:
        return f"the Hopper kernel has no build for next_n {next_n}, {heads} heads ({e})"
    return sm90.serving_unavailable(device, config)


def describe(device: torch.device | str, heads: int, next_n: int = 1) -> str:
    """One line naming the kernels that serve decode (and target verify at ``next_n`` > 1) on ``device``, and why.

    Where the Hopper scorer serves, its decode build (``next_n`` 1, ``heads``,
    fp32 logits, SGLang's 2-D lengths) is built and loaded here
    (``sm90.serving_unavailable``; the serving path reuses it), so a build
    failure shows in this line rather than at the first step.

    Args:
        device: the serving device.
        heads: index heads.
        next_n: query rows per request in target verify (1: no speculative decoding).

    Returns:
        e.g. ``"scorer: Hopper CUDA kernel (decode; target verify next_n 2, one pass per request); store and
        CTA planner: CUDA kernels"``.
    """
    device = torch.device(device)
    why = hopper_reason(device)
    if why is None:
        why = _hopper_build_problem(device, 1, heads)
    if why is not None:
        scorer = f"scorer: Triton kernels ({why})"
        if next_n > 1:
            scorer += f"; target verify next_n {next_n}: " + (
                "one pass per request" if verify_request_form(device, heads, next_n) else "per row")
    else:
        scorer = "scorer: Hopper CUDA kernel (decode"
        if next_n > 1:
            if verify_request_form(device, heads, next_n):
                failed = _hopper_build_problem(device, next_n, heads)
                scorer += (f"; target verify next_n {next_n}, one pass per request" if failed is None else
                           f"; target verify next_n {next_n}: Triton kernels, one pass per request ({failed})")
            else:
                scorer += (f"; target verify next_n {next_n} per row, as SGLang hands it over: "
                           f"{sm90.query_tile_problem(next_n, heads)}")
        scorer += ")"
    return f"{scorer}; {_store_and_planner(device)}"
