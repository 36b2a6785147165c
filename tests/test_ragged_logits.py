"""ops/ragged_logits.py: the prefill / extend scorer against ``reference.ragged_logits_reference``.

CPU tests run the Triton kernels under TRITON_INTERPRET=1 on small shapes
(the interpreter emulates the FP8 dot exactly, so they run the FP8 code path);
the ``gpu`` tests run the full size on the device.

Tolerance. Every product is exact (decoded keys and e4m3/bf16 queries are
exact in the MMA types), so the only error is fp32 accumulation: each output
is a sum of at most 128 + 4 + H (<= 200) rounded terms, so its error is at most
``200 * 2**-24 * bound < 2**-16 * bound`` where ``bound[t, j] = sum_h |w[t,h]|
* sum_d |q[t,h,d] * k_j[d]|``. On the GPU, Hopper's FP8 MMA adds its products
with reduced-precision adders (about 14 bits kept: DeepSeek-V3 report, section
3.3.2), four K=32 steps per dot: ``2**-10 * bound`` there.
"""

from __future__ import annotations

import os

import pytest
import torch
from cases import DEVICE, INTERPRET, kernel_marker

from sglang_fp4_indexer.format import dequantize_index_k, quantize_index_k, unpack_e2m1
from sglang_fp4_indexer.ops.ragged_logits import (
    FOLD_EXACT_SPREAD,
    deepgemm_reason,
    iter_ragged_logits,
    prepare_keys,
    ragged_logits,
    rows_per_chunk,
)
from sglang_fp4_indexer.reference import ragged_logits_reference

needs_kernel = kernel_marker("needs")
CPU_RTOL = 2.0**-16
GPU_RTOL = 2.0**-10


