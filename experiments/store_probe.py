"""Time the CUDA store kernel's tokens per lane group and the Triton kernel (not product code: docs/perf-notes.md).

64K bf16 tokens into shuffled pages, CUDA-graph timing with enough key/cache copies
rotated that every call reads from HBM, each variant's bytes checked against the
Triton kernel's. Usage on the device: PYTHONPATH=. python3 -m experiments.store_probe
"""
import ctypes

import torch
import triton

from sglang_fp4_indexer.ops import nvrtc
from sglang_fp4_indexer.ops.quantize import _cuda_store, store_index_k
from sglang_fp4_indexer.pool import allocate_index_k_cache

from .common import copy_bandwidth, graph_time

n, sets = 65536, 12
bw = copy_bandwidth()
floor = n * (256 + 68) / bw
pages = n // 64
g = torch.Generator(device="cuda").manual_seed(0)
ks = [(torch.randn(n, 128, device="cuda", generator=g) * 3).bfloat16() for _ in range(sets)]
slots = (torch.randperm(pages, device="cuda", generator=g)[:, None] * 64 + torch.arange(64, device="cuda")).reshape(-1)
caches = [allocate_index_k_cache(pages, device="cuda") for _ in range(sets)]
want = allocate_index_k_cache(pages, device="cuda")
store_index_k(ks[0], want, slots, check_slots=False, use_cuda=False)
print(f"copy bandwidth {bw / 1e12:.3f} TB/s, floor {floor * 1e6:.2f} us")
t = graph_time(lambda i: store_index_k(ks[i % sets], caches[i % sets], slots, check_slots=False, use_cuda=False))
print(f"triton      {t * 1e6:6.2f} us = {100 * floor / t:4.1f}% of floor")
for tpg in (1, 2, 4):
    dev, fn = _cuda_store(ks[0], caches[0], slots, tokens_per_group=tpg)

    def call(i, fn=fn, tpg=tpg):
        args = [ctypes.c_void_p(ks[i % sets].data_ptr()), ctypes.c_void_p(caches[i % sets].data_ptr()),
                ctypes.c_void_p(slots.data_ptr()), ctypes.c_longlong(n), ctypes.c_longlong(256),
                ctypes.c_longlong(pages * 64)]
        nvrtc.launch(fn, dev, triton.cdiv(n, 32 * tpg), 256, 0, args)

    call(0)
    torch.cuda.synchronize()
    ok = torch.equal(caches[0], want)
    t = graph_time(call)
    print(f"cuda tokens/group={tpg}  {t * 1e6:6.2f} us = {100 * floor / t:4.1f}% of floor  bytes {'equal' if ok else 'DIFFER'}")
