"""The Hopper scorer (``paged_logits(impl="wgmma")``) on the device, against the torch oracle.

Same checks as test_paged_logits.py (its ``_check``), against the kernel's own
bound ``sm90.logit_error_bound`` (the FP8 MMA and its f16 accumulator, ``sm90.MMA_REL`` of
``sum_h |w| sum_d |q k|``, plus ``sm90.logit_error_floor``, plus its f16 head sum's ``sm90.HEADSUM_REL`` of
``sum_h |w| relu(s_h)``); the small
cases mirror that file's CPU cases, then full-size rows, every logits dtype,
out-of-range pages with check=False, and a CUDA graph of planner + scorer
replayed with new lengths (bitwise equal to eager runs).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from cases import floor_bound, make_paged_case, relu_bound, term_bound
from test_paged_logits import _check as _check_paged

from sglang_fp4_indexer.ops import sm90
from sglang_fp4_indexer.ops.paged_logits import paged_logits
from sglang_fp4_indexer.ops.schedule import plan_paged_schedule, plan_paged_schedule_into
from sglang_fp4_indexer.reference import paged_logits_reference

pytestmark = pytest.mark.gpu


def _kernel_bound(case, width, term=None):
    """``sm90.logit_error_bound`` per (row, column) of ``case`` (``term``: its term bound, if already computed)."""
    term = term_bound(case, width) if term is None else term
    return sm90.logit_error_bound(term, relu_bound(case, width), floor_bound(case, width))


def _within_bound(got, ref, case, width, cols=None, term=None):
    """|got - ref| <= ``_kernel_bound`` on the finite reference entries (of ``cols`` only, if given); returns the
    largest error / bound."""
    fin = torch.isfinite(ref) if cols is None else torch.isfinite(ref) & cols
    err = (got.double() - ref.double()).abs()[fin]
    allowed = _kernel_bound(case, width, term).to(got.device)[fin]
    assert torch.all(err <= allowed + 1e-30), f"max error / bound {(err / (allowed + 1e-30)).max().item():.3g}"
    return (err / (allowed + 1e-30)).max().item() if err.numel() else 0.0


def _check(case, **kw):
    """test_paged_logits' check (written elements, -inf tails) against the kernel's own per-logit bound."""
    return _check_paged(case, bound=_kernel_bound, **kw)


@pytest.fixture(autouse=True)
def _needs_hopper():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    why = sm90.unavailable_reason("cuda")
    if why:
        pytest.skip(why)


@pytest.mark.parametrize("heads", [64, 32])
@pytest.mark.parametrize("lens", [[1], [63], [64], [65], [1, 63, 64, 65, 130]])
def test_decode_small(heads, lens):
    _check(make_paged_case(lens, next_n=1, heads=heads, seed=len(lens) + heads, device="cuda"), impl="wgmma")


@pytest.mark.parametrize("next_n", [2, 3, 4])
@pytest.mark.parametrize("heads", [64, 32])
def test_target_verify(heads, next_n):
    _check(make_paged_case([4, 66, 129], next_n=next_n, heads=heads, seed=heads + next_n, device="cuda"), impl="wgmma")


@pytest.mark.parametrize("next_n", [2, 4])
def test_row_strided_block_table(next_n):
    """The kernel reads the page table through its row stride: every next_n-th row of SGLang's per-row table."""
    case = make_paged_case([4, 66, 129, 300], next_n=next_n, heads=64, seed=next_n, device="cuda")
    strided = case.block_table.repeat_interleave(next_n, dim=0)[::next_n]
    assert not strided.is_contiguous()
    _check(dataclasses.replace(case, block_table=strided), impl="wgmma")


def test_per_row_lengths_zero_rows_and_width():
    case = make_paged_case([[0, 5, 64], [70, 0, 1]], next_n=3, heads=32, per_row=True, seed=7, device="cuda")
    _check(case, width=150, impl="wgmma")


