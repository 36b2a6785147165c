"""The Triton store op (ops/quantize.py) against the reference format.

Oracle: ``format.quantize_index_k`` for the codes, written into a copy of the
cache through ``pool.payload_plane`` / ``pool.scale_plane`` at
``pool.scale_row(row)``. The whole buffer is compared, bit for bit, after the
cache was poisoned with random bytes: the op must write exactly the bytes of the
valid slots and nothing else.

Runs on the CPU under TRITON_INTERPRET=1 (small shapes); the ``gpu`` test runs
the full 64K-token size on CUDA.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from cases import DEVICE, INTERPRET, kernel_marker

from sglang_fp4_indexer import format as fmt
from sglang_fp4_indexer import pool
from sglang_fp4_indexer.ops.quantize import INF_SATURATES_TO, store_index_k

needs_kernel = kernel_marker("the store kernel needs")


def _poisoned_cache(num_pages: int, page_size: int = 64, seed: int = 0, device=DEVICE) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (num_pages, page_size * 68), dtype=torch.uint8, generator=gen).to(device)


def _expected(cache: torch.Tensor, k: torch.Tensor, slots: torch.Tensor, page_size: int) -> torch.Tensor:
    """``cache`` with the reference encoding of ``k`` written at the valid slots."""
    out = cache.clone()
    keep = (slots >= 0) & (slots < cache.shape[0] * page_size)
    payload, scales = fmt.quantize_index_k(k[keep])
    page, row = pool.slot_to_page_row(slots[keep], page_size)
    pool.payload_plane(out, page_size)[page, row] = payload
    pool.scale_plane(out, page_size)[page, pool.scale_row(row, page_size)] = scales
    return out


def _store_and_check(k, cache, slots, page_size=64, **kw):
    expected = _expected(cache, k, slots, page_size)
    store_index_k(k, cache, slots, page_size, **kw)
    if not torch.equal(cache, expected):
        diff = (cache != expected).nonzero()
        raise AssertionError(f"{diff.shape[0]} bytes differ, first at (page, byte) {diff[:5].tolist()}")


def _mixed_keys(n: int, dtype, seed: int = 0) -> torch.Tensor:
    """Random keys whose groups span the whole range: zero, subnormal, tiny, O(1),
    huge, exact midpoints (ties) and exact scale boundaries."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, 32, generator=gen, dtype=torch.float64)
    shift = torch.randint(-140, 120, (n, 4, 1), generator=gen).to(torch.float64)
    x = x * torch.exp2(shift)
    kind = torch.randint(0, 6, (n, 4), generator=gen)
    # ties: anchor 6 * 2**e plus every midpoint (and negated) at that scale
    mids = torch.tensor(fmt._MIDPOINTS, dtype=torch.float64)
    tie_group = torch.cat([torch.tensor([6.0]), mids, -mids, torch.zeros(32 - 15, dtype=torch.float64)])
    e = torch.randint(-126, 120, (n, 4, 1), generator=gen).to(torch.float64)
    x = torch.where((kind == 0)[..., None], tie_group * torch.exp2(e), x)
    x = torch.where((kind == 1)[..., None], torch.zeros_like(x), x)
    # boundary: amax exactly 6 * 2**e (or one fp32 ulp above, via the 1 + 2**-23 factor)
    bound = torch.randn(n, 4, 32, generator=gen, dtype=torch.float64).clamp(-1, 1) * torch.exp2(e)
    bound[..., 0] = 6.0 * torch.exp2(e[..., 0]) * torch.where(torch.rand(n, 4, generator=gen) < 0.5, 1.0, 1 + 2**-23)
    x = torch.where((kind == 2)[..., None], bound, x)
    # subnormal / tiny groups
    tiny = torch.randn(n, 4, 32, generator=gen, dtype=torch.float64) * 2.0**-128
    x = torch.where((kind == 3)[..., None], tiny, x)
    x = x.reshape(n, 128)
    x[0, :32] = -0.0
    return x.to(dtype)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_bit_exact_with_format_on_mixed_keys(dtype, slot_dtype):
    n, num_pages = 150, 4
    k = _mixed_keys(n, dtype if dtype != torch.float16 else torch.float32, seed=1)
    if dtype == torch.float16:
        k = (k.to(torch.float64).clamp(-60000, 60000)).to(torch.float16)
    assert k.isfinite().all()
    gen = torch.Generator().manual_seed(2)
    slots = torch.randperm(num_pages * 64, generator=gen)[:n].to(slot_dtype)  # shuffled, across pages
    slots[::7] = -1  # skipped
    slots[3] = -12345
    cache = _poisoned_cache(num_pages, seed=3)
    _store_and_check(k.to(DEVICE), cache, slots.to(DEVICE))


