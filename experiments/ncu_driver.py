"""Launch each hot kernel twice (compile, then the profiled launch) for `ncu` (experiments/ncu_probe.sh)."""
import torch

from sglang_fp4_indexer.format import quantize_index_k
from sglang_fp4_indexer.ops.paged_logits import paged_logits
from sglang_fp4_indexer.ops.quantize import store_index_k
from sglang_fp4_indexer.ops.schedule import plan_paged_schedule, plan_paged_schedule_into
from sglang_fp4_indexer.pool import allocate_index_k_cache, payload_plane, scale_plane
from sglang_fp4_indexer.ops.grid import default_num_ctas

dev = "cuda"
batch, ctx, heads = 8, 131072, 64
pages = batch * ctx // 64
cache = allocate_index_k_cache(pages, device=dev)
k = torch.randn(pages * 64, 128, device=dev)
for t0 in range(0, k.shape[0], 1 << 16):
    p, s = quantize_index_k(k[t0 : t0 + (1 << 16)])
    n = p.shape[0] // 64
    payload_plane(cache)[t0 // 64 : t0 // 64 + n] = p.view(n, 64, 64)
    scale_plane(cache)[t0 // 64 : t0 // 64 + n] = s.view(n, 64, 4)
bt = torch.randperm(pages, device=dev).view(batch, -1).int()
lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
q = torch.randn(batch, heads, 128, device=dev).to(torch.float8_e4m3fn)
w = torch.rand(batch, heads, device=dev)
out = torch.empty(batch, ctx, device=dev)
sched = plan_paged_schedule(lens, 128, default_num_ctas(dev))
for impl in ("scaled", "folded"):
    for _ in range(2):
        paged_logits(q, w, cache, bt, lens, schedule=sched, out=out, check=False, impl=impl)
kb = torch.randn(65536, 128, device=dev).bfloat16()
slots = torch.randperm(pages * 64, device=dev)[:65536]
for _ in range(2):
    store_index_k(kb, cache, slots, check_slots=False)
lens64 = torch.randint(1, 131072, (64,), dtype=torch.int32, device=dev)
so = torch.empty(default_num_ctas(dev) + 1, 2, dtype=torch.int32, device=dev)
for _ in range(2):
    plan_paged_schedule_into(lens64, 128, so)
torch.cuda.synchronize()
print("driver done")