@pytest.mark.parametrize("num_ctas", [1, 3, 16, 400])
@pytest.mark.parametrize("block_kv", [64, 256])
def test_any_schedule(num_ctas, block_kv):
    case = make_paged_case([200, 3, 700, 64], next_n=2, heads=64, seed=3, device="cuda")
    _check(case, num_ctas=num_ctas, block_kv=block_kv, impl="wgmma")


@pytest.mark.parametrize("lens, num_ctas", [([0, 4096], 1), ([4096, 0, 4096], 1), ([0] * 9 + [5000], 2)])
def test_requests_without_keys_followed_by_many_pages(lens, num_ctas):
    # A request with no visible key takes a ring slot; more than STAGES jobs after it must not hang.
    _check(make_paged_case(lens, next_n=1, heads=64, seed=len(lens), device="cuda"), num_ctas=num_ctas,
           block_kv=64, impl="wgmma")


def test_all_zero_lengths_write_minus_inf():
    case = make_paged_case([0, 0], heads=32, seed=2, extra_pages=1, device="cuda")
    case.context_lens.zero_()
    got, _ = _check(case, width=70, impl="wgmma")
    assert torch.all(got == float("-inf"))


@pytest.mark.parametrize("heads", [16, 128])
def test_other_head_counts(heads):
    _check(make_paged_case([65, 300], next_n=1, heads=heads, seed=heads, device="cuda"), impl="wgmma")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_logits_are_the_fp32_logits_rounded_once(dtype):
    case = make_paged_case([70, 129, 1000], next_n=2, heads=64, seed=41, device="cuda")
    args = (case.q, case.weights, case.cache, case.block_table, case.context_lens)
    sched = plan_paged_schedule(case.context_lens, 64, 7)
    full = paged_logits(*args, schedule=sched, block_kv=64, impl="wgmma")
    low = paged_logits(*args, schedule=sched, block_kv=64, impl="wgmma", logits_dtype=dtype)
    assert torch.equal(low, full.to(dtype))


def test_unchecked_out_of_range_pages_are_masked_not_read():
    case = make_paged_case([300], heads=64, seed=4, device="cuda")
    good = make_paged_case([300], heads=64, seed=4, device="cuda")
    case.block_table[0, 1] = 10_000  # past the cache
    case.block_table[0, 3] = -5
    out = paged_logits(case.q, case.weights, case.cache, case.block_table, case.context_lens, check=False,
                       schedule=plan_paged_schedule(case.context_lens, 64, 3), block_kv=64, impl="wgmma")
    ref = paged_logits_reference(good.q, good.weights, good.cache, good.block_table, good.context_lens)
    bad = torch.zeros(out.shape[1], dtype=torch.bool, device="cuda")
    bad[64:128] = True
    bad[192:256] = True
    bad[300:] = True
    assert torch.all(out[0, bad] == float("-inf"))
    _within_bound(out, ref, good, out.shape[1], cols=~bad.unsqueeze(0))


def test_unchecked_lengths_schedule_and_nan_queries():
    # check=False: rows longer than the block table (nothing read past it, -inf columns), a schedule entry
    # naming request -2 (clamped: nothing written before out), NaN e4m3 query bytes (read as 0) -- the CPU
    # cases of test_paged_logits.py on the Hopper kernel, against its own bound.
    from test_paged_logits import (unchecked_lengths_past_the_block_table, unchecked_nan_query_elements,
                                   unchecked_negative_schedule_entry)

    def within(got, ref, case, width):
        _within_bound(got, ref, case, width)

    for run in (unchecked_lengths_past_the_block_table, unchecked_negative_schedule_entry, unchecked_nan_query_elements):
        run("wgmma", "cuda", within)


@pytest.mark.parametrize("next_n", [1, 4])
def test_full_size_h64_batch8_32k(next_n):
    lens = [32768 - 97 * i for i in range(8)]
    case = make_paged_case(lens, next_n=next_n, heads=64, seed=99, device="cuda")
    ctas = 3 * torch.cuda.get_device_properties(0).multi_processor_count
    # FP8 MMA on Hopper adds products in a narrower internal accumulator than fp32 (DeepGEMM's notes), the
    # kernel accumulates in f16: _check asserts sm90.logit_error_bound.
    _check(case, num_ctas=ctas, impl="wgmma", block_kv=64)
    _check(case, num_ctas=ctas, impl="wgmma", block_kv=256)


