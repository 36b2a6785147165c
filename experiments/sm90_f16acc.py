"""The Hopper scorer with f16 accumulators: the product kernel's source, edited, built, checked and timed.

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


def source(n: int) -> str:
    """The edited kernel text with its wrappers for N = ``n`` (rows per wgmma x heads).

    Raises:
        RuntimeError: an edit no longer matches the product kernel the expected number of times.
    """
    text = sm90.SOURCE.read_text()
    for old, new, count in EDITS:
        if text.count(old) != count:
            raise RuntimeError(f"edit no longer matches the product kernel {count} time(s): {old[:60]!r}")
        text = text.replace(old, new)
    head, tail = text.split(sm90._MARKER, 1)
    return head + _wrappers(n) + sm90._MARKER + tail


def spec(config: sm90.Config) -> nvrtc.KernelSpec:
    """The ``nvrtc.KernelSpec`` of the f16 build of ``config`` (same defines and layout as the product's)."""
    return nvrtc.KernelSpec(source(config.mma_rows * config.heads), "paged_logits_sm90_f16acc.cu",
                            "fp4_paged_logits_sm90", config.defines(), config.smem_bytes, "the f16-accumulator kernel",
                            "nothing")


def launch(config, q, weights, cache, block_table, context_lens, schedule, out, *, block_kv: int,
           clean_logits: bool = True) -> None:
    """Launch it as ``sm90.launch`` launches the product kernel (same arguments, grid and block).

    Raises:
        RuntimeError: the build, the load or the launch fails.
    """
    sp = spec(config)
    fn = nvrtc.load(q.device, sp)
    if fn is None:
        raise RuntimeError(nvrtc.failure(q.device, sp))
    args = sm90._kernel_args(q, weights, cache, block_table, context_lens, schedule, out, block_table.shape[0],
                             out.shape[1], block_kv, clean_logits)
    nvrtc.launch(fn, q.device, -(-(schedule.shape[0] - 1) // sm90.WGS), sm90.THREADS, sp.smem, args)


def _scorer(mma_rows: int | None = None):
    from sglang_fp4_indexer.bench.scorers import OursScorer, PreparedScorer, _case_bytes
    from sglang_fp4_indexer.bench.timing import rotation_sets
    from sglang_fp4_indexer.ops import paged_logits as pl
    from sglang_fp4_indexer.ops.grid import default_num_ctas
    from sglang_fp4_indexer.ops.schedule import plan_paged_schedule

    class F16AccScorer(OursScorer):
        """This module's kernel on the product's CTA schedule, with the product's block_kv and CTA count."""

        def __init__(self):
            super().__init__(None)
            self.name = "f16acc" if mma_rows is None else f"f16acc[rows {mma_rows}]"
            self.label = "experiments.sm90_f16acc"

        def prepare(self, inputs, l2_bytes):
            shape, dev = inputs.shape, inputs.device
            block_kv, num_ctas = pl.default_block_kv(dev, None), default_num_ctas(dev, None)
            schedule = plan_paged_schedule(inputs.context_lens, block_kv, num_ctas)
            case = _case_bytes(shape, self.key_bytes)
            sets = min(len(inputs.caches), rotation_sets(case, l2_bytes))
            outs = [torch.full((shape.rows, inputs.width), float("nan"), device=dev) for _ in range(sets)]
            cfg = sm90.Config.of_call(shape.next_n, shape.heads, torch.float32, False)
            if mma_rows is not None and shape.next_n % mma_rows == 0:  # else the product's rows per wgmma
                cfg = sm90.Config(cfg.next_n, cfg.heads, cfg.out_kind, cfg.lens_2d, mma_rows)
            self.ran = f"f16acc mma_rows {cfg.mma_rows}"
            q = inputs.q.view(shape.batch * shape.next_n, shape.heads, 128)
            clean = not shape.width

            def fn(s):
                launch(cfg, q, inputs.weights, inputs.caches[s], inputs.block_table, inputs.context_lens, schedule,
                       outs[s], block_kv=block_kv, clean_logits=clean)
                return outs[s]

            return PreparedScorer(fn, sets, REL, clean, case)

    return F16AccScorer()


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
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    scorers = [OursScorer(), _scorer(), DeepGemmFP8Scorer(), DeepGemmFP8Scorer(native=True)]
    if a.rows2:
        scorers.insert(2, _scorer(2))
    cfg = BenchConfig(device=torch.device("cuda"), shapes=parse_shapes(a.shapes), scorers=scorers, store_tokens=None,
                      planner_batch=None, command="python -m experiments.sm90_f16acc " + " ".join(argv or sys.argv[1:]))

    def save(rep):  # after every shape, so that a run cut short still leaves its numbers
        if a.json:
            write_json(rep, a.json)

    report = run_benchmark(cfg, log=lambda line: print(line, flush=True), on_progress=save)
    print(render_summary(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
