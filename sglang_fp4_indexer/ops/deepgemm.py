"""DeepGEMM's index-logits entry points across sgl-deep-gemm versions (no SGLang here).

SGLang 0.5.23 pins sgl-deep-gemm 0.2.3.post2, whose Python API has
``fp8_mqa_logits(q, kv, weights, ks, ke, clean_logits=False, max_seqlen_k=0)``
(ragged, prefill), ``fp8_paged_mqa_logits(q, kv_cache, weights, context_lens,
block_table, schedule_meta, max_context_len, clean_logits=False, indices=None)``
(paged, decode) and their ``fp8_fp4_*`` forms with ``clean_logits`` and
``logits_dtype``. sgl-deep-gemm 0.2.5 keeps only
``fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end,
max_seqlen_k, schedule_meta=None)``, whose SM90 kernel writes only compressed
logits (row ``t``'s key ``j`` at column ``j - ks[t]``, ``max_seqlen_k`` wide), and
``fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table,
schedule_meta, max_context_len, indices=None)`` (no ``clean_logits``, no
``logits_dtype``; absolute columns as before).

``api()`` reads the installed module once and returns two callables with one
contract each (absolute columns, as the prefill route and SGLang's top-k use
them), or the reason there is none: ``ragged`` is None for the compressed-only
0.2.5 form (the prefill route then runs the Triton scorer; the reason is
warned about once), ``paged`` serves both versions (``clean_logits=True`` only
where DeepGEMM offers it).
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import types
import warnings
from typing import Callable, NamedTuple

import torch

__all__ = ["DeepGemmApi", "api", "read_api"]


class DeepGemmApi(NamedTuple):
    """The installed DeepGEMM's index-logits entry points, each with one contract (module docstring).

    Attributes:
        module: the ``deep_gemm`` module, or None when it does not import.
        version: the ``sgl-deep-gemm`` (or ``deep-gemm``) distribution's version, or ``"unknown"``.
        ragged: ``(q, kv, weights, ks, ke, clean_logits, logits_dtype) -> [T, S]`` logits at absolute
            columns (a view with DeepGEMM's padded row stride), or None.
        ragged_problem: why ``ragged`` is None (None when it is not).
        paged: ``(q, kv_cache, weights, context_lens, block_table, schedule, max_context_len, clean_logits)
            -> [rows, max_context_len]`` fp32 logits, or None.
        paged_problem: why ``paged`` is None (None when it is not).
    """

    module: types.ModuleType | None
    version: str
    ragged: Callable | None
    ragged_problem: str | None
    paged: Callable | None
    paged_problem: str | None


def _params(fn) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return ()


def _legacy_form(fn, before: int) -> bool:
    """Whether ``fn`` takes ``clean_logits`` as its argument after the first ``before`` (0.2.3's form).

    A compiled function without a readable signature counts as that form (called positionally, as before).
    """
    params = _params(fn)
    return not params or (len(params) > before and params[before] == "clean_logits")


def _version(module) -> str:
    for dist in ("sgl-deep-gemm", "deep-gemm", "deep_gemm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return str(getattr(module, "__version__", "unknown"))


def _ragged(module, version: str):
    """The ragged entry point with absolute columns, or ``(None, reason)``."""
    legacy = getattr(module, "fp8_mqa_logits", None)
    fp8_fp4 = getattr(module, "fp8_fp4_mqa_logits", None)
    fp8_fp4_params = _params(fp8_fp4)
    typed = fp8_fp4 is not None and {"clean_logits", "logits_dtype"} <= set(fp8_fp4_params)
    if legacy is not None and _legacy_form(legacy, 5):
        def ragged(q, kv, weights, ks, ke, clean_logits, logits_dtype):
            if logits_dtype == torch.float32 or not typed:
                out = legacy(q, kv, weights, ks, ke, clean_logits)
                return out if logits_dtype == torch.float32 else out.to(logits_dtype)
            return fp8_fp4((q, None), kv, weights, ks, ke, clean_logits=clean_logits, max_seqlen_k=0,
                           logits_dtype=logits_dtype)

        return ragged, None
    if typed:
        def ragged(q, kv, weights, ks, ke, clean_logits, logits_dtype):
            return fp8_fp4((q, None), kv, weights, ks, ke, clean_logits=clean_logits, max_seqlen_k=0,
                           logits_dtype=logits_dtype)

        return ragged, None
    if fp8_fp4 is not None:
        return None, (f"DeepGEMM {version} has no fp8_mqa_logits, and its fp8_fp4_mqa_logits"
                      f"({', '.join(fp8_fp4_params)}) writes compressed logits (each row from its own ks), "
                      "not the absolute columns SGLang's top-k reads")
    return None, f"DeepGEMM {version} has neither fp8_mqa_logits nor fp8_fp4_mqa_logits"


def _paged(module, version: str):
    """The paged entry point, or ``(None, reason)``."""
    legacy = getattr(module, "fp8_paged_mqa_logits", None)
    if legacy is not None and _legacy_form(legacy, 7):
        def paged(q, kv_cache, weights, context_lens, block_table, schedule, max_context_len, clean_logits):
            return legacy(q, kv_cache, weights, context_lens, block_table, schedule, max_context_len, clean_logits)

        return paged, None
    fp8_fp4 = getattr(module, "fp8_fp4_paged_mqa_logits", None)
    params = _params(fp8_fp4)
    if fp8_fp4 is not None and params[:7] == ("q", "kv_cache", "weights", "context_lens", "block_table",
                                              "schedule_meta", "max_context_len"):
        cleans = "clean_logits" in params

        def paged(q, kv_cache, weights, context_lens, block_table, schedule, max_context_len, clean_logits):
            if cleans:
                return fp8_fp4(q, kv_cache, weights, context_lens, block_table, schedule, max_context_len,
                               clean_logits=clean_logits)
            if clean_logits:
                raise ValueError(f"clean_logits: DeepGEMM {version}'s fp8_fp4_paged_mqa_logits does not clean "
                                 "the logits; pass False")
            return fp8_fp4(q, kv_cache, weights, context_lens, block_table, schedule, max_context_len)

        return paged, None
    return None, (f"DeepGEMM {version} has neither fp8_paged_mqa_logits nor fp8_fp4_paged_mqa_logits(q, kv_cache, "
                  "weights, context_lens, block_table, schedule_meta, max_context_len, ...)")


def read_api(module: types.ModuleType | None, version: str | None = None) -> DeepGemmApi:
    """The index-logits entry points of a ``deep_gemm`` module (``api`` reads the installed one).

    Args:
        module: the module, or None (not installed / does not import).
        version: its version for the messages (default: from the installed distribution).

    Never raises.
    """
    if module is None:
        why = "the deep_gemm package is not installed or does not import"
        return DeepGemmApi(None, "none", None, why, None, why)
    version = _version(module) if version is None else version
    ragged, ragged_problem = _ragged(module, version)
    paged, paged_problem = _paged(module, version)
    return DeepGemmApi(module, version, ragged, ragged_problem, paged, paged_problem)


@functools.lru_cache(maxsize=None)
def api() -> DeepGemmApi:
    """The installed DeepGEMM's entry points (``read_api``), read once per process.

    When ``deep_gemm`` imports but its ragged scorer cannot serve the prefill
    route, one warning says why (the Triton ragged scorer serves instead).
    """
    try:
        import deep_gemm as module
    except Exception:  # missing, or built for another torch / CUDA: the Triton scorers serve
        module = None
    found = read_api(module)
    if module is not None and found.ragged is None:
        warnings.warn(f"sglang-fp4-indexer: {found.ragged_problem}; prefill scores with the Triton kernels",
                      stacklevel=2)
    return found
