"""The Hopper scorer (ops/sm90.py, ops/cuda/paged_logits_sm90.cu) on the CPU.

The kernel itself needs an H100/H200 (its GPU tests are in test_sm90_gpu.py).
Here: (1) NVRTC builds every configuration the op dispatches to, with no
register spills and within the register budget of its CTAs per SM; (2) a
numpy replay of the kernel's per-thread data flow -- the PRMT/LUT decode of
each payload word, the permutation and 128-byte swizzle of the index queries
in shared memory, and the wgmma fragment maps (PTX ISA: A of m64nNk32 8-bit,
thread = (warp, lane): rows 16 warp + lane / 4 (+ 8), k 4 (lane % 4) (+ 16);
B read through the K-major 128-byte-swizzle descriptor) -- gives exactly the
dot products of the decoded keys with the queries (oracle: fp64 matmul of
format.dequantize_index_k's values), scaled as the epilogue scales them.
"""

from __future__ import annotations

import ctypes

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

from sglang_fp4_indexer.format import dequantize_index_k, quantize_index_k
from sglang_fp4_indexer.ops import nvrtc, sm90


def _prmt(a: np.ndarray, b: np.ndarray, sel: np.ndarray) -> np.ndarray:
    """PTX prmt.b32 default mode: selector nibble i picks byte (nibble & 7) of {b, a}; with bit 3
    set, that byte's msb replicated (0x00 or 0xFF) instead."""
    src = (b.astype(np.uint64) << np.uint64(32)) | a.astype(np.uint64)
    out = np.zeros_like(a, dtype=np.uint32)
    for i in range(4):
        idx = (sel >> np.uint32(4 * i)) & np.uint32(7)
        byte = (src >> (idx.astype(np.uint64) * np.uint64(8))) & np.uint64(0xFF)
        sign_mode = ((sel >> np.uint32(4 * i + 3)) & 1).astype(bool)
        byte = np.where(sign_mode, np.where(byte >= 0x80, 0xFF, 0x00), byte)
        out |= byte.astype(np.uint32) << np.uint32(8 * i)
    return out


def _decode_word_rep(w, lut_lo, lut_hi):
    """Mirror of decode_word_rep() in the .cu file: magnitudes through the LUT, signs spread by PRMT's
    sign-replicate mode from w and w << 4 (w * 16, the IMAD), merged by a | (b & 0x80808080)."""
    u = np.uint32
    m = w & u(0x77777777)
    mh = ((m.astype(np.uint64) * 65536) >> 32).astype(np.uint32)  # __umulhi(m, 65536)
    assert np.array_equal(mh, m >> u(16))
    w4 = ((w.astype(np.uint64) * 16) & 0xFFFFFFFF).astype(np.uint32)
    s0 = _prmt(w, w4, np.full_like(w, 0x9D8C))
    s1 = _prmt(w, w4, np.full_like(w, 0xBFAE))
    return (_prmt(lut_lo, lut_hi, m) | (s0 & u(0x80808080)), _prmt(lut_lo, lut_hi, mh) | (s1 & u(0x80808080)))


def _max_byte(w):
    """Mirror of max_byte() in the .cu file (byte extracts by PRMT with a zero source)."""
    u, zero = np.uint32, np.zeros_like(w)
    b1, b2 = _prmt(w, zero, np.full_like(w, 0x4441)), _prmt(w, zero, np.full_like(w, 0x4442))
    return np.maximum(np.maximum(w & u(0xFF), b1), np.maximum(b2, w >> u(24)))


def _lut_of_a(a):
    """Mirror of group_lut's choice for exponent fields ``a`` (int64 array): ``A * multiplier + addend``
    (mod 2**32) for A >= 1, else row ``A - KEYFOLD_LOW`` of ``sm90.keyfold_table`` when
    ``KEYFOLD_LOW <= A <= 0``, else its last row (zeros). Returns the (lo, hi) words."""
    table = np.array(sm90.keyfold_table(), dtype=np.uint64)
    ua = a.astype(np.uint64) & 0xFFFFFFFF
    row = np.where((a - sm90.KEYFOLD_LOW >= 0) & (a <= 0), a - sm90.KEYFOLD_LOW, len(table) - 1)
    return tuple(np.where(a >= 1, (ua * mul + add) & 0xFFFFFFFF, table[row, i]).astype(np.uint32)
                 for i, (mul, add) in enumerate([(0x08080800, 0x0C080000), (0x08080808, 0x1C181410)]))


def _group_lut(scales_word, group, s_max):
    """Mirror of group_lut(prmt(scales, 0, 0x4440 + group), s_max) in the .cu file: A = code - s_max + 3."""
    code = _prmt(scales_word, np.zeros_like(scales_word), np.full_like(scales_word, 0x4440 + group))
    return _lut_of_a(code.astype(np.int64) - s_max.astype(np.int64) + 3)


def _nearest_e4m3(x: float) -> float:
    """Independent oracle: the e4m3 value nearest to ``x >= 0`` among all finite non-negative e4m3 values
    (bytes 0 .. 0x7E: subnormals m 2**-9, normals (1 + m / 8) 2**(e - 7)), ties to the even byte."""
    values = [(b & 7) * 2.0**-9 if b < 8 else (1 + (b & 7) / 8) * 2.0 ** ((b >> 3) - 7) for b in range(0x7F)]
    return values[min(range(0x7F), key=lambda b: (abs(values[b] - x), b & 1))]


def _e4m3(bits: np.ndarray) -> np.ndarray:
    return torch.from_numpy(bits.astype(np.uint8)).view(torch.float8_e4m3fn).double().numpy()


def _q_smem(q_bytes: np.ndarray) -> np.ndarray:
    """Mirror of the kernel's query store: [H, 128] e4m3 bytes -> H*128 bytes of shared memory."""
    heads = q_bytes.shape[0]
    smem = np.zeros(heads * 128, dtype=np.uint8)
    words = q_bytes.reshape(heads, 32, 4)
    for h in range(heads):
        for wi in range(32):
            cc, s, hi = wi >> 3, (wi >> 1) & 3, wi & 1
            chunk = 2 * s + hi
            off = h * 128 + ((chunk ^ (h & 7)) << 4) + 4 * cc
            smem[off:off + 4] = words[h, wi]
    return smem


