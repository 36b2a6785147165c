"""A/B timing of the Hopper scorer built from variants of its CUDA source (a measurement tool, not product code).

Each variant is the full-variant kernel source (``cuda/paged_logits_sm90_variants.cu``, built at the
product's settings) with one function body replaced (``VARIANTS``); every
variant is timed with CUDA graphs on the same inputs and its logits compared with the
default build's. Usage on a GPU machine, from the repository root::

    PYTHONPATH=. python3 -m experiments.sm90_source_ab [--shapes 8x131072x64x2,...] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from sglang_fp4_indexer.ops.schedule import plan_paged_schedule
from sglang_fp4_indexer.ops.grid import SM90_CTAS_PER_SM

from . import sm90_variants as variants
from .common import build, copy_bandwidth, graph_time

_NAN_BODY = """    const u32 nan = ((w & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u;
    return w & ~((nan >> 7) * 0xFFu);"""
#: name -> (text in the source, its replacement); "default" is the source as it is.
VARIANTS = {
    "default": None,
    "nan-kept": (_NAN_BODY, "    return w;"),
    "nan-prmt": (_NAN_BODY, "    const u32 nan = ((w & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u;\n"
                            "    return w & ~prmt(nan, 0u, 0xBA98u);"),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8x131072x64x1,8x131072x64x2,128x8192x64x2,8x131072x64x4,8x131072x32x2")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "sm90_source_ab.json"))
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    text = variants.SOURCE.read_text()
    sources = {}
    for name, sub in VARIANTS.items():
        if sub is None:
            sources[name] = text
            continue
        if sub[0] not in text:
            raise SystemExit(f"variant {name}: its source text is not in {variants.SOURCE}")
        sources[name] = text.replace(sub[0], sub[1])
    results = []
    for shape in args.shapes.split(","):
        batch, ctx, heads, next_n = map(int, shape.split("x"))
        caches, bt, lens, q, w, outs = build(batch, ctx, heads, next_n, 4)
        width = outs[0].shape[1]
        sched = plan_paged_schedule(lens, 64, SM90_CTAS_PER_SM * sms)
        ref = None
        for name, src in sources.items():
            def fn(i, src=src):
                j = i % len(caches)
                variants.launch(q, w, caches[j], bt, lens, sched, outs[j], batch=batch, next_n=next_n, heads=heads,
                                width=width, block_kv=64, min_ctas=1, text=src)

            outs[0].fill_(float("nan"))
            fn(0)
            torch.cuda.synchronize()
            got = outs[0].clone()
            if ref is None:
                ref = got
            same = bool(torch.equal(torch.nan_to_num(got), torch.nan_to_num(ref)))
            t = graph_time(fn)
            res = dict(shape=shape, variant=name, us=round(t * 1e6, 2), same_as_default=same)
            results.append(res)
            print(json.dumps(res), flush=True)
        caches.clear()
        outs.clear()
        torch.cuda.empty_cache()
    Path(args.json).write_text(json.dumps(dict(copy_bw=bw, results=results), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
