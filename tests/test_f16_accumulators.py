"""The f16-accumulator numerics study (experiments/f16_accumulators.py): its f16 rounding against
torch's, its fold against the format's decode, and the no-overflow bound against adversarial keys."""
import torch

from experiments import f16_accumulators as f16
from sglang_fp4_indexer import format as fmt


def test_round_f16_matches_torch_half():
    """One rounding of fp32 values (normals, subnormals, overflow, ties) equals torch's fp32 -> f16."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20000, generator=g) * torch.exp2(torch.randint(-30, 18, (20000,), generator=g).float())
    x = torch.cat([x, torch.tensor([65504.0, 65519.0, 65520.0, -65520.0, 2.0**-25, 3 * 2.0**-26, 2049.0, 2051.0])])
    assert torch.equal(f16.round_f16(x.double()), x.half().double())


def test_fold_is_the_decoded_key_times_a_power_of_two():
    """Unflushed groups fold exactly; the folded values are e4m3 values at most 6 * 2**FOLD_EXP."""
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(64, 128, generator=g) * torch.exp2(torch.randint(-4, 1, (64, 4), generator=g).float()).repeat_interleave(32, 1)
    payload, scales = fmt.quantize_index_k(keys)
    folded, key_scale, flushed = f16.fold_keys(payload, scales)
    assert not flushed.any()
    assert torch.equal(folded * key_scale[:, None], fmt.dequantize_index_k(payload, scales).double())
    assert torch.equal(folded.float().to(torch.float8_e4m3fn).double(), folded)
    assert float(folded.abs().max()) <= 6 * 2.0**f16.FOLD_EXP


def test_no_overflow_for_the_worst_key_and_query():
    """All-max keys and queries of one sign, every rounding model: the f16 accumulator reaches the
    derived worst case (43008; exactly unless per-product rounding ties below it) and stays finite; one binade more of fold would overflow."""
    keys = torch.full((3, 128), 6.0)
    keys[1] *= 2.0**20  # the scale only moves the per-key factor
    keys[2, 32:] = 6.0 * 2.0**-4  # smaller groups: smaller sum
    payload, scales = fmt.quantize_index_k(keys)
    folded, _, _ = f16.fold_keys(payload, scales)
    q8 = torch.full((1, 2, 128), 448.0).to(torch.float8_e4m3fn)
    q8[0, 1] = -448.0
    qs = f16.scale_queries(q8)[0]
    worst = f16.worst_partial_sum(f16.FOLD_EXP, f16.QUERY_SHIFT)
    assert worst == 43008.0 < f16.F16_MAX < f16.worst_partial_sum(f16.FOLD_EXP + 1, f16.QUERY_SHIFT)
    for model in f16.ROUNDINGS:
        s = f16.f16_scores(qs, folded, model)
        assert torch.isfinite(s).all()
        if model == "product":  # 336 added at an f16 spacing of 32 ties to even below the exact sum
            assert 0.98 * worst < s[0, 0] <= worst and s[0, 1] == -s[0, 0] and s[1, 0] == s[0, 0]
        else:
            assert s[0, 0] == worst and s[0, 1] == -worst and s[1, 0] == worst
        assert 0 < s[2, 0] < worst
    # today's fold with an f16 accumulator overflows on the same input
    today = folded * 2.0 ** (6 - f16.FOLD_EXP)
    assert torch.isinf(f16.f16_scores(q8[0].double(), today, "k32")).any()


def test_flush_threshold_of_the_fold():
    """A group 2**(FOLD_EXP + 5) below its key's largest is kept, one binade further is flushed."""
    keep = -5 - f16.FOLD_EXP
    keys = torch.full((2, 128), 6.0)
    keys[0, 96:] *= 2.0**keep
    keys[1, 96:] *= 2.0 ** (keep - 1)
    _, _, flushed = f16.fold_keys(*fmt.quantize_index_k(keys))
    assert flushed.tolist() == [[False] * 4, [False, False, False, True]]
