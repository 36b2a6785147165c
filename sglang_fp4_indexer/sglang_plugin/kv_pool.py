"""The FP4 index-key cache inside SGLang 0.5.23's DSA KV pool (no numerics here).

Seams (docs/sglang-seams.md):

- ``KVCacheConfigurator._build_dsa_kv_pool`` (AROUND): asks the gate for this
  configurator's pools; when enabled, the pool is built inside an FP4 scope.
- ``DSATokenToKVPool._create_index_key_cache`` (AROUND): inside the scope it
  returns ``Fp4IndexKeyCache`` (``[pages, 64 * 68]`` uint8 per layer, docs/format.md) instead of SGLang's 132-byte ``IndexKeyCache``.
- ``DefaultPoolConfigurator._compute_dsa_indexer_cell_size`` (AROUND): the
  one place SGLang turns index bytes into ``max_total_num_tokens`` for plain
  DSA pools (target and EAGLE/MTP draft share); with FP4 enabled it counts 68
  bytes per token per index layer instead of 132. HiCache's host pool has its
  own 132-byte formula (``host_pool``); the other sites with it belong to
  features the gate refuses (hybrid SWA pools, page-interleave pools, DeepSeek-V4).

One process holds either FP4 or FP8 DSA pools, never both: the paged-MQA
schedule resolver is process-wide (``metadata.py``), so a mix would hand one
scorer the other's schedule. A later pool follows the first one's layout, or
startup stops with an error naming the conflict.
"""

from __future__ import annotations

import contextlib
import contextvars

from .. import pool as fp4_pool
from ..gate import Decision, report
from . import dcp_modes
from .facts import decision_for_kvc, global_rank, requested
from .index_key_cache import Fp4IndexKeyCache
from .seams import TESTED_SGLANG_VERSIONS, missing_hooks, refusal

__all__ = [
    "Fp4IndexKeyCache",
    "is_fp4_pool",
    "fp4_active",
    "reset_state",
    "pool_decision",
    "build_dsa_kv_pool",
    "create_index_key_cache",
    "compute_dsa_indexer_cell_size",
    "serving_device",
    "serving_geometry",
    "serving_kernels",
]

_fp4_scope: contextvars.ContextVar[bool] = contextvars.ContextVar("fp4_index_pool_scope", default=False)
_state = {"fp4_pools": 0, "fp8_pools": 0}


def fp4_active() -> bool:
    """Whether this process has built an FP4 DSA index-key cache."""
    return _state["fp4_pools"] > 0


def reset_state() -> None:
    """Forget the pools built in this process (for tests)."""
    _state["fp4_pools"] = 0
    _state["fp8_pools"] = 0
    _state.pop("serving", None)
    _state.pop("kernels", None)


def is_fp4_pool(pool) -> bool:
    """Whether ``pool`` (a DSA KV pool, or anything) holds the FP4 index-key cache."""
    return isinstance(getattr(pool, "index_key_cache", None), Fp4IndexKeyCache)


@contextlib.contextmanager
def _scope():
    token = _fp4_scope.set(True)
    try:
        yield
    finally:
        _fp4_scope.reset(token)


def _requested(kvc) -> bool:
    """Whether FP4 was asked for the server ``kvc`` sizes and builds for (``facts.requested``; nothing else read).

    Raises:
        ValueError: ``$SGLANG_ENABLE_FP4_INDEXER`` holds neither an on nor an off value.
    """
    return requested(getattr(kvc, "server_args", None))


