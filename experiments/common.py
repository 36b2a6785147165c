"""Helpers the GPU probes share: the HBM copy floor, CUDA-graph timing, and a paged decode workload.

Not product code (the repository's experiments folder; not shipped with the package).
"""

from __future__ import annotations

import statistics

import torch

from sglang_fp4_indexer.format import quantize_index_k
from sglang_fp4_indexer.pool import PAGE_SIZE, allocate_index_k_cache, payload_plane, scale_plane


def copy_bandwidth(nbytes=2 << 30):
    """Device-to-device copy bandwidth in bytes/s (median of 10 copies of ``nbytes``): the HBM floor's rate."""
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
    """Seconds per call of ``fn(i)`` (median over ``replays`` replays of a CUDA graph of ``calls`` calls)."""
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
    """A decode workload on the GPU: ``copies`` caches holding the same random keys (so timed loops can rotate
    past L2), a shuffled block table, ``[batch]`` lengths ``ctx``, e4m3 queries, fp32 weights and one fp32
    logits buffer per copy. Returns ``(caches, block_table, lens, q, weights, outs)``."""
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
