"""Host time of the paged scorer's serving call on a CUDA device, taken apart step by step (GPU).

The benchmark's host column (``bench --scorers ours,deepgemm``) gives the whole call; this probe times each step
of what the plugin's paged hook does for one decode call, eagerly, ``--calls`` calls back to back after a
warm-up, synchronised only at the end (the host's wall time to issue them, as ``bench.timing.time_host``):

* ``empty``: ``torch.empty`` of the logits (the hook allocates them per call);
* ``arg_values``: the tensors' pointers, sizes and strides read and packed (``sm90._arg_values`` +
  ``ArgBlock.pack``);
* ``stream``: torch's current raw stream and current device (``nvrtc.current_stream``,
  ``torch.cuda.current_device``);
* ``launch_bindings``: ``cuLaunchKernel`` through ``cuda.bindings`` with everything prepared (what
  ``_Function.launch_packed`` calls), ``launch_ctypes``: the same driver entry point through ``ctypes`` with its
  argument types declared once (expected to be the lower bound a Python caller reaches; on an H100 it was
  slower than ``cuda.bindings``, docs/benchmarks.md "Host time");
* ``launcher``: the launcher's whole call (``ServingKernels.paged(...)(...)``) with preallocated logits, and
  ``hook_call``: with the logits allocated per call (the benchmark's host column for ours);
DeepGEMM's host time on the same shape is the benchmark's (``--scorers ours,deepgemm``), not repeated here.

Every launch scores the same inputs; the last launch's logits are compared with the launcher's (both variants
launch the same kernel with the same packed arguments, so they must be equal bit for bit).

    PYTHONPATH=. python3 -m experiments.launch_host_gpu [--calls 2000] [--batch 1] [--context 4096]
        [--next-n 1] [--json PATH]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics


def _host_time(fn, calls: int) -> list[float]:
    """Seconds per call of ``fn()``: the benchmark's host timer (``bench.timing.time_host``), 5 repeats."""
    import torch

    from sglang_fp4_indexer.bench.timing import time_host

    dev = torch.device("cuda", torch.cuda.current_device())
    return time_host(lambda _: fn(), dev, warmup=50, calls=calls, repeats=5).samples


def main() -> int:
    import torch

    from sglang_fp4_indexer.ops import nvrtc, sm90
    from sglang_fp4_indexer.ops.serving import ServingKernels

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--next-n", type=int, default=1)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--json", default=None, metavar="PATH")
    args = ap.parse_args()
    dev = torch.device("cuda", torch.cuda.current_device())
    b, n, h = args.batch, args.next_n, args.heads
    pages = -(-args.context // 64)
    width = pages * 64
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(b * n, h, 128, device=dev, generator=gen).to(torch.float8_e4m3fn)
    w = torch.rand(b * n, h, device=dev, generator=gen)
    cache = torch.randint(0, 256, (b * pages, 64 * 68), dtype=torch.uint8, device=dev, generator=gen)
    # Each request's scale plane holds UE8M0 exponents near 127 (2^0), as the store writes for unit-size keys.
    cache.view(b * pages, 64 * 68)[:, 64 * 64:] = 127
    table = torch.arange(b * pages, dtype=torch.int32, device=dev).view(b, pages)
    lens = torch.full((b, n), args.context, dtype=torch.int32, device=dev)
    kernels = ServingKernels(dev, heads=h, next_n=n)
    scorer = kernels.paged(h, n)
    if not isinstance(scorer, sm90.Launcher):
        print(f"the Hopper launcher does not serve here ({getattr(scorer, 'reason', scorer)}); nothing to time")
        return 1
    schedule = kernels.plan(lens)
    out = torch.empty((b * n, width), device=dev)
    got: dict[str, list[float]] = {}

    got["empty"] = _host_time(lambda: torch.empty((b * n, width), device=dev), args.calls)
    values = sm90._arg_values(q, w, cache, table, lens, schedule, out, scorer.block_kv, scorer.clean)
    block = nvrtc.ArgBlock(sm90.ARG_FORMAT)

    def arg_values():
        block.pack(*sm90._arg_values(q, w, cache, table, lens, schedule, out, scorer.block_kv, scorer.clean))

    got["arg_values"] = _host_time(arg_values, args.calls)
    index = dev.index
    got["stream"] = _host_time(lambda: (nvrtc.current_stream(index), torch.cuda.current_device()), args.calls)

    params = block.pack(*values)
    grid = -(-values[17] // sm90.WGS)
    fn = scorer.fn
    stream = nvrtc.current_stream(index)
    driver = fn.driver
    got["launch_bindings"] = _host_time(
        lambda: driver.cuLaunchKernel(fn.function, grid, 1, 1, sm90.THREADS, 1, 1, scorer.smem, stream, params, 0),
        args.calls)
    libcuda = ctypes.CDLL("libcuda.so.1")
    launch = libcuda.cuLaunchKernel
    launch.restype = ctypes.c_int
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    handle = int(fn.function)
    out_ctypes = torch.empty_like(out)
    params_ctypes = nvrtc.ArgBlock(sm90.ARG_FORMAT)
    p2 = params_ctypes.pack(*sm90._arg_values(q, w, cache, table, lens, schedule, out_ctypes, scorer.block_kv,
                                              scorer.clean))
    got["launch_ctypes"] = _host_time(
        lambda: launch(handle, grid, 1, 1, sm90.THREADS, 1, 1, scorer.smem, stream, p2, None), args.calls)
    err = launch(handle, grid, 1, 1, sm90.THREADS, 1, 1, scorer.smem, stream, p2, None)
    got["launcher"] = _host_time(lambda: scorer(q, w, cache, table, lens, schedule, out), args.calls)
    got["hook_call"] = _host_time(
        lambda: scorer(q, w, cache, table, lens, schedule, torch.empty((b * n, width), device=dev)), args.calls)
    scorer(q, w, cache, table, lens, schedule, out)
    torch.cuda.synchronize()
    same = err == 0 and torch.equal(out, out_ctypes)
    rows = {k: statistics.median(v) * 1e6 for k, v in got.items()}
    print(f"host us per call, {b} x {args.context} next_n {n}, {h} heads ({torch.cuda.get_device_name(dev)}), "
          f"median of 5 x {args.calls}:")
    for k, v in rows.items():
        spread = (max(got[k]) - min(got[k])) * 1e6
        print(f"  {k:16s} {v:7.2f}  (spread {spread:.2f})")
    print(f"ctypes launch equals the launcher's output: {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": [b, args.context, n, h], "device": torch.cuda.get_device_name(dev),
                       "calls": args.calls, "seconds": got, "ctypes_equal": same}, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