def _keys(num: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantized keys with magnitudes spread over several powers of two."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(num, 128, generator=g) * torch.exp(torch.randn(num, 1, generator=g))
    return quantize_index_k(k)


def _causal_windows(requests):
    """``requests`` = [(prefix, new)]: flat keys are each request's prefix + new tokens,
    query token i of a request sees its keys [start, start + prefix + i + 1)."""
    ks, ke, start = [], [], 0
    for prefix, new in requests:
        for i in range(new):
            ks.append(start)
            ke.append(start + prefix + i + 1)
        start += prefix + new
    return ks, ke, start


def _queries(tokens: int, heads: int, seed: int, dtype=torch.float8_e4m3fn):
    g = torch.Generator().manual_seed(seed + 100)
    q = (torch.randn(tokens, heads, 128, generator=g) * 2).to(dtype)
    w = torch.rand(tokens, heads, generator=g) * heads**-0.5
    return q, w


def _bound(q, w, payload, scales, ks, ke, dtype=torch.float64) -> torch.Tensor:
    """``sum_h |w| sum_d |q k|`` per (token, column), 0 outside windows, returned on the CPU.

    A sum of n non-negative terms: computing it in fp32 (the full-size GPU test,
    for speed) changes it by a relative n * 2**-24 at most (under 0.1 % for the
    40 K-key windows there), immaterial for a tolerance scale.
    """
    keys = dequantize_index_k(payload, scales).to(dtype).abs().to(q.device)
    out = torch.zeros(q.shape[0], keys.shape[0], dtype=torch.float64, device=q.device)
    for t, (lo, hi) in enumerate(zip(ks.tolist(), ke.tolist())):
        if hi > lo:
            out[t, lo:hi] = ((keys[lo:hi] @ q[t].to(dtype).abs().t()) @ w[t].to(dtype).abs()).double()
    return out.cpu()


def _assert_close(got, want, bound, rtol):
    got, want = got.cpu(), want.cpu()
    assert got.shape == want.shape and got.dtype == torch.float32
    fin = torch.isfinite(want)
    assert torch.equal(fin, torch.isfinite(got)), "finite pattern differs"
    assert bool((got[~fin] == float("-inf")).all()) and bool((want[~fin] == float("-inf")).all())
    err = (got[fin].double() - want[fin].double()).abs()
    assert bool((err <= rtol * bound.cpu()[fin] + 1e-30).all()), f"max error {err.max().item()}"


def _run(q, w, payload, scales, ks, ke, device=DEVICE, **kw):
    d = device
    return ragged_logits(q.to(d), w.to(d), payload.to(d), scales.to(d), ks.to(d), ke.to(d), **kw)


def _tensors(ks, ke):
    return torch.tensor(ks, dtype=torch.int32), torch.tensor(ke, dtype=torch.int32)


@needs_kernel
@pytest.mark.parametrize("mode", ["folded", "grouped"])
@pytest.mark.parametrize("heads", [64, 32])
def test_causal_batch_windows_from_zero_and_mid_buffer(mode, heads):
    # Request 0 starts at key 0 (no prefix); request 1 is prefix-cached (its windows start
    # mid-buffer); request 2 is a single token. Windows cross 32-key tile boundaries.
    ks, ke, width = _causal_windows([(0, 5), (37, 6), (3, 1)])
    ks, ke = _tensors(ks, ke)
    payload, scales = _keys(width, seed=heads)
    q, w = _queries(len(ks), heads, seed=heads)
    want = ragged_logits_reference(q, w, payload, scales, ks, ke)
    got = _run(q, w, payload, scales, ks, ke, mode=mode, block_n=32)
    _assert_close(got, want, _bound(q, w, payload, scales, ks, ke), CPU_RTOL)


@needs_kernel
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("mode", ["folded", "grouped"])
def test_empty_single_key_and_boundary_windows(num_splits, mode):
    width = 100
    # empty at 0, empty mid-buffer, one key, one key at the last column, a window
    # exactly one 16-key tile, one crossing a tile boundary, the whole buffer, ke < ks.
    ks, ke = _tensors([0, 40, 17, 99, 32, 15, 0, 60], [0, 40, 18, 100, 48, 17, 100, 50])
    payload, scales = _keys(width, seed=7)
    q, w = _queries(len(ks), 32, seed=7)
    want = ragged_logits_reference(q, w, payload, scales, ks, ke)
    assert bool(torch.isinf(want[0]).all()) and bool(torch.isinf(want[7]).all())
    assert int(torch.isfinite(want[2]).sum()) == 1
    got = _run(q, w, payload, scales, ks, ke, mode=mode, block_n=16, block_m=2, num_splits=num_splits)
    _assert_close(got, want, _bound(q, w, payload, scales, ks, ke), CPU_RTOL)


@needs_kernel
@pytest.mark.parametrize("mma", ["fp16", "fp32"])
def test_portable_mma_types(mma):
    # fp16 (e4m3 queries and decoded keys are exact in it) and fp32, the CPU stand-in
    # for the bf16 MMA of bf16 queries; both modes.
    ks, ke, width = _causal_windows([(20, 7), (0, 4)])
    ks, ke = _tensors(ks, ke)
    payload, scales = _keys(width, seed=11)
    q, w = _queries(len(ks), 32, seed=11)
    want = ragged_logits_reference(q, w, payload, scales, ks, ke)
    bound = _bound(q, w, payload, scales, ks, ke)
    for mode in ("folded", "grouped"):
        got = _run(q, w, payload, scales, ks, ke, mode=mode, mma=mma, block_n=16)
        _assert_close(got, want, bound, CPU_RTOL)


@needs_kernel
def test_bf16_queries():
    ks, ke, width = _causal_windows([(10, 6)])
    ks, ke = _tensors(ks, ke)
    payload, scales = _keys(width, seed=12)
    q, w = _queries(len(ks), 64, seed=12, dtype=torch.bfloat16)
    want = ragged_logits_reference(q, w, payload, scales, ks, ke)
    got = _run(q, w, payload, scales, ks, ke, block_n=16)  # auto: fp32 MMA on the CPU, bf16 on a GPU
    _assert_close(got, want, _bound(q, w, payload, scales, ks, ke), CPU_RTOL if INTERPRET else GPU_RTOL)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["folded", "grouped"])