@needs_kernel
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("block_t", [16, 32, 64])
def test_page_sizes_and_block_sizes(page_size, block_t):
    n, num_pages = 70, 6
    k = (torch.randn(n, 128, generator=torch.Generator().manual_seed(4)) * 3).to(torch.bfloat16)
    slots = torch.randperm(num_pages * page_size, generator=torch.Generator().manual_seed(5))[:n]
    cache = _poisoned_cache(num_pages, page_size, seed=6)
    _store_and_check(k.to(DEVICE), cache, slots.to(DEVICE), page_size, block_t=block_t)


@needs_kernel
def test_every_slot_of_a_page_and_last_slot():
    num_pages = 2
    k = (torch.randn(128, 128, generator=torch.Generator().manual_seed(8)) * 0.1).to(torch.float32)
    slots = torch.arange(128).flip(0)  # fills both pages completely, reversed
    cache = _poisoned_cache(num_pages, seed=9)
    _store_and_check(k.to(DEVICE), cache, slots.to(DEVICE))
    # every byte of the cache was written: nothing of the poison survives by accident
    assert torch.equal(cache, _expected(torch.zeros_like(cache), k.to(DEVICE), slots.to(DEVICE), 64))


@needs_kernel
def test_row_strided_keys():
    big = torch.randn(40, 256, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16)
    k = big[:, 64:192]  # row stride 256, last dim contiguous
    assert not k.is_contiguous()
    slots = torch.arange(40) * 3
    cache = _poisoned_cache(2, seed=11)
    _store_and_check(k.to(DEVICE), cache, slots.to(DEVICE))


@needs_kernel
def test_all_slots_negative_writes_nothing():
    cache = _poisoned_cache(2, seed=12)
    before = cache.clone()
    store_index_k(torch.randn(33, 128, device=DEVICE), cache, torch.full((33,), -1, device=DEVICE))
    assert torch.equal(cache, before)


@needs_kernel
def test_empty_batch_and_empty_cache_are_no_ops():
    cache = _poisoned_cache(1, seed=13)
    before = cache.clone()
    store_index_k(torch.zeros(0, 128, device=DEVICE), cache, torch.zeros(0, dtype=torch.int64, device=DEVICE))
    assert torch.equal(cache, before)
    empty = torch.zeros(0, 64 * 68, dtype=torch.uint8, device=DEVICE)
    store_index_k(torch.zeros(2, 128, device=DEVICE), empty, torch.tensor([-1, -1], device=DEVICE))


