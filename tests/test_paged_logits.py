"""The paged FP4 scorer against the torch oracle (reference.paged_logits_reference).

Tolerance: the kernel multiplies exactly (e4m3 x e4m3, or fp16/bf16 holding
the same values) and accumulates in fp32 in an order of its own; the oracle
sums in fp64. A float32 sum of n terms lies within n * 2**-24 of the sum of
the terms' magnitudes; a logit is built from at most 32 + 4 + H + 2 roundings,
so |kernel - oracle| <= 2e-5 * bound, with bound = sum_h |w| sum_d |q k| per
column (tests/cases.py). Columns at or past a row's length must be exactly -inf.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from cases import make_paged_case, term_bound

from sglang_fp4_indexer.ops.paged_logits import DEFAULT_BLOCK_KV, TritonTuning, paged_logits, paged_scorer
from sglang_fp4_indexer.ops.schedule import plan_paged_schedule
from sglang_fp4_indexer.reference import paged_logits_reference, topk_reference

REL = 2e-5


def _check(case, width=None, num_ctas=5, mma="auto", rel=REL, block_kv=64, impl="scaled", num_warps=None, bound=None):
    """Run the scorer on ``case`` and check it against the oracle: every element written, ``-inf`` exactly
    where the reference has it, and ``|got - ref| <= rel * term_bound`` elsewhere, or ``<= bound(case, width)``
    when a bound function is given (a kernel with its own error model). Returns ``(got, ref)``.

    ``paged_logits`` runs it, or with ``num_warps`` the launcher of its configuration with that Triton
    tuning (``paged_scorer``, as the experiments tune it)."""
    max_pages = case.block_table.shape[1]
    width = width or max_pages * 64
    sched = plan_paged_schedule(case.context_lens, block_kv, num_ctas)
    out = torch.full((case.q.shape[0], width), float("nan"), dtype=torch.float32, device=case.q.device)
    if num_warps is None:
        got = paged_logits(
            case.q, case.weights, case.cache, case.block_table, case.context_lens,
            width=width, schedule=sched, out=out, mma=mma, block_kv=block_kv, impl=impl,
        )
    else:
        launcher = paged_scorer(case.q.device, case.q.shape[1], case.q.shape[0] // case.block_table.shape[0],
                                lens_2d=case.context_lens.dim() == 2, block_kv=block_kv, clean_logits=True,
                                q_dtype=case.q.dtype, impl=impl, mma=mma, tuning=TritonTuning(num_warps=num_warps))
        got = launcher(case.q, case.weights, case.cache, case.block_table, case.context_lens, sched, out)
    assert got.data_ptr() == out.data_ptr()
    ref = paged_logits_reference(case.q, case.weights, case.cache, case.block_table, case.context_lens, width=width)
    assert not torch.isnan(got).any(), "an output element was left unwritten"
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(got)), "-inf columns differ from the reference"
    assert torch.all(got[~fin] == float("-inf"))
    allowed = (rel * term_bound(case, width) if bound is None else bound(case, width)).to(got.device)
    err = (got.double() - ref.double()).abs()
    assert torch.all(err[fin] <= allowed[fin] + 1e-30), f"max err / bound {(err[fin] / (allowed[fin] + 1e-30)).max()}"
    return got, ref


@pytest.mark.parametrize("impl", ["scaled", "folded"])
@pytest.mark.parametrize("heads", [64, 32])
@pytest.mark.parametrize("lens", [[1], [63], [64], [65], [1, 63, 64, 65, 130]])
def test_decode_matches_reference(heads, lens, impl):
    _check(make_paged_case(lens, next_n=1, heads=heads, seed=len(lens) + heads), impl=impl)


@pytest.mark.parametrize("impl", ["scaled", "folded"])
@pytest.mark.parametrize("heads", [64, 32])
def test_target_verify_next_n_4(heads, impl):
    # [B] lengths: row i of a request sees ctx - next_n + i + 1 keys.
    _check(make_paged_case([4, 66, 129], next_n=4, heads=heads, seed=heads), impl=impl)


def test_next_n_per_row_lengths_and_padding():
    # [B, next_n] lengths with next_n = 3 (padded to 4 inside the kernel), zero-length rows.
    case = make_paged_case([[0, 5, 64], [70, 0, 1]], next_n=3, heads=32, per_row=True, seed=7)
    _check(case, width=150)


def test_more_ctas_than_tiles_and_one_cta():
    case = make_paged_case([200, 3], next_n=2, heads=32, seed=3)
    _check(case, num_ctas=1)
    _check(case, num_ctas=16)


@pytest.mark.parametrize("mma", ["fp8", "fp16"])
def test_mma_modes_agree(mma):
    _check(make_paged_case([70, 129], heads=32, seed=11), mma=mma, impl="scaled")


def test_bf16_queries():
    _check(make_paged_case([65, 10], heads=32, seed=5, q_dtype=torch.bfloat16))


def test_block_kv_128_two_pages_per_tile():
    _check(make_paged_case([200, 65, 1], heads=32, seed=13), block_kv=128)


def test_all_zero_lengths_write_minus_inf():
    case = make_paged_case([0, 0], heads=32, seed=2, extra_pages=1)
    case.context_lens.zero_()
    got, _ = _check(case, width=70)
    assert torch.all(got == float("-inf"))


def test_topk_over_kernel_logits_matches_reference_topk():
    case = make_paged_case([300, 129], heads=64, seed=21)
    got, ref = _check(case)
    k = 64
    # Top-k agrees wherever the reference's k-th and (k+1)-th scores are separated by more than the tolerance.
    a, b = topk_reference(got, k), topk_reference(ref, k)
    assert torch.equal(a, b)


def test_unchecked_out_of_range_page_is_masked_not_read():
    case = make_paged_case([100], heads=32, seed=4)
    case.block_table[0, 1] = 10_000  # a page past the cache
    out = paged_logits(case.q, case.weights, case.cache, case.block_table, case.context_lens, check=False,
                       schedule=plan_paged_schedule(case.context_lens, 64, 2))
    assert torch.all(out[0, 64:] == float("-inf"))
    good = make_paged_case([100], heads=32, seed=4)
    ref = paged_logits_reference(good.q, good.weights, good.cache, good.block_table, good.context_lens)
    assert torch.allclose(out[0, :64], ref[0, :64], rtol=1e-5, atol=0)
    with pytest.raises(ValueError, match="block_table"):
        paged_logits(case.q, case.weights, case.cache, case.block_table, case.context_lens)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda c: setattr(c, "q", c.q.float()), "q: expected float8_e4m3fn or bfloat16"),
        (lambda c: setattr(c, "q", c.q[:, :, :64]), r"q: expected \[rows, H, 128\]"),
        (lambda c: setattr(c, "q", c.q[:, :24]), "index heads"),
        (lambda c: setattr(c, "weights", c.weights.double()), "weights"),
        (lambda c: setattr(c, "weights", c.weights[:, :1]), "weights"),
        (lambda c: setattr(c, "cache", c.cache[:, :100]), "cache"),
        (lambda c: setattr(c, "cache", c.cache.to(torch.int8)), "cache: expected uint8"),
        (lambda c: setattr(c, "block_table", c.block_table.long()), "block_table"),
        (lambda c: setattr(c, "context_lens", c.context_lens.long()), "context_lens"),
        (lambda c: setattr(c, "context_lens", c.context_lens[:1]), "context_lens"),
        (lambda c: setattr(c, "context_lens", c.context_lens * 0 + 10_000), "context_lens"),
        (lambda c: (setattr(c, "q", torch.cat([c.q, c.q[:1]])), setattr(c, "weights", torch.cat([c.weights, c.weights[:1]]))), "rows"),
    ],
)
def test_bad_input_raises(mutate, match):
    case = make_paged_case([70, 5], heads=32, seed=1)
    mutate(case)
    with pytest.raises(ValueError, match=match):
        paged_logits(case.q, case.weights, case.cache, case.block_table, case.context_lens)


def test_index_tensor_errors_say_what_is_wrong():
    # Each message names the argument and the one property that is off (dtype, shape, or contiguity).
    case = make_paged_case([70, 5], heads=32, seed=1)
    q, w, cache, bt, lens = case.q, case.weights, case.cache, case.block_table, case.context_lens
    strided_lens = torch.stack([lens, lens], dim=1)[:, 0]  # int32 [2], stride 2
    strided_bt = bt.t().contiguous().t()  # int32 [2, 2], column-major
    assert strided_lens.dtype == torch.int32 and not strided_lens.is_contiguous() and not strided_bt.is_contiguous()
    for args, match in (
        ((q, w, cache, bt, strided_lens), r"^context_lens: expected a contiguous tensor, got shape \[2\] with strides \[2\]"),
        ((q, w, cache, strided_bt, lens), r"^block_table: expected contiguous rows \(column stride 1\), got shape \[2, 2\]"),
        ((q, w, cache, bt, lens.long()), r"^context_lens: expected int32, got torch.int64$"),
        ((q, w, cache, bt.long(), lens), r"^block_table: expected int32, got torch.int64$"),
        ((q, w, cache, bt, lens[:1]), r"^context_lens: expected shape \[2\] or \[2, 1\], got \[1\]$"),
        ((q, w, cache, bt[0], lens), r"^block_table: expected shape \[B, max_pages\], got \[2\]$"),
    ):
        with pytest.raises(ValueError, match=match):
            paged_logits(*args)


@pytest.mark.parametrize("impl", ["scaled", "folded"])
def test_row_strided_block_table(impl):
    """A row-strided table (every next_n-th row of SGLang's per-row table, as the plugin hands over target verify)
    is read through its row stride, no copy: the same logits as the reference on the contiguous table."""
    case = make_paged_case([70, 130, 5], next_n=2, heads=32, seed=3)
    per_row = case.block_table.repeat_interleave(2, dim=0)  # SGLang's form: one page-table row per query row
    strided = per_row[::2]
    assert not strided.is_contiguous() and strided.stride() == (2 * per_row.shape[1], 1)
    _check(dataclasses.replace(case, block_table=strided), impl=impl)


def test_bad_width_out_schedule_raise():
    case = make_paged_case([70, 5], heads=32, seed=1)
    args = (case.q, case.weights, case.cache, case.block_table, case.context_lens)
    with pytest.raises(ValueError, match="width"):
        paged_logits(*args, width=10)
    with pytest.raises(ValueError, match="out"):
        paged_logits(*args, out=torch.empty(2, 3))
    with pytest.raises(ValueError, match="schedule"):
        paged_logits(*args, schedule=torch.zeros(3, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="mma"):
        paged_logits(*args, mma="int8")


@pytest.mark.gpu
@pytest.mark.parametrize("next_n", [1, 4])
def test_gpu_full_size_h64_batch8_32k(next_n):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    lens = [32768 - 97 * i for i in range(8)]
    case = make_paged_case(lens, next_n=next_n, heads=64, seed=99, device="cuda")
    # FP8 MMA on Hopper adds products in a narrower internal accumulator than fp32
    # (DeepGEMM's notes); the bound is the same shape, wider by the measured factor.
    ctas = 2 * torch.cuda.get_device_properties(0).multi_processor_count
    for impl in ("scaled", "folded"):
        _check(case, num_ctas=ctas, rel=1e-3, impl=impl, block_kv=128)
    # The folded PTX must be right whatever register layout Triton picks.
    for block_kv, warps in ((256, 4), (128, 8), (256, 8)):
        _check(case, num_ctas=ctas, rel=1e-3, impl="folded", block_kv=block_kv, num_warps=warps)


@pytest.mark.parametrize("next_n", [1, 3])
def test_scaled_impl_odd_next_n(next_n):
    _check(make_paged_case([65, 130, 3], next_n=next_n, heads=32, seed=17 + next_n), impl="scaled")


def test_unknown_formulations_are_refused():
    case = make_paged_case([65], next_n=1, heads=32, seed=1)
    for impl in ("group", "fold"):
        with pytest.raises(ValueError, match=r"impl: expected 'auto' or one of \('scaled', 'folded', 'wgmma'\)"):
            paged_logits(case.q, case.weights, case.cache, case.block_table, case.context_lens, impl=impl)


@pytest.mark.parametrize("next_n", [1, 2])
@pytest.mark.parametrize("heads", [64, 32])
def test_folded_impl_matches_reference(heads, next_n):
    # Keys of tests/cases.py have group scales within 2**11 of each other, where "folded" is exact.
    _check(make_paged_case([1, 65, 130], next_n=next_n, heads=heads, seed=23 + heads), impl="folded")


def test_folded_flushes_groups_more_than_2_11_below_the_largest():
    from sglang_fp4_indexer.format import quantize_index_k
    from sglang_fp4_indexer.pool import payload_plane, scale_plane

    case = make_paged_case([64], heads=32, seed=31, extra_pages=0)
    keys = torch.randn(64, 128)
    keys[:, 32:64] *= 2.0**-14  # group 1 far below the others: flushed by "folded"
    keys[:, 64:96] *= 2.0**-8  # group 2 within range: exact
    p, s = quantize_index_k(keys)
    page = int(case.block_table[0, 0])
    payload_plane(case.cache)[page] = p
    scale_plane(case.cache)[page] = s
    got = paged_logits(case.q, case.weights, case.cache, case.block_table, case.context_lens, impl="folded",
                       schedule=plan_paged_schedule(case.context_lens, DEFAULT_BLOCK_KV, 2))
    flushed = keys.clone()
    flushed[:, 32:64] = 0
    p2, s2 = quantize_index_k(flushed)
    s2[:, 1] = s[:, 1]  # keep a valid scale code for the zero group
    payload_plane(case.cache)[page] = p2
    scale_plane(case.cache)[page] = s2
    ref = paged_logits_reference(case.q, case.weights, case.cache, case.block_table, case.context_lens)
    bound = term_bound(case, 64)
    assert torch.all((got.double() - ref.double()).abs()[:, :64] <= REL * bound + 1e-30)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_logits_are_the_fp32_logits_rounded_once(dtype):
    case = make_paged_case([70, 129], heads=32, seed=41)
    args = (case.q, case.weights, case.cache, case.block_table, case.context_lens)
    sched = plan_paged_schedule(case.context_lens, DEFAULT_BLOCK_KV, 3)
    full = paged_logits(*args, schedule=sched)
    low = paged_logits(*args, schedule=sched, logits_dtype=dtype)
    assert low.dtype == dtype
    # Same fp32 sum, one rounding on store: equal to the fp32 logits cast.
    assert torch.equal(low, full.to(dtype))
    with pytest.raises(ValueError, match="logits_dtype"):
        paged_logits(*args, logits_dtype=torch.float64)


def test_stale_schedule_or_other_block_kv_is_refused_when_checked():
    case = make_paged_case([300, 10], heads=32, seed=43)
    args = (case.q, case.weights, case.cache, case.block_table, case.context_lens)
    stale = plan_paged_schedule(torch.tensor([10, 10], dtype=torch.int32), 64, 3)
    with pytest.raises(ValueError, match="schedule: does not match"):
        paged_logits(*args, schedule=stale, block_kv=64)
    other_bkv = plan_paged_schedule(case.context_lens, DEFAULT_BLOCK_KV, 3)
    with pytest.raises(ValueError, match="schedule: does not match"):
        paged_logits(*args, schedule=other_bkv, block_kv=64)
    with pytest.raises(ValueError, match="schedule: does not match"):
        paged_logits(*args, schedule=torch.zeros(4, 2, dtype=torch.int32), block_kv=64)


def test_nan_queries_or_weights_are_refused_when_checked():
    case = make_paged_case([70], heads=32, seed=44, q_dtype=torch.bfloat16)
    q = case.q.clone()
    q[0, 3, 7] = float("nan")
    with pytest.raises(ValueError, match="q: holds NaN"):
        paged_logits(q, case.weights, case.cache, case.block_table, case.context_lens)
    w = case.weights.clone()
    w[0, 1] = float("inf")
    with pytest.raises(ValueError, match="weights: holds NaN"):
        paged_logits(case.q, w, case.cache, case.block_table, case.context_lens)


def test_non_tensor_arguments_raise_type_error_naming_them():
    case = make_paged_case([70], heads=32, seed=45)
    with pytest.raises(TypeError, match="block_table"):
        paged_logits(case.q, case.weights, case.cache, case.block_table.tolist(), case.context_lens)
    with pytest.raises(TypeError, match="context_lens"):
        paged_logits(case.q, case.weights, case.cache, case.block_table, [70])
    with pytest.raises(ValueError, match="weights"):
        paged_logits(case.q, case.weights.tolist(), case.cache, case.block_table, case.context_lens)
    with pytest.raises(TypeError, match="schedule"):
        paged_logits(case.q, case.weights, case.cache, case.block_table, case.context_lens, schedule=[[0, 0]])


def test_empty_batch_returns_an_empty_result():
    case = make_paged_case([70], heads=32, seed=46)
    out = paged_logits(case.q[:0], case.weights[:0], case.cache, case.block_table[:0], case.context_lens[:0], width=64)
    assert out.shape == (0, 64) and out.dtype == torch.float32
    with pytest.raises(ValueError, match="rows"):
        paged_logits(case.q[:0], case.weights[:0], case.cache, case.block_table, case.context_lens)


@pytest.mark.parametrize("impl", ["folded", "scaled"])
def test_clean_logits_false_leaves_the_tail_past_the_last_page(impl):
    # The serving path: a buffer as wide as the model's context; SGLang's top-k masks by length, so the
    # columns past each request's last page are not written (the NaN poison stays), while every column up to
    # the end of that page is exactly as with clean_logits=True.
    case = make_paged_case([5, 64, 130], next_n=2, heads=32, seed=11)
    width = 512
    sched = plan_paged_schedule(case.context_lens, 64, 4)
    ref = paged_logits_reference(case.q, case.weights, case.cache, case.block_table, case.context_lens, width=width)
    clean = paged_logits(case.q, case.weights, case.cache, case.block_table, case.context_lens, width=width,
                         schedule=sched, block_kv=64, impl=impl)
    out = torch.full_like(clean, float("nan"))
    paged_logits(case.q, case.weights, case.cache, case.block_table, case.context_lens, width=width,
                 schedule=sched, block_kv=64, impl=impl, out=out, clean_logits=False)
    for r in range(out.shape[0]):
        written = -(-int(case.context_lens[r // 2]) // 64) * 64  # up to the end of the request's last page
        assert torch.equal(out[r, :written], clean[r, :written])
        assert torch.isnan(out[r, written:]).all()
        assert torch.equal(torch.isfinite(clean[r]), torch.isfinite(ref[r]))


def _rel_within(rel=REL):
    """``within(got, ref, case, width)``: ``|got - ref| <= rel * term_bound`` on the finite reference entries."""
    def within(got, ref, case, width):
        fin = torch.isfinite(ref)
        allowed = (rel * term_bound(case, width)).to(got.device)
        assert torch.all((got.double() - ref.double()).abs()[fin] <= allowed[fin] + 1e-30)
    return within


def unchecked_lengths_past_the_block_table(impl, device="cpu", within=_rel_within()):
    """check=False with rows longer than the block table holds: keys past max_pages * 64 are not read (not the
    next request's row, not past the tensor for the last one) and their columns are -inf; the keys the table
    holds are scored as the reference scores them (``within`` asserts the error bound)."""
    from sglang_fp4_indexer.reference import expand_context_lens

    case = make_paged_case([128, 100], next_n=2, heads=32, seed=51, device=device)  # 2 pages per row
    assert case.block_table.shape[1] == 2
    long_lens = torch.tensor([200, 190], dtype=torch.int32, device=device)
    width = 256
    out = torch.full((4, width), float("nan"), device=device)
    paged_logits(case.q, case.weights, case.cache, case.block_table, long_lens, width=width, out=out, impl=impl,
                 block_kv=64, schedule=plan_paged_schedule(long_lens, 64, 3), check=False)
    # Oracle: row i of request b sees ctx - next_n + 1 + i keys, of which the table holds the first 128.
    case.context_lens = expand_context_lens(long_lens.cpu(), 2).clamp(max=128).to(torch.int32).to(device)
    assert case.context_lens.tolist() == [[128, 128], [128, 128]]
    ref = paged_logits_reference(case.q, case.weights, case.cache, case.block_table, case.context_lens, width=width)
    assert torch.all(out[:, 128:] == float("-inf")), "a column past the block table was scored"
    assert torch.equal(torch.isfinite(ref).to(out.device), torch.isfinite(out))
    within(out, ref, case, width)


def unchecked_negative_schedule_entry(impl, device="cpu", within=_rel_within()):
    """A corrupt schedule whose first entry names request -2 and key block -1: the kernel clamps them to 0,
    so nothing is written before ``out`` and the logits are the reference's."""
    case = make_paged_case([70, 130], next_n=1, heads=32, seed=52, device=device)
    sched = plan_paged_schedule(case.context_lens, 64, 3)
    assert sched[0].tolist() == [0, 0]
    sched[0] = torch.tensor([-2, -1], dtype=torch.int32, device=sched.device)
    guard = 4
    buf = torch.full((guard + 2, 192), 7.0, device=device)
    out = buf[guard:]
    paged_logits(case.q, case.weights, case.cache, case.block_table, case.context_lens, out=out, impl=impl,
                 block_kv=64, schedule=sched, check=False)
    assert torch.all(buf[:guard] == 7.0), "the kernel wrote before out"
    ref = paged_logits_reference(case.q, case.weights, case.cache, case.block_table, case.context_lens, width=192)
    assert torch.equal(torch.isfinite(ref).to(out.device), torch.isfinite(out))
    within(out, ref, case, 192)


def _nan_queries(q):
    """e4m3 ``q`` with NaN bytes (0x7F and 0xFF) in a few elements of several heads, and the same queries
    with those elements 0 (what check=False promises to read)."""
    bits = q.view(torch.uint8).clone()
    bits[0, 3, 7] = 0x7F
    bits[0, 3, 100] = 0xFF
    bits[1, 0, 0] = 0x7F
    bits[-1, -1, 127] = 0xFF
    zeroed = bits.clone()
    zeroed[(zeroed & 0x7F) == 0x7F] = 0
    return bits.view(torch.float8_e4m3fn), zeroed.view(torch.float8_e4m3fn)


def unchecked_nan_query_elements(impl, device="cpu", within=_rel_within()):
    """check=False reads a NaN element of e4m3 q as 0 (check=True refuses it)."""
    case = make_paged_case([70, 130], next_n=2, heads=32, seed=53, device=device)
    nan_q, zeroed = _nan_queries(case.q)
    assert int(torch.isnan(nan_q.float()).sum()) == 4
    sched = plan_paged_schedule(case.context_lens, 64, 3)
    got = paged_logits(nan_q, case.weights, case.cache, case.block_table, case.context_lens, impl=impl,
                       block_kv=64, schedule=sched, check=False)
    case.q = zeroed
    ref = paged_logits_reference(case.q, case.weights, case.cache, case.block_table, case.context_lens)
    assert torch.equal(torch.isfinite(ref).to(got.device), torch.isfinite(got))
    within(got, ref, case, got.shape[1])
    with pytest.raises(ValueError, match="q: holds NaN"):
        paged_logits(nan_q, case.weights, case.cache, case.block_table, case.context_lens, impl=impl, block_kv=64)


@pytest.mark.parametrize("impl", ["folded", "scaled"])
def test_unchecked_lengths_past_the_block_table_are_masked(impl):
    unchecked_lengths_past_the_block_table(impl)


@pytest.mark.parametrize("impl", ["folded", "scaled"])
def test_unchecked_negative_schedule_entry_writes_nothing_before_out(impl):
    unchecked_negative_schedule_entry(impl)


@pytest.mark.parametrize("impl", ["folded", "scaled"])
def test_unchecked_nan_query_elements_are_read_as_zero(impl):
    unchecked_nan_query_elements(impl)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["folded", "scaled"])
def test_gpu_unchecked_reads_and_writes_stay_in_bounds(impl):
    # The three check=False cases on the GPU's Triton kernels (FP8 MMA: the narrow-accumulation bound).
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for run in (unchecked_lengths_past_the_block_table, unchecked_negative_schedule_entry, unchecked_nan_query_elements):
        run(impl, "cuda", _rel_within(1e-3))


def test_unchecked_nan_bf16_query_elements_are_read_as_zero():
    case = make_paged_case([70], heads=32, seed=54, q_dtype=torch.bfloat16)
    q = case.q.clone()
    q[0, 5, 9] = float("nan")
    zeroed = q.nan_to_num(nan=0.0)
    got = paged_logits(q, case.weights, case.cache, case.block_table, case.context_lens, check=False,
                       schedule=plan_paged_schedule(case.context_lens, DEFAULT_BLOCK_KV, 2), block_kv=DEFAULT_BLOCK_KV)
    case.q = zeroed
    ref = paged_logits_reference(case.q, case.weights, case.cache, case.block_table, case.context_lens)
    assert torch.equal(torch.isfinite(ref), torch.isfinite(got))
    _rel_within()(got, ref, case, got.shape[1])
