"""Does a register-sourced FP8 wgmma slow the other warps' ALU / FMA work on the same SM? (measurement tool
for docs/perf-notes.md, not product code; device machine only)

One CTA of four warpgroups per SM. Warpgroup 0 runs back-to-back m64n64k32 e4m3 wgmma groups (four k steps,
committed and waited, as the scorer issues them per page) with A from registers (RS) or from shared memory (SS),
or nothing, accumulating in f32 (32 registers per thread, as the scorer does) or in f16 (16 registers of packed
f16x2: ``wgmma.mma_async ... .f16.e4m3.e4m3``, the hypothesis that the accumulators' register-file traffic is
what the other warps wait on); warpgroups 1-3 run a fixed amount of independent integer (PRMT/LOP3) or fp32 (FFMA) work. Each warp
times itself with clock64. If the tensor-core work and the other warps' issue did not interfere, the worker
warps' cycles would not depend on what warpgroup 0 runs.

    PYTHONPATH=. python3 -m experiments.sm90_interference [--iters 4000] [--work-iters 400] [--acc f32,f16]
        [--json $OUT/sm90_interference.json]
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from sglang_fp4_indexer.ops import nvrtc

from . import sm90_variants as variants

# The scorer's own helpers (prmt, q_desc, the RS wgmma_f8 wrapper for N = 64), as the product builds them.
_SCORER_HELPERS = variants.source(1, 64, 0, False, **variants.PRODUCTION).split('extern "C" __global__', 1)[0]

SOURCE = r"""
#define ACC32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define ACC_OUT(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

#define ACC16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define ACC16_OUT(d) "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), \
    "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15])

// TENSOR: 0 none, 1 RS, 2 SS. WORK: 0 none, 1 integer (PRMT + LOP3), 2 fp32 FFMA. GROUP: wgmma per
// commit group and wait (1 or 4). F16: accumulate in packed f16x2 (16 registers) instead of f32 (32).
// The accumulators chain across all iterations (only the very first
// wgmma starts from zero), so no wgmma is dead code.
extern "C" __global__ void __launch_bounds__(512, 1) interference(long long* out, int iters, int work_iters, u32 seed) {
    __shared__ __align__(1024) unsigned char tiles[16384];  // B (8 KB: four k32 steps) then A (8 KB)
    // Random finite e4m3 bytes (the tensor cores are faster on zeros): a hash masked by MASK (0x77777777:
    // positive, exponents <= 14; 0xB7B7B7B7: either sign, |x| < 1, so that f16 sums stay finite).
    for (int i = threadIdx.x; i < 4096; i += 512) reinterpret_cast<u32*>(tiles)[i] = (i * 2654435761u + seed) & MASK;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    // Warp-uniform role (broadcast from lane 0, as the scorer does), workers first and returning, so the
    // wgmma code is not on a divergent path.
    const int warp = __shfl_sync(0xffffffffu, threadIdx.x >> 5, 0), lane = threadIdx.x & 31;
    long long t0 = clock64();
    u32 sink = 0;
    if (warp >= 4) {
#if WORK == 1
        u32 r[8];
        for (int i = 0; i < 8; ++i) r[i] = seed * (threadIdx.x + i + 1);
        for (int it = 0; it < work_iters; ++it) {
#pragma unroll
            for (int k = 0; k < 8; ++k) {
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    r[i] = prmt(r[i], r[(i + 1) & 7], 0x3210u + 0x1111u * (k & 1));
                    r[i] = (r[i] & 0x77777777u) ^ (r[(i + 3) & 7] | seed);
                }
            }
        }
        for (int i = 0; i < 8; ++i) sink ^= r[i];
#elif WORK == 2
        float f[8];
        for (int i = 0; i < 8; ++i) f[i] = __uint_as_float(seed) * (threadIdx.x + i);
        const float m = 1.0001f + __uint_as_float(seed), c = 0.5f * __uint_as_float(seed);
        for (int it = 0; it < work_iters; ++it) {
#pragma unroll
            for (int k = 0; k < 16; ++k) {
#pragma unroll
                for (int i = 0; i < 8; ++i) f[i] = fmaf(f[i], m, c);
            }
        }
        for (int i = 0; i < 8; ++i) sink ^= __float_as_uint(f[i]);
#endif
        long long t1 = clock64();
        if (lane == 0) out[blockIdx.x * 16 + warp] = t1 - t0;
        if (sink == 0x9e3779b9u && seed == 12345u) out[0] = -1;  // keeps the work live
        return;
    }
#if TENSOR
#if F16
    u32 acc[16];
    for (int j = 0; j < 16; ++j) acc[j] = 0u;
#else
    float acc[32];
#endif
    u32 a[4];
    for (int j = 0; j < 4; ++j) a[j] = ((threadIdx.x * 4 + j) * 2246822519u + seed) & MASK;
    const u32 b0 = static_cast<u32>(__cvta_generic_to_shared(tiles));
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            if (s % GROUP == 0) asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
            const u64 db = q_desc(b0 + 32 * s);
#if TENSOR == 1 && !F16
            wgmma_f8(acc, a, db, (it | s) != 0);
#elif TENSOR == 1
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                         "wgmma.mma_async.sync.aligned.m64n64k32.f16.e4m3.e4m3 " ACC16 ", {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
                         : ACC16_OUT(acc) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(it | s));
