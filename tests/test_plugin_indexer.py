"""The hooked DSA Indexer methods driven with real SGLang 0.5.23 objects and
compared with the core reference: store bytes, paged logits and top-k (decode,
target verify next_n 2-4, draft extend), ragged prefill logits and top-k, the
published CTA schedule; and pass-through when the pool is not FP4.

Real objects: the DSA pool (``DSATokenToKVPool`` with the plugin's FP4 cache,
built on the CPU), ``DSAMetadata``, ``DSAIndexerMetadata`` with SGLang's torch
top-k backend, ``ForwardMode``, SGLang's forward context, the ``Indexer`` class
and its own ``_mask_init_and_local_tokens`` / ``_get_index_k_read_buffer``.
Stand-ins (each says what it stands for): the attention backend and the
forward batch, whose constructors need a GPU model runner; the Indexer
instance skips ``Indexer.__init__`` (its RoPE kernels need CUDA).

Tolerance of logits: the FP4 scorer multiplies exactly and sums in fp32 in its
own order, the oracle sums in fp64; |got - ref| <= 2e-5 * sum of term
magnitudes (see tests/test_paged_logits.py). Top-k is checked as a valid top-k
of the reference logits within that tolerance (ties may order differently).
"""

from __future__ import annotations

import types

import pytest
import torch

from plugin_support import DSV32, H200, load, published, stand_in_kvc
from sglang_fp4_indexer import pool as fp4_pool
from sglang_fp4_indexer.format import dequantize_index_k, quantize_index_k
from sglang_fp4_indexer.ops.grid import default_num_ctas
from sglang_fp4_indexer.ops.paged_logits import default_block_kv
from sglang_fp4_indexer.reference import (
    expand_context_lens,
    paged_logits_reference,
    paged_schedule_reference,
    ragged_logits_reference,
)

pytestmark = pytest.mark.sglang

REL = 2e-5
TOPK = 16


@pytest.fixture(scope="module")
def env():
    """Hooks applied, a real FP4 DSA pool of 24 pages x 1 layer on the CPU, a published runtime context."""
    load()
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool
    from sglang.srt.server_args import prepare_server_args

    from sglang_fp4_indexer.sglang_plugin import facts
    from sglang_fp4_indexer.sglang_plugin import kv_pool as plugin_pool

    mp = pytest.MonkeyPatch()
    mp.setattr(facts, "device_facts", lambda *a, **k: H200)
    plugin_pool.reset_state()
    ctx = published(page_size=64)
    ctx.__enter__()
    sa = prepare_server_args(["--model-path", "dummy", "--enable-fp4-indexer"])
    pool = KVCacheConfigurator._build_dsa_kv_pool(
        stand_in_kvc(DSV32, sa, num_layers=1), max_total_num_tokens=23 * 64,
        max_running_requests=8, dsa_pool_class=DSATokenToKVPool,
    )
    assert plugin_pool.is_fp4_pool(pool)
    yield types.SimpleNamespace(pool=pool, cache=pool.index_key_cache.buffer[0])
    ctx.__exit__(None, None, None)
    plugin_pool.reset_state()
    mp.undo()


def _indexer(heads, init_tokens=0, local_tokens=0):
    """The real ``Indexer`` class without ``__init__`` (which builds CUDA RoPE kernels); the fields its methods read."""
    from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer

    ix = Indexer.__new__(Indexer)
    torch.nn.Module.__init__(ix)
    ix.n_heads, ix.head_dim, ix.index_topk = heads, 128, TOPK
    ix.num_init_tokens, ix.num_local_tokens = init_tokens, local_tokens
    ix.block_size, ix.scale_fmt = 128, None
    return ix


def _forward(pool):
    """SGLang's forward context over a stand-in for DeepseekSparseAttnBackend (only ``token_to_kv_pool`` is read)."""
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    return forward_context(ForwardContext(attn_backend=types.SimpleNamespace(token_to_kv_pool=pool)))


def _batch(mode, **fields):
    """Stands for ForwardBatch (built by ModelRunner from a ScheduleBatch): the fields the indexer reads."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return types.SimpleNamespace(forward_mode=getattr(ForwardMode, mode), **fields)


class _SpyMetadata:
    """Mixin recording the logits SGLang's indexer metadata hands to top-k."""

    def topk_transform(self, logits, topk, **kw):
        self.seen.append(logits.clone())
        return super().topk_transform(logits, topk, **kw)


def _metadata(*, cache_seqlens, seqlens_expanded, table, extend_lens, ctx2d=None, schedule=None,
              ks=None, ke=None, indexer_seq_lens=None, token_to_batch_idx=None, topk_indices_offset=None):
    from sglang.srt.layers.attention.dsa.dsa_indexer_metadata import DSAIndexerMetadata
    from sglang.srt.layers.attention.dsa.dsa_topk_backend import DSATopKBackend, TopkTransformMethod
    from sglang.srt.layers.attention.dsa_backend import DSAMetadata

    spy = type("SpyDSAIndexerMetadata", (_SpyMetadata, DSAIndexerMetadata), {})
    rows = int(seqlens_expanded.shape[0])
    cu = torch.arange(rows + 1, dtype=torch.int32)
    md = DSAMetadata(
        page_size=64, cache_seqlens_int32=cache_seqlens, max_seq_len_q=1,
        max_seq_len_k=int(cache_seqlens.max()) if cache_seqlens.numel() else 0, cu_seqlens_q=cu,
        cu_seqlens_k=torch.nn.functional.pad(torch.cumsum(cache_seqlens, 0), (1, 0)).to(torch.int32),
        page_table_1=None, real_page_table=table, dsa_cache_seqlens_int32=seqlens_expanded,
        dsa_cu_seqlens_q=cu, dsa_cu_seqlens_k=cu, dsa_extend_seq_lens_list=extend_lens,
        dsa_seqlens_expanded=seqlens_expanded, paged_mqa_schedule_metadata=schedule,
        paged_mqa_ctx_lens_2d=ctx2d,
        indexer_k_start_end=None if ks is None else (ks, ke),
        indexer_seq_lens=indexer_seq_lens, indexer_seq_lens_cpu=indexer_seq_lens,
        token_to_batch_idx=token_to_batch_idx, topk_indices_offset=topk_indices_offset,
    )
    out = spy(
        attn_metadata=md, topk_transform_method=TopkTransformMethod.PAGED, topk_backend=DSATopKBackend.TORCH,
        paged_mqa_schedule_metadata=schedule, paged_mqa_ctx_lens_2d=ctx2d, force_unfused_topk=True,
    )
    object.__setattr__(out, "seen", [])
    return out


