"""Schedule publishing in SGLang 0.5.23's DSA backends with the FP4 cache:
the resolver, in-place replay refresh, the draft steps SGLang's fused copy leaves
stale re-planned from their own lengths (and only those); SGLang's publish sites still route through the hooked seams; and a
non-DSA target with a draft model (Llama + EAGLE3) never reaches the plugin."""

from __future__ import annotations

import inspect
import types

import pytest
import torch

from plugin_support import load
from sglang_fp4_indexer.reference import paged_schedule_reference
from sglang_fp4_indexer.ops.grid import default_num_ctas
from sglang_fp4_indexer.ops.paged_logits import default_block_kv

BKV = default_block_kv("cpu")

CTAS = default_num_ctas("cpu")

pytestmark = pytest.mark.sglang


@pytest.fixture()
def fp4(monkeypatch):
    """Hooks applied and this process marked as holding an FP4 DSA pool (as after _build_dsa_kv_pool)."""
    load()
    from sglang_fp4_indexer.sglang_plugin import kv_pool as pool

    saved = dict(pool._state)
    pool.reset_state()
    pool._state["fp4_pools"] = 1
    yield
    pool._state.update(saved)


def _dsa_metadata(cache_seqlens, schedule=None, ctx2d=None):
    from sglang.srt.layers.attention.dsa_backend import DSAMetadata

    n = cache_seqlens.shape[0]
    cu = torch.arange(n + 1, dtype=torch.int32)
    return DSAMetadata(
        page_size=64, cache_seqlens_int32=cache_seqlens, max_seq_len_q=1, max_seq_len_k=4096,
        cu_seqlens_q=cu, cu_seqlens_k=cu, page_table_1=None, real_page_table=torch.zeros(n, 64, dtype=torch.int32),
        dsa_cache_seqlens_int32=cache_seqlens, dsa_cu_seqlens_q=cu, dsa_cu_seqlens_k=cu,
        dsa_extend_seq_lens_list=[1] * n, dsa_seqlens_expanded=cache_seqlens,
        paged_mqa_schedule_metadata=schedule, paged_mqa_ctx_lens_2d=ctx2d,
    )


def test_capture_then_replays_refresh_in_place(fp4):
    """Capture stores the resolver's tensor; each replay re-plans it in place from the new lengths."""
    from sglang.srt.layers.attention import dsa_backend
    from sglang.srt.layers.attention.dsa_backend import DeepseekSparseAttnBackend

    lens = torch.tensor([5, 700, 64, 129], dtype=torch.int32)
    ctx = lens.view(-1, 1)
    captured = dsa_backend.resolve_paged_mqa_logits_metadata_fn()(ctx, 64, 6)
    md = _dsa_metadata(lens, captured, ctx)
    ptr = captured.data_ptr()
    backend = object.__new__(DeepseekSparseAttnBackend)  # the method reads nothing off the backend
    for new in ([1, 1, 1, 1], [4000, 3, 65, 64], [0, 0, 2, 1000]):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        backend._refresh_paged_mqa_schedule_metadata(md, ctx)
        assert md.paged_mqa_schedule_metadata.data_ptr() == ptr
        assert torch.equal(md.paged_mqa_schedule_metadata, paged_schedule_reference(ctx, BKV, CTAS))
    # Verify-shaped [B, next_n] lengths plan per request.
    ctx4 = torch.tensor([[60, 61, 62, 63], [200, 201, 202, 203]], dtype=torch.int32)
    md4 = _dsa_metadata(ctx4[:, -1].contiguous(), torch.zeros(7, 2, dtype=torch.int32), ctx4)
    backend._refresh_paged_mqa_schedule_metadata(md4, ctx4)
    assert torch.equal(md4.paged_mqa_schedule_metadata, paged_schedule_reference(ctx4, BKV, 6))


def _plan_topk_v2(seq_lens):
    """Stands for SGLang's CUDA ``plan_topk_v2`` (a JIT kernel): a plan that is a function of the lengths."""
    plan = torch.zeros(seq_lens.shape[0] + 1, 4, dtype=torch.int32)
    plan[1:, 0] = torch.cumsum(seq_lens, 0)
    return plan


