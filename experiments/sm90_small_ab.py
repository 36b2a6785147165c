"""Small-batch A/B of the product Hopper kernel: which part of its prologue costs at 1 x 4K.

Each variant is a text edit of ``sglang_fp4_indexer/ops/cuda/paged_logits_sm90.cu`` (the product untouched),
built like the product (``sm90._spec``'s defines and wrappers) and timed through one launcher by the benchmark's
runner (same inputs, checks, CUDA graphs). Diagnostic variants may fail the check; their time is still recorded:

* ``product``: unedited;
* ``table_immediates``: the low-exponent LUT rows built from immediates (a select chain on the thread index)
  instead of copied from the global constant array ``KEYFOLD_TABLE``;
* ``no_table``: no LUT row for the low exponent fields (zeros; wrong where a group is far below its key's
  largest);
* ``no_rowmax``: every row's weight exponent taken as 127 (no reduction, no barrier; weights not rescaled to the
  row's range);
* ``table_all``: every LUT from the shared table, the rows of ``A = 1 .. 3`` included (no formula, no select:
  what the shared-memory read costs beside the ALU work it replaces);
* ``warp_any``: the table read only where a lane of the warp needs it (``__any_sync``; on keys whose groups all
  lie within ``2**2`` of their largest, as the accuracy study's, no warp reads it).

Probe variants (wrong scores by construction, so they fail the check; their time says what a part costs):

* ``no_decode``: the payload words fed to the wgmma as they are (no LUT, no nibble-to-byte decode);
* ``no_mma``: no score wgmma (the fragments kept alive, the accumulators zero; the head sum and the stores as
  in the product);
* ``no_decode_mma``: both;
* ``no_qload``: the index queries not read from global memory (each math warpgroup's load of its request's
  queries, ``NEXT_N x HEADS x 128`` bytes through L2, replaced by constants; still written to shared memory):
  what that load costs where an entry covers few pages (one long request over every SM's four entries reads
  the same queries 528 times). Its queries are nearly all zero bytes, so the tensor cores also draw less power
  (the board's clock limit, docs/perf-notes.md);
* ``no_qload_dense``: the same with dense constant queries (every byte a nonzero e4m3 of either sign, varying
  with the thread): the load's cost without the power confound;
* (``q_one_chunk``, every one of a thread's query loads issued before the first is used, one round trip to
  memory instead of two at next_n 4 and 64 heads, was measured faster at 1 x 128K next_n 4 and is now the
  product's load; docs/perf-notes.md)
* ``q_cp_async``: one round trip without holding the queries in registers: every query copy issued at once as
  ``cp.async`` (global to shared, 16 bytes each, at the copy's own head row of the query tile), then, once they
  have landed, each head row permuted in place by the 8 lanes that copied it (read, ``__syncwarp``, write); the
  copies are issued after the barrier that ends the previous request's wgmma (NVRTC for sm_90a: no spills at
  next_n 1, 2, 4 and 64 heads, nor at next_n 4 and 32 heads; 96 registers, as the product).

A structural variant aimed at that load:

* ``coop_q``: where all four math warpgroups of a CTA begin with the same request (a long request spread over
  every SM), its queries are read from global memory once per CTA, each math thread a quarter of them, written
  into every math warpgroup's query tile, published by a fence and one named barrier over the CTA's math
  threads; each warpgroup's first ``load_request`` then loads only the weights and lengths. Later requests load
  as in the product.

A structural variant:

* ``pipeline``: the next page read and decoded while this page's score wgmma runs (two fragment sets, the loop
  unrolled by two so that they alternate without copies); the next request's queries still load only when no
  wgmma is in flight.

    PYTHONPATH=. python3 -m experiments.sm90_small_ab [--variants product,...] [--shapes ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import functools
import sys

import torch

from sglang_fp4_indexer.ops import nvrtc, sm90

def _bytes(a: int) -> list[int]:
    """The eight LUT bytes of exponent field ``a``: ``E2M1(x) x 2**(a - 6)`` rounded to nearest e4m3."""
    from sglang_fp4_indexer.format import E2M1_MAGNITUDES

    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32) * 2.0 ** (a - 6)
    return mags.to(torch.float8_e4m3fn).view(torch.uint8).tolist()


_NO_DECODE = (
    """            decode_word_rep(w0[s], lo0, hi0, k16, k65536, fr.a[s][0], fr.a[s][2]);
            decode_word_rep(w1[s], lo1, hi1, k16, k65536, fr.a[s][1], fr.a[s][3]);
