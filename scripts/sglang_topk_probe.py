"""Is SGLang's decode top-k exact at the logit scale of dummy weights? A probe, run on a GPU machine.

SGLang 0.5.23 selects the top-k of decode-shaped rows (one row per request: plain decode and MTP's draft decode)
with its DeepSeek-V4 top-k v2 kernel (``sglang.kernels.ops.attention.dsv4.topk.topk_transform_paged_v2``), FP8 and
FP4 index alike; target verify and draft extend rows too, where SGLang repeats the page table per draft token. That
kernel bins the scores by their fp16 value first, and its cluster path "still truncates an overflowing threshold
bin" (its source says so): when more than 2048 scores share the threshold bin it keeps an arbitrary subset of them.
It takes the cluster path when the scores' width (the page table's width x 64: under CUDA graphs the model's whole
context) passes a floor (32 768 on Hopper for up to 15 rows) and the batch is small. With dummy weights every index
logit is far below fp16's smallest value, so all positive scores share one bin.

(Its first GPU run, benchmarks/results/sglang_topk_probe_h100_2026-12-06.txt, planned no row for the cluster path at
any shape, yet both kernels missed entries of rows of 64K and 128K keys at the dummy scale: not the cluster path.)

For each (rows, row lengths, scores' width, score scale) this runs that kernel, and SGLang's unfused top-k
(``sgl_kernel.fast_topk_v2``, what its top-k backend calls where the fused transform does not apply), on the same
random fp32 scores (past each row's length too) and compares each row's selected set with the exact top-k
(``torch.topk``; random normal scores have no ties). It prints each result as it comes and rewrites ``--json``
after each. Nothing here is product code: it reads SGLang.

    python scripts/sglang_topk_probe.py --json topk_probe.json
"""

from __future__ import annotations

import argparse
import json
import sys

#: The tiny model's context: the scores' width of a call under CUDA graphs (page-table width x 64).
CONTEXT = 163840
#: (rows, row lengths, scores' width): the MTP check's two draft decode rows at the server's width and at their
#: own, its eight target verify rows, a long single row, a full batch of 64K rows, a batch past the cluster path's.
SHAPES = ((2, (5121, 3077), CONTEXT), (2, (5121, 3077), 5184), (8, (5121,) * 4 + (3077,) * 4, CONTEXT),
          (1, (131072,), CONTEXT), (8, (65536,) * 8, CONTEXT), (32, (3000,) * 32, CONTEXT))
#: Score scales: what real weights give, and what SGLang's dummy weights give (the MTP check saw |logits| < 1e-16).
SCALES = (1.0, 1e-19)
TOPK = 2048


def exact_sets(scores, lens) -> list[set]:
    """The exact top-k positions of each row (``min(TOPK, len)`` of them) as sets."""
    import torch

    out = []
    for r, n in enumerate(lens):
        k = min(TOPK, n)
        out.append(set(torch.topk(scores[r, :n].double(), k).indices.tolist()))
    return out


def compare(served, lens, exact) -> dict:
    """Rows whose served set differs from the exact one, and how many entries differ in all."""
    rows, entries = 0, 0
    for r, n in enumerate(lens):
        got = {int(v) for v in served[r].tolist() if v >= 0}
        miss = len(exact[r] - got)
        rows += miss > 0
        entries += miss
    return {"rows": len(lens), "rows_differ": rows, "entries_differ": entries}


def probe(shapes=SHAPES, scales=SCALES, seed: int = 0, report=None) -> list[dict]:
    """Run SGLang's top-k v2 kernel and its unfused top-k on each shape and scale.

    Args:
        report: called with the results so far after each one (printing, writing the JSON).

    Returns:
        one dict per (kernel, rows, lengths, width, scale): ``rows``, ``rows_differ``, ``entries_differ`` (or
        ``error`` where the kernel raised), and for the v2 kernel the plan's ``cluster_items``.

    Raises:
        ImportError: SGLang or its kernels are not installed (a GPU machine with the check's wheels).
    """
    import torch
    from sglang.kernels.ops.attention.dsv4 import topk as v2

    def v2_topk(scores, seq):  # as SGLang's DSA backend plans and calls it (small batches leave the plan unwritten)
        plan = v2.plan_topk_v2(seq)
        written = v2.topk_v2_plan_is_written(seq)
        out = torch.full((seq.numel(), TOPK), -1, dtype=torch.int32, device="cuda")
        v2.topk_transform_paged_v2(scores, seq, None, out, 64, plan)
        torch.cuda.synchronize()
        return out.cpu(), {"cluster_items": int(plan[0, 1].item()) if written else 0}

    def unfused_topk(scores, seq):
        from sgl_kernel import fast_topk_v2

        out = fast_topk_v2(scores, seq, TOPK)
        torch.cuda.synchronize()
        return out.cpu(), {}

    g = torch.Generator(device="cuda").manual_seed(seed)
    results = []
    for bs, lens, width in shapes:
        seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
        for scale in scales:
            scores = torch.randn(bs, width, generator=g, device="cuda", dtype=torch.float32) * scale
            exact = exact_sets(scores.cpu(), lens)
            base = {"batch": bs, "lens": list(lens), "width": width, "scale": scale}
            for name, run in (("SGLang's top-k v2 (topk_transform_paged_v2)", lambda: v2_topk(scores, seq)),
                              ("SGLang's unfused top-k (sgl_kernel.fast_topk_v2)", lambda: unfused_topk(scores, seq))):
                row = dict(base, kernel=name)
                try:
                    served, extra = run()
                    row.update(compare(served, lens, exact), **extra)
                except Exception as e:  # noqa: BLE001 - reported, and the other shapes still run
                    row["error"] = f"{type(e).__name__}: {e}"
                results.append(row)
                if report:
                    report(results)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sglang_topk_probe.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write the results here")
    o = p.parse_args(argv)

    def report(results):
        r = results[-1]
        head = f"{r['kernel']:<46} rows {r['batch']:>2} len {r['lens'][0]:>6} width {r['width']:>6} scale {r['scale']:.0e}: "
        print(head + (r["error"] if "error" in r else
                      f"{r['rows_differ']} of {r['rows']} rows differ from the exact top-k ({r['entries_differ']} "
                      "entries)" + (f", {r['cluster_items']} rows planned for the cluster path"
                                    if "cluster_items" in r else "")), flush=True)
        if o.json:
            with open(o.json, "w") as f:
                json.dump(results, f, indent=1)

    probe(report=report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