def _draft_steps(n, fusion=False):
    """``n`` draft-step backends (the real DeepseekSparseAttnBackend class, fields set as after capture) whose
    lengths then change as a replay's metadata copy writes them; schedules and top-k plans are left stale."""
    from sglang.srt.layers.attention.dsa_backend import DeepseekSparseAttnBackend

    from sglang_fp4_indexer.sglang_plugin.metadata import plan_fp4_schedule

    steps = []
    for i in range(n):
        lens = torch.tensor([10 + i, 300 + i, 1], dtype=torch.int32)
        ctx = lens.view(-1, 1) if i % 2 == 0 else lens.clone().view(-1, 1)  # a view, or a separate copy
        md = _dsa_metadata(lens, plan_fp4_schedule(ctx, 64, 5), ctx)
        object.__setattr__(md, "topk_v2_plan", _plan_topk_v2(lens))
        backend = object.__new__(DeepseekSparseAttnBackend)
        backend.forward_metadata, backend.experimental_kpool_metadata_fusion = md, fusion
        steps.append(backend)
    for i, s in enumerate(steps):
        s.forward_metadata.cache_seqlens_int32.copy_(torch.tensor([900 + 300 * i, 2, 64 * (i + 1)], dtype=torch.int32))
    return steps


@pytest.mark.parametrize("num_steps, fusion", [(5, False), (6, False), (3, False), (2, False), (5, True)])
def test_draft_steps_replanned_only_where_sglang_leaves_them_stale(fp4, monkeypatch, num_steps, fusion):
    """With more than 3 draft steps SGLang's fused copy refreshes the first three steps' lengths but not their
    schedules or top-k v2 plans: exactly those are re-planned (in place, from their own lengths). Every other step
    and branch SGLang refreshes itself (through the hooked schedule refresh): the hook leaves them alone."""
    from sglang.kernels.ops.attention.dsv4 import topk
    from sglang.srt.layers.attention.dsa_backend import DeepseekSparseAttnMultiStepBackend

    from sglang_fp4_indexer.sglang_plugin import metadata as hooks

    monkeypatch.setattr(topk, "plan_topk_v2", _plan_topk_v2)
    steps = _draft_steps(num_steps - 1, fusion)
    multi = object.__new__(DeepseekSparseAttnMultiStepBackend)
    multi.attn_backends, multi.speculative_num_steps = steps, num_steps
    ptrs = [(s.forward_metadata.paged_mqa_schedule_metadata.data_ptr(), s.forward_metadata.topk_v2_plan.data_ptr())
            for s in steps]
    before = [(s.forward_metadata.paged_mqa_schedule_metadata.clone(), s.forward_metadata.topk_v2_plan.clone())
              for s in steps]
    batch = types.SimpleNamespace(batch_size=3)  # stands for the draft ForwardBatch
    hooks.multi_step_init_forward_metadata_out_graph(None, multi, batch, in_capture=True)
    assert all(torch.equal(b[0], s.forward_metadata.paged_mqa_schedule_metadata) for b, s in zip(before, steps))
    hooks.multi_step_init_forward_metadata_out_graph(None, multi, batch)
    stale = range(3) if num_steps > 3 and not fusion else range(0)
    for i, (s, ptr, old) in enumerate(zip(steps, ptrs, before)):
        md = s.forward_metadata
        own = md.cache_seqlens_int32.view(-1, 1)
        assert (md.paged_mqa_schedule_metadata.data_ptr(), md.topk_v2_plan.data_ptr()) == ptr
        if i in stale:
            assert torch.equal(md.paged_mqa_ctx_lens_2d, own)
            assert torch.equal(md.paged_mqa_schedule_metadata, paged_schedule_reference(own, BKV, CTAS))
            assert torch.equal(md.topk_v2_plan, _plan_topk_v2(md.cache_seqlens_int32))
        else:
            assert torch.equal(md.paged_mqa_schedule_metadata, old[0]) and torch.equal(md.topk_v2_plan, old[1])


