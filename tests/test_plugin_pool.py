"""The FP4 index-key cache inside SGLang 0.5.23's DSA pool, and SGLang's own
sizing functions counting 68 bytes per index cell with FP4 (132 without)."""

from __future__ import annotations

import pytest
import torch

from plugin_support import DSV32, GLM5, GLM52, published, stand_in_kvc
from plugin_support import plugin  # noqa: F401 (the fixture)
from plugin_support import server_args as _server_args
from sglang_fp4_indexer import pool as fp4_pool
from sglang_fp4_indexer.format import quantize_index_k

pytestmark = pytest.mark.sglang


@pytest.mark.parametrize("cfg", [DSV32, GLM5], ids=["deepseek-v3.2", "glm-5"])
def test_sglang_sizing_counts_68_bytes_with_fp4(plugin, cfg):
    from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator

    layers = cfg["num_hidden_layers"]
    conf = object.__new__(DefaultPoolConfigurator)  # the sizing methods read only kvc
    with published(page_size=64):
        fp8 = stand_in_kvc(cfg, _server_args())
        fp4 = stand_in_kvc(cfg, _server_args("--enable-fp4-indexer"))
        assert conf._compute_dsa_indexer_cell_size(kvc=fp8, num_layers=layers) == layers * 132
        assert conf._compute_dsa_indexer_cell_size(kvc=fp4, num_layers=layers) == layers * 68
        # The EAGLE/MTP draft's index share goes through the same function.
        assert conf._compute_dsa_indexer_cell_size(kvc=fp4, num_layers=1, allocate_all_layers=True) == 68
        # The whole per-token cell that sets max_total_num_tokens moves by exactly the index bytes.
        cell_fp8 = conf._compute_cell_size(fp8, layers)
        cell_fp4 = conf._compute_cell_size(fp4, layers)
    assert cell_fp8 - cell_fp4 == layers * (132 - 68)
    # The same ratio as the core capacity model.
    kv = (cell_fp8 - layers * 132) // layers
    cap = fp4_pool.capacity(10**12, kv, layers)
    assert cap.bytes_per_token_fp8 == cell_fp8 and cap.bytes_per_token_fp4 == cell_fp4


#: Flags the gate refuses FP4 for (a HiCache storage backend) that leave SGLang's sizing as it is.
_STORAGE = ("--enable-hierarchical-cache", "--hicache-storage-backend", "file")


def test_sizing_refused_keeps_132(plugin):
    from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator

    conf = object.__new__(DefaultPoolConfigurator)
    with published(page_size=64, enable_hierarchical_cache=True, hicache_storage_backend="file"):
        kvc = stand_in_kvc(DSV32, _server_args("--enable-fp4-indexer", *_STORAGE))
        assert conf._compute_dsa_indexer_cell_size(kvc=kvc, num_layers=61) == 61 * 132


def _build(kvc, tokens=256):
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

    return KVCacheConfigurator._build_dsa_kv_pool(
        kvc, max_total_num_tokens=tokens, max_running_requests=4, dsa_pool_class=DSATokenToKVPool
    )


def test_build_pool_fp4_and_fp8(plugin):
    with published(page_size=64):
        p4 = _build(stand_in_kvc(DSV32, _server_args("--enable-fp4-indexer"), num_layers=2))
        assert plugin.is_fp4_pool(p4) and plugin.fp4_active()
        # SGLang's IndexKeyCache: num_pages = (size + page + 1) // page
        assert [tuple(b.shape) for b in p4.index_key_cache.buffer] == [(5, 64 * 68)] * 2
        assert all(b.dtype == torch.uint8 for b in p4.index_k_with_scale_buffer)
        assert p4.get_index_k_with_scale_buffer(0).data_ptr() == p4.index_key_cache.buffer[0].data_ptr()
        plugin.reset_state()
        p8 = _build(stand_in_kvc(DSV32, _server_args(), num_layers=2))
        assert not plugin.is_fp4_pool(p8) and not plugin.fp4_active()
        assert [tuple(b.shape) for b in p8.index_key_cache.buffer] == [(5, 64 * 132)] * 2
        assert p8.get_kv_size_bytes() - p4.get_kv_size_bytes() == 2 * 5 * 64 * (132 - 68)


def test_one_process_never_mixes_layouts(plugin):
    with published(page_size=64):
        _build(stand_in_kvc(DSV32, _server_args("--enable-fp4-indexer"), num_layers=2))
        refused = stand_in_kvc(DSV32, _server_args("--enable-fp4-indexer", *_STORAGE), num_layers=2)
        with pytest.raises(RuntimeError, match="cannot mix FP4 and FP8"):
            _build(refused)
        plugin.reset_state()
        first = _build(stand_in_kvc(DSV32, _server_args(), num_layers=2))  # FP8 first
        later = _build(stand_in_kvc(DSV32, _server_args("--enable-fp4-indexer"), num_layers=2))
        assert not plugin.is_fp4_pool(first) and not plugin.is_fp4_pool(later)


