"""Sweep of the Hopper scorer's build and launch knobs (not product code: a measurement tool for docs/perf-notes.md).

Times the full-variant kernel (``experiments/sm90_variants.py``: ring depth ``stages``, register budget
``min_ctas``, CTAs per SM of the persistent grid, schedule ``block_kv``) with
CUDA graphs on a few shapes, against the HBM floor measured in the same run
and the Triton ``folded`` scorer, and checks each variant's output against
the folded scorer's. Usage on the device::

    PYTHONPATH=. python3 -m experiments.sm90_probe [--shapes 8x131072x64x1,...] [--stages 2,4] [--min-ctas 3] [--split-sign 0,1] [--headsum 0,1]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch

from sglang_fp4_indexer.ops.paged_logits import paged_logits
from sglang_fp4_indexer.ops.schedule import plan_paged_schedule

from . import sm90_variants as variants
from .common import build, copy_bandwidth, graph_time

TL_JOBS, TL_STAMPS = variants.TIMELINE_JOBS, variants.TIMELINE_STAMPS  # the kernel's PROBE 64 record layout
PHASES = ("between", "decode_issue", "wgmma_wait", "epilogue", "acquire")


def timeline_summary(buf, entries, wgs):
    """PROBE 64: the clock stamps lane 0 of every math warp wrote over the logits buffer -> per-phase cycles
    (mean, median over jobs 1..; job 0's first phase includes the wait for the first slot) and, per SM
    sub-partition (warp % 4 of every math warpgroup shares one), the share of cycles in which 0..4 of its
    math warps are in an issuing phase (decode/issue, epilogue, between) rather than waiting (wgmma, slot).
    A buffer too small for every entry's records (the kernel then skips them) gives ``{"error": ...}``."""
    n = entries * 4 * TL_JOBS * TL_STAMPS
    if buf.numel() < n or entries % wgs:
        return {"error": f"logits buffer of {buf.numel()} words holds no full timeline of {entries} entries "
                         f"({n} words) in CTAs of {wgs} warpgroups"}
    rec = buf.reshape(-1)[:n].cpu().to(torch.int64).reshape(entries // wgs, wgs, 4, TL_JOBS, TL_STAMPS)
    valid = rec[..., 7] >= 0
    t = rec[..., :6] & 0xFFFFFFFF
    ref = t[:, 0, 0, 0, 0].reshape(-1, 1, 1, 1, 1)
    t = (t - ref) % (1 << 32)
    t = torch.where(t >= (1 << 31), t - (1 << 32), t)
    d = t[..., 1:] - t[..., :-1]  # between, decode_issue, wgmma_wait, epilogue, acquire
    out = {"jobs": int(valid.sum())}
    steady = valid.clone()
    steady[..., 0] = False
    for k, name in enumerate(PHASES):
        x = d[..., k][steady].double()
        if x.numel():
            out[name] = dict(mean=round(float(x.mean()), 1), median=round(float(x.median()), 1))
    tot = (t[..., 5] - t[..., 0])[steady].double()
    if tot.numel():
        out["job_cycles"] = dict(mean=round(float(tot.mean()), 1), median=round(float(tot.median()), 1))
    # Issuing-warp occupancy of each sub-partition, on a 16-cycle grid over the window all its warps are recorded.
    hist = torch.zeros(5, dtype=torch.float64)
    for cta in range(rec.shape[0]):
        for w in range(4):
            v = valid[cta, :, w]
            if not bool(v.any(dim=1).all()):
                continue
            lo = max(int(t[cta, g, w, 0, 0]) for g in range(wgs))
            hi = min(int(t[cta, g, w][v[g]][:, 5].max()) for g in range(wgs))
            if hi - lo < 1024:
                continue
            grid = torch.arange(lo, hi, 16, dtype=torch.int64)
            active = torch.zeros_like(grid)
            for g in range(wgs):
                tt = t[cta, g, w][v[g]]
                for a, b in ((0, 2), (3, 4)):  # [between + decode/issue), [epilogue)
                    starts, ends = tt[:, a], tt[:, b]
                    inside = (grid[:, None] >= starts[None, :]) & (grid[:, None] < ends[None, :])
                    active += inside.any(dim=1).to(torch.int64)
            hist += torch.bincount(active.clamp(max=4), minlength=5).double()
    if hist.sum() > 0:
        out["issuing_warps_share"] = [round(float(x), 3) for x in (hist / hist.sum())]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8x131072x64x1,32x131072x64x1,32x32768x64x1,1x4096x64x1,8x131072x64x4,8x131072x32x1")
    ap.add_argument("--stages", default="2,4,6")
    ap.add_argument("--min-ctas", default="3")
    ap.add_argument("--ctas-per-sm", default="2,3,4")
    ap.add_argument("--block-kv", default="64,256")
    ap.add_argument("--probe", default="0", help="comma list of PROBE bit sets: 0 scorer, 1 loads only, 2 compute only, 4 no wgmma, 8 no decode, 16 one wgmma per page, 32 no head sum, 64 timeline of clock stamps (phases per job)")
    ap.add_argument("--split-sign", default="0", help="comma list of the SPLIT_SIGN build option (0-3)")
    ap.add_argument("--pipeline", default="1", help="comma list of the PIPELINE build option (0, 1)")
    ap.add_argument("--wgs", default="4", help="comma list of the WGS build option (math warpgroups per CTA, 1-4)")
    ap.add_argument("--mma-rows", default="1", help="comma list of the MMA_ROWS build option (next_n rows per wgmma; "
                    "values that do not divide a shape's next_n are skipped)")
    ap.add_argument("--headsum", default="0", help="comma list of the HEADSUM build option (0 fp32, 1 tf32 wgmma, 2 bf16 wgmma)")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "sm90_probe.json"))
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    for shape in args.shapes.split(","):
        batch, ctx, heads, next_n = map(int, shape.split("x"))
        floor_bytes = batch * ctx * 68 + batch * next_n * ctx * 4
        copies = max(1, min(8, int(4 * 60e6 // floor_bytes) + 1))
        caches, bt, lens, q, w, outs = build(batch, ctx, heads, next_n, copies)
        width = outs[0].shape[1]
        floor = floor_bytes / bw
        # Reference: the Triton folded scorer (same numerics), timed with its defaults.
        sched = plan_paged_schedule(lens, 256, 2 * sms)

        def folded(i, sched=sched):
            j = i % copies
            paged_logits(q, w, caches[j], bt, lens, schedule=sched, block_kv=256, out=outs[j], check=False, impl="folded")

        t = graph_time(folded)
        folded(0)
        torch.cuda.synchronize()
        ref = outs[0].clone()
        fin = torch.isfinite(ref)
        res = dict(shape=shape, variant="folded", us=t * 1e6, floor_us=floor * 1e6, pct_floor=100 * floor / t)
        results.append(res)
        print(json.dumps(res), flush=True)
        ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
        for wgs, stages, probe, ss, hs, pl, min_ctas, cps, bkv, mr in itertools.product(
                ints(args.wgs), ints(args.stages), ints(args.probe), ints(args.split_sign), ints(args.headsum), ints(args.pipeline),
                ints(args.min_ctas), [float(x) for x in args.ctas_per_sm.split(",")], ints(args.block_kv),
                ints(args.mma_rows)):
            if next_n % mr or mr * heads > 256:
                continue
            ctas = int(cps * sms)
            sched = plan_paged_schedule(lens, bkv, ctas)
            variant = (f"wgmma st{stages} mc{min_ctas} ctas{ctas} bkv{bkv}" + (f" PROBE{probe}" if probe else "")
                       + (f" SS{ss}" if ss else "") + (f" HS{hs}" if hs else "") + ("" if pl == 1 else f" PL{pl}")
                       + (f" WGS{wgs}" if wgs > 1 else "") + (f" MR{mr}" if mr > 1 else ""))
            try:
                def fn(i, sched=sched, bkv=bkv, stages=stages, min_ctas=min_ctas, probe=probe, ss=ss, hs=hs, pl=pl, wgs=wgs,
                       mr=mr):
                    j = i % copies
                    variants.launch(q, w, caches[j], bt, lens, sched, outs[j], batch=batch, next_n=next_n, heads=heads,
                                width=width, block_kv=bkv, stages=stages, min_ctas=min_ctas, probe=probe, split_sign=ss,
                                headsum=hs, pipeline=pl, wgs=wgs, mma_rows=mr)

                outs[0].fill_(float("nan"))
                fn(0)
                torch.cuda.synchronize()
                got = outs[0]
                timeline = None
                if probe & 64:
                    outs[0].view(torch.int32).fill_(-1)
                    fn(0)
                    torch.cuda.synchronize()
                    timeline = timeline_summary(outs[0].view(torch.int32), ctas, wgs)
                if probe:
                    err = float("nan")  # measurement build: output not meaningful
                elif not torch.equal(fin, torch.isfinite(got)):
                    err = float("inf")
                else:
                    err = ((got[fin] - ref[fin]).abs() / (ref[fin].abs() + 1e-3)).max().item()
                t = graph_time(fn)
                res = dict(shape=shape, variant=variant, us=t * 1e6, floor_us=floor * 1e6,
                           pct_floor=100 * floor / t, max_rel_vs_folded=err)
                if timeline:
                    res["timeline"] = timeline
            except Exception as exc:  # a variant that does not build is reported, not fatal
                res = dict(shape=shape, variant=variant, error=repr(exc)[:400])
            results.append(res)
            print(json.dumps(res), flush=True)
        caches.clear()
        outs.clear()
        torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump(dict(copy_bw=bw, results=results), f, indent=1)
    print("\nbest per shape (folded = the Triton scorer, for comparison):")
    for shape in args.shapes.split(","):
        ok = [r for r in results if r["shape"] == shape and "us" in r]
        fold = [r for r in ok if r["variant"] == "folded"]
        wg = [r for r in ok if r["variant"] != "folded" and r.get("max_rel_vs_folded", 1) < 1e-2]
        bad = [r for r in ok if r["variant"] != "folded" and not r.get("max_rel_vs_folded", 1) < 1e-2]
        line = f"{shape:>16} floor {ok[0]['floor_us']:7.1f} us" if ok else shape
        if fold:
            line += f" | folded {fold[0]['us']:7.1f}"
        if wg:
            r = min(wg, key=lambda r: r["us"])
            line += f" | {r['variant']}: {r['us']:7.1f} us = {r['pct_floor']:5.1f}% of floor"
        if bad:
            line += f" | {len(bad)} wgmma variants WRONG (e.g. err {bad[0].get('max_rel_vs_folded')})"
        print(line)


if __name__ == "__main__":
    sys.exit(main())