def pool_decision(kvc) -> Decision:
    """The gate's decision for ``kvc``'s DSA pools (used for sizing and building).

    Checked in this order, so that a server that did not ask for FP4 reads
    nothing of SGLang's internals: FP4 requested (``facts.requested``); this
    SGLang can hold the FP4 cache (``seams.refusal``: hook signatures, version,
    pool attributes, the pool class for ``kvc``); the gate's facts, where any
    error while gathering them is a refusal naming it; no FP8 DSA pool in this
    process yet; every hook applied (``missing_hooks``).

    Raises:
        ValueError: ``$SGLANG_ENABLE_FP4_INDEXER`` holds neither an on nor an off value.
    """
    if not _requested(kvc):
        return Decision(False, "--enable-fp4-indexer not given", "", ("off",))
    problem = refusal(kvc)
    if problem:
        code, reason = problem
        return Decision(False, reason, "use an SGLang version this release was tested with "
                        f"({', '.join(TESTED_SGLANG_VERSIONS)}), or a release of sglang-fp4-indexer made for yours",
                        (code,))
    try:
        decision: Decision = decision_for_kvc(kvc, log=False)
    except Exception as exc:  # a renamed SGLang helper or field: refuse, never fail the launch
        return Decision(False, f"could not read the server's facts from SGLang ({type(exc).__name__}: {exc})",
                        "use an SGLang version this release was tested with "
                        f"({', '.join(TESTED_SGLANG_VERSIONS)})", ("facts_error",))
    if decision.enabled and _state["fp8_pools"]:
        return Decision(
            False, "another DSA pool of this process already uses SGLang's FP8 index cache",
            "make the draft and target agree", ("mixed",),
        )
    missing = missing_hooks() if decision.enabled else []
    if missing:
        return Decision(
            False, f"SGLang did not apply the plugin's hooks on {missing} (see its 'Failed to apply hooks' log)",
            f"use an SGLang version this plugin was tested with ({', '.join(TESTED_SGLANG_VERSIONS)})",
            ("hooks_missing",),
        )
    return decision


def build_dsa_kv_pool(original, *args, **kwargs):
    """AROUND hook of ``KVCacheConfigurator._build_dsa_kv_pool``: build the pool in the FP4 layout when the gate allows.

    Passes the call through untouched (``*args, **kwargs``) when FP4 was not
    asked for; arguments are bound by name (SGLang 0.5.23's
    ``(self, *, max_total_num_tokens, max_running_requests, dsa_pool_class)``) only when it was.
    """
    if not _requested(args[0] if args else kwargs.get("self")):
        if _state["fp4_pools"]:
            raise RuntimeError(_MIXED.format(reason="--enable-fp4-indexer not given for this pool"))
        pool = original(*args, **kwargs)
        _state["fp8_pools"] += 1
        return pool
    return _build_dsa_kv_pool(original, *args, **kwargs)


_MIXED = ("sglang-fp4-indexer: this process already holds an FP4 DSA index cache, but the gate "
          "refuses FP4 for this pool ({reason}); one process cannot mix FP4 and FP8 "
          "DSA pools. Fix: make the draft and target agree, or drop --enable-fp4-indexer.")


def serving_device(kvc):
    """The torch device a ``KVCacheConfigurator``'s pools live on (its ``device`` and ``gpu_id``)."""
    import torch

    device = torch.device(kvc.device)
    if device.type == "cuda" and device.index is None and getattr(kvc, "gpu_id", None) is not None:
        device = torch.device("cuda", int(kvc.gpu_id))
    return device


def _with_kernels(decision: Decision, kvc) -> Decision:
    """An enabled decision whose reason also names the kernels that will serve (``ops.serving.describe``).

    Resolves them here, once (``ops.serving.ServingKernels``: the decode and target-verify scorers, the store
    op, the planner), for the hooks to call (``serving_kernels``); records the index heads and device for the
    schedule hooks (``serving_geometry``).
    """
    import dataclasses

    from ..ops.serving import ServingKernels, describe
    from .facts import model_facts, server_field

    heads = model_facts(kvc.model_config.hf_config).index_n_heads
    next_n = int(server_field(kvc.server_args, "speculative_num_draft_tokens", 1) or 1)
    device = serving_device(kvc)
    _state["serving"] = (device, heads)
    try:
        _state["kernels"] = ServingKernels(device, heads, next_n)
        kernels = describe(device, heads, next_n)
    except Exception as exc:  # the line must never fail the launch; each op still picks its kernel at first use
        kernels = f"kernels chosen at first use ({type(exc).__name__}: {exc})"
    return dataclasses.replace(decision, reason=f"{decision.reason}; {kernels}")


def serving_geometry():
    """``(device, index heads)`` of this process's FP4 pool (None before one is built)."""
    return _state.get("serving")


def serving_kernels(device):
    """The kernels the hooks launch on ``device`` (``ops.serving.ServingKernels``): those resolved when this
    process's FP4 pool was built, or, on another device or before a pool, ones resolved once for ``device``."""
    kernels = _state.get("kernels")
    if kernels is not None and kernels.device == device:
        return kernels
    from ..ops.serving import kernels_for

    return kernels_for(device)