@needs_kernel
def test_out_of_range_slots_without_check_are_skipped():
    """check_slots=False (the CUDA-graph path): out-of-range slots are masked, not written."""
    num_pages = 2
    k = torch.randn(20, 128, generator=torch.Generator().manual_seed(14)).to(torch.bfloat16)
    slots = torch.arange(20) * 5
    slots[[2, 9, 19]] = torch.tensor([128, 1 << 40, 129])
    backing = _poisoned_cache(num_pages + 2, seed=15)  # pages past the cache: must stay untouched
    before = backing.clone()
    cache = backing[:num_pages]
    expected = _expected(cache, k.to(DEVICE), slots.to(DEVICE), 64)
    store_index_k(k.to(DEVICE), cache, slots.to(DEVICE), check_slots=False)
    assert torch.equal(cache, expected)
    assert torch.equal(backing[num_pages:], before[num_pages:])
    with pytest.raises(ValueError, match=r"^slots: slot 1099511627776 is out of range"):
        store_index_k(k.to(DEVICE), cache, slots.to(DEVICE))


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_nonfinite_input_stores_documented_codes(dtype):
    """NaN is stored as +0 and ignored by the group scale; +-Inf as +-INF_SATURATES_TO.

    Oracle: format.py on the same keys with those substitutions made first.
    """
    k = (torch.randn(6, 128, generator=torch.Generator().manual_seed(16)) * 4).to(dtype)
    nan, inf = float("nan"), float("inf")
    k[0, 3] = nan
    k[0, 40] = -nan
    k[1, :32] = nan  # all-NaN group: like an all-zero group
    k[2, 5] = inf
    k[2, 70] = -inf
    k[3, 0] = inf
    k[3, 1] = nan
    k[4, 100:] = -inf
    with pytest.raises(ValueError, match="k: row 0"):
        fmt.quantize_index_k(k)  # the reference path rejects it; the kernel must not
    sat = torch.tensor(INF_SATURATES_TO, dtype=torch.float64)
    sub = k.to(torch.float64)
    sub = torch.where(sub.isnan(), torch.zeros_like(sub), sub)
    sub = torch.where(sub.isinf(), sat.copysign(sub), sub)
    assert INF_SATURATES_TO == 1.5 * 2.0**127 and torch.tensor(INF_SATURATES_TO, dtype=torch.float32).isfinite()
    slots = torch.tensor([0, 1, 2, 3, 4, 70])
    cache = _poisoned_cache(2, seed=17)
    expected = _expected(cache, sub.to(torch.float32).to(DEVICE), slots.to(DEVICE), 64)
    store_index_k(k.to(DEVICE), cache, slots.to(DEVICE))
    assert torch.equal(cache, expected)
    payload, scales = pool.read_index_k(cache, slots.to(DEVICE))
    assert ((scales >= 1) & (scales <= 254)).all()
    deq = fmt.dequantize_index_k(payload, scales)
    assert deq.isfinite().all()  # no NaN, and Inf saturates to a finite value
    assert deq[1, :32].eq(0).all() and scales[1, 0] == 1
    assert deq[3, 0] == INF_SATURATES_TO and deq[4, 100] == -INF_SATURATES_TO


# ---------------------------------------------------------------- validation


def _good():
    return (
        torch.zeros(4, 128, dtype=torch.bfloat16),
        _poisoned_cache(2, seed=18, device="cpu"),
        torch.arange(4, dtype=torch.int64),
    )


