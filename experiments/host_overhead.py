"""CPU-side Python overhead of the paged scorer's serving call up to the kernel launch, before and after the
launcher (CPU only; no GPU, so no launch: the driver call is stubbed, in this script only).

What is timed, per call, on CPU tensors shaped like the serving calls (e4m3 index queries, SGLang's 2-D lengths,
a published schedule of 132 x 4 entries, ``clean_logits=False``), with the Hopper kernel standing in:

* ``before``: ``paged_logits(..., check=False, schedule=..., clean_logits=False)`` as the plugin called it up
  to commit 5b4ffd1, that commit's package (``git archive`` into a temporary folder, run in its own process);
  to reach its Hopper branch on the CPU, its device checks, NVRTC build, module load and ``nvrtc.launch`` are
  replaced in that temporary copy (as its own CPU tests stood in for an H200);
* ``after``: what the plugin's paged hook does now: the logits allocated (``torch.empty``) and the launcher of
  the configuration (``sm90.Launcher``, made once here with a stub kernel object whose ``launch_packed``
  returns at once) called with the tensors.

Both leave out what neither path changed (the hook's slicing of SGLang's tensors, ``paged_scorer_inputs``),
the current-stream lookup and ``cuLaunchKernel`` itself (inside ``nvrtc.launch`` before, ``launch_packed``
now). CPU-side Python overhead only: not a GPU host time (the benchmark's host column measures that).

    PYTHONPATH=. python3 -m experiments.host_overhead [--calls 20000] [--json PATH]

The raw figures of docs/benchmarks.md are benchmarks/results/host_overhead_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASELINE = "5b4ffd1"
#: (label, batch, context, next_n, heads) of the issue's measurements.
SHAPES = (("1 x 4K", 1, 4096, 1, 64), ("64 x 4K", 64, 4096, 1, 64), ("8 x 4K next_n 2", 8, 4096, 2, 64))
NUM_CTAS = 132 * 4


def _inputs(batch, context, next_n, heads):
    import torch

    rows, pages = batch * next_n, context // 64
    q = torch.zeros(rows, heads, 128, dtype=torch.float8_e4m3fn)
    weights = torch.ones(rows, heads)
    cache = torch.zeros(batch * pages, 64 * 68, dtype=torch.uint8)
    table = torch.arange(batch * pages, dtype=torch.int32).view(batch, pages)
    lens = torch.full((batch, next_n), context, dtype=torch.int32)
    schedule = torch.zeros(NUM_CTAS + 1, 2, dtype=torch.int32)
    return q, weights, cache, table, lens, schedule, pages * 64


def _time(fn, calls: int, repeats: int = 5) -> float:
    for _ in range(200):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls)
    return statistics.median(samples)


def measure_before(package: str, calls: int) -> dict:
    """The baseline package's serving call with its Hopper branch stood in (see the module docstring)."""
    sys.path.insert(0, package)
    import torch

    from sglang_fp4_indexer.ops import nvrtc
    from sglang_fp4_indexer.ops import paged_logits as pl

    if not pl.__file__.startswith(package):
        raise SystemExit(f"imported {pl.__file__}, not the package at {package}")
    # The temporary copy only: an H200 as its CPU tests stood one in, and no launch.
    pl._wgmma_unavailable = lambda *a, **k: None
    nvrtc._index = lambda device: 0
    nvrtc.cuda_arch = lambda device: "sm_90a"
    nvrtc.compile_cubin = lambda *a, **k: (b"cubin", "")
    nvrtc.get_function = lambda *a, **k: "fn"
    nvrtc.launch = lambda *a, **k: None
    out = {}
    for label, batch, context, next_n, heads in SHAPES:
        q, w, cache, table, lens, schedule, width = _inputs(batch, context, next_n, heads)

        def call():
            return pl.paged_logits(q, w, cache, table, lens, width=width, schedule=schedule, block_kv=64,
                                   page_size=64, check=False, clean_logits=False)

        out[label] = _time(call, calls)
    return out


class _StubKernel:
    """Stands for the loaded kernel: ``launch_packed`` returns at once (no GPU here)."""

    def launch_packed(self, index, grid, block, smem, params):
        return None


def measure_after(calls: int) -> dict:
    """The plugin's paged call now: allocate the logits, call the configuration's launcher (stub kernel)."""
    import torch

    from sglang_fp4_indexer.ops import sm90

    out = {}
    for label, batch, context, next_n, heads in SHAPES:
        q, w, cache, table, lens, schedule, width = _inputs(batch, context, next_n, heads)
        launcher = sm90.Launcher(sm90.Config.of_call(next_n, heads, torch.float32, True), 0, _StubKernel(),
                                 block_kv=64, clean_logits=False)
        rows = q.shape[0]

        def call():
            logits = torch.empty((rows, width), dtype=torch.float32, device=q.device)
            return launcher(q, w, cache, table, lens, schedule, logits)

        out[label] = _time(call, calls)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000, help="calls per timed repeat (5 repeats, median)")
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the figures (seconds per call) as JSON")
    ap.add_argument("--side", choices=("before", "after"), help=argparse.SUPPRESS)
    ap.add_argument("--package", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side == "before":
        print(json.dumps(measure_before(args.package, args.calls)))
        return 0
    if args.side == "after":
        print(json.dumps(measure_after(args.calls)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", BASELINE, "sglang_fp4_indexer"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        env = dict(os.environ, TRITON_INTERPRET="1")
        got = {}
        for side, extra in (("before", ["--package", tmp]), ("after", [])):
            run = subprocess.run([sys.executable, "-m", "experiments.host_overhead", "--side", side,
                                  "--calls", str(args.calls), *extra], capture_output=True, text=True, env=env,
                                 cwd=REPO, check=True)
            got[side] = json.loads(run.stdout.strip().splitlines()[-1])
    if args.json:
        import platform

        import torch

        Path(args.json).write_text(json.dumps({
            "what": "CPU-side Python overhead per paged serving call up to the launch (launch stubbed), seconds",
            "baseline": BASELINE, "calls": args.calls, "repeats": 5, "python": platform.python_version(),
            "torch": torch.__version__, "cpu": platform.processor() or platform.machine(), **got}, indent=1) + "\n")
    print(f"CPU-side Python overhead per paged serving call, up to the launch (launch stubbed; {args.calls} calls "
          f"x 5, median; before = {BASELINE}):")
    for label, *_ in SHAPES:
        before, after = got["before"][label] * 1e6, got["after"][label] * 1e6
        print(f"  {label:<18} before {before:6.1f} us   after {after:5.1f} us   ({before / after:.1f}x less)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
