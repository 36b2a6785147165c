"""Which kernels serve a deployment, and why (no SGLang here).

The serving path picks, per device, the Hopper CUDA C++ scorer (``ops/sm90.py``)
or the Triton scorers (``ops/paged_logits.py``), and the CUDA or Triton store op
(``ops/quantize.py``) and CTA planner (``ops/schedule.py``). ``verify_request_form``
says whether target verify is handed to the scorer one page-table row per request
(``[B, next_n]`` lengths) or in SGLang's per-row form (``[B * next_n, 1]``);
``describe`` writes the one text the plugin's "FP4 indexer active" line carries.

``ServingKernels`` holds what a serving process launches, each resolved once per
configuration when the pool is built: the paged scorer's launchers
(``paged_logits.paged_scorer``), the store op's (``quantize.StoreLauncher``) and the
planner (``schedule.Planner``); the plugin's hooks call them with tensors only.
"""

from __future__ import annotations

import functools

import torch

from ..pool import PAGE_SIZE
from . import sm90
from .grid import default_num_ctas
from .paged_logits import MAX_NEXT_N, default_block_kv, paged_scorer
from .quantize import store_launcher
from .schedule import planner_for

__all__ = ["hopper_reason", "verify_request_form", "describe", "ServingKernels", "kernels_for"]


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


class ServingKernels:
    """The kernels one serving process launches on one device, each resolved once per configuration.

    What a call would otherwise re-decide -- which kernel, its build, its launch
    parameters and argument layout -- is decided here, once, as FlashInfer's
    ``plan()`` does for its ``run()``: the serving hooks look a launcher up by its
    configuration (a dict lookup) and call it with tensors only. Built when the
    plugin builds the pool (``sglang_plugin/kv_pool.py``), with the decode and the
    target-verify scorers resolved (and the Hopper ones built) then; a
    configuration first seen later is resolved at its first call.

    Args:
        device: the serving device.
        heads: the model's index heads (``None``: scorers resolved at first use only).
        next_n: query rows per request in target verify (1: no speculative decoding).
        page_size: tokens per index page.

    Attributes:
        device: the device (with its index on CUDA).
        block_kv: keys per schedule tile (``paged_logits.default_block_kv``).
        num_ctas: schedule entries of the persistent grid (``grid.default_num_ctas``).
        planner: the CTA planner (``schedule.planner_for``) for ``block_kv``.
        max_next_n: most rows per request one scorer call takes (``MAX_NEXT_N``).

    Raises:
        ValueError: an unsupported head count or next_n (``paged_logits.paged_scorer``).
    """

    def __init__(self, device: torch.device | str, heads: int | None = None, next_n: int = 1,
                 page_size: int = PAGE_SIZE):
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device, self.page_size, self.max_next_n = device, page_size, MAX_NEXT_N
        self.block_kv = default_block_kv(device)
        self.num_ctas = default_num_ctas(device)
        self.planner = planner_for(device, self.block_kv)
        self._paged: dict = {}
        if heads is not None:
            self.paged(heads, 1)
            if next_n > 1 and verify_request_form(device, heads, next_n):
                self.paged(heads, next_n)
        self.store(torch.bfloat16, torch.int64, page_size)  # SGLang's index keys and slots

    def paged(self, heads: int, next_n: int):
        """The paged scorer's launcher for ``heads`` x ``next_n`` rows per request as SGLang calls it: e4m3 index
        queries, ``[B, next_n]`` lengths, fp32 logits, ``clean_logits=False`` (``paged_logits.paged_scorer``);
        ``launcher(q, weights, cache, block_table, context_lens, schedule, out) -> out``."""
        got = self._paged.get((heads, next_n))
        if got is None:
            got = self._paged[(heads, next_n)] = paged_scorer(
                self.device, heads, next_n, lens_2d=True, page_size=self.page_size, block_kv=self.block_kv)
        return got

    def store(self, k_dtype: torch.dtype, slot_dtype: torch.dtype, page_size: int):
        """The store op's launcher for these dtypes and page size (``quantize.store_launcher``, one per process and
        configuration): ``store(k, cache, slots)``."""
        return store_launcher(self.device, k_dtype, slot_dtype, page_size)

    def plan(self, context_lens: torch.Tensor) -> torch.Tensor:
        """The CTA schedule of ``context_lens`` in a new int32 ``[num_ctas + 1, 2]`` buffer (``planner``)."""
        out = torch.empty((self.num_ctas + 1, 2), dtype=torch.int32, device=self.device)
        return self.planner(context_lens, out)


@functools.lru_cache(maxsize=None)
def kernels_for(device: torch.device) -> ServingKernels:
    """A ``ServingKernels`` of ``device`` without a head count, resolved once per device (for callers that hold
    none, e.g. a schedule published before any pool was built)."""
    return ServingKernels(device)
