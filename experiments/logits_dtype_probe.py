"""Speed of the paged scorer's logits dtype (fp32 / bf16 / fp16) on the GPU.

Not product code: a measurement for docs/accuracy.md. CUDA-graph timing through
``bench.timing.time_calls``, caches rotated past L2 as the bench does; the
bf16/fp16 outputs are checked to equal the fp32 logits rounded once.

    PYTHONPATH=. python3 -m experiments.logits_dtype_probe
"""

import torch

from sglang_fp4_indexer.bench.timing import time_calls
from sglang_fp4_indexer.format import quantize_index_k
from sglang_fp4_indexer.ops.paged_logits import default_block_kv, paged_logits
from sglang_fp4_indexer.ops.schedule import plan_paged_schedule
from sglang_fp4_indexer.pool import allocate_index_k_cache, payload_plane, scale_plane
from sglang_fp4_indexer.ops.grid import default_num_ctas

dev = torch.device("cuda")
bw_copy = None
print(f"{'shape':>16} {'dtype':>9} {'us':>8} {'floor us':>9}")
a = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
b = torch.empty_like(a)
run = time_calls(lambda s: b.copy_(a), dev, 1)
bw = 2 * a.numel() / run.timing.seconds
del a, b
for batch, ctx, next_n in ((8, 131072, 1), (32, 32768, 1), (8, 131072, 4)):
    pages = batch * ctx // 64
    sets = 2
    caches = []
    for s in range(sets):
        cache = allocate_index_k_cache(pages, device=dev)
        for t0 in range(0, pages * 64, 1 << 16):
            p, sc = quantize_index_k(torch.randn(1 << 16, 128, device=dev))
            payload_plane(cache)[t0 // 64 : t0 // 64 + 1024] = p.view(1024, 64, 64)
            scale_plane(cache)[t0 // 64 : t0 // 64 + 1024] = sc.view(1024, 64, 4)
        caches.append(cache)
    bt = torch.randperm(pages, device=dev).view(batch, -1).int()
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    q = torch.randn(batch * next_n, 64, 128, device=dev).to(torch.float8_e4m3fn)
    w = torch.rand(batch * next_n, 64, device=dev) * 0.125
    sched = plan_paged_schedule(lens, default_block_kv(dev), default_num_ctas(dev))
    full = paged_logits(q, w, caches[0], bt, lens, schedule=sched, check=False)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        outs = [torch.empty(batch * next_n, ctx, dtype=dtype, device=dev) for _ in range(sets)]
        fn = lambda s: paged_logits(q, w, caches[s], bt, lens, schedule=sched, out=outs[s], logits_dtype=dtype, check=False)
        t = time_calls(fn, dev, sets).timing.seconds
        fn(0)
        torch.cuda.synchronize()
        assert torch.equal(outs[0], full.to(dtype)), f"{dtype}: not the fp32 logits rounded once"
        floor = (batch * ctx * 68 + batch * next_n * ctx * dtype.itemsize) / bw
        print(f"{batch}x{ctx}x{next_n:>1} {str(dtype)[6:]:>9} {t * 1e6:8.1f} {floor * 1e6:9.1f}", flush=True)
    del caches
    torch.cuda.empty_cache()
print(f"copy bandwidth {bw / 1e12:.3f} TB/s")
