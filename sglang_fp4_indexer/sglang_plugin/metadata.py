"""Publish the FP4 CTA schedule wherever SGLang 0.5.23 publishes the paged-MQA schedule (no numerics here).

SGLang's DSA backend computes the DeepGEMM paged-MQA schedule from every
metadata path -- eager ``init_forward_metadata``, CUDA-graph capture
(``_build_forward_metadata_cuda_graph``), graph replay and
``*_from_precomputed`` (both through ``_refresh_paged_mqa_schedule_metadata``),
the indexer's own fallback -- by calling
``resolve_paged_mqa_logits_metadata_fn()(context_lens_2d, 64, num_sms)`` and
storing the result in ``metadata.paged_mqa_schedule_metadata`` (captured
buffers are refreshed with ``copy_``, so their addresses stay fixed). Our
planner has the same call signature and result shape, so:

- ``dsa.utils.resolve_paged_mqa_logits_metadata_fn`` (AROUND): returns
  ``plan_fp4_schedule`` while this process holds the FP4 index cache.
- ``DeepseekSparseAttnBackend._refresh_paged_mqa_schedule_metadata`` (AROUND):
  with FP4, plans in place into the captured buffer (no allocation, no copy).
- ``DeepseekSparseAttnMultiStepBackend.init_forward_metadata_out_graph``
  (AFTER): SGLang's fused three-backend metadata copy (more than 3 draft steps)
  refreshes lengths but neither the schedule nor the top-k v2 plan of those
  three steps; with FP4 exactly those are re-planned in place (every other
  replay path already re-plans through the hooked refresh).

- ``DeepseekSparseAttnBackend._build_paged_mqa_schedule_2d_ctx_lens``
  (AROUND): the lengths every one of those paths plans from and stores in
  ``metadata.paged_mqa_ctx_lens_2d``. Below SM100 SGLang gives target verify
  per-row lengths ``[B * next_n, 1]``; with FP4 they are handed over in the
  request form ``[B, next_n]`` (the same per-row lengths) where the scorer takes
  all ``next_n`` rows of a request in one tile (``ops.serving.verify_request_form``),
  so it reads each key once per request instead of once per row.

All four act only on DSA classes or DSA call sites, so a non-DSA target with
a draft model (e.g. Llama + EAGLE3) never reaches them.
"""

from __future__ import annotations

import torch

from .kv_pool import fp4_active, serving_kernels
from .seams import passthrough_after, passthrough_around

__all__ = [
    "plan_fp4_schedule",
    "resolve_paged_mqa_logits_metadata_fn",
    "refresh_paged_mqa_schedule_metadata",
    "multi_step_init_forward_metadata_out_graph",
    "replan_in_place",
    "build_paged_mqa_schedule_2d_ctx_lens",
]


def plan_fp4_schedule(context_lens, block_kv, num_sms):
    """Drop-in for DeepGEMM's ``get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms)``.

    Plans the FP4 scorer's CTA schedule with the planner resolved for the pool
    (``kv_pool.serving_kernels``: ``ops.serving.ServingKernels.plan``) with the scorer's own tile and grid: ``default_block_kv(device)`` keys per tile
    (SGLang passes DeepGEMM's 64) and ``ops.grid.default_num_ctas`` CTAs (the
    scorer's measured grid; SGLang passes DeepGEMM's SM count). Every buffer
    that holds it is planned by this function or in place with the same shape,
    so SGLang's ``copy_`` refreshes between them stay shape-compatible.

    Returns:
        int32 ``[num_ctas + 1, 2]`` on ``context_lens``'s device.
    """
    return serving_kernels(context_lens.device).plan(context_lens.contiguous())


@passthrough_around(fp4_active)
def resolve_paged_mqa_logits_metadata_fn(original):
    """AROUND hook: SGLang's schedule function, or ``plan_fp4_schedule`` when this process holds the FP4 cache."""
    return plan_fp4_schedule


def replan_in_place(context_lens, schedule) -> bool:
    """Re-plan ``schedule`` (a published int32 ``[n + 1, 2]`` buffer) from ``context_lens``, in place.

    Returns:
        False (nothing done) when either is None, else True.
    """
    if context_lens is None or schedule is None:
        return False
    serving_kernels(schedule.device).planner(context_lens.contiguous(), schedule)
    return True


@passthrough_around(fp4_active)
def refresh_paged_mqa_schedule_metadata(original, self, metadata, seqlens_32_2d):
    """AROUND hook of ``DeepseekSparseAttnBackend._refresh_paged_mqa_schedule_metadata``: plan in place with FP4."""
    if metadata.paged_mqa_schedule_metadata is not None:
        replan_in_place(seqlens_32_2d, metadata.paged_mqa_schedule_metadata)
        return None
    return original(self, metadata, seqlens_32_2d)


#: Draft-step backends SGLang 0.5.23's fused metadata copy refreshes (``fused_metadata_copy_multi_cuda``).
FUSED_COPY_STEPS = 3