def _bad_cases():
    k, cache, slots = _good()
    meta_cache = torch.empty(2, 64 * 68, dtype=torch.uint8, device="meta")
    meta_slots = torch.empty(4, dtype=torch.int64, device="meta")
    return [
        ("k not a tensor", dict(k=k.tolist()), TypeError, r"^k: expected a torch.Tensor"),
        ("cache not a tensor", dict(cache=None), TypeError, r"^cache: expected a torch.Tensor"),
        ("slots not a tensor", dict(slots=[0, 1, 2, 3]), TypeError, r"^slots: expected a torch.Tensor"),
        ("k float64", dict(k=k.double()), ValueError, r"^k: expected bfloat16, float16 or float32"),
        ("k int", dict(k=k.to(torch.int32)), ValueError, r"^k: expected bfloat16"),
        ("k fp8", dict(k=k.to(torch.float8_e4m3fn)), ValueError, r"^k: expected bfloat16"),
        ("k width 64", dict(k=k[:, :64].contiguous()), ValueError, r"^k: expected shape \[N, 128\]"),
        ("k 1-D", dict(k=k.reshape(-1)), ValueError, r"^k: expected shape"),
        ("k 3-D", dict(k=k.reshape(4, 1, 128)), ValueError, r"^k: expected shape"),
        ("k inner stride", dict(k=torch.zeros(4, 256, dtype=torch.bfloat16)[:, ::2]), ValueError, r"^k: expected the last dimension contiguous"),
        ("cache int8", dict(cache=cache.to(torch.int8)), ValueError, r"^cache: expected uint8"),
        ("cache 1-D", dict(cache=cache.reshape(-1)), ValueError, r"^cache: expected shape"),
        ("cache width", dict(cache=torch.zeros(2, 64 * 68 + 4, dtype=torch.uint8)), ValueError, r"^page_size: 64 needs a cache of width 4352"),
        ("cache non-contiguous", dict(cache=torch.zeros(2, 2 * 64 * 68, dtype=torch.uint8)[:, ::2]), ValueError, r"^cache: expected a contiguous"),
        ("page_size vs width", dict(page_size=32), ValueError, r"^page_size: 32 needs a cache of width 2176"),
        ("page_size 0", dict(page_size=0), ValueError, r"^page_size: expected a positive int"),
        ("page_size float", dict(page_size=64.0), ValueError, r"^page_size: expected a positive int"),
        ("page_size bool", dict(page_size=True), ValueError, r"^page_size: expected a positive int"),
        ("slots float", dict(slots=slots.float()), ValueError, r"^slots: expected int32 or int64"),
        ("slots int16", dict(slots=slots.to(torch.int16)), ValueError, r"^slots: expected int32 or int64"),
        ("slots too short", dict(slots=slots[:3]), ValueError, r"^slots: expected shape \[4\]"),
        ("slots 2-D", dict(slots=slots.reshape(2, 2)), ValueError, r"^slots: expected shape \[4\]"),
        ("slots non-contiguous", dict(slots=torch.arange(8)[::2]), ValueError, r"^slots: expected a contiguous"),
        ("slot past the cache", dict(slots=torch.tensor([0, 1, 128, 2])), ValueError, r"^slots: slot 128 is out of range; the cache holds 128 slots"),
        ("cache other device", dict(cache=meta_cache), ValueError, r"^cache: expected the device of k"),
        ("slots other device", dict(slots=meta_slots), ValueError, r"^slots: expected the device of k"),
        ("block_t not a power of two", dict(block_t=48), ValueError, r"^block_t: expected a power of two"),
        ("block_t zero", dict(block_t=0), ValueError, r"^block_t: expected a power of two"),
    ]


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_input_raises_naming_the_argument(case):
    _, override, exc, pattern = case
    k, cache, slots = _good()
    args = dict(k=k, cache=cache, slots=slots)
    args.update(override)
    cache = args["cache"]
    before = cache.clone() if isinstance(cache, torch.Tensor) and cache.device.type == "cpu" else None
    with pytest.raises(exc, match=pattern):
        store_index_k(**args)
    if before is not None:
        assert torch.equal(args["cache"], before)  # nothing written on a rejected call


