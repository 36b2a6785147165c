"""The FP4 index-key cache in SGLang 0.5.23's hierarchical cache: the host pool SGLang builds for an FP4 DSA
pool holds 68-byte tokens (``64 x 68`` bytes per page and layer), and its device -> host -> device copies
give back every byte, skip-top-k layers and a packed MTP draft layer included.

The host pools are SGLang's own, built by its HiCache assembler (``prepare_host_pool_config`` /
``build_host_pool_group``) from the pool's ``host_pool_decls()``, on CPU tensors. Two CUDA-only pieces
stand in: ``cudaHostRegister`` of the host buffers (page pinning: no bytes change) and sgl-kernel's
``transfer_kv_*direct*`` ops, which the 'direct' io backend calls with SGLang's page indices and buffers;
the stand-ins copy whole rows with torch indexing and refuse rows of different widths (what the CUDA
ops would copy past).
"""

from __future__ import annotations

import pytest
import torch

from plugin_support import DSV32, published, stand_in_kvc
from plugin_support import plugin  # noqa: F401 (the fixture)
from plugin_support import server_args as _server_args
from sglang_fp4_indexer import pool as fp4_pool
from sglang_fp4_indexer.format import quantize_index_k

pytestmark = pytest.mark.sglang

#: DeepSeek-V3.2's geometry; layers 1 and 3 reuse the previous layer's top-k and keep no index keys
#: (SGLang's ``index_topk_pattern``, "S" for shared).
SKIPPING = {**DSV32, "index_topk_pattern": "FSFS"}
#: One 64-token FP4 page of one layer: 64 tokens x (64 payload + 4 scale bytes), docs/format.md.
FP4_PAGE = 64 * (64 + 4)
#: SGLang's FP8 page: 64 tokens x (128 e4m3 bytes + one fp32 scale).
FP8_PAGE = 64 * (128 + 4)
TOKENS = 256  # 5 device pages (SGLang adds one)


def _rows_equal(dst, src, what):
    if dst.shape[1:] != src.shape[1:]:
        raise AssertionError(f"{what}: rows of {tuple(src.shape[1:])} copied into rows of {tuple(dst.shape[1:])}")


def _transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
    """Stands in for sgl-kernel's ``transfer_kv_direct``: per layer, ``page_size``-row blocks by index."""
    rows = torch.arange(page_size)
    src_rows = (src_indices[:, None] * page_size + rows).flatten()
    dst_rows = (dst_indices[:, None] * page_size + rows).flatten()
    for src, dst in zip(src_layers, dst_layers, strict=True):
        _rows_equal(dst, src, "transfer_kv_direct")
        dst[dst_rows] = src[src_rows]


def _transfer_kv_all_layer_direct_lf_pf(src_ptrs, dst_ptrs, src_indices, dst_indices, page_size):
    """Stands in for sgl-kernel's layer-first -> page-first copy: ``dst[page, layer]`` from ``src[layer][row]``."""
    assert page_size == 1
    (dst,) = dst_ptrs
    for layer, src in enumerate(src_ptrs):
        _rows_equal(dst[:, layer, 0], src, "transfer_kv_all_layer_direct_lf_pf")
        dst[dst_indices, layer, 0] = src[src_indices]


def _transfer_kv_per_layer_direct_pf_lf(src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id, page_size):
    """Stands in for sgl-kernel's page-first -> layer-first copy of one layer."""
    assert page_size == 1
    (src,), (dst,) = src_ptrs, dst_ptrs
    _rows_equal(dst, src[:, layer_id, 0], "transfer_kv_per_layer_direct_pf_lf")
    dst[dst_indices] = src[src_indices, layer_id, 0]


@pytest.fixture()
def cpu_host_pools(monkeypatch):
    """SGLang's host pools on this machine: no page pinning, the torch stand-ins for the direct copy ops."""
    from sglang.srt.mem_cache.pool_host import common, dsa

    monkeypatch.setattr(common, "_cuda_host_register", lambda *a, **k: None)
    for fn in (_transfer_kv_direct, _transfer_kv_all_layer_direct_lf_pf, _transfer_kv_per_layer_direct_pf_lf):
        monkeypatch.setattr(dsa, fn.__name__[1:], fn, raising=False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)