def test_low_precision_logits_are_the_fp32_logits_rounded_once(dtype, mode):
    # Same fp32 sum, one round-to-nearest-even on store: equal to the fp32 logits cast
    # (torch's cast rounds to nearest even; -inf outside the windows survives the cast).
    ks, ke, width = _causal_windows([(70, 5), (3, 4)])
    ks, ke = _tensors(ks, ke)
    payload, scales = _keys(width, seed=13)
    q, w = _queries(len(ks), 32, seed=13)
    full = _run(q, w, payload, scales, ks, ke, mode=mode, block_n=32)
    low = _run(q, w, payload, scales, ks, ke, mode=mode, block_n=32, logits_dtype=dtype)
    assert low.dtype == dtype
    assert torch.equal(low.cpu(), full.cpu().to(dtype))
    chunks = [c.clone() for _, _, c in iter_ragged_logits(
        q.to(DEVICE), w.to(DEVICE), payload.to(DEVICE), scales.to(DEVICE), ks.to(DEVICE), ke.to(DEVICE),
        budget_bytes=4 * width * 3, mode=mode, block_n=32, logits_dtype=dtype)]
    assert torch.equal(torch.cat(chunks).cpu(), low.cpu())
    with pytest.raises(ValueError, match="logits_dtype"):
        _run(q, w, payload, scales, ks, ke, logits_dtype=torch.float64)
    with pytest.raises(ValueError, match="out"):
        _run(q, w, payload, scales, ks, ke, logits_dtype=dtype,
             out=torch.empty(len(ks), width, dtype=torch.float32, device=DEVICE))


@needs_kernel
def test_clean_logits_false_leaves_untouched_tiles():
    width = 96
    # Block of 2 tokens with windows inside keys [0, 20); tiles [32, 96) touch no window.
    ks, ke = _tensors([0, 3, 70, 70], [10, 20, 80, 70])
    payload, scales = _keys(width, seed=13)
    q, w = _queries(4, 16, seed=13)
    want = ragged_logits_reference(q, w, payload, scales, ks, ke)
    sentinel = 12345.0
    out = torch.full((4, width), sentinel, device=DEVICE)
    res = _run(q, w, payload, scales, ks, ke, clean_logits=False, out=out, block_n=16, block_m=2)
    assert res is out
    got = res.cpu()
    inside = torch.isfinite(want)
    bound = _bound(q, w, payload, scales, ks, ke)
    err = (got[inside].double() - want[inside].double()).abs()
    assert bool((err <= CPU_RTOL * bound[inside]).all())
    outside = ~inside
    assert bool(((got[outside] == float("-inf")) | (got[outside] == sentinel)).all())
    # Tokens 0-1: tiles [0, 32) scored (-inf past the window), [32, 96) untouched.
    assert bool((got[:2, 32:] == sentinel).all()) and bool((got[1, 20:32] == float("-inf")).all())
    # Tokens 2-3: only the tile [64, 80) is scored; token 3's window is empty.
    assert bool((got[2:, :64] == sentinel).all()) and bool((got[2:, 80:] == sentinel).all())
    assert bool((got[3, 64:80] == float("-inf")).all())


@needs_kernel
@pytest.mark.parametrize("mode", ["folded", "grouped"])
def test_prepare_keys_decodes_exactly(mode):
    payload, scales = _keys(70, seed=14)
    keys = prepare_keys(payload.to(DEVICE), scales.to(DEVICE), mode=mode, mma="fp8")
    vals = keys.values.cpu().to(torch.float64).view(70, 4, 2, 16)
    # Stored order per group: the 16 even elements, then the 16 odd ones.
    natural = vals.permute(0, 1, 3, 2).reshape(70, 128)
    exact = dequantize_index_k(payload, scales).double()
    if mode == "grouped":
        factor = torch.ldexp(torch.ones(70, 4, dtype=torch.float64), scales.double() - 127 + 6)
        got = (natural.view(70, 4, 32) * factor[:, :, None]).view(70, 128)
        assert keys.key_factor is None
    else:
        got = natural * keys.key_factor.cpu().double()[:, None]
        m = scales.max(dim=1).values.double()
        assert torch.equal(keys.key_factor.cpu().double(), torch.ldexp(torch.ones(70, dtype=torch.float64), m - 133))
    assert torch.equal(got, exact)


