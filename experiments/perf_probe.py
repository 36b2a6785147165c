"""Scorer variant sweep on the GPU (not product code: a measurement tool for docs/perf-notes.md).

Times ``ops.paged_logits.paged_logits`` variants (impl x block_kv x num_warps x
num_stages) with CUDA graphs on a few shapes, against the HBM floor measured in
the same run, and checks each variant's output against the first one. The
``"group"`` formulation and the portable (non-PTX) folded decode it once also
swept left the product; they are at git tag ``sm90-experiments-2026-12``.
Usage on the device::

    PYTHONPATH=. python3 -m experiments.perf_probe [--shapes 8x131072x64x1,...] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch

from sglang_fp4_indexer.ops.paged_logits import TritonTuning, paged_scorer
from sglang_fp4_indexer.ops.schedule import plan_paged_schedule

from .common import build, copy_bandwidth, graph_time


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
        space = [("scaled", 256, 4, 1, None)] + [
            ("folded", b, w, st, None) for (b, w) in ((128, 4), (256, 4), (128, 8), (256, 8), (512, 8)) for st in (1, 2)]
    else:
        space = list(itertools.product(["scaled", "folded"], [64, 128, 256], [4, 8], [1, 2, 3], [None]))
    impls = sorted({v[0] for v in space})
    results = []
    for shape in args.shapes.split(","):
        batch, ctx, heads, next_n = map(int, shape.split("x"))
        floor_bytes = batch * ctx * 68 + batch * next_n * ctx * 4
        copies = max(1, min(8, int(4 * l2 // floor_bytes) + 1))
        caches, bt, lens, q, w, outs = build(batch, ctx, heads, next_n, copies)
        floor = floor_bytes / bw
        ref = None
        for impl, bkv, nw, ns, mr in space:
            for ctas in [int(c * sms) for c in args.ctas_per_sm.split(',') for c in [float(c)]]:
                sched = plan_paged_schedule(lens, bkv, ctas)
                try:
                    # The Triton knobs live on the launcher of the configuration (resolved once, as serving does).
                    scorer = paged_scorer(q.device, heads, next_n, lens_2d=lens.dim() == 2, block_kv=bkv,
                                          clean_logits=True, impl=impl,
                                          tuning=TritonTuning(num_warps=nw, num_stages=ns, maxnreg=mr))

                    def fn(i, scorer=scorer, sched=sched):
                        j = i % copies
                        scorer(q, w, caches[j], bt, lens, sched, outs[j])
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
                    res = dict(shape=shape, impl=impl, block_kv=bkv, warps=nw, stages=ns, maxnreg=mr, ctas=ctas, us=t * 1e6,
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