def _pools(flags, *, draft=False, **memory):
    """SGLang's target DSA pool (4 layers, SKIPPING) built through the plugin's gate, its MTP draft's (one
    layer) when asked, and the HiCache host pool group SGLang assembles for them (the draft packed into the
    target's index host pool, as SGLang does for an MTP draft sharing the target's pages)."""
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import (
        build_host_pool_group,
        prepare_host_pool_config,
    )
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

    def build(kvc):
        return KVCacheConfigurator._build_dsa_kv_pool(
            kvc, max_total_num_tokens=TOKENS, max_running_requests=4, dsa_pool_class=DSATokenToKVPool)

    with published(page_size=64, enable_hierarchical_cache=True, **memory):
        args = _server_args("--enable-hierarchical-cache", *flags)
        target = build(stand_in_kvc(SKIPPING, args, num_layers=4))
        drafts = (build(stand_in_kvc(SKIPPING, args, num_layers=1, is_draft_worker=True)),) if draft else ()
        config = prepare_host_pool_config(
            decls=target.host_pool_decls(), full_layer_mapping={i: i for i in range(4)},
            transfer_layer_id_max=4, transfer_page_size=64, packed_draft_device_pools=drafts)
        group = build_host_pool_group(config=config)
    return target, drafts, group.get_pool(PoolName.INDEXER)


def _fill(buffers, seed):
    """Quantized random keys in every slot of every non-empty FP4 buffer (the store's bytes)."""
    g = torch.Generator().manual_seed(seed)
    for buf in buffers:
        if buf.shape[0] == 0:
            continue
        slots = torch.arange(buf.shape[0] * 64)
        payload, scales = quantize_index_k(torch.randn(len(slots), 128, generator=g))
        page, row = slots // 64, slots % 64
        fp4_pool.payload_plane(buf)[page, row] = payload
        fp4_pool.scale_plane(buf)[page, fp4_pool.scale_row(row)] = scales


def test_host_index_pool_holds_68_byte_tokens(plugin, cpu_host_pools):
    target, _, host = _pools(["--enable-fp4-indexer"])
    assert plugin.is_fp4_pool(target)
    assert target.skip_topk_layers == [False, True, False, True]
    assert host.decl.storage_info.bytes_per_token_per_layer == 68
    assert host.indexer_page_stride_size == FP4_PAGE
    # SGLang's host layers: only the layers that hold index keys (0 and 2), one host page per 64 slots.
    assert host.layer_num == 2 and host._live_target_layers == [0, 2]
    assert host.index_k_with_scale_buffer.shape[1:] == (2, 1, FP4_PAGE)  # page_first, SGLang's default
    assert host.get_size_per_token() == 2 * 68


def test_without_the_flag_the_host_pool_is_sglangs(plugin, cpu_host_pools):
    target, _, host = _pools([])
    assert not plugin.is_fp4_pool(target)
    assert host.decl.storage_info.bytes_per_token_per_layer == 132
    assert host.indexer_page_stride_size == FP8_PAGE


@pytest.mark.parametrize("layout", ["layer_first", "page_first_direct"])
def test_device_host_device_round_trip_is_byte_exact(plugin, cpu_host_pools, layout):
    """Pages 1 and 3 of every index layer (and of the packed MTP draft layer) go to host pages 4 and 2
    through SGLang's ``backup_from_device_all_layer``, the device pages are overwritten, and SGLang's
    ``load_to_device_per_layer`` brings back exactly the bytes that were there; pages not copied keep
    the bytes written over them."""
    target, (draft,), host = _pools(["--enable-fp4-indexer"], draft=True,
                                    hicache_mem_layout=layout, hicache_io_backend="direct")
    assert plugin.is_fp4_pool(draft) and host.layer_num == 3  # layers 0 and 2, then the draft's
    buffers = list(target.index_k_with_scale_buffer) + list(draft.index_k_with_scale_buffer)
    _fill(buffers, seed=1)
    before = [buf.clone() for buf in buffers]
    device_slots = torch.cat([torch.arange(64, 128), torch.arange(192, 256)])  # pages 1 and 3
    host_slots = torch.cat([torch.arange(256, 320), torch.arange(128, 192)])   # host pages 4 and 2
    host.backup_from_device_all_layer(target, host_slots, device_slots, "direct")
    _fill(buffers, seed=2)  # the device pages are reused by other requests
    overwritten = [buf.clone() for buf in buffers]
    for layer in range(4):  # SGLang's loader walks every device layer; skip-top-k layers have no host layer
        host.load_to_device_per_layer(target, host_slots, device_slots, layer, "direct")
    host.load_to_device_per_layer(draft, host_slots, device_slots, target.layer_num, "direct", is_draft=True)
    for buf, old, new in zip(buffers, before, overwritten):
        if buf.shape[0] == 0:
            continue
        assert torch.equal(buf[[1, 3]], old[[1, 3]])
        assert torch.equal(buf[[0, 2, 4]], new[[0, 2, 4]])
    # The keys read back decode to what was stored (the first layer, slot 70: page 1, row 6).
    payload, scales = fp4_pool.read_index_k(buffers[0], torch.tensor([70]))
    want_payload, want_scales = fp4_pool.read_index_k(before[0], torch.tensor([70]))
    assert torch.equal(payload, want_payload) and torch.equal(scales, want_scales)
