"""Page math, plane views and capacity accounting (pool.py).

Oracles: byte offsets written out by hand from docs/design.md, The index-key format (page =
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
    # NVIDIA layout: identity (docs/design.md, The index-key format); on tensors too
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
    assert abs(cap.gain - 0.088) < 0.001  # the +8.8 % of docs/user-guide.md, "Memory effect", to 0.1 %


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


def _move_oracle(cache: torch.Tensor, dst: list[int], src: list[int], page_size: int) -> torch.Tensor:
    """Byte-level oracle of a token move: every source token's 64 + 4 bytes read first, then written at its
    destination; a pair with a slot outside the cache is skipped."""
    out = cache.clone()
    slots = cache.shape[0] * page_size
    taken = []
    for d, s in zip(dst, src):
        if 0 <= d < slots and 0 <= s < slots:
            sp, sr = divmod(s, page_size)
            taken.append((d, [int(cache[sp, _payload_offset(sr, i, page_size)]) for i in range(64)],
                          [int(cache[sp, _scale_offset(sr, g, page_size)]) for g in range(4)]))
    for d, payload, scales in taken:
        dp, dr = divmod(d, page_size)
        for i, v in enumerate(payload):
            out[dp, _payload_offset(dr, i, page_size)] = v
        for g, v in enumerate(scales):
            out[dp, _scale_offset(dr, g, page_size)] = v
    return out


@pytest.mark.parametrize("page_size", [64, 16])
def test_copy_slots_checked_and_unchecked_agree_on_in_range_pairs(page_size):
    cache = _random_cache(4, page_size, seed=5)
    gen = torch.Generator().manual_seed(6)
    slots = 4 * page_size
    src = torch.randint(0, slots, (20,), generator=gen)
    dst = torch.randperm(slots, generator=gen)[:20]  # distinct destinations (some of them also sources)
    want = _move_oracle(cache, dst.tolist(), src.tolist(), page_size)
    checked, unchecked = cache.clone(), cache.clone()
    pool.copy_slots(checked, dst, src, page_size)
    pool.copy_slots(unchecked, dst.to(torch.int32), src.to(torch.int32), page_size, check=False)
    assert torch.equal(checked, want) and torch.equal(unchecked, want)


def test_copy_slots_unchecked_skips_pairs_with_an_out_of_range_slot():
    cache = _random_cache(3, 64, seed=7)
    dst = [5, -1, 70, 191, 192, 130, 3]
    src = [100, 9, -4, 2, 8, 10_000, 190]
    got = cache.clone()
    pool.copy_slots(got, torch.tensor(dst), torch.tensor(src), check=False)
    want = _move_oracle(cache, dst, src, 64)
    assert torch.equal(got, want)
    changed = {s for s in range(3 * 64) if not torch.equal(pool.read_index_k(got, torch.tensor([s]))[0],
                                                             pool.read_index_k(cache, torch.tensor([s]))[0])}
    assert changed <= {5, 191, 3}  # only the destinations of the in-range pairs
    # Nothing in range at all: nothing changes (also pair 0 is out of range).
    none = cache.clone()
    pool.copy_slots(none, torch.tensor([-1, 500]), torch.tensor([0, 1]), check=False)
    assert torch.equal(none, cache)
    # The checked form refuses the same input.
    with pytest.raises(ValueError, match="past the cache"):
        pool.copy_slots(cache.clone(), torch.tensor([5, 192]), torch.tensor([100, 8]))


def test_copy_slots_unchecked_refuses_bad_arguments():
    cache = _random_cache(2, 64)
    with pytest.raises(ValueError, match="lengths differ"):
        pool.copy_slots(cache, torch.tensor([1, 2]), torch.tensor([1]), check=False)
    with pytest.raises(ValueError, match="src_slots: expected an integer tensor"):
        pool.copy_slots(cache, torch.tensor([1]), torch.tensor([1.0]), check=False)
    with pytest.raises(ValueError, match="cache"):
        pool.copy_slots(cache[:, :100], torch.tensor([1]), torch.tensor([1]), check=False)


class _HostSync(AssertionError):
    pass


def _forbid_host_reads(monkeypatch):
    """Make every way a Python caller reads a tensor's value on the host raise (``int()``, ``bool()``, ``float()``,
    ``.item()``, ``.tolist()``, use as an index, ``.cpu()``/``.numpy()``): on a GPU each is a device sync."""
    def refuse(name):
        def raiser(self, *args, **kwargs):
            raise _HostSync(f"host read of a tensor value: Tensor.{name}")
        return raiser

    for name in ("__bool__", "__int__", "__float__", "__index__", "item", "tolist", "cpu", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, refuse(name))


def test_forbid_host_reads_catches_the_checked_copy(monkeypatch):
    # The detector itself: the checked copy reads max/min on the host, so it must trip.
    cache = _random_cache(2, 64)
    dst, src = torch.tensor([1, 2]), torch.tensor([3, 4])
    _forbid_host_reads(monkeypatch)
    with pytest.raises(_HostSync):
        pool.copy_slots(cache, dst, src)


def test_copy_slots_unchecked_reads_nothing_on_the_host():
    cache = _random_cache(3, 64, seed=8)
    dst, src = [5, -1, 191, 7], [100, 9, 2, 500]
    want = _move_oracle(cache, dst, src, 64)
    dst_t, src_t = torch.tensor(dst), torch.tensor(src)
    with pytest.MonkeyPatch.context() as mp:
        _forbid_host_reads(mp)
        pool.copy_slots(cache, dst_t, src_t, check=False)
    assert torch.equal(cache, want)


@pytest.mark.gpu
def test_gpu_copy_slots_unchecked_issues_no_device_sync():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cache = _random_cache(40, 64, seed=9)
    gen = torch.Generator().manual_seed(10)
    dst = torch.randperm(40 * 64, generator=gen)[:300]
    src = torch.randint(0, 40 * 64, (300,), generator=gen)
    dst[::7] = -1
    src[::11] = 40 * 64 + 5
    want = _move_oracle(cache, dst.tolist(), src.tolist(), 64)
    got = cache.cuda()
    dst_d, src_d = dst.cuda(), src.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        pool.copy_slots(got, dst_d, src_d, check=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(got.cpu(), want)