@pytest.mark.parametrize("next_n", [1, 2])
@pytest.mark.parametrize("heads", [32, 64])
def test_schedule_entries_past_the_last_cta(next_n, heads):
    # 7 schedule entries: the last CTA's fourth math warpgroup has no entry (its producer writes the end marker
    # at once). Within sm90.rel_bound() of the term bound plus the floor, and within sm90.logit_error_bound.
    case = make_paged_case([65, 300, 1000], next_n=next_n, heads=heads, seed=50 + next_n + heads, device="cuda")
    width = case.block_table.shape[1] * 64
    sched = plan_paged_schedule(case.context_lens, 64, 7)
    out = torch.full((case.q.shape[0], width), float("nan"), device="cuda")
    config = sm90.Config.of_call(next_n, heads, out.dtype, case.context_lens.dim() == 2)
    sm90.launch(config, case.q, case.weights, case.cache, case.block_table, case.context_lens, sched, out, block_kv=64)
    ref = paged_logits_reference(case.q, case.weights, case.cache, case.block_table, case.context_lens, width=width)
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(out))
    bound = term_bound(case, width).to(out.device)  # the same tolerance as test_paged_logits' GPU tests
    floor = floor_bound(case, width).to(out.device)
    err = (out.double() - ref.double()).abs()[fin] / (bound[fin] + 1e-30)
    assert torch.all((out.double() - ref.double()).abs()[fin] <= sm90.rel_bound() * bound[fin] + floor[fin])
    worst = _within_bound(out, ref, case, width, term=bound.cpu())
    print(f"next_n {next_n} H {heads}: max error / term bound {err.max().item():.3e}, / logit_error_bound {worst:.3e}")


