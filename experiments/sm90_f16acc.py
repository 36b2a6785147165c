"""The Hopper scorer with f16 accumulators: the product kernel's source, edited, built, checked and timed.

Historical: it applies to the product kernel of commit 650565e, before the kernel took f16 accumulators and the
fold on the index key (docs/perf-notes.md); run it from that commit.

The score wgmma accumulates in f16 (``wgmma.mma_async ... .f16.e4m3.e4m3``: ``MMA_N / 4`` registers of
packed f16x2 per thread instead of ``MMA_N / 2`` fp32), which the interference probe
(``sm90_interference.py --acc f32,f16``) says no longer slows the decode's integer work beside it.
What changes against ``sglang_fp4_indexer/ops/cuda/paged_logits_sm90.cu`` (``EDITS``, applied to its
text; the product is not touched):

* **Fold**: a key's largest group at ``2**3 x E2M1`` (decode exponent field ``A = s_g - s_max + 9``,
  flushed when ``A < 1``: groups more than ``2**8`` below their key's largest), not ``2**6``.
* **Index query**: each (row, head) is scaled by ``2**-p`` with ``p = max(0, E - 9)``, ``E`` the
  exponent field of the head's largest e4m3 magnitude, so that every scaled element is below 8
  (e4m3 -> f16x2, times ``2**-p`` exactly, back to e4m3 with round-to-nearest). With ``|k'| <= 48``,
  every partial sum of a head score is below ``128 x 8 x 48 = 49152 < 65504`` for any input. Elements
  under ``2**(p - 6)`` are rounded to multiples of ``2**(p - 9)``.
* **Head sum** in f16 (``m64n8k16.f32.f16.f16``): ``relu(S)`` is ``max.f16x2`` of the accumulator
  register as it stands (no rounding), the weights ``w_h 2**(p_h + e_r)`` as hi + lo f16, with a per-row
  exponent ``e_r`` that puts the row's largest scaled weight in ``[2**14, 2**15)``; the row factor
  ``2**(3 - e_r)`` is applied at the store. Two more barriers per request load (the heads' shifts and the
  rows' largest weights are exchanged through the weights' shared-memory region, unused by the product).

Error bound used by the check (``REL``, a factor of the term bound ``sum_h |w_h| sum_d |q_hd k_d|`` as in
``bench.checks``): f16 accumulation with one rounding per k32 step (``4 x 2**-11`` / (1 - ...): an
assumption, the hardware's rounding inside a step is not documented), plus ``MMA_REL`` for the fp32 head
sum, plus ``2**-21`` for the weights' hi + lo split. The query rounding and the flush are outside ``REL``:
on the benchmark's inputs no group is flushed (``bench.inputs.SCALE_CODES`` spans 7 binades) and the rounded
query elements are below ``2**-5`` (heads' largest 8-16: ``p`` = 1).

    PYTHONPATH=. python3 -m experiments.sm90_f16acc [--shapes 64x8x128Kx1,...] [--json OUT]

times the product kernel, this one and DeepGEMM (as SGLang calls it, and native next_n) in one run through
the benchmark's own runner (``bench.runner.run_benchmark``: same inputs, checks and HBM floor).
"""

from __future__ import annotations

import argparse
import functools
import sys

import torch

from sglang_fp4_indexer.ops import nvrtc, sm90

#: Check tolerance (module docstring).
REL = 4 * 2.0**-11 / (1 - 4 * 2.0**-11) + sm90.MMA_REL + 2.0**-21

_FP8_F16 = '''__device__ __forceinline__ void wgmma_f8(u32* d, const u32* a, u64 desc, bool accumulate) {{
    asm volatile("{{\\n.reg .pred p;\\n"
        "setp.ne.b32 p, %{p}, 0;\\n"
        "wgmma.mma_async.sync.aligned.m64n{n}k32.f16.e4m3.e4m3 {{{d}}}, {{{a}}}, %{desc}, p, 1, 1;\\n"
        "}}\\n"
        : {outs}
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(static_cast<u32>(accumulate)));
}}
__device__ __forceinline__ void wgmma_f16_n8(float* d, const u32* a, u64 desc, bool accumulate) {{
    asm volatile("{{\\n.reg .pred p;\\n"
        "setp.ne.b32 p, %9, 0;\\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, %8, p, 1, 1, 0;\\n"
        "}}\\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(static_cast<u32>(accumulate)));
}}
// Four e4m3 bytes times 2**-p (hs: 2**-p as f16x2), rounded to nearest e4m3.
__device__ __forceinline__ u32 scale_e4m3x4(u32 w, u32 hs) {{
    u32 lo, hi;
    unsigned short a = static_cast<unsigned short>(w & 0xFFFFu), b = static_cast<unsigned short>(w >> 16);
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(lo) : "h"(a));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(hi) : "h"(b));
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(lo) : "r"(lo), "r"(hs));
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(hi) : "r"(hi), "r"(hs));
    asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(a) : "r"(lo));
    asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(b) : "r"(hi));
    return static_cast<u32>(a) | (static_cast<u32>(b) << 16);
}}
'''


