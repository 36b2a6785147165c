"""Compile the paged scorer for sm_90a without a GPU (Triton's bundled ptxas) and report registers/spills.

Usage: python scripts/compile_scorer.py [impl ...]   (impl in scaled, folded)
"""
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sglang_fp4_indexer.ops.paged_logits import IMPLS, _paged_logits_kernel

print("triton", triton.__version__)
names = ["q_ptr", "w_ptr", "cache_ptr", "bt_ptr", "lens_ptr", "sched_ptr", "out_ptr", "num_requests", "num_pages",
         "width", "stride_q_row", "stride_q_head", "stride_w_row", "stride_bt", "stride_out"]
types = ["*fp8e4nv", "*fp32", "*u8", "*i32", "*i32", "*i32", "*fp32"] + ["i32"] * 8
for impl in sys.argv[1:] or ["scaled", "folded"]:
    for bkv, nw in ((128, 4), (256, 4), (128, 8)):
        sig = dict(zip(names, types))
        cx = dict(LENS_PER_ROW=False, NEXT_N=1, NEXT_N_PAD=1, H=64, PAGE=64, BLOCK_KV=bkv, DOT_MODE=0,
                  IMPL=IMPLS[impl], ASM=impl == "folded")
        for k in cx:
            sig[k] = "constexpr"
        src = ASTSource(fn=_paged_logits_kernel, signature=sig, constexprs=cx)
        try:
            c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": nw, "num_stages": 1})
        except Exception as e:
            print(impl, bkv, nw, "FAILED:", str(e)[-3000:])
            continue
        ptx = c.asm["ptx"]
        mma = sorted(set(re.findall(r"wgmma\.mma_async[.\w]*", ptx)))
        c._init_handles() if hasattr(c, "_init_handles") and False else None
        print(impl, bkv, nw, "smem", c.metadata.shared, mma[:2], "ld.local" in ptx and "LOCAL-MEM" or "")
