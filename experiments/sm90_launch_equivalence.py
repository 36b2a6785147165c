"""Proof that the product's launch of the Hopper kernel is that of commit 1e88a43 (CPU; needs git and the tests'
``cases.py``).

For every served configuration (``sm90.served_configs()``) and both ``clean_logits`` values, the call goes
through the Hopper launch path (1e88a43: ``paged_logits._launch_wgmma``; now ``sm90.launch``, the launcher that
``paged_logits`` and the serving path call) with NVRTC, the module load and the launch replaced by recorders, once with commit 1e88a43's package (``git archive`` into a temporary folder)
and once with this checkout's, each in its own process. Compared: the arch, the kernel name and dynamic
shared memory of the load, the grid, the block, the launch's shared memory, and every kernel argument's
ctypes type and value (pointers by type only: they are separate processes' tensors). The program text is
the subject of ``sm90_equivalence.py``.

    PYTHONPATH=. python3 -m experiments.sm90_launch_equivalence
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def capture(package: str, out: str) -> None:
    """Record the launches with the package at ``package`` first on ``sys.path`` into ``out`` (JSON)."""
    sys.path.insert(0, package)
    sys.path.insert(1, str(REPO / "tests"))
    import torch
    from cases import make_paged_case

    from sglang_fp4_indexer.ops import nvrtc, sm90
    from sglang_fp4_indexer.ops import paged_logits as pl

    if not sm90.__file__.startswith(package):
        raise SystemExit(f"imported {sm90.__file__}, not the package at {package}")
    new = hasattr(nvrtc, "load")
    seen: dict = {}

    def fake_compile(source, name, arch, defines=(), **kwargs):
        seen["arch"] = arch
        return b"cubin", ""

    def record(grid, block, smem, args):
        records.append(dict(arch=seen["arch"], load=seen["load"], grid=grid, block=block, smem=smem,
                            args=[type(a).__name__ + ("" if isinstance(a.value, int) and type(a).__name__ ==
                                                       "c_void_p" else f":{a.value}") for a in args]))

    class Recorder:
        """The loaded kernel of the launcher path: reads the packed arguments back through the pointer array."""

        def launch_packed(self, index, grid, block, smem, params):
            import ctypes

            block_args = nvrtc.ArgBlock(sm90.ARG_FORMAT)
            values = [block_args._CTYPES[code].from_address(ctypes.c_void_p.from_address(params + 8 * i).value).value
                      for i, code in enumerate(sm90.ARG_FORMAT)]
            record(grid, block, smem, block_args.as_ctypes(values))

    launcher_path = hasattr(sm90, "Launcher")

    def fake_get_function(device, cubin, kernel, smem=0):
        seen["load"] = [kernel, smem]
        return Recorder() if launcher_path else "fn"

    def fake_launch(fn, device, grid, block, smem, args):
        record(grid, block, smem, args)

    nvrtc.compile_cubin = fake_compile
    nvrtc.get_function = fake_get_function
    nvrtc.launch = fake_launch
    if new:
        nvrtc._index = lambda device: 0
        nvrtc.cuda_arch = lambda device: "sm_90a"
    else:
        sm90._device_index = lambda device: 0
    records: list = []
    for heads in (16, 32, 64, 128):
        for next_n in range(1, 9):
            if next_n * heads * 128 > 32 * 1024:
                continue
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                for lens_2d in (False, True):
                    for clean in (True, False):
                        case = make_paged_case([70, 200, 5], next_n=next_n, heads=heads, seed=1)
                        lens = case.context_lens
                        if lens_2d:
                            lens = lens.view(-1, 1).expand(-1, next_n).contiguous()
                        width = case.block_table.shape[1] * 64 + 64
                        out_t = torch.empty(case.q.shape[0], width, dtype=dtype)
                        sched = torch.zeros(10 + next_n, 2, dtype=torch.int32)
                        common = (case.q, case.weights, case.cache, case.block_table, lens, sched, out_t)
                        if launcher_path:
                            config = sm90.Config.of_call(next_n, heads, dtype, lens_2d)
                            sm90.launch(config, *common, block_kv=64, clean_logits=clean)
                        elif new:
                            pl._launch_wgmma(*common, next_n, heads, 64, clean, explicit=True)
                        else:
                            pl._launch_wgmma(*common, case.block_table.shape[0], next_n, heads, width, 64, clean,
                                             explicit=True)
                        records[-1]["call"] = [heads, next_n, str(dtype), lens_2d, clean]
    Path(out).write_text(json.dumps(records))


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--capture":
        capture(sys.argv[2], sys.argv[3])
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        old_pkg = Path(tmp) / "old"
        old_pkg.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "1e88a43", "sglang_fp4_indexer"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old_pkg)], input=archive, check=True)
        env = dict(os.environ, TRITON_INTERPRET="1")
        got = {}
        for tag, pkg in (("old", str(old_pkg)), ("new", str(REPO))):
            out = Path(tmp) / f"{tag}.json"
            subprocess.run([sys.executable, "-m", "experiments.sm90_launch_equivalence", "--capture", pkg, str(out)],
                           check=True, env=env, cwd=REPO)
            got[tag] = json.loads(out.read_text())
    old, new = got["old"], got["new"]
    bad = [(a["call"], b) for a, b in zip(old, new) if a != b]
    print(f"launches: {len(old)} (served configurations x clean_logits), {len(old) - len(bad)} identical "
          f"(arch, load, grid, block, shared memory, argument types and values)")
    for call, b in bad[:5]:
        print("differs:", call, b, file=sys.stderr)
    return 1 if bad or len(old) != len(new) else 0


if __name__ == "__main__":
    sys.exit(main())