def _wrappers(n: int) -> str:
    n_acc = n // 4
    return _FP8_F16.format(n=n, p=n_acc + 5, desc=n_acc + 4, d=", ".join(f"%{i}" for i in range(n_acc)),
                           a=", ".join(f"%{n_acc + i}" for i in range(4)),
                           outs=", ".join(f'"+r"(d[{i}])' for i in range(n_acc)))


#: (old, new, count) text edits of the product kernel (each must match exactly ``count`` times).
EDITS = [
    ("static_cast<int>(s_max) + 12;", "static_cast<int>(s_max) + 9;", 1),
    ("    int row_len[NEXT_N];\n", "    int row_len[NEXT_N];\n    float row_g[NEXT_N];\n", 1),
    # queries: each head's shift from its largest magnitude (8 lanes hold one head), then scaled
    ("""                const u32 words[4] = {zero_nan_e4m3(v[k].x), zero_nan_e4m3(v[k].y), zero_nan_e4m3(v[k].z),
                                      zero_nan_e4m3(v[k].w)};
""", """                u32 words[4] = {zero_nan_e4m3(v[k].x), zero_nan_e4m3(v[k].y), zero_nan_e4m3(v[k].z),
                                zero_nan_e4m3(v[k].w)};
                u32 mb = max(max(max_byte(words[0] & 0x7F7F7F7Fu), max_byte(words[1] & 0x7F7F7F7Fu)),
                             max(max_byte(words[2] & 0x7F7F7F7Fu), max_byte(words[3] & 0x7F7F7F7Fu)));
                mb = max(mb, __shfl_xor_sync(0xffffffffu, mb, 1));
                mb = max(mb, __shfl_xor_sync(0xffffffffu, mb, 2));
                mb = max(mb, __shfl_xor_sync(0xffffffffu, mb, 4));
                const int pq = max(0, static_cast<int>(mb >> 3) - 9);
                if (m == 0) reinterpret_cast<int*>(w_smem)[i * HEADS + h] = pq;
                if (pq > 0) {
                    const u32 hsc = static_cast<u32>(15 - pq) << 10;
                    const u32 hs2 = hsc | (hsc << 16);
#pragma unroll
                    for (int kk = 0; kk < 4; ++kk) words[kk] = scale_e4m3x4(words[kk], hs2);
                }
""", 1),
    ("""        load_chunk(0);     // in flight across the barrier
        math_barrier(wg);  // every wgmma reading the previous queries has completed
""", """        load_chunk(0);     // in flight across the barrier
        math_barrier(wg);  // every wgmma reading the previous queries has completed
        int* rowmax = reinterpret_cast<int*>(w_smem) + NEXT_N * HEADS;
        if (tid < NEXT_N) rowmax[tid] = 0;
""", 1),
    # weights: the rows' largest |w| 2**p, then hi + lo f16 of w 2**(p + e_r)
    ("""#pragma unroll
        for (int k = 0; k < WV; ++k) {
            const int idx = tid + k * MATH_THREADS, i = idx / HEADS, h = idx % HEADS;
            if (idx >= NEXT_N * HEADS) break;
            // fp32 epilogue: lane c reads (w[8j + 2c], w[8j + 2c + 1]) for j = 0 .. HEADS / 8 - 1.
            const int j = h >> 3, cc = (h & 7) >> 1;
            w_smem[(i * 4 + cc) * W_STRIDE + 2 * j + (h & 1)] = wv[k];
""", """        math_barrier(wg);  // the heads' shifts
        int wsh[WV];
#pragma unroll
        for (int k = 0; k < WV; ++k) {
            const int idx = tid + k * MATH_THREADS, i = idx / HEADS, h = idx % HEADS;
            wsh[k] = 0;
            if (idx >= NEXT_N * HEADS) break;
            wsh[k] = reinterpret_cast<int*>(w_smem)[i * HEADS + h];
            atomicMax(rowmax + i, __float_as_int(fabsf(ldexpf(wv[k], wsh[k]))));
        }
        math_barrier(wg);  // the rows' largest scaled weights
#pragma unroll
        for (int i = 0; i < NEXT_N; ++i) {
            const int ew = min(max((rowmax[i] >> 23) & 0xFF, 12), 254);
            row_g[i] = __int_as_float((ew - 11) << 23);
        }
#pragma unroll
        for (int k = 0; k < WV; ++k) {
            const int idx = tid + k * MATH_THREADS, i = idx / HEADS, h = idx % HEADS;
            if (idx >= NEXT_N * HEADS) break;
            const int ew = min(max((rowmax[i] >> 23) & 0xFF, 12), 254);
            const float ws = ldexpf(wv[k], wsh[k] + 141 - ew);
""", 1),
    ("""            unsigned short hi16, lo16;
            asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(hi16) : "f"(wv[k]));
            const float rest = wv[k] - __uint_as_float(static_cast<u32>(hi16) << 16);
            asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(lo16) : "f"(rest));
""", """            unsigned short hi16, lo16;
            float hif;
            asm("cvt.rn.f16.f32 %0, %1;" : "=h"(hi16) : "f"(ws));
            asm("cvt.f32.f16 %0, %1;" : "=f"(hif) : "h"(hi16));
            asm("cvt.rn.f16.f32 %0, %1;" : "=h"(lo16) : "f"(ws - hif));
""", 1),
    ("    float acc[MMA_N / 2];", "    u32 acc[MMA_N / 4];", 1),
    ("for (int j = 0; j < MMA_N / 2; ++j) asm volatile(\"\" : \"+f\"(acc[j])::\"memory\");",
     "for (int j = 0; j < MMA_N / 4; ++j) asm volatile(\"\" : \"+r\"(acc[j])::\"memory\");", 2),
    ("float* acc_i = acc + (i % MMA_ROWS) * (HEADS / 2);", "u32* acc_i = acc + (i % MMA_ROWS) * (HEADS / 4);", 1),
    ('asm("cvt.rn.relu.bf16x2.f32 %0, %1, %2;" : "=r"(ra[j]) : "f"(acc_i[2 * j + 1]), "f"(acc_i[2 * j]));',
     'asm("max.f16x2 %0, %1, %2;" : "=r"(ra[j]) : "r"(acc_i[j]), "r"(0u));', 1),
    ("""                asm("cvt.rn.relu.bf16x2.f32 %0, %1, %2;"
                    : "=r"(ra[k][j])
                    : "f"(acc[k * (HEADS / 2) + 2 * j + 1]), "f"(acc[k * (HEADS / 2) + 2 * j]));""",
     """                asm("max.f16x2 %0, %1, %2;" : "=r"(ra[k][j]) : "r"(acc[k * (HEADS / 4) + j]), "r"(0u));""", 1),
    ("wgmma_bf16_n8(", "wgmma_f16_n8(", 2),
    ("row_len[i] ? v * f :", "row_len[i] ? v * f * row_g[i] :", 1),
    ("row_len[i0 + k] ? v * f :", "row_len[i0 + k] ? v * f * row_g[i0 + k] :", 1),
]