def test_cpu_tensors_without_interpreter_raise():
    """Outside TRITON_INTERPRET=1 a CPU call is rejected with a clear message."""
    code = (
        "import torch\n"
        "from sglang_fp4_indexer.ops.quantize import store_index_k\n"
        "try:\n"
        "    store_index_k(torch.zeros(1, 128), torch.zeros(1, 64 * 68, dtype=torch.uint8), torch.zeros(1, dtype=torch.int64))\n"
        "except ValueError as e:\n"
        "    print('RAISED', e)\n"
    )
    env = {key: val for key, val in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "RAISED k: CPU tensors need the Triton interpreter" in out.stdout, out.stdout + out.stderr


# ---------------------------------------------------------------- GPU, full size


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("check_slots", [True, False])
def test_gpu_full_size_bit_exact(dtype, check_slots):
    """64K tokens into a 1100-page cache on CUDA, shuffled slots, some skipped, poisoned cache."""
    n, num_pages = 65536, 1100
    k = _mixed_keys(n, dtype, seed=20).cuda()
    gen = torch.Generator().manual_seed(21)
    slots = torch.randperm(num_pages * 64, generator=gen)[:n]
    slots[torch.randint(0, n, (2000,), generator=gen)] = -1
    cache = _poisoned_cache(num_pages, seed=22, device="cuda")
    _store_and_check(k, cache, slots.cuda(), check_slots=check_slots)
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_gpu_cuda_kernel_on_every_cpu_case(dtype):
    """On NVIDIA GPUs store_index_k runs the CUDA kernel: the CPU cases' oracles, on the device."""
    from sglang_fp4_indexer.ops.quantize import _cuda_store

    k = torch.zeros(4, 128, dtype=dtype, device="cuda")
    assert _cuda_store(k, _poisoned_cache(1, device="cuda"), torch.zeros(4, dtype=torch.int64, device="cuda")) is not None
    for slot_dtype in (torch.int32, torch.int64):
        test_bit_exact_with_format_on_mixed_keys(dtype, slot_dtype)
    test_nonfinite_input_stores_documented_codes(dtype)
    for page_size, block_t in ((64, 32), (16, 8), (128, 64)):
        test_page_sizes_and_block_sizes(page_size, block_t)
    test_every_slot_of_a_page_and_last_slot()
    test_row_strided_keys()
    test_all_slots_negative_writes_nothing()
    test_out_of_range_slots_without_check_are_skipped()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_cuda_and_triton_kernels_write_the_same_bytes(dtype):
    n, num_pages = 65536, 1100
    k = _mixed_keys(n, torch.float32 if dtype == torch.float16 else dtype, seed=30)
    if dtype == torch.float16:
        k = k.clamp(-60000, 60000).to(torch.float16)
    k = k.cuda()
    gen = torch.Generator().manual_seed(31)
    slots = torch.randperm(num_pages * 64, generator=gen)[:n].cuda()
    a, b = _poisoned_cache(num_pages, seed=32, device="cuda"), _poisoned_cache(num_pages, seed=32, device="cuda")
    store_index_k(k, a, slots, check_slots=False)
    store_index_k(k, b, slots, check_slots=False, use_cuda=False)
    assert torch.equal(a, b)


def _cuda_store_replay(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numpy float32 replay of cuda/store_index_k.cu's arithmetic on finite fp32 keys [N, 128].

    Returns (E2M1 codes with sign [N, 128], UE8M0 codes [N, 4]). The kernel's fmaf(|x|, 2**m, 2**23)
    equals this product-then-add: the product is exact except below 2**-126, where both round to 0.
    """
    bits = x.astype(np.float32).view(np.uint32).reshape(-1, 4, 32)
    a = bits & np.uint32(0x7FFFFFFF)
    amax = a.max(axis=2).astype(np.int64)
    code = np.clip((amax >> 23) - 2 + ((amax & 0x7FFFFF) > 0x400000), 1, 254)[:, :, None]
    kb = np.clip((a >> 23).astype(np.int64) - code, 0, 2)
    mexp = 255 - code - kb
    assert mexp.min() >= 1 and mexp.max() <= 254  # the multiplier is a normal power of two
    z = a.view(np.float32) * (mexp.astype(np.uint32) << 23).view(np.float32)
    q = ((z + np.float32(2.0**23)).astype(np.float32).view(np.uint32) & 7).astype(np.int64) + 2 * kb
    t0 = np.float32(0.25) * (code.astype(np.uint32) << 23).view(np.float32)
    q = q + np.where((bits >> 31).astype(bool) & (a.view(np.float32) > t0), 8, 0)
    return q.reshape(-1, 128), code[:, :, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_store_arithmetic_replayed_in_numpy_is_bit_exact(dtype):
    k = _mixed_keys(4000, dtype, seed=40).float()
    k[1, :] = torch.tensor([3.4028e38, -3.4e38, 2.0**127] + [1.0] * 125)  # the largest finite magnitudes
    payload, scales = fmt.quantize_index_k(k)
    q, code = _cuda_store_replay(k.numpy())
    p = payload.numpy()
    want = np.stack([p & 15, p >> 4], axis=2).reshape(-1, 128)
    assert (code == scales.numpy()).all()
    assert (q == want).all(), f"{int((q != want).sum())} codes differ"
