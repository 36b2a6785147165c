"""ops/gather.py: flat gather of a batch's FP4 keys, bit-exact against a torch gather.

CPU under TRITON_INTERPRET=1; the oracle is ``reference.gather_index_k_reference``
(``reference.paged_slots`` + ``pool.read_index_k``, which reads scales through
``pool.scale_row``).
"""

from __future__ import annotations

import os

import pytest
import torch

from sglang_fp4_indexer.format import quantize_index_k
from sglang_fp4_indexer.ops.gather import gather_index_k
from sglang_fp4_indexer.pool import PAGE_SIZE, allocate_index_k_cache, payload_plane, scale_plane
from sglang_fp4_indexer.reference import gather_index_k_reference

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
pytestmark = pytest.mark.skipif(
    not INTERPRET and not torch.cuda.is_available(), reason="needs CUDA or TRITON_INTERPRET=1"
)
DEVICE = "cuda" if (torch.cuda.is_available() and not INTERPRET) else "cpu"


def _filled_cache(num_pages: int, seed: int) -> torch.Tensor:
    """A cache whose every slot holds a distinct quantized key (random magnitudes)."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(num_pages * PAGE_SIZE, 128, generator=g) * torch.exp(
        2 * torch.randn(num_pages * PAGE_SIZE, 1, generator=g)
    )
    payload, scales = quantize_index_k(keys)
    cache = allocate_index_k_cache(num_pages)
    payload_plane(cache)[:] = payload.view(num_pages, PAGE_SIZE, 64)
    scale_plane(cache)[:] = scales.view(num_pages, PAGE_SIZE, 4)
    return cache


def _case(lens, max_pages=None, num_pages=None, seed=0, table_dtype=torch.int32):
    need = [max(1, -(-n // PAGE_SIZE)) for n in lens]
    max_pages = max_pages or max(need)
    num_pages = num_pages or len(lens) * max_pages + 2
    g = torch.Generator().manual_seed(seed + 1)
    perm = torch.randperm(num_pages, generator=g)[: len(lens) * max_pages]
    table = perm.view(len(lens), max_pages).to(table_dtype)
    cache = _filled_cache(num_pages, seed)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return cache.to(DEVICE), table.to(DEVICE), seq_lens.to(DEVICE)


@pytest.mark.parametrize(
    "lens",
    [
        [1],
        [64],
        [65, 0, 200],  # zero-length request between others
        [300, 1, 64, 129, 17],
        [600],  # crosses the 256-key block of the grid
    ],
)
@pytest.mark.parametrize("table_dtype", [torch.int32, torch.int64])
def test_gather_bit_exact(lens, table_dtype):
    cache, table, seq_lens = _case(lens, seed=len(lens), table_dtype=table_dtype)
    payload, scales = gather_index_k(cache, table, seq_lens, sum(lens), max(lens))
    want_p, want_s = gather_index_k_reference(cache.cpu(), table.cpu(), seq_lens.cpu())
    assert payload.dtype == torch.uint8 and payload.shape == (sum(lens), 64) and payload.is_contiguous()
    assert scales.dtype == torch.uint8 and scales.shape == (sum(lens), 4) and scales.is_contiguous()
    assert torch.equal(payload.cpu(), want_p)
    assert torch.equal(scales.cpu(), want_s)


def test_gather_rows_follow_requests_in_order():
    # Request b's key j is flat row sum(lens[:b]) + j: check a few rows by hand against the planes.
    cache, table, seq_lens = _case([70, 3], seed=5)
    payload, scales = gather_index_k(cache, table, seq_lens, 73, 70)
    pp, sp = payload_plane(cache.cpu()), scale_plane(cache.cpu())
    t = table.cpu()
    assert torch.equal(payload[69].cpu(), pp[t[0, 1], 5])
    assert torch.equal(payload[71].cpu(), pp[t[1, 0], 1])
    assert torch.equal(scales[72].cpu(), sp[t[1, 0], 2])


def test_gather_larger_max_len_and_empty():
    cache, table, seq_lens = _case([10, 20], seed=2)
    payload, scales = gather_index_k(cache, table, seq_lens, 30, 500)  # max_len above the max is fine
    want_p, want_s = gather_index_k_reference(cache.cpu(), table.cpu(), seq_lens.cpu())
    assert torch.equal(payload.cpu(), want_p) and torch.equal(scales.cpu(), want_s)
    zero = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    p0, s0 = gather_index_k(cache, table, zero, 0, 0)
    assert p0.shape == (0, 64) and s0.shape == (0, 4)
    empty_t = torch.zeros((0, 1), dtype=torch.int32, device=DEVICE)
    p1, _ = gather_index_k(cache, empty_t, torch.zeros(0, dtype=torch.int32, device=DEVICE), 0, 0)
    assert p1.shape == (0, 64)


def test_gather_unchecked_bad_page_writes_zero_rows_in_bounds():
    cache, table, seq_lens = _case([100, 40], seed=3)
    table = table.clone()
    table[0, 1] = cache.shape[0] + 7  # keys 64..99 of request 0 sit on a page outside the cache
    table[1, 0] = -1
    payload, scales = gather_index_k(cache, table, seq_lens, 140, 100, check=False)
    good_p, good_s = gather_index_k_reference(cache.cpu(), table[:1, :1].cpu(), torch.tensor([64]))
    assert torch.equal(payload[:64].cpu(), good_p) and torch.equal(scales[:64].cpu(), good_s)
    assert int(payload[64:].abs().sum()) == 0 and int(scales[64:].abs().sum()) == 0


def test_gather_unchecked_short_total_len_never_writes_past_it():
    cache, table, seq_lens = _case([50, 50], seed=4)
    payload, scales = gather_index_k(cache, table, seq_lens, 70, 50, check=False)
    want_p, want_s = gather_index_k_reference(cache.cpu(), table.cpu(), seq_lens.cpu())
    assert payload.shape == (70, 64)
    assert torch.equal(payload.cpu(), want_p[:70]) and torch.equal(scales.cpu(), want_s[:70])


def test_gather_bad_inputs_name_the_argument():
    cache, table, seq_lens = _case([100, 40], seed=6)
    with pytest.raises(ValueError, match="total_len"):
        gather_index_k(cache, table, seq_lens, 139, 100)
    with pytest.raises(ValueError, match="max_len"):
        gather_index_k(cache, table, seq_lens, 140, 99)
    with pytest.raises(ValueError, match="max_len"):
        gather_index_k(cache, table, seq_lens, 140, -1)
    with pytest.raises(ValueError, match="seq_lens"):
        gather_index_k(cache, table, torch.tensor([100, -1], dtype=torch.int32, device=DEVICE), 99, 100)
    with pytest.raises(ValueError, match="seq_lens"):
        gather_index_k(cache, table, seq_lens.float(), 140, 100)
    with pytest.raises(ValueError, match="seq_lens"):
        gather_index_k(cache, table, seq_lens[:1], 100, 100)
    with pytest.raises(TypeError, match="block_table"):
        gather_index_k(cache, [[0, 1]], seq_lens, 140, 100)
    with pytest.raises(ValueError, match="block_table"):
        gather_index_k(cache, table[:, :1], seq_lens, 140, 100)  # too few pages per row
    bad = table.clone()
    bad[1, 0] = cache.shape[0]
    with pytest.raises(ValueError, match="block_table"):
        gather_index_k(cache, bad, seq_lens, 140, 100)
    with pytest.raises(ValueError, match="cache"):
        gather_index_k(cache[:, :-4], table, seq_lens, 140, 100)
    with pytest.raises(ValueError, match="cache"):
        misaligned = cache.view(-1)[1 : 1 + (cache.shape[0] - 1) * cache.shape[1]].view(-1, cache.shape[1])
        gather_index_k(misaligned, table, seq_lens, 140, 100)