#: Two pages per math-warpgroup step (``--pairs``), edits applied after ``EDITS``: the producer pads each
#: (schedule entry, request) run of jobs to an even count with a job without a page (request set, no page
#: index: nothing stored), so the math warpgroup takes its slots two at a time, both of one request; it
#: decodes both pages, issues both k-chains (two f16 accumulators) under one commit, waits once, and runs
#: both head sums under one commit and one wait. Per page that halves the fences, commits, waits, the
#: descriptor arithmetic and the loop, and puts two independent chains on the tensor cores per wait.
#: One wgmma per next_n row (``MMA_ROWS`` 1).
PAIR_EDITS = [
    # the producer's own loop runs one job further where a request's run is odd: that job has no page
    ("""            const int p_end = npages == 0 ? p + 1 : min(blk_hi * pages_per_block, npages);
            for (; p < p_end; ++p) {
                int page = -1;
                if (npages > 0) {
""", """            const int p_end = npages == 0 ? p + 1 : min(blk_hi * pages_per_block, npages);
            const int p_stop = p_end + ((p_end - p) & 1);  // the math warpgroup takes a request's jobs in pairs
            for (; p < p_stop; ++p) {
                const bool pad = p >= p_end;  // warp-uniform
                int page = -1;
                if (npages > 0 && !pad) {
""", 1),
    ("const bool last = p == npages - 1 || npages == 0;", "const bool last = !pad && (p == npages - 1 || npages == 0);", 1),
    ("make_int4(page, b, npages == 0 ? -1 : p,", "make_int4(page, b, npages == 0 || pad ? -1 : p,", 1),
    ("""    Slot next;
    acquire(next);
    while (next.job.y >= 0) {
        const int4 job = next.job;
        if (job.y != cur_b) {
            cur_b = job.y;
            load_request(cur_b);  // no wgmma is in flight here
        }
        Frag fr;
        float f;
        decode(next, fr, f);
#pragma unroll
        for (int i = 0; i + MMA_ROWS < NEXT_N; i += MMA_ROWS) {
            issue_row(i, fr);
            FINISH_GROUP(i);
        }
        issue_row(NEXT_N - MMA_ROWS, fr);
        FINISH_GROUP(NEXT_N - MMA_ROWS);
        acquire(next);
        fill_tail(job);
    }
""", """    static_assert(MMA_ROWS == 1, "pairs: one wgmma per next_n row");
    u32 acc2[MMA_N / 4];
    // Both pages' k-chains of next_n row i under one commit.
    auto issue_pair = [&](int i, const Frag& fa, const Frag& fb) {
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int s = 0; s < 4; ++s) wgmma_f8(acc, fa.a[s], q_desc0 + (i * Q_BYTES + 32 * s) / 16, s > 0);
#pragma unroll
        for (int s = 0; s < 4; ++s) wgmma_f8(acc2, fb.a[s], q_desc0 + (i * Q_BYTES + 32 * s) / 16, s > 0);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    };
    // Row i's epilogue of both pages (finish_row's numerics): one wait for the chains, both head sums
    // under one commit and one wait.
    auto finish_pair = [&](int i, const int4& ja, float fa, const int4& jb, float fb) {
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
        for (int j = 0; j < MMA_N / 4; ++j) asm volatile("" : "+r"(acc[j]), "+r"(acc2[j])::"memory");
        u32 ra[HEADS / 4], rb[HEADS / 4];
#pragma unroll
        for (int j = 0; j < HEADS / 4; ++j) {
            asm("max.f16x2 %0, %1, %2;" : "=r"(ra[j]) : "r"(acc[j]), "r"(0u));
            asm("max.f16x2 %0, %1, %2;" : "=r"(rb[j]) : "r"(acc2[j]), "r"(0u));
        }
        float hs[4], hs2[4];
        const u32 hb = smem_u32(hs_smem) + i * HS_BYTES;
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int t = 0; t < HEADS / 16; ++t) wgmma_f16_n8(hs, ra + 4 * t, hs_desc(hb + 256 * t), t > 0);
#pragma unroll
        for (int t = 0; t < HEADS / 16; ++t) wgmma_f16_n8(hs2, rb + 4 * t, hs_desc(hb + 256 * t), t > 0);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+f"(hs[j]), "+f"(hs2[j])::"memory");
        const float ninf = -__int_as_float(0x7f800000);
        const int col_a = ja.z * PAGE + my_row, col_b = jb.z * PAGE + my_row;
        float va = 2.f * (mine1 ? hs[2] + hs[3] : hs[0] + hs[1]);
        float vb = 2.f * (mine1 ? hs2[2] + hs2[3] : hs2[0] + hs2[1]);
        va = ja.z >= 0 && ja.x >= 0 && col_a < row_len[i] ? va * fa * row_g[i] : ninf;
        vb = jb.z >= 0 && jb.x >= 0 && col_b < row_len[i] ? vb * fb * row_g[i] : ninf;
        if (ja.z >= 0 && c < 2 && col_a < width) store_logit(row_out + i * stride_out + col_a, va);
        if (jb.z >= 0 && c < 2 && col_b < width) store_logit(row_out + i * stride_out + col_b, vb);
    };
    Slot sa, sb;
    acquire(sa);
    while (sa.job.y >= 0) {
        acquire(sb);  // the same request's next job (the producer pads each run of jobs to an even count)
        const int4 ja = sa.job, jb = sb.job;
        if (ja.y != cur_b) {
            cur_b = ja.y;
            load_request(cur_b);  // no wgmma is in flight here
        }
        Frag fa, fb;
        float f_a, f_b;
        decode(sa, fa, f_a);
        decode(sb, fb, f_b);
#pragma unroll
        for (int i = 0; i < NEXT_N; ++i) {
            issue_pair(i, fa, fb);
            finish_pair(i, ja, f_a, jb, f_b);
        }
        acquire(sa);
        fill_tail(ja);
        fill_tail(jb);
    }
""", 1),
]