def test_sglang_publish_sites_go_through_the_hooked_seams():
    """If an upgrade publishes the paged-MQA schedule some other way, this names the site."""
    load()
    from sglang.srt.layers.attention.dsa import dsa_indexer
    from sglang.srt.layers.attention.dsa.dsa_metadata_manager import DSAMetadataManagementMixin
    from sglang.srt.layers.attention.dsa_backend import DeepseekSparseAttnBackend as B

    def src(fn):
        return inspect.getsource(inspect.unwrap(fn))

    for name in ("init_forward_metadata", "_build_forward_metadata_cuda_graph"):
        assert "resolve_paged_mqa_logits_metadata_fn()(" in src(getattr(B, name)), name
    for name in ("_apply_cuda_graph_metadata", "init_forward_metadata_replay_cuda_graph_from_precomputed"):
        assert "self._refresh_paged_mqa_schedule_metadata(" in src(getattr(B, name)), name
    # Every site takes its lengths from the hooked builder (target verify in the request form with FP4).
    for name in ("init_forward_metadata", "_build_forward_metadata_cuda_graph", "_apply_cuda_graph_metadata",
                 "init_forward_metadata_replay_cuda_graph_from_precomputed"):
        assert "self._build_paged_mqa_schedule_2d_ctx_lens(" in src(getattr(B, name)), name
    assert "resolve_paged_mqa_logits_metadata_fn()(" in src(B._refresh_paged_mqa_schedule_metadata)
    # Sibling copies copy the first step's schedule; the multi-step AFTER hook re-plans every step.
    assert "paged_mqa_schedule_metadata.copy_(" in src(DSAMetadataManagementMixin._copy_replay_metadata_from_sibling)
    # The indexer's fallback when nothing was published.
    assert "resolve_paged_mqa_logits_metadata_fn()(" in src(dsa_indexer.Indexer._get_topk_paged)


def test_non_dsa_target_with_draft_never_reaches_the_plugin():
    """Llama + EAGLE3: its backends, draft backends and pools share no hooked class and no hooked method."""
    load()
    import importlib

    from sglang.srt.configs.model_config import is_deepseek_dsa
    from sglang.srt.layers.attention import dsa_backend
    from sglang.srt.layers.attention.dsa import utils as dsa_utils
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MHATokenToKVPool

    from plugin_support import LLAMA, hf_config
    from sglang_fp4_indexer.sglang_plugin import hooks

    assert not is_deepseek_dsa(hf_config(LLAMA))
    hooked_classes = set()
    targets = {hook.target for hook in hooks()}
    for hook in hooks():
        owner = hook.target.rsplit(".", 1)[0]
        module, _, cls = owner.rpartition(".")
        try:
            obj = getattr(importlib.import_module(module), cls)
        except ModuleNotFoundError:
            continue  # a module-level function target (resolve_paged_mqa_logits_metadata_fn)
        if isinstance(obj, type):
            hooked_classes.add(obj)
    non_dsa = []
    for module, names in (
        ("sglang.srt.layers.attention.flashinfer_backend", ("FlashInferAttnBackend", "FlashInferMultiStepDraftBackend")),
        ("sglang.srt.layers.attention.triton_backend", ("TritonAttnBackend", "TritonMultiStepDraftBackend")),
    ):
        mod = importlib.import_module(module)
        non_dsa += [getattr(mod, n) for n in names]
    non_dsa.append(MHATokenToKVPool)
    for cls in non_dsa:
        assert not (set(cls.__mro__) & hooked_classes), f"{cls.__name__} inherits a hooked class"
        for klass in cls.__mro__:
            for name in vars(klass):
                assert f"{klass.__module__}.{klass.__qualname__}.{name}" not in targets, f"{cls.__name__}.{name}"
    assert DSATokenToKVPool in hooked_classes and not issubclass(MHATokenToKVPool, DSATokenToKVPool)
    # With no FP4 pool in the process the resolver is SGLang's own function.
    from sglang_fp4_indexer.sglang_plugin import kv_pool as pool

    saved = dict(pool._state)
    pool.reset_state()
    try:
        orig = inspect.unwrap(dsa_utils.resolve_paged_mqa_logits_metadata_fn)
        assert dsa_backend.resolve_paged_mqa_logits_metadata_fn is dsa_utils.resolve_paged_mqa_logits_metadata_fn
        try:
            expected = orig()
        except Exception as exc:  # DeepGEMM is not importable without CUDA: both raise the same
            with pytest.raises(type(exc)):
                dsa_utils.resolve_paged_mqa_logits_metadata_fn()
        else:
            assert dsa_utils.resolve_paged_mqa_logits_metadata_fn() is expected
    finally:
        pool._state.update(saved)