#elif !F16
            const u64 da = q_desc(b0 + 8192 + 32 * s);
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                         "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " ACC32 ", %32, %33, p, 1, 1;\n}\n"
                         : ACC_OUT(acc) : "l"(da), "l"(db), "r"(it | s));
#else
            const u64 da = q_desc(b0 + 8192 + 32 * s);
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                         "wgmma.mma_async.sync.aligned.m64n64k32.f16.e4m3.e4m3 " ACC16 ", %16, %17, p, 1, 1;\n}\n"
                         : ACC16_OUT(acc) : "l"(da), "l"(db), "r"(it | s));
#endif
            if (s % GROUP == GROUP - 1) {
                asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
                asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
#if F16
                for (int j = 0; j < 16; ++j) asm volatile("" : "+r"(acc[j])::"memory");
#else
                for (int j = 0; j < 32; ++j) asm volatile("" : "+f"(acc[j])::"memory");
#endif
            }
        }
    }
#if F16
    for (int j = 0; j < 16; ++j) sink ^= acc[j];
#else
    for (int j = 0; j < 32; ++j) sink ^= __float_as_uint(acc[j]);
#endif
#endif
    long long t1 = clock64();
    if (lane == 0) out[blockIdx.x * 16 + warp] = t1 - t0;
    if (sink == 0x9e3779b9u && seed == 12345u) out[0] = -1;  // keeps the work live
}
"""


def build(tensor: int, work: int, group: int = 4, f16: bool = False, mask: int = 0x77777777) -> bytes:
    """The probe kernel's cubin for one configuration (``f16``: f16 accumulators instead of f32; ``mask``: the
    bits kept of the random e4m3 operand bytes).

    Raises:
        RuntimeError: the compile fails, or ptxas serialized the wgmma (its "serialized" performance
            warnings, C7510-C7520): the timing would not be that of the scorer's pipelined wgmma.
    """
    src = (f"#define TENSOR {tensor}\n#define WORK {work}\n#define GROUP {group}\n#define F16 {int(f16)}\n#define MASK {mask:#x}u\n"
           + _SCORER_HELPERS + SOURCE)
    cubin, log = nvrtc.compile_cubin(src, f"interference_{tensor}_{work}_{group}_{int(f16)}_{mask:x}.cu", "sm_90a", verbose=True)
    if "serialized" in log:
        raise RuntimeError(f"ptxas serialized the probe's wgmma (tensor {tensor}, work {work}, group {group}, "
                           f"f16 {f16}):\n{log}")
    return cubin


def run(tensor: int, work: int, iters: int, work_iters: int, sms: int, group: int = 4, f16: bool = False,
        mask: int = 0x77777777) -> dict:
    cubin = build(tensor, work, group, f16, mask)
    device = torch.device("cuda")
    fn = nvrtc.get_function(device, cubin, "interference", 0)
    import ctypes

    out = torch.zeros(sms * 16, dtype=torch.int64, device=device)
    args = [ctypes.c_void_p(out.data_ptr()), ctypes.c_int(iters), ctypes.c_int(work_iters), ctypes.c_uint(1)]
    for _ in range(2):  # warm-up, then the measured launch
        out.zero_()
        nvrtc.launch(fn, device, sms, 512, 0, args)
        torch.cuda.synchronize()
    cyc = out.view(sms, 16).double()
    res = dict(tensor=("none", "RS", "SS")[tensor], work=("none", "int PRMT/LOP3", "fp32 FFMA")[work], group=group,
               acc=("f16" if f16 else "f32") if tensor else "-", mask=f"{mask:#010x}")
    if tensor:
        res["tensor_warp_cycles"] = round(float(cyc[:, :4].mean()), 1)
        res["cycles_per_wgmma"] = round(float(cyc[:, :4].mean()) / (4 * iters), 2)
    if work:
        res["work_warp_cycles"] = round(float(cyc[:, 4:].mean()), 1)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=4000, help="wgmma groups (four k32 steps each) of warpgroup 0")
    ap.add_argument("--work-iters", type=int, default=400, help="loop trips of the worker warps")
    ap.add_argument("--acc", default="f32,f16", help="accumulator types to run, of f32 and f16 (comma-separated)")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "sm90_interference.json"))
    args = ap.parse_args()
    if not set(a.strip() for a in args.acc.split(",")) <= {"f32", "f16"}:
        ap.error(f"--acc: expected f32 and/or f16, comma-separated; got {args.acc!r}")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []

    def one(tensor, work, group=4, f16=False, mask=0x77777777):
        r = run(tensor, work, args.iters, args.work_iters, sms, group, f16, mask)
        results.append(r)
        print(json.dumps(r), flush=True)

    accs = [a.strip() for a in args.acc.split(",")]
    for work in (1, 2):
        one(0, work)
    # f32 on the data of the earlier measurements, then f32 and f16 on signed data below 1 (f16 sums of the
    # positive data would reach inf).
    runs = [(False, 0x77777777)] if "f32" in accs else []
    runs += [(acc == "f16", 0xB7B7B7B7) for acc in accs]
    for f16, mask in runs:
        for work in (1, 2):
            for tensor in (1, 2):
                one(tensor, work, 4, f16, mask)
        for tensor in (1, 2):
            one(tensor, 0, 4, f16, mask)
        # One commit group (and wait) per wgmma instead of per four.
        for work in (0, 1, 2):
            one(1, work, 1, f16, mask)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