#: Diagnostic variants (``--variants``), edits applied after ``EDITS`` (never with ``--pairs``):
#: ``warpmax``: each row's largest scaled weight reduced within the warp (a request's row is warp-uniform:
#: HEADS is a multiple of 32) and one shared atomic per warp instead of one per weight; ``noshift``: the
#: index query is never shifted (``p`` = 0: exact only while every head score's partial sums stay in f16's
#: range, which the benchmark's 2 x N(0, 1) queries do; the check says if not) -- the cost of the shift;
#: ``intshift``: the same shift, exact, without conversions where it can: a query word whose four exponent
#: fields all exceed ``p`` is shifted by subtracting ``p << 3`` from each byte (no byte borrows, the results are
#: normal e4m3), any other word through the e4m3 -> f16 -> e4m3 conversions as before.
VARIANT_EDITS = {
    "warpmax": [
        ("            atomicMax(rowmax + i, __float_as_int(fabsf(ldexpf(wv[k], wsh[k]))));\n",
         "            const int wmax = static_cast<int>(__reduce_max_sync(0xffffffffu, static_cast<u32>(\n"
         "                __float_as_int(fabsf(ldexpf(wv[k], wsh[k]))))));\n"
         "            if (lane == 0) atomicMax(rowmax + i, wmax);\n", 1),
    ],
    "noshift": [
        ("                const int pq = max(0, static_cast<int>(mb >> 3) - 9);\n",
         "                const int pq = 0 * static_cast<int>(mb);\n", 1),
    ],
    "intshift": [
        ("#pragma unroll\n                    for (int kk = 0; kk < 4; ++kk) words[kk] = scale_e4m3x4(words[kk], hs2);\n",
         "                    const u32 lim = static_cast<u32>((pq + 1) << 3) * 0x01010101u;\n"
         "                    const u32 dec = static_cast<u32>(pq << 3) * 0x01010101u;\n"
         "#pragma unroll\n"
         "                    for (int kk = 0; kk < 4; ++kk) {\n"
         "                        const u32 ge = (((words[kk] & 0x78787878u) | 0x80808080u) - lim) & 0x80808080u;\n"
         "                        words[kk] = ge == 0x80808080u ? words[kk] - dec : scale_e4m3x4(words[kk], hs2);\n"
         "                    }\n", 1),
    ],
}