@needs_kernel
def test_prepare_keys_in_element_order_is_the_fp8_index_key_form():
    # values * key_factor is the key exactly, element by element: SGLang's FP8 form (e4m3 + fp32 per key).
    payload, scales = _keys(70, seed=16)
    keys = prepare_keys(payload.to(DEVICE), scales.to(DEVICE), mode="folded", mma="fp8", element_order=True)
    assert keys.values.dtype == torch.float8_e4m3fn and keys.values.is_contiguous()
    got = keys.values.cpu().double() * keys.key_factor.cpu().double()[:, None]
    assert torch.equal(got, dequantize_index_k(payload, scales).double())


def test_deepgemm_impl_refused_where_it_cannot_run():
    payload, scales = _keys(8, seed=17)
    q, w = _queries(2, 32, seed=17)
    ks, ke = _tensors([0, 0], [4, 8])
    assert deepgemm_reason(q, 32) == "not an NVIDIA CUDA device"
    with pytest.raises(ValueError, match="impl: 'deepgemm' cannot run here: not an NVIDIA CUDA device"):
        ragged_logits(q, w, payload, scales, ks, ke, impl="deepgemm")
    with pytest.raises(ValueError, match="impl: expected 'auto' or one of"):
        ragged_logits(q, w, payload, scales, ks, ke, impl="cutlass")


@needs_kernel
def test_packed_and_per_element_decode_agree():
    payload, scales = _keys(33, seed=15)
    aligned = prepare_keys(payload.to(DEVICE), scales.to(DEVICE), mode="grouped", mma="fp8")
    buf = torch.empty(33 * 64 + 1, dtype=torch.uint8, device=DEVICE)
    shifted = buf[1:].view(33, 64)  # misaligned by one byte: takes the per-element path
    shifted.copy_(payload)
    assert shifted.data_ptr() % 4 != 0
    other = prepare_keys(shifted, scales.to(DEVICE), mode="grouped", mma="fp8")
    assert torch.equal(aligned.values.view(torch.uint8), other.values.view(torch.uint8))
    # And the e4m3 bytes are those of docs/design.md, The index-key format: sign << 7 | (code & 7) << 2.
    codes = unpack_e2m1(payload).to(torch.int32).view(33, 4, 16, 2).permute(0, 1, 3, 2).reshape(33, 128)
    assert torch.equal(aligned.values.view(torch.uint8).cpu().to(torch.int32), ((codes & 8) << 4) | ((codes & 7) << 2))


@needs_kernel
def test_fold_beyond_exact_spread_rounds_as_documented():
    _check_fold_beyond_exact_spread(DEVICE)


@pytest.mark.gpu
def test_fold_beyond_exact_spread_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _check_fold_beyond_exact_spread("cuda", rtol=GPU_RTOL)


