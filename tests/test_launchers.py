"""The launchers, resolved once per configuration and called with tensors only (CPU, Triton under the interpreter):
the paged scorer's (``paged_logits.paged_scorer``) against the torch oracle over several calls of one
configuration, the serving set (``serving.ServingKernels``: store bytes against ``format.quantize_index_k``,
schedules against ``reference.paged_schedule_reference``), the argument block, and the errors naming the argument.
Tolerance as tests/test_paged_logits.py."""

from __future__ import annotations

import ctypes

import pytest
import torch
from cases import make_paged_case, term_bound

from sglang_fp4_indexer.format import quantize_index_k
from sglang_fp4_indexer.ops import nvrtc
from sglang_fp4_indexer.ops.paged_logits import TritonTuning, paged_scorer
from sglang_fp4_indexer.ops.schedule import plan_paged_schedule
from sglang_fp4_indexer.ops.serving import ServingKernels
from sglang_fp4_indexer.pool import allocate_index_k_cache, read_index_k
from sglang_fp4_indexer.reference import expand_context_lens, paged_logits_reference, paged_schedule_reference

REL = 2e-5


def _per_row(case, next_n):
    """``case`` with SGLang's per-row ``[B, next_n]`` lengths."""
    case.context_lens = expand_context_lens(case.context_lens, next_n).to(torch.int32).contiguous()
    return case


@pytest.mark.parametrize("impl", ["folded", "scaled"])
def test_one_launcher_scores_many_calls_of_its_configuration(impl):
    """Resolved once, the launcher scores calls of other batches and lengths of its configuration; each equals
    the oracle within the fp32 bound, -inf exactly where the oracle has it, the tail past the request's last page
    left untouched (clean_logits=False)."""
    launcher = paged_scorer("cpu", 32, 2, lens_2d=True, block_kv=64, clean_logits=False, impl=impl)
    assert (launcher.kernel, launcher.reason, launcher.clean_logits) == (impl, None, False)
    for seed, lens in enumerate(([70, 130], [1, 64, 65], [200])):
        case = _per_row(make_paged_case(lens, next_n=2, heads=32, seed=40 + seed), 2)
        width = case.block_table.shape[1] * 64 + 64
        out = torch.full((case.q.shape[0], width), float("nan"))
        sched = plan_paged_schedule(case.context_lens, 64, 3)
        assert launcher(case.q, case.weights, case.cache, case.block_table, case.context_lens, sched, out) is out
        ref = paged_logits_reference(case.q, case.weights, case.cache, case.block_table, case.context_lens,
                                     width=width)
        for r in range(out.shape[0]):
            end = -(-int(case.context_lens[r // 2].max()) // 64) * 64  # the request's last page
            assert torch.isnan(out[r, end:]).all()  # not written
            fin = torch.isfinite(ref[r, :end])
            assert torch.equal(fin, torch.isfinite(out[r, :end]))
            assert torch.all(out[r, :end][~fin] == float("-inf"))
            err = (out[r, :end].double() - ref[r, :end].double()).abs()[fin]
            assert torch.all(err <= REL * term_bound(case, width)[r, :end][fin] + 1e-30)


def test_auto_on_the_cpu_is_the_folded_triton_kernel_and_says_why():
    launcher = paged_scorer("cpu", 64, 1)
    assert (launcher.kernel, launcher.reason, launcher.block_kv) == ("folded", "not an NVIDIA CUDA device", 256)
    assert paged_scorer("cpu", 64, 1, q_dtype=torch.bfloat16).kernel == "scaled"


def test_tuning_reaches_the_triton_launch():
    assert paged_scorer("cpu", 64, 4, impl="scaled")._kw["num_warps"] == 8  # the H200-tuned default, wide tile
    tuned = paged_scorer("cpu", 64, 4, impl="scaled", tuning=TritonTuning(num_warps=4, num_stages=3))
    assert (tuned._kw["num_warps"], tuned._kw["num_stages"]) == (4, 3)


@pytest.mark.parametrize("kwargs, match", [
    (dict(heads=48), r"heads: 48 index heads"),
    (dict(next_n=9), r"next_n: expected an int in 1 .. 8"),
    (dict(logits_dtype=torch.int32), r"logits_dtype: expected float32"),
    (dict(block_kv=48), r"block_kv: expected a power of two >= 16"),
    (dict(page_size=0), r"page_size: expected a positive int"),
    (dict(q_dtype=torch.float16), r"q_dtype: expected float8_e4m3fn or bfloat16"),
    (dict(impl="fast"), r"impl: expected 'auto' or one of"),
    (dict(impl="wgmma"), r"impl: 'wgmma' cannot run here: not an NVIDIA CUDA device"),
    (dict(impl="folded", q_dtype=torch.bfloat16), r"impl: 'folded' needs e4m3 queries"),
    (dict(tuning={"num_warps": 4}), r"tuning: expected a TritonTuning"),
])
def test_resolution_errors_name_the_argument(kwargs, match):
    args = dict(heads=64, next_n=1) | kwargs
    with pytest.raises(ValueError, match=match):
        paged_scorer("cpu", args.pop("heads"), args.pop("next_n"), **args)


def test_tuning_values_are_checked():
    with pytest.raises(ValueError, match="num_warps: expected a positive int or None, got 0"):
        TritonTuning(num_warps=0)


def test_serving_kernels_store_score_and_plan():
    """The set the plugin builds with the pool: one launcher per configuration (looked up, not rebuilt), the
    store op's bytes equal to the reference encoder's, the planner's schedules equal to the oracle's."""
    kernels = ServingKernels("cpu", heads=64, next_n=2)
    assert kernels.paged(64, 1) is kernels.paged(64, 1) and kernels.paged(64, 2) is not kernels.paged(64, 1)
    assert (kernels.block_kv, kernels.num_ctas, kernels.planner.kernel) == (256, 4, "triton")
    g = torch.Generator().manual_seed(5)
    k = (torch.randn(70, 128, generator=g) * torch.exp(torch.randn(70, 1, generator=g))).to(torch.bfloat16)
    cache = allocate_index_k_cache(3)
    slots = torch.randperm(3 * 64, generator=g)[:70].to(torch.int64)
    store = kernels.store(torch.bfloat16, torch.int64, 64)
    assert store is kernels.store(torch.bfloat16, torch.int64, 64) and store.kernel == "triton"
    store(k, cache, slots)
    for got, want in zip(read_index_k(cache, slots), quantize_index_k(k)):
        assert torch.equal(got, want)
    for lens in (torch.tensor([5, 300, 0], dtype=torch.int32), torch.tensor([[3, 4], [700, 701]], dtype=torch.int32)):
        assert torch.equal(kernels.plan(lens), paged_schedule_reference(lens, 256, 4))


def test_arg_block_packs_in_place_with_c_alignment():
    block = nvrtc.ArgBlock("PiqiP")
    params = block.pack(0x1000, -7, 1 << 40, 3, 0x2000)
    assert params == block.params and block.values() == (0x1000, -7, 1 << 40, 3, 0x2000)
    ptrs = [ctypes.c_void_p.from_address(params + 8 * i).value for i in range(5)]
    assert [p - ptrs[0] for p in ptrs] == [0, 8, 16, 24, 32]  # the int after a pointer, the long long aligned to 8
    kinds = (ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p)
    assert [t.from_address(p).value for t, p in zip(kinds, ptrs)] == [0x1000, -7, 1 << 40, 3, 0x2000]
    with pytest.raises(ValueError, match="format: expected struct codes P, i, q"):
        nvrtc.ArgBlock("Pf")