#: ``keyfold``: the fold moved from the index query to the index key. The query is used as it comes (no shift, no
#: conversions: ``noshift``'s edit) and a key's largest group goes to ``2**-3 x E2M1`` (decode exponent field
#: ``A = s_g - s_max + 3``), so ``|k'| <= 0.75`` and, for any e4m3 query (``|q| <= 448``), every partial sum of a
#: head score stays within ``4 x 32 x 448 x 0.75 = 43008 < 65504``. Groups with ``A >= 1`` (up to ``2**2`` below
#: their key's largest) decode by the product's formula; groups with ``-6 <= A <= 0`` by ``KEYFOLD_TABLE``: their
#: smaller values are e4m3 subnormals, exact down to ``A = -2`` and rounded to nearest (ties to even) on the
#: ``2**-9`` grid below; ``A < -6`` is zero. The store factor grows by ``2**6`` to match.
KEYFOLD_LOW = -6


def keyfold_bytes(a: int) -> list[int]:
    """The eight e4m3 bytes of the ``keyfold`` decode table for exponent field ``a``: byte ``x`` is
    ``E2M1(x) x 2**(a - 6)`` rounded to nearest e4m3 (ties to even, by torch's ``float8_e4m3fn`` cast), for the
    magnitude codes ``x = 0 .. 7``.

    Args:
        a: the decode exponent field ``s_g - s_max + 3`` (any int; below ``KEYFOLD_LOW`` every byte is 0).

    Returns:
        eight ints in ``0 .. 0x7E``.
    """
    from sglang_fp4_indexer.format import e2m1_table

    mags = e2m1_table()[:8].to(torch.float64) * 2.0 ** (a - 6)
    return [int(b) for b in mags.to(torch.float8_e4m3fn).view(torch.uint8)]


def _keyfold_table_text() -> str:
    words = []
    for a in range(KEYFOLD_LOW, 1):
        b = keyfold_bytes(a)
        words.append(f"{{0x{int.from_bytes(bytes(b[:4]), 'little'):08X}u, 0x{int.from_bytes(bytes(b[4:]), 'little'):08X}u}}")
    words.append("{0u, 0u}")
    return ("// keyfold: the decode tables of A = %d .. 0 (e4m3 subnormals where the value is below 2**-6), then zeros.\n"
            "static __device__ const uint2 KEYFOLD_TABLE[8] = {%s};\n__shared__ uint2 keyfold_lut[8];\n"
            % (KEYFOLD_LOW, ", ".join(words)))


