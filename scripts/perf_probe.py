"""Scorer variant sweep on the GPU (not product code: a measurement tool for docs/perf-notes.md).

Times ``ops.paged_logits.paged_logits`` variants (impl x block_kv x num_warps x
num_stages) with CUDA graphs on a few shapes, against the HBM floor measured in
the same run, and checks each variant's output against the first (group, exact)
one on a few rows. Usage on the device::

    PYTHONPATH=. python3 scripts/perf_probe.py [--shapes 8x131072x64x1,...] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys

import torch

from sglang_fp4_indexer.format import quantize_index_k
from sglang_fp4_indexer.ops.paged_logits import paged_logits
from sglang_fp4_indexer.ops.schedule import plan_paged_schedule
from sglang_fp4_indexer.pool import PAGE_SIZE, allocate_index_k_cache, payload_plane, scale_plane


def copy_bandwidth(nbytes=2 << 30):
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    return 2 * nbytes / statistics.median(times)


def graph_time(fn, calls=20, replays=7):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn(0)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        st.record()
        g.replay()
        en.record()
        torch.cuda.synchronize()
        times.append(st.elapsed_time(en) * 1e-3 / calls)
    return statistics.median(times)


def build(batch, ctx, heads, next_n, copies):
    pages_per_req = (ctx + PAGE_SIZE - 1) // PAGE_SIZE
    num_pages = batch * pages_per_req
    caches = []
    for c in range(copies):
        cache = allocate_index_k_cache(num_pages, device="cuda")
        # Random keys for the first copy; the rest are byte copies (same values, distinct memory).
        if c == 0:
            chunk = 1 << 16
            for t0 in range(0, num_pages * PAGE_SIZE, chunk):
                k = torch.randn(min(chunk, num_pages * PAGE_SIZE - t0), 128, device="cuda")
                p, s = quantize_index_k(k)
                n = p.shape[0] // PAGE_SIZE
                pg = t0 // PAGE_SIZE
                payload_plane(cache)[pg : pg + n] = p.view(n, PAGE_SIZE, 64)
                scale_plane(cache)[pg : pg + n] = s.view(n, PAGE_SIZE, 4)
        else:
            cache.copy_(caches[0])
        caches.append(cache)
    g = torch.Generator(device="cuda").manual_seed(0)
    bt = torch.randperm(num_pages, device="cuda", generator=g).view(batch, pages_per_req).to(torch.int32)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    rows = batch * next_n
    q = torch.randn(rows, heads, 128, device="cuda").to(torch.float8_e4m3fn)
    w = torch.rand(rows, heads, device="cuda") * heads**-0.5
    outs = [torch.empty(rows, pages_per_req * PAGE_SIZE, device="cuda") for _ in range(copies)]
    return caches, bt, lens, q, w, outs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8x131072x64x1,32x32768x64x1,1x4096x64x1,8x131072x64x4")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ctas-per-sm", default="1,2")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "perf_probe.json"))
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    l2 = 60e6
    if args.quick:
        space = [("scaled", 256, 4, 1, None, True)] + [
            ("folded", b, w, st, None, ptx) for (b, w) in ((128, 4), (256, 4), (128, 8), (256, 8), (512, 8))
            for st in (1, 2) for ptx in (True, False)]
    else:
        space = list(itertools.product(["group", "scaled", "folded"], [64, 128, 256], [4, 8], [1, 2, 3], [None], [True]))
    impls = sorted({v[0] for v in space})
    results = []
    for shape in args.shapes.split(","):
        batch, ctx, heads, next_n = map(int, shape.split("x"))
        floor_bytes = batch * ctx * 68 + batch * next_n * ctx * 4
        copies = max(1, min(8, int(4 * l2 // floor_bytes) + 1))
        caches, bt, lens, q, w, outs = build(batch, ctx, heads, next_n, copies)
        floor = floor_bytes / bw
        ref = None
        for impl, bkv, nw, ns, mr, ptx in space:
            for ctas in [int(c * sms) for c in args.ctas_per_sm.split(',') for c in [float(c)]]:
                sched = plan_paged_schedule(lens, bkv, ctas)
                try:
                    def fn(i, impl=impl, bkv=bkv, nw=nw, ns=ns, sched=sched, mr=mr, ptx=ptx):
                        j = i % copies
                        paged_logits(q, w, caches[j], bt, lens, schedule=sched, block_kv=bkv, out=outs[j],
                                     check=False, impl=impl, num_warps=nw, num_stages=ns, maxnreg=mr, use_ptx=ptx)
                    t = graph_time(fn)
                    out = outs[0].clone()
                    fn(0)
                    torch.cuda.synchronize()
                    if ref is None:  # the reference variant: the first in the space
                        ref = outs[0].clone()
                    fin = torch.isfinite(ref)
                    err = ((outs[0][fin] - ref[fin]).abs() / (ref[fin].abs() + 1e-3)).max().item()
                    if not torch.equal(fin, torch.isfinite(outs[0])):
                        err = float("inf")
                    res = dict(shape=shape, impl=impl, block_kv=bkv, warps=nw, stages=ns, maxnreg=mr, ptx=ptx, ctas=ctas, us=t * 1e6,
                               floor_us=floor * 1e6, pct_floor=100 * floor / t, max_rel_vs_first=err)
                except Exception as exc:  # a variant that does not compile is reported, not fatal
                    res = dict(shape=shape, impl=impl, block_kv=bkv, warps=nw, stages=ns, maxnreg=mr, ctas=ctas, error=repr(exc)[:300])
                results.append(res)
                print(json.dumps(res), flush=True)
        del caches, outs
        torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump(dict(copy_bw=bw, results=results), f, indent=1)
    print("\nbest per shape:")
    print(f"{'shape':>18} {'impl':>6} {'bkv':>4} {'w':>2} {'st':>2} {'reg':>4} {'ctas':>4} {'us':>9} {'floor':>8} {'%floor':>7}")
    for shape in args.shapes.split(","):
        ok = [r for r in results if r["shape"] == shape and "us" in r]
        for impl in impls:
            rs = [r for r in ok if r["impl"] == impl]
            if rs:
                r = min(rs, key=lambda r: r["us"])
                print(f"{shape:>18} {impl:>6} {r['block_kv']:>4} {r['warps']:>2} {r['stages']:>2} {str(r.get('maxnreg')):>4} {r['ctas']:>4} "
                      f"{r['us']:9.1f} {r['floor_us']:8.1f} {r['pct_floor']:6.1f}%")


if __name__ == "__main__":
    sys.exit(main())