""",
    """            fr.a[s][0] = fr.a[s][2] = w0[s];
            fr.a[s][1] = fr.a[s][3] = w1[s];
""", 1)
_NO_MMA = [
    ("        for (int s = 0; s < 4; ++s) wgmma_f8(acc, fr.a[s], q_desc0 + (i * Q_BYTES + 32 * s) / 16, s > 0);\n",
     '        for (int s = 0; s < 4; ++s) asm volatile("" :: "r"(fr.a[s][0]), "r"(fr.a[s][1]), "r"(fr.a[s][2]), '
     '"r"(fr.a[s][3]));\n', 1),
    ("    u32 acc[MMA_N / 4];  //", "    u32 acc[MMA_N / 4] = {};  //", 1),
]
#: The product's main loop, quoted whole: the pipelined loop replaces it, so a change of the product's loop
#: breaks this edit instead of being pipelined unseen.
_LOOP = """    Slot next;
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
}"""
_PIPELINED_LOOP = """    Slot next;
    acquire(next);
    Frag fa, fb;
    float fa_f = 0.f, fb_f = 0.f;
    if (next.job.y >= 0) decode(next, fa, fa_f);
    // One page: its first wgmma issued, the next page read and decoded while it runs, then its epilogue.
    auto step = [&](const Frag& fr, const float f, Frag& fn, float& fn_f) -> bool {
        const int4 job = next.job;
        if (job.y != cur_b) {
            cur_b = job.y;
            load_request(cur_b);  // no wgmma is in flight here
        }
        issue_row(0, fr);
        acquire(next);
        if (next.job.y >= 0) decode(next, fn, fn_f);
        FINISH_GROUP(0);
#pragma unroll
        for (int i = MMA_ROWS; i < NEXT_N; i += MMA_ROWS) {
            issue_row(i, fr);
            FINISH_GROUP(i);
        }
        // fr stays unmodified until its last wgmma has been waited for.
#pragma unroll
        for (int s = 0; s < 4; ++s)
            asm volatile("" ::"r"(fr.a[s][0]), "r"(fr.a[s][1]), "r"(fr.a[s][2]), "r"(fr.a[s][3]) : "memory");
        fill_tail(job);
        return next.job.y >= 0;
    };
    while (next.job.y >= 0) {
        if (!step(fa, fa_f, fb, fb_f)) break;
        if (!step(fb, fb_f, fa, fa_f)) break;
    }
}"""
VARIANT_EDITS = {
    "product": [],
    "table_immediates": [
        ("    if (threadIdx.x < 8) keyfold_lut[threadIdx.x] = KEYFOLD_TABLE[threadIdx.x];\n",
         "    if (threadIdx.x < 8) keyfold_lut[threadIdx.x] = keyfold_row(threadIdx.x);\n", 1),
        ('extern "C" __global__',
         "__device__ __forceinline__ uint2 keyfold_row(int i) { return %smake_uint2(0u, 0u); }\nextern \"C\" __global__"
         % "".join(f"i == {i} ? make_uint2(0x{lo:08X}u, 0x{hi:08X}u) : "
                   for i, (lo, hi) in enumerate(sm90.keyfold_table()[:-1])), 1),
    ],
    "no_table": [
        ("    const uint2 t = keyfold_lut[", "    const uint2 t = make_uint2(0u, 0u); (void)keyfold_lut[", 1),
    ],
    "no_rowmax": [
        ("            wmax = __reduce_max_sync(0xffffffffu, wmax);\n", "", 1),
        ("            if (idx < NEXT_N * HEADS && idx % WSEG == 0) wmax_smem[idx / WSEG] = wmax;\n", "", 1),
        ("        math_barrier(wg);  // the warps' largest weights\n", "", 1),
        ("            return min(max(static_cast<int>(m >> 23), 12), 254);\n", "            return 127 + 0 * static_cast<int>(m);\n", 1),
        ("for (int s = 0; s < HEADS / WSEG; ++s) m = max(m, wmax_smem[i * (HEADS / WSEG) + s]);", "(void)i;", 1),
    ],
    "table_all": [
        ("__shared__ uint2 keyfold_lut[8];", "__shared__ uint2 keyfold_lut[16];", 1),
        ("    if (threadIdx.x < 8) keyfold_lut[threadIdx.x] = KEYFOLD_TABLE[threadIdx.x];\n",
         "    if (threadIdx.x < 11) keyfold_lut[threadIdx.x] = KF_ALL[threadIdx.x];\n", 1),
        ('extern "C" __global__',
         "static __device__ const uint2 KF_ALL[11] = {%s};\nextern \"C\" __global__" % ", ".join(
             f"{{0x{int.from_bytes(bytes(_b[:4]), 'little'):08X}u, 0x{int.from_bytes(bytes(_b[4:]), 'little'):08X}u}}"
             for _b in [_bytes(a) for a in range(sm90.KEYFOLD_LOW, 4)] + [[0] * 8]), 1),
        ("""    const uint2 t = keyfold_lut[static_cast<u32>(a - KEYFOLD_LOW) <= static_cast<u32>(-KEYFOLD_LOW)
                                    ? a - KEYFOLD_LOW : 7];
    lut_lo = a >= 1 ? ua * 0x08080800u + 0x0C080000u : t.x;
    lut_hi = a >= 1 ? ua * 0x08080808u + 0x1C181410u : t.y;""",
         """    const uint2 t = keyfold_lut[static_cast<u32>(a - KEYFOLD_LOW) <= static_cast<u32>(3 - KEYFOLD_LOW)
                                    ? a - KEYFOLD_LOW : 10];
    (void)ua;
    lut_lo = t.x;
    lut_hi = t.y;""", 1),
    ],
    "warp_any": [
        ("""    const uint2 t = keyfold_lut[static_cast<u32>(a - KEYFOLD_LOW) <= static_cast<u32>(-KEYFOLD_LOW)
                                    ? a - KEYFOLD_LOW : 7];""",
         """    uint2 t = make_uint2(0u, 0u);
    if (__any_sync(0xffffffffu, a < 1))
        t = keyfold_lut[static_cast<u32>(a - KEYFOLD_LOW) <= static_cast<u32>(-KEYFOLD_LOW) ? a - KEYFOLD_LOW : 7];""", 1),
    ],
    "no_decode": [_NO_DECODE],
    "no_mma": _NO_MMA,
    "no_decode_mma": [_NO_DECODE, *_NO_MMA],
    "pipeline": [(_LOOP, _PIPELINED_LOOP, 1)],
    "coop_q": [
        ("    auto load_request = [&](int b) {\n", "    auto load_request = [&](int b, bool with_q) {\n", 1),
        ("            load_request(b0);\n", "            load_request(b0, true);\n", 1),
        ("            load_request(cur_b);  // no wgmma is in flight here\n",
         "            load_request(cur_b, true);  // no wgmma is in flight here\n", 1),
        ("        load_chunk(0);     // in flight across the barrier\n",
         "        if (with_q) load_chunk(0);     // in flight across the barrier\n", 1),
        ("""        for (int k0 = 0; k0 < QV; k0 += Q_CHUNK) {
            if (k0 > 0) load_chunk(k0);""",
         """        for (int k0 = 0; k0 < QV; k0 += Q_CHUNK) {
            if (!with_q) break;
            if (k0 > 0) load_chunk(k0);""", 1),
        ('    if (vcta < num_ctas) {\n        const int b0 = max(__ldg(schedule + 2 * vcta), 0), blk0', '    // coop_q: do the CTA\'s WGS entries all begin with one request? Then its queries are read once per CTA.\n    int coop_b = -1;\n    {\n        bool same = true;\n#pragma unroll\n        for (int g = 0; g < WGS; ++g) {\n            const int e = blockIdx.x * WGS + g;\n            int bb = -1;\n            if (e < num_ctas) {\n                const int x0 = max(__ldg(schedule + 2 * e), 0), y0 = max(__ldg(schedule + 2 * e + 1), 0);\n                const int x1 = __ldg(schedule + 2 * e + 2), y1 = __ldg(schedule + 2 * e + 3);\n                if (x0 < batch && (x0 < x1 || (x0 == x1 && y0 < y1))) bb = x0;\n            }\n            if (g == 0) coop_b = bb;\n            same = same && bb >= 0 && bb == coop_b;\n        }\n        if (!same) coop_b = -1;\n    }\n    if (coop_b >= 0) {\n        constexpr int QT = NEXT_N * HEADS * 8, CQ = (QT + WGS * MATH_THREADS - 1) / (WGS * MATH_THREADS);\n        const int gt = wg * MATH_THREADS + tid;\n        uint4 cv[CQ];\n#pragma unroll\n        for (int k = 0; k < CQ; ++k) {\n            const int idx = gt + k * WGS * MATH_THREADS;\n            const int i = idx / (HEADS * 8), h = (idx >> 3) % HEADS, m = idx & 7;\n            cv[k] = idx < QT ? __ldg(reinterpret_cast<const uint4*>(\n                                   q + static_cast<i64>(coop_b * NEXT_N + i) * stride_q_row + h * stride_q_head + 16 * m))\n                             : make_uint4(0u, 0u, 0u, 0u);\n        }\n#pragma unroll\n        for (int k = 0; k < CQ; ++k) {\n            const int idx = gt + k * WGS * MATH_THREADS;\n            if (idx >= QT) break;\n            const int i = idx / (HEADS * 8), h = (idx >> 3) % HEADS, m = idx & 7;\n            const u32 words[4] = {zero_nan_e4m3(cv[k].x), zero_nan_e4m3(cv[k].y), zero_nan_e4m3(cv[k].z),\n                                  zero_nan_e4m3(cv[k].w)};\n#pragma unroll\n            for (int kk = 0; kk < 4; ++kk) {\n                const int wi = 4 * m + kk, cc = wi >> 3, s = (wi >> 1) & 3, hi = wi & 1;\n                const int off = i * Q_BYTES + h * 128 + (((2 * s + hi) ^ (h & 7)) << 4) + 4 * cc;\n#pragma unroll\n                for (int g = 0; g < WGS; ++g) *reinterpret_cast<u32*>(smem_base + g * WG_BYTES + off) = words[kk];\n            }\n        }\n        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");\n        asm volatile("bar.sync 5, %0;" ::"n"(WGS * MATH_THREADS) : "memory");\n        cur_b = coop_b;\n        load_request(coop_b, false);\n    } else if (vcta < num_ctas) {\n        const int b0 = max(__ldg(schedule + 2 * vcta), 0), blk0', 1),
    ],
    "no_qload": [
        ("""                v[k] = __ldg(reinterpret_cast<const uint4*>(
                    q + static_cast<i64>(b * NEXT_N + i) * stride_q_row + h * stride_q_head + 16 * m));""",
         """                v[k] = make_uint4(static_cast<u32>(i + h + m), 0u, 0u, 0u);""", 1),
    ],
    "q_cp_async": [
        ('        uint4 v[Q_CHUNK];\n        auto load_chunk = [&](int k0) {\n#pragma unroll\n            for (int k = 0; k < Q_CHUNK; ++k) {\n                const int idx = tid + (k0 + k) * MATH_THREADS;\n                const int i = idx / (HEADS * 8), h = (idx >> 3) % HEADS, m = idx & 7;\n                v[k] = __ldg(reinterpret_cast<const uint4*>(\n                    q + static_cast<i64>(b * NEXT_N + i) * stride_q_row + h * stride_q_head + 16 * m));\n            }\n        };\n        load_chunk(0);     // in flight across the barrier\n        math_barrier(wg);  // every wgmma reading the previous queries has completed',
         '        math_barrier(wg);  // every wgmma reading the previous queries has completed\n        // q_cp_async: every query copy in flight at once, global -> shared at its own head row (raw; the\n        // 8 lanes that copy a head row are the 8 that permute it below), no registers held.\n#pragma unroll\n        for (int k = 0; k < QV; ++k) {\n            const int idx = tid + k * MATH_THREADS;\n            const int i = idx / (HEADS * 8), h = (idx >> 3) % HEADS, m = idx & 7;\n            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(q_smem + i * Q_BYTES + h * 128 + 16 * m)),\n                         "l"(q + static_cast<i64>(b * NEXT_N + i) * stride_q_row + h * stride_q_head + 16 * m)\n                         : "memory");\n        }\n        asm volatile("cp.async.commit_group;" ::: "memory");', 1),
        ('#pragma unroll\n        for (int k0 = 0; k0 < QV; k0 += Q_CHUNK) {\n            if (k0 > 0) load_chunk(k0);\n#pragma unroll\n            for (int k = 0; k < Q_CHUNK; ++k) {\n                const int idx = tid + (k0 + k) * MATH_THREADS;\n                const int i = idx / (HEADS * 8), h = (idx >> 3) % HEADS, m = idx & 7;\n                unsigned char* row = q_smem + i * Q_BYTES + h * 128;\n                const u32 words[4] = {zero_nan_e4m3(v[k].x), zero_nan_e4m3(v[k].y), zero_nan_e4m3(v[k].z),\n                                      zero_nan_e4m3(v[k].w)};',
         '        asm volatile("cp.async.wait_all;" ::: "memory");\n        __syncwarp();  // the other 7 lanes\' copies into each of this warp\'s head rows\n#pragma unroll\n        for (int k0 = 0; k0 < QV; k0 += 1) {\n            {\n                const int k = 0;\n                const int idx = tid + (k0 + k) * MATH_THREADS;\n                const int i = idx / (HEADS * 8), h = (idx >> 3) % HEADS, m = idx & 7;\n                unsigned char* row = q_smem + i * Q_BYTES + h * 128;\n                const uint4 vk = *reinterpret_cast<const uint4*>(row + 16 * m);\n                __syncwarp();  // the head row\'s 8 raw uint4 read before any is overwritten\n                const u32 words[4] = {zero_nan_e4m3(vk.x), zero_nan_e4m3(vk.y), zero_nan_e4m3(vk.z),\n                                      zero_nan_e4m3(vk.w)};', 1),
    ],
    "no_qload_dense": [
        ("""                v[k] = __ldg(reinterpret_cast<const uint4*>(
                    q + static_cast<i64>(b * NEXT_N + i) * stride_q_row + h * stride_q_head + 16 * m));""",
         """                const u32 r = static_cast<u32>(idx) * 0x9E3779B1u;
                v[k] = make_uint4(0x38B848C8u | (r & 0x07070707u), 0xC848B838u | ((r >> 3) & 0x07070707u),
                                  0xB83848C8u | ((r >> 6) & 0x07070707u), 0x48C838B8u | ((r >> 9) & 0x07070707u));""", 1),
    ],
}



def source(config: sm90.Config, variant: str) -> str:
    """The product's program source for ``config`` (wrappers inserted) with ``VARIANT_EDITS[variant]`` applied.

    Raises:
        RuntimeError: an edit no longer matches the expected number of times.
        KeyError: unknown ``variant``.
    """
    text = sm90._source_text(config.mma_rows * config.heads)
    for old, new, count in VARIANT_EDITS[variant]:
        if text.count(old) != count:
            raise RuntimeError(f"edit no longer matches the product kernel {count} time(s): {old[:60]!r}")
        text = text.replace(old, new)
    return text


@functools.lru_cache(maxsize=None)
def spec(config: sm90.Config, variant: str) -> nvrtc.KernelSpec:
    """The variant's ``nvrtc.KernelSpec`` (memoised: equal host cost per call for every variant)."""
    return nvrtc.KernelSpec(source(config, variant), f"paged_logits_sm90_{variant}.cu", "fp4_paged_logits_sm90",
                            config.defines(), config.smem_bytes, f"the {variant} variant", "nothing")


def _scorer(variant: str):
    from sglang_fp4_indexer.bench.scorers import OursScorer, PreparedScorer, _case_bytes
    from sglang_fp4_indexer.bench.timing import rotation_sets
    from sglang_fp4_indexer.ops import paged_logits as pl
    from sglang_fp4_indexer.ops.grid import default_num_ctas
    from sglang_fp4_indexer.ops.schedule import plan_paged_schedule

    class VariantScorer(OursScorer):
        def __init__(self):
            super().__init__(None)
            self.name, self.label = f"ab[{variant}]", "experiments.sm90_small_ab"

        def prepare(self, inputs, l2_bytes):
            shape, dev = inputs.shape, inputs.device
            block_kv, num_ctas = pl.default_block_kv(dev, None), default_num_ctas(dev, None)
            schedule = plan_paged_schedule(inputs.context_lens, block_kv, num_ctas)
            case = _case_bytes(shape, self.key_bytes)
            sets = min(len(inputs.caches), rotation_sets(case, l2_bytes))
            outs = [torch.full((shape.rows, inputs.width), float("nan"), device=dev) for _ in range(sets)]
            cfg = sm90.Config.of_call(shape.next_n, shape.heads, torch.float32, False)
            sp = spec(cfg, variant)
            fn_k = nvrtc.load(dev, sp)
            if fn_k is None:
                raise RuntimeError(nvrtc.failure(dev, sp))
            q = inputs.q.view(shape.batch * shape.next_n, shape.heads, 128)
            clean = not shape.width
            self.ran = variant

            def fn(s):
                args = sm90._kernel_args(q, inputs.weights, inputs.caches[s], inputs.block_table, inputs.context_lens,
                                         schedule, outs[s], inputs.block_table.shape[0], outs[s].shape[1], block_kv,
                                         clean)
                nvrtc.launch(fn_k, dev, -(-(schedule.shape[0] - 1) // sm90.WGS), sm90.THREADS, sp.smem, args)
                return outs[s]

            return PreparedScorer(fn, sets, sm90.rel_bound(), clean, case, floor=True)

    return VariantScorer()


def main(argv=None) -> int:
    from sglang_fp4_indexer.bench.report import render_summary, write_json
    from sglang_fp4_indexer.bench.runner import BenchConfig, run_benchmark
    from sglang_fp4_indexer.bench.scorers import OursScorer
    from sglang_fp4_indexer.bench.shapes import parse_shapes

    p = argparse.ArgumentParser(prog="python -m experiments.sm90_small_ab")
    p.add_argument("--shapes", default="64x1x4Kx1@160K,64x1x128Kx1@160K,64x64x4Kx1@160K,64x8x128Kx1@160K")
    p.add_argument("--variants", default=",".join(VARIANT_EDITS))
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    unknown = [v for v in a.variants.split(",") if v not in VARIANT_EDITS]
    if unknown:
        p.error(f"--variants: unknown {unknown}, expected names from {sorted(VARIANT_EDITS)}")
    scorers = [OursScorer()] + [_scorer(v) for v in a.variants.split(",")]
    cfg = BenchConfig(device=torch.device("cuda"), shapes=parse_shapes(a.shapes), scorers=scorers, store_tokens=None,
                      planner_batch=None, seed=0, command="python -m experiments.sm90_small_ab " + " ".join(argv or sys.argv[1:]))
    report = run_benchmark(cfg, log=lambda line: print(line, flush=True),
                           on_progress=(lambda rep: write_json(rep, a.json)) if a.json else None)
    print(render_summary(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