VARIANT_EDITS["keyfold"] = VARIANT_EDITS["noshift"] + [
    ("""// The LUT of one (key, group) from the group's code and the key's largest""",
     _keyfold_table_text() + """// The LUT of one (key, group) from the group's code and the key's largest""", 1),
    ("""    const int a = static_cast<int>(code) - static_cast<int>(s_max) + 9;
    const u32 ua = static_cast<u32>(a);
    lut_lo = a >= 1 ? ua * 0x08080800u + 0x0C080000u : 0u;
    lut_hi = a >= 1 ? ua * 0x08080808u + 0x1C181410u : 0u;
""", """    const int a = static_cast<int>(code) - static_cast<int>(s_max) + 3;
    const u32 ua = static_cast<u32>(a);
    const uint2 t = keyfold_lut[static_cast<u32>(a + 6) <= 6u ? a + 6 : 7];
    lut_lo = a >= 1 ? ua * 0x08080800u + 0x0C080000u : t.x;
    lut_hi = a >= 1 ? ua * 0x08080808u + 0x1C181410u : t.y;
""", 1),
    ("""        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
""", """        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if (threadIdx.x < 8) keyfold_lut[threadIdx.x] = KEYFOLD_TABLE[threadIdx.x];
    __syncthreads();
""", 1),
    ("<< 23)) * 0.0078125f;", "<< 23)) * 0.5f;", 1),
]


def keyfold_rel(inputs) -> float:
    """The check tolerance of ``keyfold`` on one shape's inputs, as a factor of ``bench.checks``' term bound
    ``sum_h |w_h| sum_d |q_hd k_d|``: ``REL`` plus the largest ratio, over the checked rows' visible keys, of what
    the variant's roundings can add beyond it, both computed from the inputs alone (fp64):

    * groups with ``A = s_g - s_max + 3 <= -3`` are rounded to the ``2**-9`` grid of the folded key, at most
      ``2**(s_max - 134)`` per element in the key's own units: ``sum_h |w_h| sum_(d in those groups) |q_hd|`` times it;
    * the f16 accumulator's subnormal range (below ``2**-14``, absolute error ``2**-25`` per rounding, four
      roundings): ``4 x 2**(s_max - 149) x sum_h |w_h|``.

    Args:
        inputs: ``bench.inputs.ScorerInputs`` of one shape.

    Returns:
        the tolerance (a float above ``REL``).
    """
    from sglang_fp4_indexer.bench.inputs import checked_requests
    from sglang_fp4_indexer.format import dequantize_index_k
    from sglang_fp4_indexer.pool import read_index_k
    from sglang_fp4_indexer.reference import expand_context_lens, logits_from_keys, paged_slots

    shape, cache = inputs.shape, inputs.caches[0]
    lens = expand_context_lens(inputs.context_lens, shape.next_n).reshape(-1)
    worst = 0.0
    for b in checked_requests(shape):
        rows = range(b * shape.next_n, (b + 1) * shape.next_n)
        longest = int(max(lens[r] for r in rows))
        if longest == 0:
            continue
        payload, scales = read_index_k(cache, paged_slots(inputs.block_table[b], longest))
        keys = dequantize_index_k(payload, scales).abs().to(torch.float64)
        s = scales.to(torch.int64)
        s_max = s.max(dim=1, keepdim=True).values
        unit = torch.ldexp(torch.ones_like(s_max, dtype=torch.float64), s_max - 134)
        delta = ((s - s_max + 3 <= -3).to(torch.float64) * unit).repeat_interleave(32, dim=1)
        floor = torch.ldexp(torch.full_like(unit, 4.0), s_max - 149).reshape(-1)
        for r in rows:
            n = int(lens[r])
            if n == 0:
                continue
            q, w = inputs.q[r].float().abs(), inputs.weights[r].abs()
            bound = logits_from_keys(q, w, keys[:n])
            extra = logits_from_keys(q, w, delta[:n]) + floor[:n] * float(w.double().sum())
            ok = bound > 0
            worst = max(worst, float((extra[ok] / bound[ok]).max()) if bool(ok.any()) else 0.0)
    return REL + worst


def _apply(text: str, edits, what: str) -> str:
    for old, new, count in edits:
        if text.count(old) != count:
            raise RuntimeError(f"edit no longer matches {what} {count} time(s): {old[:60]!r}")
        text = text.replace(old, new)
    return text


def source(n: int, pairs: bool = False, variant: str | None = None) -> str:
    """The edited kernel text with its wrappers for N = ``n`` (rows per wgmma x heads); ``pairs``: with
    ``PAIR_EDITS`` too; ``variant``: with ``VARIANT_EDITS[variant]`` too.

    Raises:
        RuntimeError: an edit no longer matches the product kernel the expected number of times.
        KeyError: ``variant`` is not in ``VARIANT_EDITS``.
    """
    text = _apply(sm90.SOURCE.read_text(), EDITS, "the product kernel")
    if pairs:
        text = _apply(text, PAIR_EDITS, "the f16 kernel")
    if variant is not None:
        text = _apply(text, VARIANT_EDITS[variant], "the f16 kernel")
    head, tail = text.split(sm90._MARKER, 1)
    return head + _wrappers(n) + sm90._MARKER + tail


