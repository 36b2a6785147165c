"""Do the FP4 kernels in a process put NUL bytes into torch's profiler traces? (not product code)

An FP4 SGLang server's Chrome traces held single NUL bytes, each one a line's first byte at a file
offset of 4 KiB - 1, while the FP8 server's traces on the same machine held none (docs/benchmarks.md,
"Where a serving decode step's time goes"). This probe takes SGLang out: in one process it profiles
(CPU and CUDA activity, as SGLang's profiler records) a few hundred steps of either plain torch work
(``plain``) or the plugin's store op and paged scorer at 1 x 32K (``fp4``, with the Hopper kernel where
it serves), exports a ``.trace.json.gz`` the way torch does, and prints how many line starts fall at
an offset of 4 KiB - 1 and how many NUL bytes the trace holds. Run both modes on the same machine.

Answered on an H100 (docs/benchmarks.md): ``fp4`` wrote them and ``plain`` did not, because the plugin's NVRTC
build wrote its empty log's NUL into CPython's shared one-byte ``b" "``; ``ops/nvrtc.py`` now builds into new
``bytearray``s; with the fix ``fp4`` wrote none on an H100 (benchmarks/results/trace_nul_probe_h100_fixed_2026-12-06.txt).

Usage on the device: PYTHONPATH=. python3 -m experiments.trace_nul_probe {plain,fp4} [--steps N] [--out DIR]
(``--device cpu`` with ``TRITON_INTERPRET=1`` only tries the code path: CPU activity, a small shape.)
"""
import argparse
import gzip
import os

import torch
from torch.profiler import ProfilerActivity, profile

from sglang_fp4_indexer.bench.inputs import build_scorer_inputs
from sglang_fp4_indexer.bench.shapes import ScorerShape
from sglang_fp4_indexer.ops.paged_logits import paged_logits
from sglang_fp4_indexer.ops.quantize import store_index_k


def nul_report(path: str) -> dict:
    """Line starts at a file offset of 4 KiB - 1 and NUL bytes in a (gzip) trace; where each NUL stands."""
    raw = gzip.decompress(open(path, "rb").read()) if path.endswith(".gz") else open(path, "rb").read()
    starts = [p for p in range(4095, len(raw), 4096) if raw[p - 1] == 10]
    nuls = [p for p, c in enumerate(raw) if c == 0]
    return {"bytes": len(raw), "line_starts_at_4k_minus_1": len(starts), "nul": len(nuls),
            "nul_at_those_line_starts": len(set(nuls) & set(starts)), "nul_offsets": nuls[:10]}


def main() -> None:
    p = argparse.ArgumentParser(prog="trace_nul_probe")
    p.add_argument("mode", choices=("plain", "fp4"))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--out", default="/tmp")
    p.add_argument("--device", default="cuda")
    opts = p.parse_args()
    dev = torch.device(opts.device)
    cuda = dev.type == "cuda"
    inputs = build_scorer_inputs(ScorerShape(64, 1, 32768 if cuda else 256, 1), dev)
    keys = torch.randn(64, 128, device=dev).bfloat16()
    slots = torch.arange(64, device=dev)
    a = torch.randn(1024 if cuda else 64, 1024 if cuda else 64, device=dev)

    def step():
        if opts.mode == "fp4":
            store_index_k(keys, inputs.caches[0], slots)
            paged_logits(inputs.q, inputs.weights, inputs.caches[0], inputs.block_table, inputs.context_lens,
                         width=inputs.width)
        else:
            torch.matmul(a, a).tanh_()

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(10):
        step()
    sync()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(opts.steps):
            step()
        sync()
    path = os.path.join(opts.out, f"trace_nul_probe_{opts.mode}.trace.json.gz")
    prof.export_chrome_trace(path)
    print(opts.mode, torch.__version__, torch.cuda.get_device_name() if cuda else "cpu", nul_report(path))


if __name__ == "__main__":
    main()