def _check_fold_beyond_exact_spread(device, rtol=CPU_RTOL):
    # Group scales 2**3, 2**0, 2**-12 and 2**-17 in every key: d = 0, 3, 15, 20 > FOLD_EXACT_SPREAD.
    # The queries are zero on groups 0 and 1, so the logits come from the groups that round.
    n = 40
    g = torch.Generator().manual_seed(16)
    payload = torch.randint(0, 256, (n, 64), generator=g, dtype=torch.uint8)
    scales = torch.tensor([130, 127, 115, 110], dtype=torch.uint8).repeat(n, 1)
    assert 130 - 115 > FOLD_EXACT_SPREAD
    ks, ke = _tensors([0, 5, 0], [n, 30, 1])
    q, w = _queries(3, 16, seed=16)
    q[:, :, :64] = 0
    exact = ragged_logits_reference(q, w, payload, scales, ks, ke)
    bound = _bound(q, w, payload, scales, ks, ke)
    _assert_close(_run(q, w, payload, scales, ks, ke, mode="grouped", block_n=16, device=device), exact, bound, rtol)
    # Folded: E2M1 * 2**(6 - d) rounded to nearest-even e4m3 (torch's cast), times 2**(m - 133).
    codes = unpack_e2m1(payload).view(n, 4, 32).long()
    e2m1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)
    d = (130 - scales.double())[:, :, None]
    folded = (e2m1[codes] * torch.exp2(6 - d)).to(torch.float32).to(torch.float8_e4m3fn).double()
    rounded_keys = (folded * 2.0 ** (130 - 133)).view(n, 128)
    want = torch.full((3, n), float("-inf"), dtype=torch.float64)
    for t, (lo, hi) in enumerate(zip(ks.tolist(), ke.tolist())):
        want[t, lo:hi] = torch.relu(rounded_keys[lo:hi] @ q[t].double().t()) @ w[t].double()
    for mma in ("fp8", "fp16"):  # the same e4m3-grid operands whatever the MMA type
        got = _run(q, w, payload, scales, ks, ke, mode="folded", mma=mma, block_n=16, device=device)
        _assert_close(got, want.to(torch.float32), bound, rtol)
    # The rounding is visible: folded differs from the exact logits by far more than the tolerance.
    fin = torch.isfinite(exact)
    assert bool(((got.cpu()[fin].double() - exact[fin].double()).abs() > rtol * bound[fin]).any())


def test_rows_per_chunk_rule():
    assert rows_per_chunk(100, 1000, 4000 * 7) == 7
    assert rows_per_chunk(5, 1000, 4000 * 7) == 5
    assert rows_per_chunk(100, 1000, 100) == 1  # one row over the budget still runs
    assert rows_per_chunk(0, 10, 100) == 1
    assert rows_per_chunk(3, 0, 100) == 3
    with pytest.raises(ValueError, match="budget_bytes"):
        rows_per_chunk(3, 4, 0)
    with pytest.raises(ValueError, match="num_rows"):
        rows_per_chunk(-1, 4, 10)


@needs_kernel
def test_iter_ragged_logits_chunks_cover_all_rows():
    ks, ke, width = _causal_windows([(30, 9), (5, 4)])
    ks, ke = _tensors(ks, ke)
    payload, scales = _keys(width, seed=17)
    q, w = _queries(len(ks), 32, seed=17)
    want = ragged_logits_reference(q, w, payload, scales, ks, ke)
    bound = _bound(q, w, payload, scales, ks, ke)
    budget = 4 * width * 5  # five rows per chunk
    d = DEVICE
    seen, buffers = [], set()
    for start, end, chunk in iter_ragged_logits(
        q.to(d), w.to(d), payload.to(d), scales.to(d), ks.to(d), ke.to(d), budget_bytes=budget, block_n=16
    ):
        assert chunk.shape == (end - start, width) and chunk.numel() * 4 <= budget
        buffers.add(chunk.data_ptr())
        _assert_close(chunk, want[start:end], bound[start:end], CPU_RTOL)
        seen.append((start, end))
    assert seen == [(0, 5), (5, 10), (10, 13)]
    assert len(buffers) == 1  # one reused buffer


@needs_kernel
def test_empty_inputs():
    payload, scales = _keys(10, seed=18)
    q, w = _queries(0, 16, seed=18)
    ks = ke = torch.zeros(0, dtype=torch.int32)
    assert _run(q, w, payload, scales, ks, ke).shape == (0, 10)
    q, w = _queries(2, 16, seed=18)
    z = torch.zeros(2, dtype=torch.int32)
    got = _run(q, w, payload[:0], scales[:0], z, z)
    assert got.shape == (2, 0)


@needs_kernel
def test_unchecked_windows_are_clamped():
    payload, scales = _keys(50, seed=19)
    q, w = _queries(2, 16, seed=19)
    ks, ke = _tensors([-5, 45], [10, 90])
    got = _run(q, w, payload, scales, ks, ke, check=False, block_n=16)
    cks, cke = ks.clamp_min(0), ke.clamp_max(50)
    want = ragged_logits_reference(q, w, payload, scales, cks, cke)
    _assert_close(got, want, _bound(q, w, payload, scales, cks, cke), CPU_RTOL)