@functools.lru_cache(maxsize=None)
def spec(config: sm90.Config, pairs: bool = False, variant: str | None = None) -> nvrtc.KernelSpec:
    """The ``nvrtc.KernelSpec`` of the f16 build of ``config`` (same defines and layout as the product's);
    ``variant`` ``"product"``: the product kernel's own spec, unedited (``sm90._spec``), so that it can be timed
    through this module's launcher with the same per-call host cost as the edited kernels. Memoised: the
    benchmark's timer sizes its CUDA graphs from an eager estimate of one call, host time included, so a launcher
    that re-edits the source on every call would get fewer calls per graph than its peers.

    Raises:
        ValueError: ``pairs`` with more than one next_n row per wgmma, or with ``variant``.
    """
    if variant == "product":
        if pairs:
            raise ValueError("pairs: not with variant 'product'")
        return sm90._spec(config)
    if pairs and config.mma_rows != 1:
        raise ValueError(f"pairs needs config.mma_rows 1, got {config.mma_rows}")
    name = "paged_logits_sm90_f16acc" + ("_pairs" if pairs else "") + (f"_{variant}" if variant else "") + ".cu"
    return nvrtc.KernelSpec(source(config.mma_rows * config.heads, pairs, variant), name, "fp4_paged_logits_sm90",
                            config.defines(), config.smem_bytes, "the f16-accumulator kernel", "nothing")