def _build_dsa_kv_pool(original, self, *, max_total_num_tokens, max_running_requests, dsa_pool_class):
    decision = pool_decision(self)
    if decision.enabled:
        decision = _with_kernels(decision, self)
    report(decision, rank=global_rank())
    kwargs = dict(
        max_total_num_tokens=max_total_num_tokens,
        max_running_requests=max_running_requests,
        dsa_pool_class=dsa_pool_class,
    )
    if not decision.enabled:
        if _state["fp4_pools"]:
            raise RuntimeError(_MIXED.format(reason=decision.reason))
        pool = original(self, **kwargs)
        _state["fp8_pools"] += 1
        return pool
    with _scope(), dcp_modes.scope(dcp_modes.pool_mode(self, decision)):
        pool = original(self, **kwargs)
    if not is_fp4_pool(pool):
        raise RuntimeError(
            f"sglang-fp4-indexer: the DSA pool class {type(pool).__name__} did not build its index cache "
            "through DSATokenToKVPool._create_index_key_cache; it cannot hold the FP4 layout"
        )
    _state["fp4_pools"] += 1
    return pool


def create_index_key_cache(original, *args, **kwargs):
    """AROUND hook of ``DSATokenToKVPool._create_index_key_cache``: the FP4 cache inside the FP4 scope.

    Outside the scope the call passes through untouched.
    """
    if not _fp4_scope.get():
        return original(*args, **kwargs)
    return _create_index_key_cache(original, *args, **kwargs)


def _create_index_key_cache(original, self):
    if self.index_kpool != 1 or self.index_head_dim != 128:
        raise RuntimeError(
            f"sglang-fp4-indexer: FP4 pool asked with index_kpool={self.index_kpool}, "
            f"index_head_dim={self.index_head_dim}; the gate should have refused it"
        )
    return dcp_modes.create_index_key_cache(self)  # Fp4IndexKeyCache, or its DCP-sharded form


def compute_dsa_indexer_cell_size(original, *args, **kwargs):
    """AROUND hook of ``DefaultPoolConfigurator._compute_dsa_indexer_cell_size``: 68 index bytes per token with FP4.

    Passes the call through untouched when FP4 was not asked for (the
    configurator is SGLang 0.5.23's keyword ``kvc``); otherwise binds
    ``(self, *, kvc, num_layers, allocate_all_layers=False)`` by name.

    SGLang returns ``index_bytes * index_layers`` with ``index_bytes = 132``
    (``index_head_dim + index_head_dim // quant_block_size * 4`` uint8 cells;
    the HiSparse ratio and NPU sizing do not apply when the gate enables FP4).
    With FP4 enabled the same layer count is charged 68 bytes each.

    Raises:
        RuntimeError: SGLang's result is not a whole number of 132-byte cells
            (the formula changed upstream; the plugin must be updated).
    """
    if not _requested(kwargs.get("kvc")):
        return original(*args, **kwargs)
    return _compute_dsa_indexer_cell_size(original, *args, **kwargs)


def _compute_dsa_indexer_cell_size(original, self, *, kvc, num_layers, allocate_all_layers=False):
    result = original(self, kvc=kvc, num_layers=num_layers, allocate_all_layers=allocate_all_layers)
    decision = pool_decision(kvc)
    if not decision.enabled:
        return result
    fp8 = fp4_pool.FP8_INDEX_BYTES_PER_TOKEN
    if result % fp8:
        raise RuntimeError(
            f"sglang-fp4-indexer: SGLang's DSA indexer cell size {result} is not a multiple of {fp8} bytes; "
            "its sizing formula changed and the plugin does not know how to rescale it"
        )
    fp4 = result // fp8 * fp4_pool.FP4_INDEX_BYTES_PER_TOKEN
    # the DCP-sharded target pool is charged 1/W of it
    return dcp_modes.indexer_cell_size(fp4, kvc, decision, allocate_all_layers=allocate_all_layers)


# The FP4 paths, bound by name with SGLang 0.5.23's parameters (tests/test_plugin_loading.py checks them).
build_dsa_kv_pool.fp4_path = _build_dsa_kv_pool
create_index_key_cache.fp4_path = _create_index_key_cache
compute_dsa_indexer_cell_size.fp4_path = _compute_dsa_indexer_cell_size