def _small_args(seed: int) -> list[torch.Tensor]:
    """``(q, w, payload, scales, ks, ke)`` on ``DEVICE``: 3 tokens x 16 heads over 20 keys, windows [0, 5 .. 7)."""
    payload, scales = _keys(20, seed=seed)
    q, w = _queries(3, 16, seed=seed)
    ks, ke = _tensors([0, 0, 0], [5, 6, 7])
    return [t.to(DEVICE) for t in (q, w, payload, scales, ks, ke)]


@needs_kernel
def test_nan_or_inf_queries_or_weights_are_refused_when_checked():
    # As paged_logits: check=True reads q and weights on the host and refuses NaN/Inf, naming the argument.
    q, w, *keys = _small_args(21)
    bad_q = q.clone().view(torch.uint8)
    bad_q[1, 2, 3] = 0x7F  # e4m3 NaN
    bad_q = bad_q.view(q.dtype)
    bad_w = w.clone()
    bad_w[2, 0] = float("inf")
    for qq, ww, name in ((bad_q, w, "q"), (q, bad_w, "weights")):
        with pytest.raises(ValueError, match=f"^{name}: holds NaN or Inf"):
            ragged_logits(qq, ww, *keys, impl="triton")
        got = ragged_logits(qq, ww, *keys, impl="triton", check=False)  # check=False: no host read, no refusal
        assert got.shape == (3, 20)
    with pytest.raises(ValueError, match="^q: holds NaN or Inf"):
        list(iter_ragged_logits(bad_q, w, *keys, budget_bytes=1 << 20, impl="triton"))


@needs_kernel
def test_bad_inputs_name_the_argument():
    args = _small_args(20)
    d = DEVICE

    def call(i=None, value=None, **kw):
        a = list(args)
        if i is not None:
            a[i] = value
        return ragged_logits(*a, **kw)

    cases = [
        (0, args[0].float(), "q"),
        (0, args[0][:, :, :64], "q"),
        (0, args[0][:, :12], "q"),  # 12 heads: not a power of two
        (1, args[1].double(), "weights"),
        (1, args[1][:2], "weights"),
        (2, args[2][:, :32], "payload"),
        (3, args[3][:10], "payload and scales"),
        (3, args[3].to(torch.int32), "scales"),
        (4, args[4].long(), "ks"),
        (5, args[5][:2], "ke"),
        (5, torch.tensor([5, 6, 21], dtype=torch.int32, device=d), "ks, ke"),
        (4, torch.tensor([-1, 0, 0], dtype=torch.int32, device=d), "ks, ke"),
        (4, torch.zeros(3, 2, dtype=torch.int32, device=d)[:, 0], r"^ks: expected a contiguous tensor"),
        (5, args[5].long(), r"^ke: expected int32, got torch.int64$"),
        (5, args[5][:2], r"^ke: expected shape \[3\], got \[2\]$"),
    ]
    for i, value, name in cases:
        with pytest.raises(ValueError, match=name):
            call(i, value)
    with pytest.raises(TypeError, match="payload"):
        call(2, args[2].cpu().numpy())
    with pytest.raises(ValueError, match="mode"):
        call(mode="fast")
    with pytest.raises(ValueError, match="mma"):
        call(mma="int8")
    with pytest.raises(ValueError, match="mma"):
        call(0, args[0].to(torch.bfloat16), mma="fp8")
    with pytest.raises(ValueError, match="block_n"):
        call(block_n=48)
    with pytest.raises(ValueError, match="block_m"):
        call(block_m=0)
    with pytest.raises(ValueError, match="num_splits"):
        call(num_splits=0)
    with pytest.raises(ValueError, match="out"):
        call(out=torch.empty(3, 19, device=d))
    with pytest.raises(ValueError, match="mode"):
        prepare_keys(args[2], args[3], mode="auto")


def test_cpu_without_interpreter_is_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    payload, scales = _keys(4, seed=21)
    q, w = _queries(1, 16, seed=21)
    ks, ke = _tensors([0], [4])
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        ragged_logits(q, w, payload, scales, ks, ke)