def _fp4_pool(plugin, tokens=256):
    with published(page_size=64):
        return _build(stand_in_kvc(DSV32, _server_args("--enable-fp4-indexer"), num_layers=2), tokens)


def _fill(cache, slots, seed):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(len(slots), 128, generator=g)
    payload, scales = quantize_index_k(k)
    page, row = slots // 64, slots % 64
    fp4_pool.payload_plane(cache)[page, row] = payload
    fp4_pool.scale_plane(cache)[page, fp4_pool.scale_row(row)] = scales
    return payload, scales


def test_move_copies_tokens_not_pages(plugin):
    p = _fp4_pool(plugin)
    src = torch.tensor([3, 70, 130])
    dst = torch.tensor([200, 5, 64])
    expected = []
    for layer, buf in enumerate(p.index_key_cache.buffer):
        _fill(buf, torch.arange(0, 5 * 64), seed=layer)
        expected.append(buf.clone())
    moved = [fp4_pool.read_index_k(buf, src) for buf in p.index_key_cache.buffer]
    p.move_kv_cache(dst, src)  # SGLang's DSATokenToKVPool.move_kv_cache -> IndexKeyCache.move
    for layer, buf in enumerate(p.index_key_cache.buffer):
        payload, scales = fp4_pool.read_index_k(buf, dst)
        assert torch.equal(payload, moved[layer][0]) and torch.equal(scales, moved[layer][1])
        keep = torch.ones(5 * 64, dtype=torch.bool)
        keep[dst] = False
        others = torch.arange(5 * 64)[keep]
        before = fp4_pool.read_index_k(expected[layer], others)
        after = fp4_pool.read_index_k(buf, others)
        assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])


def test_move_is_sync_free_and_matches_the_checked_copy(plugin):
    """``Fp4IndexKeyCache.move`` reads no tensor value on the host (no ``int()``/``bool()``/``.item()``: each is a
    GPU sync), gives the bytes of the checked ``pool.copy_slots`` on in-range pairs, and skips a pair with a slot
    outside the cache instead of raising (no sync to find out)."""
    from test_pool import _forbid_host_reads

    p = _fp4_pool(plugin)
    for layer, buf in enumerate(p.index_key_cache.buffer):
        _fill(buf, torch.arange(0, 5 * 64), seed=20 + layer)
    src = torch.tensor([3, 70, 130, 319, 7])
    dst = torch.tensor([200, 5, 64, 1, 5 * 64])  # the last pair's destination is past the cache
    want = []
    for buf in p.index_key_cache.buffer:
        ref = buf.clone()
        fp4_pool.copy_slots(ref, dst[:4], src[:4])  # the checked copy, on the in-range pairs
        want.append(ref)
    with pytest.MonkeyPatch.context() as mp:
        _forbid_host_reads(mp)
        p.index_key_cache.move(dst, src)
    for buf, ref in zip(p.index_key_cache.buffer, want):
        assert torch.equal(buf, ref)


def test_cpu_copy_round_trip_and_state_buf_infos(plugin, monkeypatch):
    # SGLang's cpu_copy/load_cpu_copy call torch.cuda.synchronize(); there is no CUDA here.
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    p = _fp4_pool(plugin)
    cache = p.index_key_cache
    for layer, buf in enumerate(cache.buffer):
        _fill(buf, torch.arange(0, 5 * 64), seed=10 + layer)
    saved_bytes = [buf.clone() for buf in cache.buffer]
    indices = torch.arange(64, 3 * 64)  # pages 1 and 2, as a retracted request's slots
    copy = cache.cpu_copy(indices)
    for buf in cache.buffer:
        buf[1:3] = 0
    cache.load_cpu_copy(copy, indices)
    for buf, saved in zip(cache.buffer, saved_bytes):
        assert torch.equal(buf, saved)
    ptrs, lens, items = p.get_state_buf_infos()
    assert lens == [5 * 64 * 68] * 2 and items == [64 * 68] * 2
    assert ptrs == [b.data_ptr() for b in cache.buffer]


def test_fp8_entry_points_refuse(plugin):
    p = _fp4_pool(plugin)
    with pytest.raises(RuntimeError, match="FP8 index-key writer"):
        p.set_index_k_scale_buffer(0, torch.tensor([1]), torch.zeros(1, 128), torch.ones(1))
    with pytest.raises(RuntimeError, match="FP8 index-key gather"):
        p.get_index_k_scale_buffer(0, torch.tensor([1]), torch.zeros(1, 1, dtype=torch.int32), 1, 1)