def _b_operand(smem: np.ndarray, heads: int, step: int) -> np.ndarray:
    """What wgmma reads as B[n, k] (k = 0..31) for k step ``step`` through q_desc(base + 32 step)."""
    out = np.zeros((heads, 32), dtype=np.uint8)
    for n in range(heads):
        for kk in range(32):
            col = 32 * step + kk
            phys = (n // 8) * 1024 + (n % 8) * 128 + (((col >> 4) ^ (n % 8)) << 4) + (col & 15)
            out[n, kk] = smem[phys]
    return out


def test_sign_replicate_decode_matches_the_e2m1_values_for_every_nibble():
    # Every nibble value in every position (and random words), for every exponent field the fold makes
    # (A = s_g - s_max + 3 <= 3) down past the table: decode_word_rep gives the e4m3 bytes of
    # E2M1(x) * 2**(A - 6) rounded to nearest e4m3 (exact for A >= -2), with x's sign.
    rng = np.random.default_rng(3)
    words = np.concatenate([np.array([sum(v << (4 * i) for i in range(8)) for v in range(16)], dtype=np.uint32),
                            rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)])
    e2m1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)
    for a in range(-9, 4):
        lo_w, hi_w = _lut_of_a(np.array([a], dtype=np.int64))
        lo, hi = np.full_like(words, int(lo_w[0])), np.full_like(words, int(hi_w[0]))
        out0, out1 = _decode_word_rep(words, lo, hi)
        got = _e4m3(np.frombuffer(np.stack([out0, out1], axis=1).astype("<u4").tobytes(), dtype=np.uint8))
        nib = (words[:, None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF
        mags = np.array([_nearest_e4m3(v * 2.0 ** (a - 6)) for v in e2m1])
        if a >= sm90.KEYFOLD_EXACT_LOW:
            np.testing.assert_array_equal(mags, e2m1 * 2.0 ** (a - 6))  # exact there
        want = np.where(nib & 8, -1.0, 1.0) * mags[nib & 7]
        np.testing.assert_array_equal(got.reshape(-1, 8), want)
        assert np.array_equal(np.signbit(got.reshape(-1, 8)), (nib & 8) > 0)  # -0 keeps its sign
    assert _nearest_e4m3(6 * 2.0 ** (sm90.KEYFOLD_LOW - 7)) == 0.0  # below the table's rows all is zero


@pytest.mark.parametrize("heads", [64, 32])
def test_fragment_replay_gives_the_exact_dot_products(heads):
    g = torch.Generator().manual_seed(heads)
    keys = torch.randn(64, 128, generator=g) * torch.exp2(torch.randint(-2, 2, (64, 4), generator=g).double()).repeat_interleave(32, 1).float()
    # group scales within 2**5 of each other (2**3 apart, and the quantizer's rounding of each group's
    # scale): the folded form is exact there
    keys[3] = 0.0  # an all-zero key
    keys[5, 32:64] = 0.0  # a zero group
    payload, scales = quantize_index_k(keys)
    q = (torch.randn(heads, 128, generator=g) * 4).to(torch.float8_e4m3fn)
    q_bits = q.view(torch.uint8).numpy()
    pay = payload.numpy()
    sc_words = scales.numpy().astype(np.uint32)
    sc_words = sc_words[:, 0] | sc_words[:, 1] << 8 | sc_words[:, 2] << 16 | sc_words[:, 3] << 24
    smem = _q_smem(q_bits)
    b_ops = [_e4m3(_b_operand(smem, heads, s)) for s in range(4)]

    acc = np.zeros((64, heads))
    for warp in range(4):
        for lane in range(32):
            c, r0 = lane & 3, 16 * warp + (lane >> 2)
            rows = (r0, r0 + 8)
            regs = {}
            for j, r in enumerate(rows):
                words = pay[r, 16 * c:16 * c + 16].view("<u4").astype(np.uint32)
                s_max = _max_byte(np.array(sc_words[r], dtype=np.uint32))
                assert int(s_max) == max(scales[r].tolist())
                lo, hi = _group_lut(np.array(sc_words[r], dtype=np.uint32), c, s_max)
                for s in range(4):
                    out0, out1 = _decode_word_rep(np.array(words[s], dtype=np.uint32), lo, hi)
                    regs[(s, j)] = int(out0)  # reg j: rows r0 / r0 + 8, k 4c .. 4c + 3
                    regs[(s, 2 + j)] = int(out1)  # reg 2 + j: same rows, k 16 + 4c ..
            for s in range(4):
                for reg in range(4):
                    row = rows[reg & 1]
                    k0 = 4 * c + 16 * (reg >> 1)
                    vals = _e4m3(np.frombuffer(np.uint32(regs[(s, reg)]).tobytes(), dtype=np.uint8))
                    acc[row] += vals @ b_ops[s][:, k0:k0 + 4].T
    s_max = scales.max(dim=1).values.double()
    d = scales.to(torch.int64) - scales.max(dim=1, keepdim=True).values.to(torch.int64)
    nonzero = dequantize_index_k(payload, scales).view(64, 4, 32).abs().amax(dim=2) > 0
    assert int(d[nonzero].min()) >= sm90.KEYFOLD_EXACT_LOW - 3  # every nonzero group within the exact rows
    got = acc * torch.exp2(s_max - 124).numpy()[:, None]  # the fold put k at 2**(124 - s_max)
    want = dequantize_index_k(payload, scales).double().numpy() @ q.double().numpy().T
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-30)


@pytest.mark.parametrize("next_n,heads,dtype,lens_2d", [
    (1, 64, torch.float32, True), (4, 64, torch.float32, False), (2, 64, torch.bfloat16, True),
    (1, 32, torch.float16, False), (2, 32, torch.float32, True), (4, 32, torch.float32, True),
    (8, 32, torch.float32, True), (1, 128, torch.float32, False), (1, 16, torch.float32, False),
    (3, 64, torch.float32, False)])
def test_nvrtc_builds_within_the_register_budget(next_n, heads, dtype, lens_2d):
    config = sm90.Config.of_call(next_n, heads, dtype, lens_2d)
    cubin, log = sm90.build(config, verbose=True)
    assert cubin[:4] == b"\x7fELF"
    regs, spilled = nvrtc.ptxas_registers(log)
    # Warp-specialised: the CTA is launched with LAUNCH_REGS per thread, and setmaxnreg can only move
    # registers within that allocation -- a larger sum would make the math warpgroups' setmaxnreg.inc
    # wait forever. ptxas must honour both setmaxnreg (it drops them with C7507/C7508 when a role's code
    # needs more) and compile each role within them.
    assert regs == sm90.LAUNCH_REGS == 96, log
    assert (sm90.THREADS, sm90.PRODUCER_REGS, sm90.MATH_REGS) == (640, 24, 112)
    assert 128 * sm90.PRODUCER_REGS + 128 * sm90.WGS * sm90.MATH_REGS <= sm90.THREADS * regs
    assert "C7507" not in log and "C7508" not in log, log
    # next_n 4 at 64 heads loads a request's 16 index-query vectors in one round trip (the query round trip in
    # docs/perf-notes.md: 6-8 % faster at batch 1 with these spills than in two round trips without them);
    # their live range leaves 12 bytes spilled, all inside load_request (the branch a math warpgroup takes when
    # its next tile is of another request; SASS: 3 STL and 3 LDL there), none on the per-tile path.
    assert spilled <= (12 if (next_n, heads) == (4, 64) else 0 if next_n <= 4 else 32), log
    # Named barriers: 0 for the CTA and one per math warpgroup, as immediates (an id in a register
    # makes ptxas reserve all 16, which limits the CTAs per SM).
    assert re.search(r"used %d barriers" % (1 + sm90.WGS), log), log
    # A wgmma under a branch ptxas cannot prove warp-uniform serializes every wgmma (C7518, C7511, C7512);
    # C7519: a fence ptxas had to inject (the head-sum operands are all packed before the wgmma.fence).
    for code in ("C7511", "C7512", "C7518", "C7519"):
        assert code not in log, log
    # One wgmma of N = mma_rows x heads per page (MMA_ROWS_DEFAULTS: 2 and 4 rows at H 32).
    assert f"m64n{config.mma_rows * heads}k32" in sm90._spec(config).source
    assert config.mma_rows == {(2, 32): 2, (4, 32): 4}.get((next_n, heads), 1)


def test_layout_is_what_the_kernel_expects():
    # The kernel static_asserts the same relations at build time; here the numbers for DeepSeek-V3.2's decode
    # and verify (H 64): queries, bf16 head-sum tiles, four 4352-byte pages, padded weights, slots, mbarriers.
    assert sm90.layout(1, 64) == {"Q_BYTES": 8192, "HS_BYTES": 1024, "W_STRIDE": 20, "HS_OFF": 8192,
                                  "RING_OFF": 9216, "W_OFF": 26624, "INFO_OFF": 26944, "BAR_OFF": 27008,
                                  "WG_BYTES": 27648}
    for config in sm90.served_configs():
        n, h = config.next_n, config.heads
        lay = sm90.layout(n, h)
        # Bytes per region summed: queries, head-sum tiles, ring, weights, 16-byte slots + mbarrier pairs.
        total = n * h * 128 + n * h * 16 + 4 * 64 * 68 + n * 4 * (h // 4 + 4) * 4 + 4 * 32
        assert lay["WG_BYTES"] == -(-total // 1024) * 1024 and lay["BAR_OFF"] + 64 == total
        assert config.smem_bytes == 4 * lay["WG_BYTES"] + 1024 <= sm90.MAX_SMEM_BYTES
        assert dict(config.defines())["WG_BYTES"] == lay["WG_BYTES"]


def test_served_configurations():
    # next_n 1-8 within 32 KB of queries per head count, three logits dtypes, two lengths forms.
    configs = list(sm90.served_configs())
    assert len(configs) == (8 + 8 + 4 + 2) * 3 * 2 == len(set(configs))
    assert {(c.next_n, c.heads) for c in configs} == {(n, h) for h in (16, 32, 64, 128) for n in range(1, 9)
                                                      if n * h <= 256}
    assert sm90.Config.of_call(2, 64, torch.bfloat16, True) == sm90.Config(2, 64, 1, True, 1)
    assert sm90.Config.of_call(2, 64, torch.bfloat16, True) is sm90.Config.of_call(2, 64, torch.bfloat16, True)


def test_rows_per_wgmma_defaults_and_limits():
    assert sm90.Config.of_call(4, 32, torch.float32, False).mma_rows == 4
    assert sm90.Config.of_call(2, 32, torch.float32, False).mma_rows == 2
    assert sm90.Config.of_call(2, 64, torch.float32, False).mma_rows == 1
    assert sm90.Config.of_call(1, 32, torch.float32, False).mma_rows == 1
    with pytest.raises(ValueError, match="mma_rows: expected a divisor of next_n 4 with mma_rows x 64 heads <= 128"):
        sm90.Config(4, 64, mma_rows=4)
    with pytest.raises(ValueError, match="mma_rows: expected a divisor of next_n 3"):
        sm90.Config(3, 32, mma_rows=2)


def test_rel_bound_is_the_mma_bound_plus_the_head_sums_rounding():
    # The tolerance of the GPU tests and the benchmark's check for the Hopper kernel (beside its floor): the FP8
    # MMA's 1e-3, four faithful f16 roundings of the accumulator (gamma_4 at u = 2**-10), and the f16 head sum's
    # 2**-15 + 2**-21 of what it adds (relu(S) exact, hi + lo f16 weights, fp32 additions), of a term bound that
    # may itself be off by MMA_REL.
    mma = 1e-3 + 4 * 2.0**-10 / (1 - 4 * 2.0**-10)
    assert sm90.MMA_REL == pytest.approx(mma, rel=1e-15)
    assert sm90.HEADSUM_REL == 2.0**-15 + 2.0**-21
    assert sm90.rel_bound() == pytest.approx(mma + (2.0**-15 + 2.0**-21) * (1 + mma), rel=1e-15)


def test_logit_error_bound_splits_the_mma_and_head_sum_scales():
    # MMA_REL of the term bound plus the floor for the score; the head sum's rounding of the relu'd scores,
    # themselves off by at most that; never above the one-factor rel_bound() x term bound plus the floor's share.
    mma, hs = sm90.MMA_REL, sm90.HEADSUM_REL
    term = torch.tensor([1.0, 10.0, 100.0], dtype=torch.float64)
    relu = torch.tensor([0.0, 2.5, 100.0], dtype=torch.float64)
    floor = torch.tensor([0.0, 1e-3, 0.5], dtype=torch.float64)
    want = mma * term + floor + hs * (relu + mma * term + floor)
    assert torch.allclose(sm90.logit_error_bound(term, relu, floor), want, rtol=1e-15, atol=0)
    assert sm90.logit_error_bound(4.0, 1.0) == pytest.approx(4 * mma + hs * (1.0 + 4 * mma))
    assert torch.all(sm90.logit_error_bound(term, relu) <= sm90.rel_bound() * term * (1 + 1e-12))
    # No relu'd score: the MMA part, and the head sum's rounding of what the MMA may have added.
    assert float(sm90.logit_error_bound(term, relu)[0]) == pytest.approx(mma * (1 + hs))


def test_logit_error_floor_is_what_the_low_groups_and_the_subnormals_can_add():
    # Oracle: the floor's three terms written out per element. Key 0: groups 0, 1, 4 and 7 below its largest
    # (only the last is rounded: A = 3 - 7 = -4 < -2); key 1: all groups equal (nothing rounded).
    g = torch.Generator().manual_seed(5)
    q = torch.randn(4, 128, generator=g)
    w = torch.tensor([0.5, -2.0, 0.0, 1.0])
    scales = torch.tensor([[130, 129, 126, 123], [120, 120, 120, 120]], dtype=torch.uint8)
    keys = torch.randn(2, 128, generator=g)
    got = sm90.logit_error_floor(q, w, keys, scales)
    qw = (w.abs().double()[:, None] * q.abs().double()).sum(dim=0)  # [128]
    decode0 = 2.0 ** (130 - 134) * float(qw[96:].sum())
    sub = [2.0 ** (s - 146) * float(w.abs().sum()) for s in (130, 120)]
    wfl = [2.0**-39 * 2.0 * float((keys[k].abs().double() * q.abs().double().sum(dim=0)).sum()) for k in range(2)]
    want = torch.tensor([decode0 + sub[0] + wfl[0], sub[1] + wfl[1]], dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="keys, scales"):
        sm90.logit_error_floor(q, w, keys, scales[:1])
    with pytest.raises(ValueError, match="q, weights"):
        sm90.logit_error_floor(q, w[:3], keys, scales)


def test_unsupported_configurations_are_refused():
    with pytest.raises(ValueError, match="heads: expected one of"):
        sm90.Config(1, 48)
    with pytest.raises(ValueError, match="next_n: 8 x 64 heads of index queries exceed"):
        sm90.Config(8, 64)
    with pytest.raises(ValueError, match="next_n: expected an int >= 1"):
        sm90.Config(0, 64)
    with pytest.raises(ValueError, match="out_kind: expected 0, 1 or 2"):
        sm90.Config(1, 64, out_kind=3)
    with pytest.raises(ValueError, match="lens_2d: expected a bool"):
        sm90.Config(1, 64, lens_2d=1)
    with pytest.raises(ValueError, match="out_dtype: expected float32, bfloat16 or float16"):
        sm90.Config.of_call(1, 64, torch.float64, True)
    assert sm90.unavailable_reason("cpu") == "not an NVIDIA CUDA device"


def _request_len(lens, b):
    return max([0, *lens[b]]) if isinstance(lens[b], list) else max(lens[b], 0)


def _entry_jobs(sched, lens, cta, block_kv, block_table=None, max_pages=None, num_pages=1 << 30):
    """Mirror of the producer's walk in paged_logits_sm90.cu: one schedule entry's ring slots as
    (cache page or -1, request, page within it or -1, tail or -1), a request at a time, with the
    kernel's 32-entry block-table cache (every read asserted in bounds) and page checks. An entry
    past the schedule's end (a math warpgroup of the last CTA may have one) has no job.
    ``block_table`` None: page p of request b is cache page p (all valid)."""
    jobs, batch, ppb = [], len(lens), block_kv // 64
    if block_table is None:
        max_pages = max_pages or max(1, max(-(-_request_len(lens, b) // 64) for b in range(batch)))
        block_table = [list(range(max_pages)) for _ in range(batch)]
    max_pages = len(block_table[0]) if max_pages is None else max_pages

    def load(b, p):  # the warp's 32 lanes: entries p .. p + 31, -1 past max_pages
        assert 0 <= b < batch and p >= 0
        return [block_table[b][q] if q < max_pages else -1 for q in range(p, p + 32)]

    if cta + 1 >= len(sched):
        return jobs
    (b, blk_lo), (b_end, blk_end) = sched[cta], sched[cta + 1]
    b, blk_lo = max(b, 0), max(blk_lo, 0)  # the kernel clamps a corrupt entry's start
    while b < batch and (b < b_end or (b == b_end and blk_lo < blk_end)):
        p = blk_lo * ppb
        cached_p0, cached = p, load(b, p)
        length = _request_len(lens, b)
        npages, nblocks = -(-length // 64), max(1, -(-length // block_kv))
        blk_hi = nblocks if b < b_end else min(blk_end, nblocks)
        p_end = p + 1 if npages == 0 else min(blk_hi * ppb, npages)
        for q in range(p, p_end):
            page = -1
            if npages:
                if not 0 <= q - cached_p0 < 32:
                    cached_p0, cached = q, load(b, q)
                page = cached[q - cached_p0]
                if page >= num_pages:
                    page = -1
            last = q == npages - 1 or npages == 0
            jobs.append((page, b, q if npages else -1, npages * 64 if last else -1))
        b, blk_lo = b + 1, 0
    return jobs


def _all_jobs(lens, block_table, max_pages, num_pages):
    """Oracle for the concatenated walks: every request's pages in order, one job without a page
    for a request with no visible key, independent of the schedule and of the cache of entries."""
    want = []
    for b in range(len(lens)):
        npages = -(-_request_len(lens, b) // 64)
        if npages == 0:
            want.append((-1, b, -1, 0))
        for p in range(npages):
            page = block_table[b][p] if p < max_pages else -1
            want.append((-1 if page >= num_pages else page, b, p, npages * 64 if p == npages - 1 else -1))
    return want


class _Barrier:
    """An mbarrier: phase completes when `count` arrivals are in; try_wait(parity) succeeds once the
    phase with that parity has completed (a fresh barrier counts phase 'parity 1' as completed)."""

    def __init__(self, count):
        self.count, self.pending, self.phase = count, count, 0

    def arrive(self, k=1):
        self.pending -= k
        if self.pending == 0:
            self.phase, self.pending = self.phase + 1, self.count

    def done(self, parity):
        return (self.phase & 1) != parity


def _run_cta(sched, lens, cta, block_kv, stages=4):
    """Interleave the producer warp and the math warpgroup of one schedule entry; None, or where it
    deadlocks. Also checks that the math warpgroup reads exactly the producer's jobs, in order, and
    that the request it loads before its first slot (the kernel's prefetch: the entry's first
    request, when the entry is not empty) is the first job's."""
    full, empty = [_Barrier(1) for _ in range(stages)], [_Barrier(128) for _ in range(stages)]
    info = [None] * stages
    walked, scored = [], []

    def producer():  # every job takes a ring slot (a copy, or a plain arrive); then the end marker
        jobs = _entry_jobs(sched, lens, cta, block_kv)
        for n in range(len(jobs) + 1):
            while not empty[n % stages].done(((n // stages) & 1) ^ 1):
                yield ("producer waits empty", n)
            if n == len(jobs):
                info[n % stages] = "end"
                full[n % stages].arrive()
                return
            info[n % stages] = jobs[n]
            walked.append(info[n % stages])
            full[n % stages].arrive()

    def consumer():  # acquire(): waits on full, reads the slot, releases it unless it is the end marker
        n = 0
        first = _entry_jobs(sched, lens, cta, block_kv)
        prefetched = first[0][1] if first else None  # the kernel's load_request(b0) before the loop
        while True:
            while not full[n % stages].done((n // stages) & 1):
                yield ("math waits full", n)
            job = info[n % stages]
            if job == "end":
                assert n > 0 or prefetched is None  # no prefetch for an entry without jobs
                return
            if n == 0:
                assert job[1] == prefetched
            scored.append(job)
            empty[n % stages].arrive(128)
            n += 1

    last = {producer(): None, consumer(): None}  # each live side -> the wait it reported last
    while last:
        moved = False
        for actor in list(last):
            try:
                state = next(actor)
            except StopIteration:
                del last[actor]
                moved = True
                continue
            moved |= state != last[actor]
            last[actor] = state
        if last and not moved:
            return f"CTA {cta} deadlocks: {list(last.values())}"
    assert scored == walked
    return None


@pytest.mark.parametrize(
    "lens, block_kv, num_ctas",
    [([0, 4096], 64, 1), ([4096, 0, 4096], 64, 1), ([0, 200], 64, 1), ([0, 256], 256, 1),
     ([[0, 0], [70, 300]], 64, 1), ([32768] * 10 + [0] + [32768] * 53, 64, 528), ([0] * 9 + [5000], 256, 2),
     ([200, 0, 300], 64, 16), ([4096], 64, 7)],
)
def test_ring_protocol_of_the_kernel_never_deadlocks(lens, block_kv, num_ctas):
    # Requests with no visible key still take a ring slot on both sides (a fixed deadlock).
    from sglang_fp4_indexer.reference import paged_schedule_reference

    sched = paged_schedule_reference(torch.tensor(lens, dtype=torch.int32), block_kv, num_ctas).tolist()
    # With WGS 4 the grid covers ceil(num_ctas / 4) * 4 entries; those past the end get no job.
    for cta in range(-(-num_ctas // 4) * 4):
        assert _run_cta(sched, lens, cta, block_kv) is None


@pytest.mark.parametrize(
    "lens, block_kv, num_ctas",
    [([0, 4096], 64, 1), ([4096, 0, 4096], 64, 3), ([0, 200], 64, 5), ([0, 256], 256, 1), ([[0, 0], [70, 300]], 64, 2),
     ([32768] * 10 + [0] + [32768] * 53, 64, 528), ([0] * 9 + [5000], 256, 2), ([200, 0, 300], 64, 16),
     ([4096], 64, 7), ([1, 64, 65, 1000, 0, 129], 128, 9), ([3000, 70], 256, 4)],
)
def test_producer_walk_covers_every_page_once_in_order(lens, block_kv, num_ctas):
    # The entries' walks, concatenated, must be exactly every request's pages in order.
    from sglang_fp4_indexer.reference import paged_schedule_reference

    sched = paged_schedule_reference(torch.tensor(lens, dtype=torch.int32), block_kv, num_ctas).tolist()
    got = [job for cta in range(-(-num_ctas // 4) * 4) for job in _entry_jobs(sched, lens, cta, block_kv)]
    bt = [list(range(len(got) + 64))] * len(lens)
    assert got == _all_jobs(lens, bt, len(bt[0]), 1 << 30)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_producer_walk_with_block_table_cache_and_page_checks(data):
    # Random lengths ([B] or [B, next_n], zeros included), tiles, entry counts (padded to whole CTAs
    # of 1, 4 or 5 math warpgroups), block tables with invalid (negative, >= num_pages) entries and
    # shorter than the context (max_pages): the walk reads the block table in bounds only, and the
    # concatenated walks are the oracle's jobs, pages checked as the kernel checks them.
    from sglang_fp4_indexer.reference import paged_schedule_reference

    batch = data.draw(st.integers(1, 6))
    length = st.one_of(st.sampled_from([0, 1, 63, 64, 65, 2048]), st.integers(0, 5000))
    lens2d = data.draw(st.booleans())
    lens = data.draw(st.lists(st.lists(length, min_size=2, max_size=2) if lens2d else length,
                              min_size=batch, max_size=batch))
    block_kv = 64 * data.draw(st.sampled_from([1, 2, 4, 8]))
    num_ctas = data.draw(st.integers(1, 40))
    wgs = data.draw(st.sampled_from([1, 4, 5]))
    longest = -(-max(_request_len(lens, b) for b in range(batch)) // 64)
    max_pages = max(1, longest - data.draw(st.sampled_from([0, 0, 1, 3])))
    num_pages = 1000
    entry = st.one_of(st.integers(-2, 1100), st.sampled_from([-1, num_pages - 1, num_pages, num_pages + 1]))
    bt = data.draw(st.lists(st.lists(entry, min_size=max_pages, max_size=max_pages),
                            min_size=batch, max_size=batch))
    sched = paged_schedule_reference(torch.tensor(lens, dtype=torch.int32), block_kv, num_ctas).tolist()
    got = []
    for cta in range(-(-num_ctas // wgs) * wgs):
        jobs = _entry_jobs(sched, lens, cta, block_kv, bt, max_pages, num_pages)
        # the math side's prefetch: an entry has jobs exactly when its first request is valid
        if cta < num_ctas:
            (b0, blk0), (b1, blk1) = sched[cta], sched[cta + 1]
            assert bool(jobs) == (b0 < batch and (b0 < b1 or (b0 == b1 and blk0 < blk1)))
            assert not jobs or jobs[0][1] == b0
        got += jobs
    assert got == _all_jobs(lens, bt, max_pages, num_pages)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_producer_walk_of_a_corrupt_schedule_reads_in_bounds(data):
    # A schedule that is not the planner's (negative or past-the-end requests and blocks): the walk still
    # reads only block-table rows 0 .. batch - 1 (``load`` asserts it) and columns within max_pages, and every
    # job it emits names a request of the batch, so the math side writes only rows of ``out``.
    batch = data.draw(st.integers(1, 5))
    lens = data.draw(st.lists(st.integers(0, 3000), min_size=batch, max_size=batch))
    max_pages = max(1, -(-max(lens) // 64))
    bt = [[data.draw(st.integers(-1, 60)) for _ in range(max_pages)] for _ in range(batch)]
    entry = st.tuples(st.integers(-3, batch + 2), st.integers(-3, 60))
    sched = [list(e) for e in data.draw(st.lists(entry, min_size=2, max_size=9))]
    block_kv = 64 * data.draw(st.sampled_from([1, 4]))
    for cta in range(len(sched) - 1):
        for page, b, p, _ in _entry_jobs(sched, lens, cta, block_kv, bt, max_pages, 50):
            assert 0 <= b < batch and -1 <= page < 50 and p >= -1


def _zero_nan_e4m3(w: np.ndarray) -> np.ndarray:
    """Mirror of zero_nan_e4m3() in the .cu file (uint32 words of four e4m3 bytes)."""
    u = np.uint32
    nan = ((w & u(0x7F7F7F7F)) + u(0x01010101)) & u(0x80808080)
    return w & ~((nan >> u(7)) * u(0xFF))


def test_query_nan_bytes_are_zeroed_and_every_other_byte_kept():
    # Every byte value at every position of a word, next to random neighbours: 0x7F and 0xFF (e4m3's NaNs)
    # become 0, every other byte is unchanged, and no byte affects its neighbours.
    rng = np.random.default_rng(0)
    for pos in range(4):
        for _ in range(4):
            others = rng.integers(0, 256, size=(256, 4), dtype=np.uint32)
            others[:, pos] = np.arange(256, dtype=np.uint32)
            words = (others[:, 0] | others[:, 1] << 8 | others[:, 2] << 16 | others[:, 3] << 24).astype(np.uint32)
            got = _zero_nan_e4m3(words)
            want = np.where((others & 0x7F) == 0x7F, 0, others).astype(np.uint32)
            assert np.array_equal(got, want[:, 0] | want[:, 1] << 8 | want[:, 2] << 16 | want[:, 3] << 24)
    nan_bytes = [b for b in range(256) if np.isnan(torch.tensor([b], dtype=torch.uint8).view(torch.float8_e4m3fn).float().item())]
    assert nan_bytes == [0x7F, 0xFF]  # the bytes it zeroes are exactly e4m3fn's NaNs


def _bf16_round(x: np.ndarray) -> np.ndarray:
    """cvt.rn.bf16.f32: round to nearest even, to 8 mantissa bits (finite inputs)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("heads", [128, 64, 32, 16])
def test_f16_head_sum_fragment_replay(heads):
    # The score wgmma's f16 accumulator register j holds (low half, high half) = the fp32 layout's
    # (acc[2j], acc[2j + 1]); ra[j] = max.f16x2(acc[j], 0), and tile t's A fragment is ra[4t .. 4t + 3],
    # read as m64n8k16's f16 A fragment (a0 (r0, k 2c, 2c + 1), a1 (r1, same k), a2 (r0, k 2c + 8, 2c + 9),
    # a3 (r1, same k); the low half is the lower k) against the tiles load_request writes (short
    # 64 (k / 8) + 8 n + k % 8 of tile t = h / 16, k = h % 16: hi = f16(w') in columns 0 and 2, lo =
    # f16(w' - hi) in 1 and 3, w' = w 2**(141 - e_r), e_r the fp32 exponent field of the row's largest
    # |w| clamped to [12, 254]), read through hs_desc.
    g = np.random.default_rng(heads + 7)
    s_acc = (g.normal(size=(64, heads)) * 300).astype(np.float16).astype(np.float32)  # f16 accumulators
    w = g.normal(size=heads).astype(np.float32) * 0.01
    e_r = min(max(int(np.abs(w).max().view(np.uint32)) >> 23, 12), 254)
    w_scaled = np.ldexp(w, 141 - e_r).astype(np.float32)
    assert 2.0**14 <= np.abs(w_scaled).max() < 2.0**15
    tiles = np.zeros((heads // 16, 128), dtype=np.float32)  # 256 bytes of f16 per tile
    for h in range(heads):
        hi = np.float32(np.float16(w_scaled[h]))
        lo = np.float32(np.float16(w_scaled[h] - hi))
        t, kb, e = h >> 4, (h >> 3) & 1, h & 7
        for n, v in ((0, hi), (1, lo), (2, hi), (3, lo)):
            tiles[t, 64 * kb + 8 * n + e] = v

    def b_tile(t):  # B[k][n] as the descriptor (K-major, no swizzle, LBO = SBO = 128 bytes) reads it
        return np.array([[tiles[t, 64 * (k // 8) + 8 * n + k % 8] for n in range(8)] for k in range(16)])

    def ra_of(warp, lane):  # the kernel's packed registers: (low, high) halves per ra[j]
        c, r0 = lane & 3, 16 * warp + (lane >> 2)
        acc = np.zeros(heads // 2, dtype=np.float32)
        for j in range(heads // 8):
            acc[4 * j:4 * j + 4] = [s_acc[r0, 8 * j + 2 * c], s_acc[r0, 8 * j + 2 * c + 1], s_acc[r0 + 8, 8 * j + 2 * c],
                                    s_acc[r0 + 8, 8 * j + 2 * c + 1]]
        relu = np.maximum(acc, 0)  # exact: max.f16x2 of f16 values
        return [(relu[2 * j], relu[2 * j + 1]) for j in range(heads // 4)]

    got = np.zeros(64)
    for warp in range(4):
        ras = [ra_of(warp, lane) for lane in range(32)]
        for lane in range(32):
            c, r0 = lane & 3, 16 * warp + (lane >> 2)
            r1 = r0 + 8
            d = np.zeros(4)
            for t in range(heads // 16):
                a = {}  # (row, k) -> value, gathered from the quad's fragments
                for cc in range(4):
                    fa = ras[(lane & ~3) | cc][4 * t:4 * t + 4]
                    for reg, (row, k0) in enumerate(((r0, 2 * cc), (r1, 2 * cc), (r0, 2 * cc + 8), (r1, 2 * cc + 8))):
                        a[(row, k0)], a[(row, k0 + 1)] = fa[reg]
                bt = b_tile(t)
                for idx, (row, col) in enumerate(((r0, 2 * c), (r0, 2 * c + 1), (r1, 2 * c), (r1, 2 * c + 1))):
                    d[idx] += sum(float(a[(row, k)]) * float(bt[k, col]) for k in range(16))
            if c == 0:
                got[r0] = d[0] + d[1]  # columns 0, 1: row r0 by hi and lo
            elif c == 1:
                got[r1] = d[2] + d[3]  # columns 2, 3: row r1 by hi and lo
    got = got * 2.0 ** (e_r - 141)  # the row's weight scale undone (row_g and the epilogue's f)
    want = (np.maximum(s_acc.astype(np.float64), 0) * w.astype(np.float64)).sum(axis=1)
    bound = (np.maximum(s_acc.astype(np.float64), 0) * np.abs(w.astype(np.float64))).sum(axis=1)
    err = np.abs(got - want)
    assert np.all(err <= 2.0**-22 * bound * 1.01), err.max()  # hi + lo f16: within 2**-22 of w'
    assert err.max() > 0  # the split did round: the replay reads f16 weights, not the fp32 values


class _StandInHopper:
    """Stands for an H200 on the CPU machine: ``paged_logits`` resolves ``impl="auto"`` to the Hopper kernel
    (``_wgmma_problem`` says nothing is missing), the CUDA ordinal is 0, and the kernel's NVRTC build, module
    load and launch are replaced by the test; the Triton kernels run under the interpreter."""

    def __init__(self, monkeypatch, build=None, launch=None):
        from sglang_fp4_indexer.ops import paged_logits as pl

        self.builds, self.launches = [], []
        monkeypatch.setattr(pl, "_wgmma_problem", lambda *a, **k: None)
        monkeypatch.setattr(nvrtc, "_index", lambda device: 0)
        monkeypatch.setattr(nvrtc, "cuda_arch", lambda device: "sm_90a")
        monkeypatch.setattr(nvrtc, "_KERNELS", {})

        def fake_build(source, name, arch, defines=(), **kwargs):
            self.builds.append(dict(defines))
            if build is not None:
                build(dict(defines))
            return b"cubin", ""

        stand_in = self

        class FakeFunction:
            def launch_packed(self, index, grid, block, smem, params):
                # The kernel's arguments, read back through the pointer array the driver would read.
                kinds = {"P": ctypes.c_void_p, "i": ctypes.c_int, "q": ctypes.c_longlong}
                args = [kinds[code].from_address(ctypes.c_void_p.from_address(params + 8 * i).value).value
                        for i, code in enumerate(sm90.ARG_FORMAT)]
                stand_in.launches.append(((index, grid, block, smem, args), {}))
                if launch is not None:
                    launch(index, grid, block, smem, params)

        monkeypatch.setattr(nvrtc, "compile_cubin", fake_build)
        monkeypatch.setattr(nvrtc, "get_function", lambda *a, **k: FakeFunction())


def _fallback_case():
    from cases import make_paged_case

    case = make_paged_case([70, 130], next_n=1, heads=32, seed=61)
    case.context_lens = case.context_lens.view(2, 1).contiguous()  # SGLang's per-row [rows, 1] form
    return case


def _triton_reference(case):
    """The Triton "folded" scorer's logits for ``case`` (what the fallback must give, bit for bit)."""
    from sglang_fp4_indexer.ops.paged_logits import DEFAULT_BLOCK_KV, paged_logits
    from sglang_fp4_indexer.ops.schedule import plan_paged_schedule

    return paged_logits(case.q, case.weights, case.cache, case.block_table, case.context_lens, impl="folded",
                        block_kv=DEFAULT_BLOCK_KV, schedule=plan_paged_schedule(case.context_lens, DEFAULT_BLOCK_KV, 3))


def test_failed_serving_build_is_warned_once_and_scored_by_triton(monkeypatch):
    # The device probe built one configuration; this call's (2-D lengths, 32 heads) fails to compile: the call
    # and every later one of that configuration run the Triton kernel, with one warning, and nothing is retried.
    from sglang_fp4_indexer.ops.paged_logits import DEFAULT_BLOCK_KV, paged_logits
    from sglang_fp4_indexer.ops.schedule import plan_paged_schedule

    def refuse(defines):
        if defines["LENS_2D"] == "1":
            raise RuntimeError("NVRTC could not compile paged_logits_sm90.cu for sm_90a (stand-in)")

    hopper = _StandInHopper(monkeypatch, build=refuse)
    case = _fallback_case()
    want = _triton_reference(case)
    sched = plan_paged_schedule(case.context_lens, DEFAULT_BLOCK_KV, 3)
    with pytest.warns(UserWarning, match=r"next_n 1, 32 heads, torch.float32 logits, \[B, next_n\] lengths could not be "
                                         r"built.*scoring it with the Triton kernels"):
        got = paged_logits(case.q, case.weights, case.cache, case.block_table, case.context_lens, schedule=sched,
                           block_kv=DEFAULT_BLOCK_KV, check=False)
    assert torch.equal(got, want) and not hopper.launches
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        again = paged_logits(case.q, case.weights, case.cache, case.block_table, case.context_lens, schedule=sched,
                             block_kv=DEFAULT_BLOCK_KV, check=False)
    assert torch.equal(again, want) and len(hopper.builds) == 1
    with pytest.raises(RuntimeError, match="impl: 'wgmma' cannot run this call: the Hopper kernel for next_n 1"):
        paged_logits(case.q, case.weights, case.cache, case.block_table, case.context_lens, schedule=sched,
                     block_kv=DEFAULT_BLOCK_KV, impl="wgmma")


def test_failed_launch_is_warned_once_and_scored_by_triton(monkeypatch):
    from sglang_fp4_indexer.ops.paged_logits import DEFAULT_BLOCK_KV, paged_logits
    from sglang_fp4_indexer.ops.schedule import plan_paged_schedule

    def fail(*args, **kwargs):
        raise RuntimeError("cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE (stand-in)")

    hopper = _StandInHopper(monkeypatch, launch=fail)
    case = _fallback_case()
    want = _triton_reference(case)
    sched = plan_paged_schedule(case.context_lens, DEFAULT_BLOCK_KV, 3)
    with pytest.warns(UserWarning, match="could not be built, loaded or launched .*cuLaunchKernel failed"):
        got = paged_logits(case.q, case.weights, case.cache, case.block_table, case.context_lens, schedule=sched,
                           block_kv=DEFAULT_BLOCK_KV, check=False)
    assert torch.equal(got, want) and len(hopper.launches) == 1
    paged_logits(case.q, case.weights, case.cache, case.block_table, case.context_lens, schedule=sched,
                 block_kv=DEFAULT_BLOCK_KV, check=False)
    assert len(hopper.launches) == 1  # not retried


def test_serving_probe_builds_what_the_launch_builds(monkeypatch):
    # The probe must build and load the very configuration launch() then uses (launch builds nothing more,
    # and a build the probe passed cannot fail later), for each serving shape: decode and verify, both head
    # counts, SGLang's 2-D lengths and the [B] form; the launch has the kernel's grid, block and shared memory.
    from cases import make_paged_case

    hopper = _StandInHopper(monkeypatch)
    for next_n, heads, lens_2d in ((1, 64, True), (1, 32, True), (2, 32, True), (4, 64, True), (3, 32, False)):
        case = make_paged_case([70, 5], next_n=next_n, heads=heads, seed=62)
        lens = case.context_lens
        if lens_2d:
            lens = lens.view(-1, 1).expand(-1, next_n).contiguous()
        hopper.builds.clear()
        hopper.launches.clear()
        config = sm90.Config.of_call(next_n, heads, torch.float32, lens_2d)
        assert sm90.serving_unavailable("cpu", config) is None
        out = torch.empty(case.q.shape[0], 128)
        sched = torch.zeros(10, 2, dtype=torch.int32)  # 9 schedule entries: 3 CTAs of 4 math warpgroups
        sm90.launch(config, case.q, case.weights, case.cache, case.block_table, lens, sched, out, block_kv=64)
        (defines,) = hopper.builds
        assert {k: defines[k] for k in ("NEXT_N", "HEADS", "OUT_KIND", "LENS_2D", "MMA_ROWS")} == {
            "NEXT_N": str(next_n), "HEADS": str(heads), "OUT_KIND": "0", "LENS_2D": str(int(lens_2d)),
            "MMA_ROWS": str(config.mma_rows)}, (next_n, heads, lens_2d)
        ((index, grid, block, smem, args), _), = hopper.launches
        assert (index, grid, block) == (0, 3, 640)
        assert smem == 4 * sm90.layout(next_n, heads)["WG_BYTES"] + 1024
        assert args[7:] == [2, case.cache.shape[0], case.block_table.shape[1], 128,
                                                case.q.stride(0), case.q.stride(1), case.weights.stride(0),
                                                case.block_table.stride(0), 128, 64, 9, 1]