def _store_requests(env, ix, lens, seed):
    """Write random keys for each request through the hooked ``_store_index_k_cache``; return the page table."""
    g = torch.Generator().manual_seed(seed)
    max_pages = max(1, -(-max(lens) // 64))
    pages = torch.randperm(env.cache.shape[0], generator=g)[: len(lens) * max_pages].view(len(lens), max_pages)
    table = pages.to(torch.int32)
    env.cache.zero_()
    for b, n in enumerate(lens):
        slots = _slots(table[b], n)
        k = (torch.randn(n, 128, generator=g) * torch.exp(torch.randn(n, 1, generator=g))).to(torch.bfloat16)
        with _forward(env.pool):
            ix._store_index_k_cache(_batch("EXTEND", out_cache_loc=slots), 0, k, out_cache_loc=slots)
        payload, scales = fp4_pool.read_index_k(env.cache, slots)
        want = quantize_index_k(k)
        assert torch.equal(payload, want[0]) and torch.equal(scales, want[1]), "store hook bytes differ from format.py"
    return table


def _queries(rows, heads, seed):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(rows, heads, 128, generator=g) * 2).to(torch.float8_e4m3fn)
    w = (torch.rand(rows, heads, 1, generator=g) * heads**-0.5).float()
    return q, w


def _slots(table_row, n):
    j = torch.arange(n)
    return table_row[j // 64].long() * 64 + j % 64


def _keys(env, table, lens):
    """Decoded keys of row ``r``'s first ``lens[r]`` slots through ``table[r]``."""
    return [dequantize_index_k(*fp4_pool.read_index_k(env.cache, _slots(table[r], n))) for r, n in enumerate(lens)]


def _bound(q, w, keys_per_row):
    """sum_h |w| sum_d |q k| per (row, column), for the tolerance."""
    out = []
    for r, keys in enumerate(keys_per_row):
        t = (keys.double().abs() @ q[r].double().abs().t()) @ w[r].double().abs()
        out.append(t)
    return out


def _page_end(n: int) -> int:
    """The end of the page holding a row's last visible key: the paged hook scores with clean_logits=False
    (as SGLang calls DeepGEMM), so columns from there to the width are left unwritten for the top-k's
    length mask."""
    return -(-n // 64) * 64


def _check_logits(got, ref, bound_rows):
    for r, bound in enumerate(bound_rows):
        n = bound.shape[0]
        end = _page_end(n)
        assert torch.equal(torch.isfinite(ref[r, :end]), torch.isfinite(got[r, :end])), \
            f"row {r}: -inf columns differ from the reference within its last page"
        err = (got[r, :n].double() - ref[r, :n].double()).abs()
        assert torch.all(err <= REL * bound + 1e-30), f"row {r}: max err {err.max()}"


def _check_topk(idx, ref, lengths, k, tol_rows):
    """``idx`` is a valid top-k of ``ref`` restricted to columns < lengths, up to ``tol`` per row."""
    for r in range(idx.shape[0]):
        n = int(lengths[r])
        chosen = idx[r][idx[r] >= 0]
        assert len(set(chosen.tolist())) == len(chosen) == min(k, n)
        assert torch.all(chosen < n)
        if n == 0:
            continue
        vals = ref[r, :n].double()
        kth = torch.sort(vals, descending=True).values[len(chosen) - 1]
        assert torch.all(vals[chosen.long()] >= kth - tol_rows[r]), f"row {r} is not a top-{k}"


def _schedule(ctx2d):
    from sglang.srt.layers.attention.dsa import utils as dsa_utils
    from sglang.srt.layers.attention import dsa_backend

    fn = dsa_utils.resolve_paged_mqa_logits_metadata_fn()
    assert fn is dsa_backend.resolve_paged_mqa_logits_metadata_fn(), "the patch reached dsa_backend's binding"
    sched = fn(ctx2d, 64, 132)  # SGLang passes DeepGEMM's block (64) and SM count; the plugin plans its own grid
    assert torch.equal(sched, paged_schedule_reference(ctx2d, default_block_kv("cpu"), default_num_ctas("cpu")))
    return sched


def _run_paged(env, ix, mode, md, q, w):
    with _forward(env.pool):
        return ix._get_topk_paged(_batch(mode), 0, q, w, md)


@pytest.mark.parametrize("heads", [64, 32])
def test_decode(env, heads):
    from sglang_fp4_indexer.sglang_plugin.metadata import plan_fp4_schedule

    lens = [1, 100, 200]
    ix = _indexer(heads)
    table = _store_requests(env, ix, lens, seed=heads)
    cache_seqlens = torch.tensor(lens, dtype=torch.int32)
    ctx2d = cache_seqlens.view(-1, 1)  # what SGLang's _to_2d_context_lens gives for decode
    sched = _schedule(ctx2d)
    from sglang.srt.layers.attention.dsa import utils as dsa_utils

    assert dsa_utils.resolve_paged_mqa_logits_metadata_fn() is plan_fp4_schedule
    md = _metadata(cache_seqlens=cache_seqlens, seqlens_expanded=cache_seqlens, table=table,
                   extend_lens=[1] * 3, ctx2d=ctx2d, schedule=sched)
    q, w = _queries(3, heads, seed=1)
    idx = _run_paged(env, ix, "DECODE", md, q, w)
    ref = paged_logits_reference(q, w[:, :, 0], env.cache, table, cache_seqlens)
    bound = _bound(q, w[:, :, 0], _keys(env, table, lens))
    _check_logits(md.seen[0], ref, bound)
    _check_topk(idx, ref, cache_seqlens, TOPK, [REL * b.max() for b in bound])
    assert idx.dtype == torch.int32 and idx.shape == (3, TOPK)


def _verify_case(env, heads, next_n, lens, seed):
    ix = _indexer(heads)
    table = _store_requests(env, ix, lens, seed=seed)
    cache_seqlens = torch.tensor(lens, dtype=torch.int32)
    per_row = expand_context_lens(cache_seqlens, next_n).to(torch.int32)  # [B, next_n] causal lengths
    rows = len(lens) * next_n
    table_rows = torch.repeat_interleave(table, next_n, dim=0)  # SGLang repeat-interleaves the page table
    q, w = _queries(rows, heads, seed=seed + 1)
    keys = _keys(env, table_rows, per_row.reshape(-1).tolist())
    return ix, table, table_rows, cache_seqlens, per_row, q, w, keys


class _ScorerSpy:
    """Records the ``context_lens`` / ``block_table`` / ``schedule`` of every call of the paged scorer's launcher the
    hook looks up (``ServingKernels.paged``), then calls it: which form of the lengths reached the scorer.
    ``poison``: the logits buffer is filled with +inf before the launch (what the scorer leaves unwritten shows)."""

    def __init__(self, monkeypatch, poison=False):
        from sglang_fp4_indexer.ops.serving import ServingKernels

        self.calls = []
        self.tables = []  # (data_ptr, strides) of each call's block_table: a view of SGLang's table or a copy
        self.kwargs = []  # the launcher's clean_logits per call
        real = ServingKernels.paged
        spy = self

        def paged(kernels, heads, next_n):
            launcher = real(kernels, heads, next_n)

            def call(q, weights, cache, block_table, context_lens, schedule, out):
                spy.calls.append((block_table.clone(), context_lens.clone(), schedule))
                spy.tables.append((block_table.data_ptr(), block_table.stride()))
                spy.kwargs.append({"clean_logits": launcher.clean_logits})
                if poison:
                    out.fill_(float("inf"))
                return launcher(q, weights, cache, block_table, context_lens, schedule, out)

            return call

        monkeypatch.setattr(ServingKernels, "paged", paged)


@pytest.mark.parametrize("heads", [32, 64])
@pytest.mark.parametrize("next_n", [2, 3, 4])
def test_target_verify_reaches_the_scorer_in_the_request_form(env, next_n, heads, monkeypatch):
    """Below SM100 SGLang builds verify lengths per row ([rows, 1], page table repeat-interleaved); with FP4 its
    own _build_paged_mqa_schedule_2d_ctx_lens (hooked) gives [B, next_n], the published schedule is planned on
    them, and one scorer call takes each request's next_n rows with one page-table row each (every key read
    once per request). The logits are the per-row oracle's, -inf past each row's own causal length."""
    from sglang.srt.layers.attention.dsa_backend import DeepseekSparseAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    ix, table, table_rows, cache_seqlens, per_row, q, w, keys = _verify_case(env, heads, next_n, [70, 130],
                                                                             10 + next_n + heads)
    expanded = per_row.reshape(-1).contiguous()
    backend = types.SimpleNamespace(speculative_num_draft_tokens=next_n)  # the fields the method reads
    ctx2d = DeepseekSparseAttnBackend._build_paged_mqa_schedule_2d_ctx_lens(
        backend, ForwardMode.TARGET_VERIFY, cache_seqlens, expanded, 2
    )
    assert ctx2d.shape == (2, next_n) and torch.equal(ctx2d, per_row)
    assert ctx2d.data_ptr() == expanded.data_ptr()  # a view of SGLang's lengths, as its own [rows, 1] form is
    sched = _schedule(ctx2d)
    md = _metadata(cache_seqlens=cache_seqlens, seqlens_expanded=expanded, table=table_rows,
                   extend_lens=[next_n] * 2, ctx2d=ctx2d, schedule=sched)
    spy = _ScorerSpy(monkeypatch)
    idx = _run_paged(env, ix, "TARGET_VERIFY", md, q, w)
    assert len(spy.calls) == 1
    got_table, got_lens, got_sched = spy.calls[0]
    assert torch.equal(got_lens, per_row) and torch.equal(got_table, table)  # request form, one row per request
    assert got_sched is sched
    # ... read in place through a row stride: every next_n-th row of SGLang's table, no copy per layer.
    assert table_rows.dtype == torch.int32
    assert spy.tables[0] == (table_rows.data_ptr(), (next_n * table_rows.shape[1], 1))
    ref = paged_logits_reference(q, w[:, :, 0], env.cache, table, per_row)
    bound = _bound(q, w[:, :, 0], keys)
    _check_logits(md.seen[0], ref, bound)
    _check_topk(idx, ref, expanded, TOPK, [REL * b.max() for b in bound])


def test_request_form_only_for_fp4_verify_within_the_tile(env):
    """The hook leaves SGLang's lengths alone for decode, draft extend, more draft tokens than one tile takes
    (the per-row form), SGLang's own [B, next_n] form (SM100), and a process without the FP4 cache."""
    from sglang.srt.layers.attention.dsa_backend import DeepseekSparseAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_fp4_indexer.ops.paged_logits import MAX_NEXT_N
    from sglang_fp4_indexer.sglang_plugin import metadata as hooks
    from sglang_fp4_indexer.sglang_plugin import kv_pool as plugin_pool

    build = DeepseekSparseAttnBackend._build_paged_mqa_schedule_2d_ctx_lens
    lens = torch.tensor([40, 90], dtype=torch.int32)
    for mode, next_n in ((ForwardMode.DECODE, 2), (ForwardMode.DRAFT_EXTEND_V2, 2),
                         (ForwardMode.TARGET_VERIFY, MAX_NEXT_N + 1), (ForwardMode.TARGET_VERIFY, 1)):
        expanded = expand_context_lens(lens, next_n).reshape(-1).to(torch.int32)
        out = build(types.SimpleNamespace(speculative_num_draft_tokens=next_n), mode, lens, expanded, 2)
        want = (lens if mode.is_decode() else expanded).view(-1, 1)
        assert torch.equal(out, want), (mode, next_n)
    full = lens.view(-1, 1).expand(-1, 3).contiguous()  # SGLang's SM100 form
    assert hooks.build_paged_mqa_schedule_2d_ctx_lens(lambda *a: full, types.SimpleNamespace(speculative_num_draft_tokens=3),
                                                      ForwardMode.TARGET_VERIFY, lens, full.reshape(-1), 2) is full
    saved = dict(plugin_pool._state)
    plugin_pool.reset_state()
    try:
        expanded = expand_context_lens(lens, 2).reshape(-1).to(torch.int32)
        out = build(types.SimpleNamespace(speculative_num_draft_tokens=2), ForwardMode.TARGET_VERIFY, lens, expanded, 2)
        assert out.shape == (4, 1)
    finally:
        plugin_pool._state.update(saved)


def test_request_form_only_where_the_hopper_kernel_takes_it(env, monkeypatch):
    """On Hopper (stand-in: sm90 answers as an H200 does) at DeepSeek-V3.2's 64 index heads, target verify with 2-4
    rows per request is handed over in the request form and 5-8 keep SGLang's per-row form (5 x 64 heads of index
    queries exceed the CUDA kernel's 32 KB), which that kernel runs as next_n 1 on the schedule planned for it."""
    from sglang.srt.layers.attention.dsa_backend import DeepseekSparseAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_fp4_indexer.ops import sm90
    from sglang_fp4_indexer.sglang_plugin import metadata as hooks

    monkeypatch.setattr(sm90, "unavailable_reason", lambda device: None)
    monkeypatch.setattr(hooks, "_request_forms", {})
    lens = torch.tensor([40, 90], dtype=torch.int32)
    build = DeepseekSparseAttnBackend._build_paged_mqa_schedule_2d_ctx_lens
    for next_n in range(2, 9):
        expanded = expand_context_lens(lens, next_n).reshape(-1).to(torch.int32)
        out = build(types.SimpleNamespace(speculative_num_draft_tokens=next_n), ForwardMode.TARGET_VERIFY, lens,
                    expanded, 2)
        want = expanded.view(2, next_n) if next_n <= 4 else expanded.view(-1, 1)
        assert torch.equal(out, want) and out.shape == want.shape, next_n


def test_active_line_names_the_kernels(monkeypatch, caplog):
    """The one 'FP4 indexer active' line says which kernels serve and why (here: the CPU, so Triton everywhere)."""
    import logging

    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool
    from sglang.srt.server_args import prepare_server_args

    from sglang_fp4_indexer import gate
    from sglang_fp4_indexer.sglang_plugin import facts
    from sglang_fp4_indexer.sglang_plugin import kv_pool as plugin_pool

    load()
    monkeypatch.setattr(facts, "device_facts", lambda *a, **k: H200)
    saved = dict(plugin_pool._state)
    plugin_pool.reset_state()
    gate.reset_reports()
    sa = prepare_server_args(["--model-path", "dummy", "--enable-fp4-indexer"])
    logging.getLogger().addHandler(caplog.handler)  # prepare_server_args' basicConfig(force=True) removed it
    try:
        with published(page_size=64), caplog.at_level(logging.INFO, logger="sglang_fp4_indexer"):
            KVCacheConfigurator._build_dsa_kv_pool(stand_in_kvc(DSV32, sa, num_layers=1), max_total_num_tokens=64,
                                                   max_running_requests=1, dsa_pool_class=DSATokenToKVPool)
    finally:
        logging.getLogger().removeHandler(caplog.handler)
        plugin_pool.reset_state()
        plugin_pool._state.update(saved)
        gate.reset_reports()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("FP4 indexer active")]
    assert len(lines) == 1
    assert lines[0].endswith("CUDA 9.0; scorer: Triton kernels (not an NVIDIA CUDA device); store and CTA planner: "
                             "Triton kernels (not an NVIDIA CUDA device))")


def test_target_verify_request_form(env):
    """The SM100 form: ctx [B, next_n] (every row the full length); SGLang's top-k masks by the per-row lengths."""
    next_n = 4
    ix, table, table_rows, cache_seqlens, per_row, q, w, keys = _verify_case(env, 64, next_n, [66, 129], 5)
    ctx2d = cache_seqlens.view(-1, 1).expand(-1, next_n).contiguous()  # as _build_paged_mqa_schedule_2d_ctx_lens on SM100
    expanded = per_row.reshape(-1).contiguous()
    md = _metadata(cache_seqlens=cache_seqlens, seqlens_expanded=expanded, table=table_rows,
                   extend_lens=[next_n] * 2, ctx2d=ctx2d, schedule=_schedule(ctx2d))
    idx = _run_paged(env, ix, "TARGET_VERIFY", md, q, w)
    ref_full = paged_logits_reference(q, w[:, :, 0], env.cache, table, ctx2d)
    bound = _bound(q, w[:, :, 0], _keys(env, table_rows, ctx2d.reshape(-1).tolist()))
    _check_logits(md.seen[0], ref_full, bound)
    _check_topk(idx, ref_full, expanded, TOPK, [REL * b.max() for b in bound])


def test_draft_extend_and_padding_and_masks(env):
    """DRAFT_EXTEND_V2 rows, extra padding rows in q (-1 results), init/local tokens forced in."""
    next_n = 2
    ix, table, table_rows, cache_seqlens, per_row, q, w, keys = _verify_case(env, 32, next_n, [90, 40], 7)
    ix.num_init_tokens, ix.num_local_tokens = 2, 3
    expanded = per_row.reshape(-1).contiguous()
    ctx2d = expanded.view(-1, 1)
    md = _metadata(cache_seqlens=cache_seqlens, seqlens_expanded=expanded, table=table_rows,
                   extend_lens=[next_n] * 2, ctx2d=ctx2d, schedule=_schedule(ctx2d))
    pad_q = torch.cat([q, q[:3]])
    pad_w = torch.cat([w, w[:3]])
    idx = _run_paged(env, ix, "DRAFT_EXTEND_V2", md, pad_q, pad_w)
    assert idx.shape == (7, TOPK) and torch.all(idx[4:] == -1)
    ref = paged_logits_reference(q, w[:, :, 0], env.cache, table, per_row)
    ix._mask_init_and_local_tokens(ref, expanded)  # SGLang's own masking on the reference
    seen = md.seen[0]
    for r in range(4):
        end = _page_end(int(expanded[r]))
        assert torch.equal(torch.isposinf(seen[r, :end]), torch.isposinf(ref[r, :end]))
    assert int(torch.isposinf(ref).sum()) > 0
    bound = _bound(q, w[:, :, 0], keys)
    _check_topk(idx[:4], ref, expanded, TOPK, [REL * b.max() for b in bound])
    for r in range(4):
        forced = torch.isposinf(ref[r]).nonzero().flatten()
        assert set(forced.tolist()) <= set(idx[r].tolist())


def test_decode_leaves_the_tail_to_sglangs_length_mask(env, monkeypatch):
    """The paged hook asks for clean_logits=False; SGLang's own top-k ignores whatever lies past each row's
    length (here +inf planted in every column the scorer does not write), so the result is still the top-k."""
    from sglang_fp4_indexer.ops import paged_logits as paged

    spy = _ScorerSpy(monkeypatch, poison=True)
    seen_kwargs = spy.kwargs
    ix = _indexer(64)
    lens = [3, 70, 200]  # rows end mid-page, so most of the width is never written
    table = _store_requests(env, ix, lens, seed=11)
    # A request table wider than the requests (as SGLang's CUDA graphs size it for the model's context).
    table = torch.cat([table, table[:, :1].expand(-1, 8)], dim=1).contiguous()
    cache_seqlens = torch.tensor(lens, dtype=torch.int32)
    ctx2d = cache_seqlens.view(-1, 1)
    md = _metadata(cache_seqlens=cache_seqlens, seqlens_expanded=cache_seqlens, table=table,
                   extend_lens=[1] * 3, ctx2d=ctx2d, schedule=_schedule(ctx2d))
    q, w = _queries(3, 64, seed=12)
    idx = _run_paged(env, ix, "DECODE", md, q, w)
    assert seen_kwargs and all(k.get("clean_logits") is False for k in seen_kwargs)
    seen = md.seen[0]
    bkv = paged.default_block_kv(torch.device("cpu"))
    for r, n in enumerate(lens):  # the columns past the request's last key block are left as they were
        end = -(-n // bkv) * bkv
        assert end < seen.shape[1] and torch.isposinf(seen[r, end:]).all(), f"row {r}: tail written"
    ref = paged_logits_reference(q, w[:, :, 0], env.cache, table, cache_seqlens)
    bound = _bound(q, w[:, :, 0], _keys(env, table, lens))
    _check_logits(seen, ref, bound)
    _check_topk(idx, ref, cache_seqlens, TOPK, [REL * b.max() for b in bound])


def test_no_schedule_and_empty_batch(env):
    """Without published lengths/schedule the scorer plans its own; a batch of 0 rows gives an empty result."""
    ix = _indexer(32)
    lens = [65, 3]
    table = _store_requests(env, ix, lens, seed=3)
    cache_seqlens = torch.tensor(lens, dtype=torch.int32)
    md = _metadata(cache_seqlens=cache_seqlens, seqlens_expanded=cache_seqlens, table=table, extend_lens=[1, 1])
    q, w = _queries(2, 32, seed=4)
    idx = _run_paged(env, ix, "DECODE", md, q, w)
    ref = paged_logits_reference(q, w[:, :, 0], env.cache, table, cache_seqlens)
    _check_logits(md.seen[0], ref, _bound(q, w[:, :, 0], _keys(env, table, lens)))
    empty = _metadata(cache_seqlens=cache_seqlens[:0], seqlens_expanded=cache_seqlens[:0], table=table[:0], extend_lens=[])
    out = _run_paged(env, ix, "DECODE", empty, q[:0], w[:0])
    assert out.shape == (0, TOPK)


@pytest.mark.parametrize("chunked", [None, "paged", "ragged"])
def test_prefill_ragged(env, chunked, monkeypatch):
    """Prefill with a cached prefix (70 + 5) and without (0 + 3); whole, or in SGLang's row chunks
    with the PAGED (per-token) or RAGGED (flat-offset) top-k arguments."""
    from sglang.srt.layers.attention.dsa import dsa_indexer

    heads = 32
    ix = _indexer(heads)
    prefix, extend = [70, 0], [5, 3]
    lens = [p + e for p, e in zip(prefix, extend)]
    table = _store_requests(env, ix, lens, seed=11)
    starts = [0, lens[0]]
    ks = torch.tensor([starts[b] for b in range(2) for _ in range(extend[b])], dtype=torch.int32)
    pos = torch.tensor([prefix[b] + i for b in range(2) for i in range(extend[b])], dtype=torch.int32)
    ke = ks + pos + 1
    seqlens_expanded = (pos + 1).to(torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    offsets = torch.repeat_interleave(torch.tensor(starts, dtype=torch.int32), torch.tensor(extend))
    md = _metadata(cache_seqlens=seq_lens, seqlens_expanded=seqlens_expanded, table=table,
                   extend_lens=extend, ks=ks, ke=ke, indexer_seq_lens=seq_lens,
                   token_to_batch_idx=torch.repeat_interleave(torch.arange(2), torch.tensor(extend)),
                   topk_indices_offset=offsets if chunked == "ragged" else None)
    if chunked:  # force SGLang's row chunking: 3 rows per chunk
        monkeypatch.setattr(dsa_indexer, "mqa_logits_should_chunk", lambda **kw: (True, 3 * kw["num_cols"] * 4))
    rows = int(ks.shape[0])
    q, w = _queries(rows, heads, seed=12)
    with _forward(env.pool):
        idx = ix._get_topk_ragged(False, _batch("EXTEND"), 0, q, w, md)
    slots = torch.cat([_slots(table[b], n) for b, n in enumerate(lens)])
    payload, scales = fp4_pool.read_index_k(env.cache, slots)
    ref = ragged_logits_reference(q, w[:, :, 0], payload, scales, ks, ke)
    seen = torch.cat(md.seen)
    assert len(md.seen) == (3 if chunked else 1)
    keys = dequantize_index_k(payload, scales)
    for t in range(rows):
        lo, hi = int(ks[t]), int(ke[t])
        bound = (keys[lo:hi].double().abs() @ q[t].double().abs().t()) @ w[t, :, 0].double().abs()
        err = (seen[t, lo:hi].double() - ref[t, lo:hi].double()).abs()
        assert torch.all(err <= REL * bound + 1e-30)
    # The torch top-k backend returns window-local positions (column - ks).
    local = torch.stack([torch.cat([ref[t, int(ks[t]):int(ke[t])], ref.new_full((ref.shape[1] - int(ke[t] - ks[t]),), float("-inf"))]) for t in range(rows)])
    _check_topk(idx, local, seqlens_expanded, TOPK, [1e-3] * rows)


def test_passthrough_without_fp4_pool():
    """With an FP8 pool (or FP4 off), every hook calls SGLang's original with the same arguments and returns its result."""
    load()
    from sglang_fp4_indexer.sglang_plugin import indexer as hooks
    from sglang_fp4_indexer.sglang_plugin import metadata as meta_hooks
    from sglang_fp4_indexer.sglang_plugin import kv_pool as plugin_pool

    calls = []

    def original(*args, **kwargs):
        calls.append((args, kwargs))
        return "sglang"

    fp8_pool = types.SimpleNamespace(index_key_cache=object())  # stands for a DSA pool with SGLang's IndexKeyCache
    ix = _indexer(32)
    fb = _batch("DECODE", out_cache_loc=torch.tensor([1]))
    with _forward(fp8_pool):
        assert hooks.get_topk_paged(original, ix, fb, 3, "q", "w", "md") == "sglang"
        assert hooks.get_topk_ragged(original, ix, True, fb, 3, "q", "w", "md", topk_result="buf") == "sglang"
        assert hooks.store_index_k_cache(original, ix, fb, 3, "k", act_quant="aq", out_cache_loc="loc") == "sglang"
        assert hooks.fused_k_prepare_and_store(original, ix, "kr", "pos", fb, 3, "aq", out_cache_loc="loc") == "sglang"
        assert hooks.fused_q_prepare_and_store(original, ix, "x", "ql", "pos", fb, 3, "aq", num_tokens=2,
                                               enable_dual_stream=False) == "sglang"
        assert hooks.maybe_rotate(original, ix, "x") == "sglang"
    assert calls == [
        ((ix, fb, 3, "q", "w", "md"), {}),
        ((ix, True, fb, 3, "q", "w", "md"), {"topk_result": "buf"}),
        ((ix, fb, 3, "k"), {"act_quant": "aq", "out_cache_loc": "loc"}),
        ((ix, "kr", "pos", fb, 3, "aq"), {"out_cache_loc": "loc"}),
        ((ix, "x", "ql", "pos", fb, 3, "aq"), {"num_tokens": 2, "enable_dual_stream": False}),
        ((ix, "x"), {}),
    ]
    saved = dict(plugin_pool._state)
    plugin_pool.reset_state()
    try:
        assert meta_hooks.resolve_paged_mqa_logits_metadata_fn(lambda: "deepgemm") == "deepgemm"
        md = types.SimpleNamespace(paged_mqa_schedule_metadata=torch.zeros(2, 2, dtype=torch.int32))
        assert meta_hooks.refresh_paged_mqa_schedule_metadata(original, "backend", md, "ctx") == "sglang"
        assert calls[-1] == (("backend", md, "ctx"), {})
        assert meta_hooks.multi_step_init_forward_metadata_out_graph("r", types.SimpleNamespace(attn_backends=[]), fb) == "r"
    finally:
        plugin_pool._state.update(saved)


def test_fused_k_path_stores_fp4(env, monkeypatch):
    """SGLang's fused norm+RoPE+FP8-store would write FP8 bytes; with FP4 its norm+RoPE runs, SGLang's
    rotate_activation rotates the key, and the rotated key is stored as FP4."""
    from sglang.srt.layers.attention.dsa import dsa_indexer

    monkeypatch.setattr(dsa_indexer, "rotate_activation", _hadamard_rotate)

    g = torch.Generator().manual_seed(9)
    key_raw = torch.randn(5, 128, generator=g).to(torch.bfloat16)
    positions = torch.arange(5)
    seen = {}

    def norm_rope(key, weight, bias, eps, cos_sin, pos):
        """Stands for SGLang's CUDA ``fused_k_indexer_norm_rope`` (not importable without CUDA): a known transform."""
        seen["args"] = (weight, bias, eps, cos_sin)
        assert torch.equal(pos, positions)
        return (key.float() * 2 - 1).to(torch.bfloat16)

    monkeypatch.setattr(dsa_indexer, "fused_k_indexer_norm_rope", norm_rope, raising=False)
    ix = _indexer(32)
    ix.k_norm = types.SimpleNamespace(weight="w", bias="b", variance_epsilon=1e-6)
    monkeypatch.setattr(type(ix), "_indexer_cos_sin_cache", property(lambda self: "cos_sin"))
    slots = torch.tensor([3, 64, 65, 200, 7])
    env.cache.zero_()
    with _forward(env.pool):
        ix._fused_k_prepare_and_store(key_raw, positions, _batch("DECODE", out_cache_loc=slots), 0, None)
    assert seen["args"] == ("w", "b", 1e-6, "cos_sin")
    payload, scales = fp4_pool.read_index_k(env.cache, slots)
    want = quantize_index_k(_hadamard_rotate((key_raw.float() * 2 - 1).to(torch.bfloat16)))
    assert torch.equal(payload, want[0]) and torch.equal(scales, want[1])
    others = torch.ones(env.cache.shape[0] * 64, dtype=torch.bool)
    others[slots] = False
    assert int(fp4_pool.read_index_k(env.cache, torch.arange(env.cache.shape[0] * 64)[others])[1].max()) == 0


# --- Interleaved indexer RoPE (GLM-5.x): SGLang's fused indexer with the FP4 cache ------------------------------
#
# With ``use_dsa_indexer_fusion`` SGLang skips the Hadamard rotation of the index queries and keys; with the FP4
# cache the plugin's hooks rotate both, in every branch. Real SGLang objects: the Indexer class and its own
# ``_fused_q_prepare_and_store``, ``_forward_cuda_k_only``, ``_get_q_k_bf16``, ``_scale_head_gates``,
# ``_get_logits_head_gate``, SGLang's ``LayerNorm``, ``RotaryEmbedding`` (interleaved) and its Triton
# ``act_quant`` (under the interpreter). Stand-ins, each saying what it stands for: ``rotate_activation``
# (CUDA-only ``hadamard_transform``), ``ReplicatedLinear`` and the CUDA norm+RoPE key kernel.

HIDDEN, Q_LORA, ROPE, GLM_HEADS = 96, 64, 64, 32


def _hadamard_rotate(x):
    """Stands for SGLang's ``rotate_activation`` (``dsa_indexer.py``), whose ``hadamard_transform`` runs on CUDA
    only: the normalized Walsh-Hadamard transform ``x @ H_n * n ** -0.5`` over the last dim, ``H_n`` from
    ``scipy.linalg.hadamard``, summed in fp32 and returned in ``x``'s dtype (SGLang's returns bf16 for bf16)."""
    import scipy.linalg

    n = x.shape[-1]
    h = torch.tensor(scipy.linalg.hadamard(n), dtype=torch.float32) * n**-0.5
    return (x.float() @ h).to(x.dtype)


class _Linear:
    """Stands for SGLang's ``ReplicatedLinear`` (built from a TP group): ``(x @ W.T, None)`` summed in fp64 and
    rounded once to bf16, so each output column is the same whether ``W`` is ``wk`` alone or ``[wk; weights_proj]``."""

    def __init__(self, weight):
        self.weight = weight

    def __call__(self, x):
        return (x.double() @ self.weight.double().t()).to(torch.bfloat16), None


def _glm_indexer(fused: bool, seed: int = 21):
    """The real ``Indexer`` class without ``__init__``, as SGLang builds it for interleaved indexer RoPE.

    ``fused`` is ``use_dsa_indexer_fusion`` (CUDA, ``SGLANG_DISABLE_DSA_INDEXER_FUSION`` unset): one
    ``wk_weights_proj = [wk; weights_proj]``; otherwise the unfused ``wk`` and ``weights_proj``. The same weights
    either way; SGLang's ``LayerNorm`` and its ``RotaryEmbedding`` with ``is_neox_style=False``, constructed as on
    a CPU platform (no CUDA kernel bound, so it runs ``forward_native``).
    """
    from sglang.srt.layers.layernorm import LayerNorm
    from sglang.srt.layers.rotary_embedding import base

    g = torch.Generator().manual_seed(seed)
    ix = _indexer(GLM_HEADS)
    ix.rope_head_dim, ix.q_lora_rank, ix.hidden_size = ROPE, Q_LORA, HIDDEN
    ix.softmax_scale = 128**-0.5
    ix.alt_stream = None
    ix.use_dsa_indexer_fusion, ix.use_aiter_fused_fp8_writer, ix.dsa_enable_prefill_cp = fused, False, False
    wq = (torch.randn(GLM_HEADS * 128, Q_LORA, generator=g) * Q_LORA**-0.5).to(torch.bfloat16)
    wk = (torch.randn(128, HIDDEN, generator=g) * HIDDEN**-0.5).to(torch.bfloat16)
    wp = (torch.randn(GLM_HEADS, HIDDEN, generator=g) * HIDDEN**-0.5).to(torch.bfloat16)
    ix.wq_b = _Linear(wq)
    if fused:
        ix.wk_weights_proj = _Linear(torch.cat([wk, wp]))
    else:
        ix.wk, ix.weights_proj = _Linear(wk), _Linear(wp)
    ix.k_norm = LayerNorm(128, dtype=torch.float32)
    with torch.no_grad():
        ix.k_norm.weight.copy_(1 + 0.1 * torch.randn(128, generator=g))
        ix.k_norm.bias.copy_(0.1 * torch.randn(128, generator=g))
    mp = pytest.MonkeyPatch()
    mp.setattr(base, "_is_cpu", True)
    try:
        ix.rotary_emb = base.RotaryEmbedding(ROPE, ROPE, 4096, 10000, False, torch.float32)
    finally:
        mp.undo()
    return ix


def _norm_rope_kernel(ix):
    """Stands for SGLang's CUDA ``fused_k_indexer_norm_rope`` (LayerNorm, then interleaved RoPE on the first 64
    dims): the same two steps with the indexer's own ``LayerNorm`` and ``RotaryEmbedding``, composed as SGLang's
    ``_get_q_k_bf16`` composes them."""

    def fused_k_indexer_norm_rope(key_raw, weight, bias, eps, cos_sin, positions):
        assert weight is ix.k_norm.weight and bias is ix.k_norm.bias and cos_sin is ix.rotary_emb.cos_sin_cache
        key = ix.k_norm(key_raw)
        dummy_q = torch.zeros(key.shape[0], 1, ROPE, dtype=key.dtype)
        _, k_rope = ix.rotary_emb(positions, dummy_q, key[..., :ROPE])
        key[..., :ROPE].copy_(k_rope)
        return key

    return fused_k_indexer_norm_rope


def _glm_inputs(n, seed=5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, HIDDEN, generator=g).to(torch.bfloat16)
    q_lora = torch.randn(n, Q_LORA, generator=g).to(torch.bfloat16)
    return x, q_lora, torch.arange(n) * 37 + 5


#: Stands for a DSA pool with SGLang's own (FP8) IndexKeyCache: every plugin hook passes through on it.
_FP8_POOL = types.SimpleNamespace(index_key_cache=object())


@pytest.fixture()
def glm(monkeypatch):
    """``rotate_activation`` stood in (``_hadamard_rotate``), torch.compile'd SGLang helpers run eagerly, SGLang's
    Triton ``act_quant``, and the unfused reference on the same weights (SGLang's unfused indexer)."""
    from sglang.kernels.ops.quantization.act_quant_triton import act_quant
    from sglang.srt.layers.attention.dsa import dsa_indexer

    monkeypatch.setattr(dsa_indexer, "rotate_activation", _hadamard_rotate)
    no_compile = torch._dynamo.config.patch(disable=True)  # SGLang's torch.compile'd head-gate helpers, eagerly
    no_compile.__enter__()
    n = 5
    x, q_lora, positions = _glm_inputs(n)
    unfused = _glm_indexer(fused=False)
    with _forward(_FP8_POOL):  # SGLang's own unfused branch: its _maybe_rotate rotates
        query, key, _ = unfused._get_q_k_bf16(q_lora, x, positions, False, forward_batch=_batch("EXTEND"))
    q_fp8, q_scale = act_quant(query, 128, None)
    weights = unfused._get_logits_head_gate(x, q_scale)
    yield types.SimpleNamespace(act_quant=act_quant, dsa_indexer=dsa_indexer, n=n, x=x, q_lora=q_lora,
                                positions=positions, query=query, key=key, q_fp8=q_fp8, weights=weights,
                                slots=torch.tensor([3, 64, 65, 200, 7]))
    no_compile.__exit__(None, None, None)


def _only_slots_written(env, slots):
    others = torch.ones(env.cache.shape[0] * 64, dtype=torch.bool)
    others[slots] = False
    assert int(fp4_pool.read_index_k(env.cache, torch.arange(env.cache.shape[0] * 64)[others])[1].max()) == 0


@pytest.mark.parametrize("num_tokens", [None, 3])
def test_fused_q_path_rotates_queries_and_keys(env, glm, num_tokens):
    """``_fused_q_prepare_and_store`` with FP4 (eager, and the CUDA-graph prefill split op's ``num_tokens``
    slicing): the index queries fed to the scorer are bit-identical to SGLang's unfused path (rotated, then
    ``act_quant``), the stored FP4 keys are exactly the unfused path's rotated keys, and the head gates match the
    unfused ones within rel 2**-7 (the fused ``wk_weights_proj`` gives bf16 gates and ``_scale_head_gates``
    scales them in bf16; the unfused projection is fp32: two bf16 roundings)."""
    keep = glm.n if num_tokens is None else num_tokens
    ix = _glm_indexer(fused=True)
    env.cache.zero_()
    with _forward(env.pool):
        q_fp8, weights = ix._fused_q_prepare_and_store(
            glm.x, glm.q_lora, glm.positions, _batch("EXTEND", out_cache_loc=glm.slots), 0, glm.act_quant,
            num_tokens=num_tokens, enable_dual_stream=False,
        )
    assert q_fp8.dtype == torch.float8_e4m3fn and q_fp8.shape == (keep, GLM_HEADS, 128)
    assert weights.dtype == torch.float32 and weights.shape == (keep, GLM_HEADS, 1)
    assert torch.equal(q_fp8.view(torch.uint8), glm.q_fp8[:keep].view(torch.uint8))
    assert torch.allclose(weights, glm.weights[:keep], rtol=2**-7, atol=0)
    payload, scales = fp4_pool.read_index_k(env.cache, glm.slots[:keep])
    want = quantize_index_k(glm.key[:keep])
    assert torch.equal(payload, want[0]) and torch.equal(scales, want[1])
    _only_slots_written(env, glm.slots[:keep])


@pytest.mark.parametrize("num_tokens", [None, 3])
def test_fused_k_only_branch_stores_rotated_keys(env, glm, monkeypatch, num_tokens):
    """SGLang's ``_forward_cuda_k_only`` (the key-only branch: short prefill, and the split op's key-only case
    with ``num_tokens``) under fusion stores exactly the unfused path's rotated keys in the FP4 cache."""
    ix = _glm_indexer(fused=True)
    monkeypatch.setattr(glm.dsa_indexer, "fused_k_indexer_norm_rope", _norm_rope_kernel(ix), raising=False)
    keep = glm.n if num_tokens is None else num_tokens
    env.cache.zero_()
    with _forward(env.pool):
        assert ix._forward_cuda_k_only(glm.x, glm.positions, _batch("EXTEND", out_cache_loc=glm.slots), 0,
                                       glm.act_quant, None, return_indices=False, num_tokens=num_tokens) is None
    payload, scales = fp4_pool.read_index_k(env.cache, glm.slots[:keep])
    want = quantize_index_k(glm.key[:keep])
    assert torch.equal(payload, want[0]) and torch.equal(scales, want[1])
    _only_slots_written(env, glm.slots[:keep])


def test_maybe_rotate_branches_rotate_and_keep_scores(env, glm):
    """The branches through ``_get_q_k_bf16`` under fusion (two-stream decode, CUDA-graph steps the split op does
    not take): with FP4 the hooked ``_maybe_rotate`` rotates query and key, exactly SGLang's unfused values and
    exactly the rotation of what SGLang's fused path computes without FP4; the scores q.k are those of the
    unrotated q and k up to bf16 rounding of the rotated values (the rotation is orthogonal):
    |delta| <= 2**-7 * |q|_2 * |k|_2 per head and key."""
    ix = _glm_indexer(fused=True)
    batch = _batch("EXTEND")
    with _forward(_FP8_POOL):  # SGLang's fused path as it is: _maybe_rotate returns its input
        q_plain, k_plain, w_plain = ix._get_q_k_bf16(glm.q_lora, glm.x, glm.positions, False, forward_batch=batch)
    with _forward(env.pool):
        q_rot, k_rot, w_rot = ix._get_q_k_bf16(glm.q_lora, glm.x, glm.positions, False, forward_batch=batch)
    assert torch.equal(q_rot, glm.query) and torch.equal(k_rot, glm.key)
    assert torch.equal(q_rot, _hadamard_rotate(q_plain)) and torch.equal(k_rot, _hadamard_rotate(k_plain))
    assert torch.equal(w_rot, w_plain)
    assert not torch.equal(q_rot, q_plain) and not torch.equal(k_rot, k_plain)
    plain = torch.einsum("thd,sd->ths", q_plain.float(), k_plain.float())
    rotated = torch.einsum("thd,sd->ths", q_rot.float(), k_rot.float())
    bound = 2**-7 * q_plain.float().norm(dim=-1)[..., None] * k_plain.float().norm(dim=-1)
    assert torch.all((rotated - plain).abs() <= bound)


def test_fused_indexer_untouched_without_fp4(glm, monkeypatch):
    """With FP4 off (no FP4 pool built in the process), SGLang's fused indexer runs exactly as without the
    plugin: ``_fused_q_prepare_and_store`` returns what SGLang's fused q kernel returns (the same objects), its
    kernels get the unrotated projections, the key goes through SGLang's fused FP8 store, and ``_maybe_rotate``
    returns its input itself. Under every hook is SGLang's own function (``__wrapped__``)."""
    from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer
    from sglang_fp4_indexer.sglang_plugin import kv_pool as plugin_pool

    load()
    di = glm.dsa_indexer
    for name in ("_fused_q_prepare_and_store", "_fused_k_prepare_and_store", "_maybe_rotate"):
        assert Indexer.__dict__[name].__wrapped__.__module__ == di.__name__
    seen = {}
    q_out = (torch.zeros(1), torch.ones(1))

    def fused_q(q, weights_raw, scale, cos_sin, positions):
        """Stands for SGLang's CUDA ``fused_q_indexer_rope_first_quant``: records its inputs."""
        seen["q"] = (q.clone(), weights_raw.clone(), scale, cos_sin, positions.clone())
        return q_out

    def fused_k_store(key_raw, buf, loc, weight, bias, eps, cos_sin, positions, page_size):
        """Stands for SGLang's CUDA ``fused_k_indexer_norm_rope_store`` (its FP8 write): records its inputs."""
        seen["k"] = (key_raw.clone(), buf, loc.clone(), positions.clone(), page_size)

    monkeypatch.setattr(di, "fused_q_indexer_rope_first_quant", fused_q, raising=False)
    monkeypatch.setattr(di, "fused_k_indexer_norm_rope_store", fused_k_store, raising=False)
    monkeypatch.setattr(di, "can_use_dsa_fused_store", lambda *a: True)
    buf = torch.zeros(4, 64 * 132, dtype=torch.uint8)
    fp8_pool = types.SimpleNamespace(index_key_cache=object(), index_page_size=64,
                                     get_index_k_with_scale_buffer=lambda layer_id: buf)
    saved = dict(plugin_pool._state)
    plugin_pool.reset_state()
    try:
        ix = _glm_indexer(fused=True)
        with _forward(fp8_pool):
            out = ix._fused_q_prepare_and_store(glm.x, glm.q_lora, glm.positions,
                                                _batch("DECODE", out_cache_loc=glm.slots), 0, glm.act_quant,
                                                num_tokens=3, enable_dual_stream=False)
            assert ix._maybe_rotate(glm.query) is glm.query
    finally:
        plugin_pool._state.update(saved)
    assert out is q_out
    q = ix.wq_b(glm.q_lora)[0].view(-1, GLM_HEADS, 128)[:3]
    kw = ix.wk_weights_proj(glm.x)[0]
    assert torch.equal(seen["q"][0], q) and torch.equal(seen["q"][1], kw[:3, 128:])
    assert seen["q"][2] == 128**-0.5 * GLM_HEADS**-0.5 and torch.equal(seen["q"][4], glm.positions[:3])
    assert torch.equal(seen["k"][0], kw[:3, :128]) and seen["k"][1] is buf
    assert torch.equal(seen["k"][2], glm.slots[:3]) and seen["k"][4] == 64