def test_copy_slots_core():
    cache = fp4_pool.allocate_index_k_cache(3)
    _fill(cache, torch.arange(3 * 64), seed=3)
    before = cache.clone()
    fp4_pool.copy_slots(cache, torch.tensor([0, 129]), torch.tensor([65, 2]))
    for d, s in ((0, 65), (129, 2)):
        a = fp4_pool.read_index_k(cache, torch.tensor([d]))
        b = fp4_pool.read_index_k(before, torch.tensor([s]))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    changed = (cache != before).any(dim=1)
    assert changed.tolist() == [True, False, True]
    fp4_pool.copy_slots(cache, torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long))
    with pytest.raises(ValueError, match="lengths differ"):
        fp4_pool.copy_slots(cache, torch.tensor([1, 2]), torch.tensor([1]))
    with pytest.raises(ValueError, match="past the cache"):
        fp4_pool.copy_slots(cache, torch.tensor([3 * 64]), torch.tensor([0]))
    with pytest.raises(ValueError, match="negative"):
        fp4_pool.copy_slots(cache, torch.tensor([-1]), torch.tensor([0]))


def test_capacity_with_fewer_index_layers():
    full = fp4_pool.capacity(10**9)
    assert fp4_pool.capacity(10**9, num_index_layers=61) == full
    part = fp4_pool.capacity(10**9, 656, 61, num_index_layers=31)
    assert part.bytes_per_token_fp8 == 61 * 656 + 31 * 132
    assert part.bytes_per_token_fp4 == 61 * 656 + 31 * 68
    with pytest.raises(ValueError, match="num_index_layers"):
        fp4_pool.capacity(10**9, num_index_layers=62)


def test_interleaved_rope_model_gets_fp4_with_sglangs_fusion_on(plugin, monkeypatch, caplog):
    """GLM-5.2 (interleaved indexer RoPE): SGLang's fused indexer skips the Hadamard rotation, the plugin's hooks
    apply it, so the pool is FP4 with SGLANG_DISABLE_DSA_INDEXER_FUSION unset (no warning) and with it set."""
    import logging

    from sglang_fp4_indexer import gate

    monkeypatch.delenv("SGLANG_DISABLE_DSA_INDEXER_FUSION", raising=False)
    record = _server_args("--enable-fp4-indexer")
    logging.getLogger().addHandler(caplog.handler)  # prepare_server_args' basicConfig(force=True) removed it
    try:
        with published(page_size=64), caplog.at_level(logging.WARNING, logger="sglang_fp4_indexer"):
            p = _build(stand_in_kvc(GLM52, record, num_layers=2))
            _build(stand_in_kvc(GLM52, record, num_layers=1, is_draft_worker=True))  # the MTP draft
    finally:
        logging.getLogger().removeHandler(caplog.handler)
    assert plugin.is_fp4_pool(p) and plugin.fp4_active()
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    plugin.reset_state()
    gate.reset_reports()
    monkeypatch.setenv("SGLANG_DISABLE_DSA_INDEXER_FUSION", "1")
    with published(page_size=64):
        assert plugin.is_fp4_pool(_build(stand_in_kvc(GLM52, record, num_layers=2)))


def test_half_applied_plugin_keeps_fp8(plugin, monkeypatch, caplog):
    """If SGLang could not apply one of the hooks, no FP4 pool is built (an FP8 reader would see FP4 bytes)."""
    import logging

    from sglang.srt.plugins.hook_registry import HookRegistry

    target = "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer._get_topk_paged"
    monkeypatch.setattr(HookRegistry, "_patched", HookRegistry._patched - {target})
    record = _server_args("--enable-fp4-indexer")
    logging.getLogger().addHandler(caplog.handler)  # prepare_server_args' basicConfig(force=True) removed it
    try:
        with published(page_size=64), caplog.at_level(logging.WARNING, logger="sglang_fp4_indexer"):
            p = _build(stand_in_kvc(DSV32, record, num_layers=2))
    finally:
        logging.getLogger().removeHandler(caplog.handler)
    assert not plugin.is_fp4_pool(p) and not plugin.fp4_active()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and target in warnings[0]
    # ... and SGLang's sizing keeps counting 132 bytes, so the FP8 pool fits its budget.
    from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator

    plugin.reset_state()
    with published(page_size=64):
        conf = object.__new__(DefaultPoolConfigurator)
        assert conf._compute_dsa_indexer_cell_size(kvc=stand_in_kvc(DSV32, record), num_layers=61) == 61 * 132