def _full_size_case(heads: int, seed: int):
    # 8 K query tokens x 40 K keys: a 4 K-token extend on a 32 K prefix, then a fresh 4 K prefill.
    ks, ke, width = _causal_windows([(32768, 4096), (0, 4096)])
    ks, ke = _tensors(ks, ke)
    payload, scales = _keys(width, seed=seed)
    q, w = _queries(len(ks), heads, seed=seed)
    dev = "cuda"
    return q.to(dev), w.to(dev), payload.to(dev), scales.to(dev), ks.to(dev), ke.to(dev)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["folded", "grouped"])
def test_full_size_against_reference_in_chunks(mode):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    q, w, payload, scales, ks, ke = _full_size_case(64, seed=30)
    assert q.shape[0] == 8192 and payload.shape[0] == 40960
    whole = ragged_logits(q, w, payload, scales, ks, ke, mode=mode, impl="triton")
    for start, end, chunk in iter_ragged_logits(q, w, payload, scales, ks, ke, mode=mode, budget_bytes=1 << 28,
                                                impl="triton"):
        want = ragged_logits_reference(q[start:end], w[start:end], payload, scales, ks[start:end], ke[start:end])
        bound = _bound(q[start:end], w[start:end], payload, scales, ks[start:end], ke[start:end], torch.float32)
        _assert_close(chunk, want, bound, GPU_RTOL)
        _assert_close(whole[start:end], want, bound, GPU_RTOL)


@pytest.mark.gpu
@pytest.mark.parametrize("mma", ["bf16", "fp16"])
def test_portable_paths_on_gpu(mma):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    ks, ke, width = _causal_windows([(3000, 700), (0, 300)])
    ks, ke = _tensors(ks, ke)
    payload, scales = _keys(width, seed=31)
    dtype = torch.bfloat16 if mma == "bf16" else torch.float8_e4m3fn
    q, w = _queries(len(ks), 32, seed=31, dtype=dtype)
    want = ragged_logits_reference(q, w, payload, scales, ks, ke)
    bound = _bound(q, w, payload, scales, ks, ke)
    for mode in ("folded", "grouped"):
        got = ragged_logits(q.cuda(), w.cuda(), payload.cuda(), scales.cuda(), ks.cuda(), ke.cuda(), mode=mode, mma=mma,
                            impl="triton")
        _assert_close(got, want, bound, GPU_RTOL)


@pytest.mark.gpu
def test_deepgemm_impl_against_reference():
    """The default prefill path where DeepGEMM is installed: folded decode + DeepGEMM's fp8_mqa_logits.

    scripts/gpu_run.sh builds DeepGEMM and runs this with REQUIRE_DEEPGEMM=1, which turns a missing
    DeepGEMM into a failure instead of a skip."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    q, w, payload, scales, ks, ke = _full_size_case(64, seed=32)
    why = deepgemm_reason(q, 64)
    if why:
        if os.environ.get("REQUIRE_DEEPGEMM") == "1":
            pytest.fail(f"DeepGEMM required: {why}")
        pytest.skip(why)
    whole = ragged_logits(q, w, payload, scales, ks, ke)  # "auto" takes DeepGEMM here
    got_iter = list(iter_ragged_logits(q, w, payload, scales, ks, ke, budget_bytes=1 << 28, impl="deepgemm"))
    assert got_iter[-1][1] == q.shape[0]
    out = torch.full((q.shape[0], payload.shape[0]), float("nan"), device="cuda")
    ragged_logits(q, w, payload, scales, ks, ke, impl="deepgemm", out=out)
    for start, end, chunk in got_iter:
        want = ragged_logits_reference(q[start:end], w[start:end], payload, scales, ks[start:end], ke[start:end])
        bound = _bound(q[start:end], w[start:end], payload, scales, ks[start:end], ke[start:end], torch.float32)
        _assert_close(chunk, want, bound, GPU_RTOL)
        _assert_close(whole[start:end], want, bound, GPU_RTOL)
        _assert_close(out[start:end], want, bound, GPU_RTOL)