def test_cuda_graph_of_planner_and_scorer_follows_new_lengths():
    batch, next_n, heads, block_kv = 6, 2, 64, 64
    # [B, next_n] lengths, so rows of zero keys are valid lengths too.
    case = make_paged_case([[4000] * next_n] * batch, next_n=next_n, heads=heads, seed=8, device="cuda", per_row=True)
    lens = case.context_lens.clone()
    num_ctas = 3 * torch.cuda.get_device_properties(0).multi_processor_count
    sched = torch.empty((num_ctas + 1, 2), dtype=torch.int32, device="cuda")
    width = case.block_table.shape[1] * 64
    out = torch.empty((batch * next_n, width), device="cuda")

    def step():
        plan_paged_schedule_into(lens, block_kv, sched)
        paged_logits(case.q, case.weights, case.cache, case.block_table, lens, schedule=sched, out=out,
                     block_kv=block_kv, check=False, impl="wgmma")

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # builds and loads the kernel outside capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    g = torch.Generator().manual_seed(2)
    for name, new in {
        "grow": torch.randint(2000, 4000, (batch, next_n), generator=g),
        "shrink": torch.randint(0, 300, (batch, next_n), generator=g),
        "zeros": torch.zeros((batch, next_n), dtype=torch.int64),
        "max": torch.full((batch, next_n), 4000),
    }.items():
        lens.copy_(new.to(torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        replayed = out.clone()
        eager = paged_logits(case.q, case.weights, case.cache, case.block_table, lens, width=width, block_kv=block_kv,
                             schedule=plan_paged_schedule(lens, block_kv, num_ctas), impl="wgmma")
        assert torch.equal(replayed, eager), name
        ref = paged_logits_reference(case.q, case.weights, case.cache, case.block_table, lens, width=width)
        fin = torch.isfinite(ref)
        assert torch.equal(fin, torch.isfinite(replayed)), name
        _within_bound(replayed, ref, dataclasses.replace(case, context_lens=lens.clone()), width)


@pytest.mark.parametrize("next_n, heads", [(2, 64), (2, 32), (4, 32), (4, 64), (8, 32)])
def test_rows_per_wgmma_and_unclean_tail(next_n, heads):
    # Served rows per wgmma (sm90.MMA_ROWS_DEFAULTS: N = 2 x 32 and 4 x 32 score several next_n rows of a page at
    # once, each row's epilogue reading its slice of the accumulators; one row per wgmma elsewhere); checked
    # against the oracle within the kernel's bound. clean_logits=False: every column up to the end of a
    # request's last page is the same as with the -inf tail, and the tail past it is not written (the NaN
    # poison stays).
    case = make_paged_case([65, 300, 1000], next_n=next_n, heads=heads, seed=90 + next_n + heads, device="cuda")
    width = case.block_table.shape[1] * 64 + 256
    sched = plan_paged_schedule(case.context_lens, 64, 7)
    outs = []
    for clean in (True, False):
        out = torch.full((case.q.shape[0], width), float("nan"), device="cuda")
        config = sm90.Config.of_call(next_n, heads, out.dtype, False)
        sm90.launch(config, case.q, case.weights, case.cache, case.block_table, case.context_lens, sched, out,
                    block_kv=64, clean_logits=clean)
        outs.append(out)
    ref = paged_logits_reference(case.q, case.weights, case.cache, case.block_table, case.context_lens, width=width)
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(outs[0])) and not torch.isnan(outs[0]).any()
    _within_bound(outs[0], ref, case, width)
    for r in range(outs[0].shape[0]):
        written = -(-int(case.context_lens[r // next_n]) // 64) * 64
        assert torch.equal(outs[1][r, :written], outs[0][r, :written])
        assert torch.isnan(outs[1][r, written:]).all()


def test_every_serving_configuration_builds_and_loads():
    # What SGLang hands the scorer: 2-D lengths ([rows, 1] decode, [B, next_n] verify), 64 (DeepSeek-V3.2) and
    # 32 (GLM-5.x) heads, fp32 logits; the [B] form too.
    for next_n, heads, lens_2d in ((1, 64, True), (1, 32, True), (2, 64, True), (4, 64, True), (2, 32, True),
                                   (4, 32, True), (8, 32, True), (1, 64, False), (4, 64, False)):
        config = sm90.Config.of_call(next_n, heads, torch.float32, lens_2d)
        assert sm90.serving_unavailable("cuda", config) is None, config


def test_failed_serving_build_falls_back_to_triton_in_a_cuda_graph(monkeypatch):
    # A configuration whose build fails (forced here) is warned about once and scored by the Triton kernel, in
    # eager warm-up and inside a captured graph, with the same schedule; the result equals the Triton kernel's.
    from sglang_fp4_indexer.ops import nvrtc
    from sglang_fp4_indexer.ops.paged_logits import WGMMA_BLOCK_KV

    real_compile = nvrtc.compile_cubin

    def refuse(source, name, arch, defines=(), **kw):
        d = dict(defines)
        if d.get("LENS_2D") == "1" and d.get("HEADS") == "32":
            raise RuntimeError("NVRTC could not compile (forced by the test)")
        return real_compile(source, name, arch, defines, **kw)

    monkeypatch.setattr(nvrtc, "compile_cubin", refuse)
    monkeypatch.setattr(nvrtc, "_KERNELS", {})
    case = make_paged_case([300, 70, 5], next_n=1, heads=32, seed=63, device="cuda")
    lens = case.context_lens.view(-1, 1).contiguous()
    sched = plan_paged_schedule(lens, WGMMA_BLOCK_KV, 8)
    want = paged_logits(case.q, case.weights, case.cache, case.block_table, lens, schedule=sched,
                        block_kv=WGMMA_BLOCK_KV, impl="folded", check=False)
    out = torch.empty_like(want)

    def step():
        paged_logits(case.q, case.weights, case.cache, case.block_table, lens, schedule=sched, out=out,
                     block_kv=WGMMA_BLOCK_KV, check=False)

    with pytest.warns(UserWarning, match="could not be built, loaded or launched"):
        step()
    assert torch.equal(out, want)
    out.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