def launch(config, q, weights, cache, block_table, context_lens, schedule, out, *, block_kv: int,
           clean_logits: bool = True, pairs: bool = False, variant: str | None = None) -> None:
    """Launch it as ``sm90.launch`` launches the product kernel (same arguments, grid and block).

    Raises:
        RuntimeError: the build, the load or the launch fails.
        ValueError: as ``spec``.
    """
    sp = spec(config, pairs, variant)
    fn = nvrtc.load(q.device, sp)
    if fn is None:
        raise RuntimeError(nvrtc.failure(q.device, sp))
    args = sm90._kernel_args(q, weights, cache, block_table, context_lens, schedule, out, block_table.shape[0],
                             out.shape[1], block_kv, clean_logits)
    nvrtc.launch(fn, q.device, -(-(schedule.shape[0] - 1) // sm90.WGS), sm90.THREADS, sp.smem, args)


def _scorer(mma_rows: int | None = None, pairs: bool = False, variant: str | None = None):
    from sglang_fp4_indexer.bench.scorers import OursScorer, PreparedScorer, _case_bytes
    from sglang_fp4_indexer.bench.timing import rotation_sets
    from sglang_fp4_indexer.ops import paged_logits as pl
    from sglang_fp4_indexer.ops.grid import default_num_ctas
    from sglang_fp4_indexer.ops.schedule import plan_paged_schedule

    class F16AccScorer(OursScorer):
        """This module's kernel on the product's CTA schedule, with the product's block_kv and CTA count."""

        def __init__(self):
            super().__init__(None)
            self.name = ("ours[same launch]" if variant == "product" else f"f16acc[{variant}]" if variant else "f16acc[pairs]" if pairs else "f16acc" if mma_rows is None
                         else f"f16acc[rows {mma_rows}]")
            self.label = "experiments.sm90_f16acc"

        def prepare(self, inputs, l2_bytes):
            shape, dev = inputs.shape, inputs.device
            block_kv, num_ctas = pl.default_block_kv(dev, None), default_num_ctas(dev, None)
            schedule = plan_paged_schedule(inputs.context_lens, block_kv, num_ctas)
            case = _case_bytes(shape, self.key_bytes)
            sets = min(len(inputs.caches), rotation_sets(case, l2_bytes))
            outs = [torch.full((shape.rows, inputs.width), float("nan"), device=dev) for _ in range(sets)]
            cfg = sm90.Config.of_call(shape.next_n, shape.heads, torch.float32, False)
            rows = 1 if pairs else mma_rows
            if rows is not None and shape.next_n % rows == 0:  # else the product's rows per wgmma
                cfg = sm90.Config(cfg.next_n, cfg.heads, cfg.out_kind, cfg.lens_2d, rows)
            self.ran = f"f16acc mma_rows {cfg.mma_rows}" + (" pairs" if pairs else "")
            q = inputs.q.view(shape.batch * shape.next_n, shape.heads, 128)
            clean = not shape.width

            def fn(s):
                launch(cfg, q, inputs.weights, inputs.caches[s], inputs.block_table, inputs.context_lens, schedule,
                       outs[s], block_kv=block_kv, clean_logits=clean, pairs=pairs, variant=variant)
                return outs[s]

            rel = sm90.rel_bound() if variant == "product" else keyfold_rel(inputs) if variant == "keyfold" else REL
            if variant == "keyfold":
                print(f"keyfold check tolerance {rel:.4g} x bound (REL {REL:.4g})", flush=True)
            return PreparedScorer(fn, sets, rel, clean, case)

    return F16AccScorer()


class _CooledScorer:
    """A benchmark scorer that leaves the GPU idle for ``seconds`` at the end of ``prepare`` (outside the timing),
    so that every scorer's timing starts from about the same thermal and power state: the product kernel runs
    into the board's power limit within a timing's ~0.25 s, so without a pause a scorer timed right after
    another heavy one starts hotter. Everything else is the wrapped scorer's."""

    def __init__(self, inner, seconds: float):
        self._inner, self._seconds = inner, seconds

    def __getattr__(self, name):  # name, label, key_bytes, ran (set by the inner prepare), availability
        return getattr(self._inner, name)

    def prepare(self, inputs, l2_bytes):
        import time

        prepared = self._inner.prepare(inputs, l2_bytes)
        torch.cuda.synchronize()
        time.sleep(self._seconds)
        return prepared


def main(argv=None) -> int:
    from sglang_fp4_indexer.bench.report import render_summary, write_json
    from sglang_fp4_indexer.bench.runner import BenchConfig, run_benchmark
    from sglang_fp4_indexer.bench.scorers import DeepGemmFP8Scorer, OursScorer
    from sglang_fp4_indexer.bench.shapes import parse_shapes

    p = argparse.ArgumentParser(prog="python -m experiments.sm90_f16acc")
    p.add_argument("--shapes", default="64x8x128Kx1@160K,64x8x128Kx2@160K,32x8x128Kx1@160K,64x32x32Kx1@160K,"
                                       "64x1x4Kx1@160K,64x128x8Kx1@160K,64x128x8Kx2@160K")
    p.add_argument("--rows2", action="store_true",
                   help="also time 2 next_n rows per wgmma (N = 2 x heads) where next_n is even (else as f16acc)")
    p.add_argument("--pairs", action="store_true",
                   help="also time two pages per math-warpgroup step (PAIR_EDITS; one wgmma per next_n row)")
    p.add_argument("--variants", default="",
                   help="comma-separated names of VARIANT_EDITS to time as well; 'product': the product kernel "
                        "unedited through this module's launcher (the same host cost per call as the edited ones)")
    p.add_argument("--no-deepgemm", action="store_true", help="leave DeepGEMM out (diagnostic runs)")
    p.add_argument("--seed", type=int, default=0, help="the benchmark inputs' seed")
    p.add_argument("--cooldown", type=float, default=0.0,
                   help="seconds of GPU idle before each scorer's timing (every scorer starts from about the same "
                        "thermal and power state; the runner's order otherwise favours the first scorer of a shape)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    unknown = [v for v in a.variants.split(",") if v and v not in VARIANT_EDITS and v != "product"]
    if unknown:
        p.error(f"--variants: unknown {unknown}, expected names from {sorted(VARIANT_EDITS)}")
    scorers = [OursScorer(), _scorer()]
    scorers += [_scorer(variant=v) for v in a.variants.split(",") if v]
    if not a.no_deepgemm:
        scorers += [DeepGemmFP8Scorer(), DeepGemmFP8Scorer(native=True)]
    if a.rows2:
        scorers.insert(2, _scorer(2))
    if a.pairs:
        scorers.insert(2, _scorer(pairs=True))
    if a.cooldown < 0:
        p.error(f"--cooldown: expected seconds >= 0, got {a.cooldown}")
    if a.cooldown:
        scorers = [_CooledScorer(s, a.cooldown) for s in scorers]
    cfg = BenchConfig(device=torch.device("cuda"), shapes=parse_shapes(a.shapes), scorers=scorers, store_tokens=None,
                      planner_batch=None, seed=a.seed,
                      command="python -m experiments.sm90_f16acc " + " ".join(argv or sys.argv[1:]))

    def save(rep):  # after every shape, so that a run cut short still leaves its numbers
        if a.json:
            write_json(rep, a.json)

    report = run_benchmark(cfg, log=lambda line: print(line, flush=True), on_progress=save)
    print(render_summary(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
