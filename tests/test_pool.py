"""Page math, plane views and capacity accounting (pool.py).

Oracles: byte offsets written out by hand from DESIGN.md section 3 (page =
``[payload plane: page_size rows x 64 B][scale plane: page_size rows x 4 B]``),
Python's ``divmod``, and exact integer arithmetic for the capacity model.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from sglang_fp4_indexer import pool

GIB = 1 << 30


def _payload_offset(row: int, byte: int, page_size: int) -> int:
    """Byte of a page holding payload byte ``byte`` of the token at ``row``."""
    return row * 64 + byte


def _scale_offset(row: int, group: int, page_size: int) -> int:
    """Byte of a page holding the scale of group ``group`` of the token at ``row``."""
    return page_size * 64 + pool.scale_row(row, page_size) * 4 + group


def _random_cache(num_pages: int, page_size: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (num_pages, page_size * 68), dtype=torch.uint8, generator=gen)


def test_constants():
    assert pool.FP4_INDEX_BYTES_PER_TOKEN == 68
    assert pool.FP8_INDEX_BYTES_PER_TOKEN == 132
    assert pool.PAGE_SIZE == 64
    # FlashMLA FP8 KV: 512 e4m3 latent + 4 fp32 scales + 64 bf16 RoPE dims
    assert pool.DEEPSEEK_V32_FP8_MLA_KV_BYTES == 656
    assert pool.DEEPSEEK_V32_NUM_LAYERS == 61


@pytest.mark.parametrize("page_size", [1, 16, 64, 128])
def test_page_bytes(page_size):
    assert pool.page_bytes(page_size) == page_size * (64 + 4)
    assert pool.page_bytes() == 64 * 68


@pytest.mark.parametrize("bad", [0, -64, 64.0, "64", None])
def test_page_bytes_rejects_bad_page_size(bad):
    with pytest.raises(ValueError, match="page_size"):
        pool.page_bytes(bad)


@pytest.mark.parametrize("page_size", [16, 64])
def test_scale_row_is_a_permutation_of_the_rows(page_size):
    rows = [pool.scale_row(r, page_size) for r in range(page_size)]
    assert sorted(rows) == list(range(page_size))
    # NVIDIA layout: identity (DESIGN section 3); on tensors too
    assert rows == list(range(page_size))
    t = torch.arange(page_size)
    assert torch.equal(pool.scale_row(t, page_size), t)


@pytest.mark.parametrize("page_size", [16, 64])
def test_plane_views_alias_the_right_bytes(page_size):
    num_pages = 3
    cache = _random_cache(num_pages, page_size)
    payload = pool.payload_plane(cache, page_size)
    scales = pool.scale_plane(cache, page_size)
    assert payload.shape == (num_pages, page_size, 64) and payload.dtype == torch.uint8
    assert scales.shape == (num_pages, page_size, 4) and scales.dtype == torch.uint8
    # views, not copies
    assert payload.untyped_storage().data_ptr() == cache.untyped_storage().data_ptr()
    assert scales.untyped_storage().data_ptr() == cache.untyped_storage().data_ptr()
    for p in range(num_pages):
        for r in range(page_size):
            for b in range(64):
                assert payload[p, r, b] == cache[p, _payload_offset(r, b, page_size)]
            for g in range(4):
                assert scales[p, pool.scale_row(r, page_size), g] == cache[p, _scale_offset(r, g, page_size)]
    # writes through the views land in the buffer, and the two planes tile each page exactly once
    c2 = torch.zeros_like(cache)
    pool.payload_plane(c2, page_size).fill_(1)
    pool.scale_plane(c2, page_size).add_(2)
    assert set(c2.unique().tolist()) == {1, 2}
    assert int((c2 == 1).sum()) == num_pages * page_size * 64
    assert int((c2 == 2).sum()) == num_pages * page_size * 4
    assert (c2[:, : page_size * 64] == 1).all() and (c2[:, page_size * 64 :] == 2).all()


def test_plane_views_reject_bad_buffers():
    with pytest.raises(ValueError, match="cache"):
        pool.payload_plane(torch.zeros(2, 64 * 68, dtype=torch.int8))
    with pytest.raises(ValueError, match="cache"):
        pool.scale_plane(torch.zeros(2, 64 * 68 - 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="page_size"):
        pool.scale_plane(torch.zeros(2, 64 * 68, dtype=torch.uint8), page_size=0)


def test_slot_to_page_row_matches_divmod():
    gen = torch.Generator().manual_seed(3)
    for page_size in (1, 16, 64):
        slots = torch.randint(0, 1 << 20, (200,), generator=gen)
        for dtype in (torch.int32, torch.int64):
            page, row = pool.slot_to_page_row(slots.to(dtype), page_size)
            assert page.dtype == torch.int64 and row.dtype == torch.int64
            assert [divmod(s, page_size) for s in slots.tolist()] == list(zip(page.tolist(), row.tolist()))
    page, row = pool.slot_to_page_row(torch.tensor([[0, 63], [64, 130]]))
    assert page.tolist() == [[0, 0], [1, 2]] and row.tolist() == [[0, 63], [0, 2]]


def test_slot_to_page_row_rejects_bad_slots():
    with pytest.raises(ValueError, match="slots"):
        pool.slot_to_page_row(torch.tensor([3, -1]))
    with pytest.raises(ValueError, match="slots"):
        pool.slot_to_page_row(torch.tensor([3.0]))
    with pytest.raises(ValueError, match="slots"):
        pool.slot_to_page_row(torch.tensor([True]))


def test_check_cache():
    pool.check_cache(torch.zeros(3, 64 * 68, dtype=torch.uint8))
    pool.check_cache(torch.zeros(0, 16 * 68, dtype=torch.uint8), page_size=16)
    with pytest.raises(TypeError, match="cache"):
        pool.check_cache([[0] * (64 * 68)])
    with pytest.raises(ValueError, match="cache: expected uint8"):
        pool.check_cache(torch.zeros(3, 64 * 68, dtype=torch.float32))
    with pytest.raises(ValueError, match="cache: expected shape"):
        pool.check_cache(torch.zeros(3 * 64 * 68, dtype=torch.uint8))
    with pytest.raises(ValueError, match="cache: expected shape"):
        pool.check_cache(torch.zeros(3, 64 * 68, dtype=torch.uint8), page_size=32)
    with pytest.raises(ValueError, match="cache: expected a contiguous"):
        pool.check_cache(torch.zeros(3, 2 * 64 * 68, dtype=torch.uint8)[:, ::2])
    with pytest.raises(ValueError, match="kv: expected"):
        pool.check_cache(torch.zeros(3, 5, dtype=torch.uint8), name="kv")


def test_allocate_index_k_cache():
    c = pool.allocate_index_k_cache(5)
    assert c.shape == (5, 64 * 68) and c.dtype == torch.uint8 and not c.any()
    assert pool.allocate_index_k_cache(2, page_size=16).shape == (2, 16 * 68)
    assert pool.allocate_index_k_cache(0).shape == (0, 64 * 68)
    with pytest.raises(ValueError, match="num_pages"):
        pool.allocate_index_k_cache(-1)
    with pytest.raises(ValueError, match="num_pages"):
        pool.allocate_index_k_cache(2.0)
    with pytest.raises(ValueError, match="page_size"):
        pool.allocate_index_k_cache(2, page_size=0)


@pytest.mark.parametrize("page_size", [16, 64])
def test_read_index_k_returns_the_tokens_bytes(page_size):
    num_pages = 4
    cache = _random_cache(num_pages, page_size, seed=page_size)
    gen = torch.Generator().manual_seed(7)
    slots = torch.randperm(num_pages * page_size, generator=gen)[:50]
    payload, scales = pool.read_index_k(cache, slots, page_size)
    assert payload.shape == (50, 64) and scales.shape == (50, 4)
    for i, s in enumerate(slots.tolist()):
        p, r = divmod(s, page_size)
        assert payload[i].tolist() == [int(cache[p, _payload_offset(r, b, page_size)]) for b in range(64)]
        assert scales[i].tolist() == [int(cache[p, _scale_offset(r, g, page_size)]) for g in range(4)]


def test_read_index_k_rejects_bad_slots():
    cache = _random_cache(2, 64)
    with pytest.raises(ValueError, match="slots"):
        pool.read_index_k(cache, torch.tensor([0, 128]))
    with pytest.raises(ValueError, match="slots"):
        pool.read_index_k(cache, torch.tensor([-1]))
    with pytest.raises(ValueError, match="cache"):
        pool.read_index_k(cache[:, :100].contiguous(), torch.tensor([0]))
    empty_p, empty_s = pool.read_index_k(cache, torch.zeros(0, dtype=torch.int64))
    assert empty_p.shape == (0, 64) and empty_s.shape == (0, 4)


def test_capacity_deepseek_v32_gains_8_8_percent():
    budget = 100 * GIB
    cap = pool.capacity(budget)  # defaults: DeepSeek-V3.2, FP8 MLA KV, 61 layers
    assert cap.bytes_per_token_fp8 == 61 * (656 + 132)
    assert cap.bytes_per_token_fp4 == 61 * (656 + 68)
    assert cap.tokens_fp8 == budget // (61 * 788)
    assert cap.tokens_fp4 == budget // (61 * 724)
    exact = Fraction(656 + 132, 656 + 68) - 1
    assert abs(cap.gain - float(exact)) < 1e-5  # integer floor at this budget
    assert abs(cap.gain - 0.088) < 0.001  # the +8.8 % of issue 2, to 0.1 %


def test_capacity_general_and_edge_cases():
    cap = pool.capacity(10**9, kv_bytes_per_token_per_layer=0, num_layers=1)
    assert cap.tokens_fp8 == 10**9 // 132 and cap.tokens_fp4 == 10**9 // 68
    cap = pool.capacity(7 * 788 * 61 - 1)
    assert cap.tokens_fp8 == 6  # floor, not round
    zero = pool.capacity(0)
    assert zero.tokens_fp8 == 0 and zero.tokens_fp4 == 0 and zero.gain == float("inf")


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(memory_bytes=-1), "memory_bytes"),
        (dict(memory_bytes=GIB, num_layers=0), "num_layers"),
        (dict(memory_bytes=GIB, kv_bytes_per_token_per_layer=-1), "bytes per token"),
        (dict(memory_bytes=GIB, index_bytes_fp8=0), "bytes per token"),
        (dict(memory_bytes=GIB, index_bytes_fp4=-68), "bytes per token"),
    ],
)
def test_capacity_rejects_bad_inputs(kwargs, name):
    with pytest.raises(ValueError, match=name):
        pool.capacity(**kwargs)