@passthrough_after(fp4_active)
def multi_step_init_forward_metadata_out_graph(result, self, forward_batch, in_capture=False):
    """AFTER hook of ``DeepseekSparseAttnMultiStepBackend.init_forward_metadata_out_graph``: the one replay branch
    SGLang leaves stale.

    SGLang 0.5.23 refreshes every draft step's replay metadata through
    ``init_forward_metadata_replay_cuda_graph_from_precomputed`` (whose schedule
    refresh is hooked: planned in place) or, with
    ``experimental_kpool_metadata_fusion``, a sibling copy of step 0's (all
    steps share one precomputed length set, and every schedule buffer is
    ours, so the copy is right). The exception: with more than 3 draft steps
    (``speculative_num_steps > 3``) the first ``FUSED_COPY_STEPS`` steps are
    refreshed by its fused metadata copy, which writes their lengths but
    neither their paged-MQA schedule nor their top-k v2 plan. Only there, with
    FP4, this hook re-plans those steps' schedules from their own decode
    lengths (``cache_seqlens_int32``), in place, brings their
    ``paged_mqa_ctx_lens_2d`` in line, and refreshes their top-k v2 plans with
    SGLang's own ``_refresh_topk_v2_plan`` (one planner call each: without it
    SGLang's level-3 top-k reads indices planned for the captured lengths; a
    server without FP4 keeps SGLang's behaviour, the plugin being invisible
    there). Nothing is done during capture.
    """
    if in_capture or self.speculative_num_steps <= FUSED_COPY_STEPS:
        return result
    if getattr(self.attn_backends[0], "experimental_kpool_metadata_fusion", False):
        return result
    bs = forward_batch.batch_size
    for backend in self.attn_backends[:FUSED_COPY_STEPS]:
        metadata = getattr(backend, "forward_metadata", None)
        schedule = getattr(metadata, "paged_mqa_schedule_metadata", None)
        if schedule is None:
            continue
        ctx = metadata.paged_mqa_ctx_lens_2d
        rows = ctx.shape[0] if ctx is not None and ctx.dim() == 2 and ctx.shape[1] == 1 else bs
        lens = metadata.cache_seqlens_int32[:rows].reshape(rows, 1)
        if ctx is not None and ctx.shape == lens.shape and ctx.data_ptr() != lens.data_ptr():
            ctx.copy_(lens)
        replan_in_place(lens, schedule)
        backend._refresh_topk_v2_plan(metadata)
    return result


_request_forms: dict[tuple, bool] = {}


def _request_form(device, next_n: int) -> bool:
    """``ops.serving.verify_request_form`` for this process's FP4 pool (its index heads), once per device and next_n."""
    from ..ops.serving import verify_request_form
    from .kv_pool import serving_geometry

    geometry = serving_geometry()
    heads = geometry[1] if geometry else None
    key = (str(device), heads, next_n)
    if key not in _request_forms:
        _request_forms[key] = heads is not None and verify_request_form(device, heads, next_n)
    return _request_forms[key]


@passthrough_around(fp4_active)
def build_paged_mqa_schedule_2d_ctx_lens(original, self, forward_mode, cache_seqlens_int32, seqlens_expanded,
                                         batch_size):
    """AROUND hook of ``DeepseekSparseAttnBackend._build_paged_mqa_schedule_2d_ctx_lens``: verify in the request form.

    SGLang's result unless this process holds the FP4 cache, the batch is
    target verify with ``next_n`` rows per request (``self.speculative_num_draft_tokens``)
    that the scorer takes in one tile (``ops.serving.verify_request_form``: on
    Hopper only where the CUDA kernel takes ``next_n`` x heads of index queries,
    at 64 heads up to 4; above that SGLang's per-row form stays, which the
    Hopper kernel runs as next_n 1), and SGLang chose per-row
    lengths ``[B * next_n, 1]``. Then it returns the first ``B * next_n`` of
    ``seqlens_expanded`` (SGLang's per-row causal lengths, request-major) as
    int32 ``[B, next_n]``, a view as SGLang's own ``[B * next_n, 1]`` is. Every publish site (eager, capture,
    replay, ``*_from_precomputed``) plans the schedule from it and stores it
    as ``paged_mqa_ctx_lens_2d``; the indexer hook then scores each request's
    rows in one tile (``indexer.paged_scorer_inputs``: the page table's first
    row of each request). SGLang's own ``[B, next_n]`` form (SM100) is kept.
    """
    result = original(self, forward_mode, cache_seqlens_int32, seqlens_expanded, batch_size)
    if not forward_mode.is_target_verify():
        return result
    next_n = int(getattr(self, "speculative_num_draft_tokens", 0) or 0)
    rows = batch_size * next_n
    per_row = result.dim() == 2 and result.shape[1] == 1
    if not _request_form(seqlens_expanded.device, next_n) or not per_row or seqlens_expanded.numel() < rows:
        return result
    return seqlens_expanded.reshape(-1)[:rows].to(torch.int32).contiguous().view(batch_size, next_n)
