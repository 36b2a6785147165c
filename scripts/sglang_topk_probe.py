"""Is SGLang's decode top-k exact at the logit scale of dummy weights? A probe, run on a GPU machine.

SGLang 0.5.23 selects the top-k of decode-shaped rows (one row per request: plain decode and MTP's draft decode)
with its DeepSeek-V4 top-k v2 kernel (``sglang.kernels.ops.attention.dsv4.topk.topk_transform_paged_v2``), FP8 and
FP4 index alike. That kernel bins the scores by their fp16 value first, and its cluster path (long rows, small
batches) "still truncates an overflowing threshold bin" (its source says so): when more than 2048 scores share the
threshold bin it keeps an arbitrary subset of them. With dummy weights every index logit is far below fp16's
smallest value, so all positive scores share one bin. Target verify and draft extend rows go through SGLang's
other top-k (``sgl_kernel.fast_topk_transform_fused``).

For each (batch, row length, score scale) this runs both of SGLang's top-k kernels on the same random fp32 scores
and compares each row's selected set with the exact top-k (``torch.topk``; random normal scores have no ties),
printing the rows that differ and writing them to ``--json``. Nothing here is product code: it reads SGLang.

    python scripts/sglang_topk_probe.py --json topk_probe.json
"""

from __future__ import annotations

import argparse
import json
import sys

#: (batch, row length) pairs: the MTP check's two requests, a long single row, a full batch, a wide batch.
SHAPES = ((2, (5121, 3077)), (1, (131072,)), (8, (65536,) * 8), (32, (3000,) * 32))
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


def probe(shapes=SHAPES, scales=SCALES, seed: int = 0) -> list[dict]:
    """Run SGLang's top-k v2 (decode rows) and its legacy fused top-k (verify / extend rows) on each shape and scale.

    Returns:
        one dict per (kernel, batch, lengths, scale): ``rows``, ``rows_differ``, ``entries_differ``, and for the v2
        kernel the plan's ``cluster_items`` (rows routed to its cluster path).

    Raises:
        ImportError: SGLang or its kernels are not installed (a GPU machine with the check's wheels).
    """
    import torch
    from sglang.kernels.ops.attention.dsv4 import topk as v2

    g = torch.Generator(device="cuda").manual_seed(seed)
    results = []
    for bs, lens in shapes:
        width = -(-max(lens) // 64) * 64
        seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
        for scale in scales:
            scores = torch.randn(bs, width, generator=g, device="cuda", dtype=torch.float32) * scale
            exact = exact_sets(scores.cpu(), lens)
            plan = v2.plan_topk_v2(seq)  # as SGLang's DSA backend builds it (small batches leave it unwritten)
            written = v2.topk_v2_plan_is_written(seq)
            out = torch.full((bs, TOPK), -1, dtype=torch.int32, device="cuda")
            v2.topk_transform_paged_v2(scores, seq, None, out, 64, plan)
            torch.cuda.synchronize()
            row = {"kernel": "top-k v2 (decode rows)", "batch": bs, "lens": list(lens), "scale": scale,
                   "cluster_items": int(plan[0, 1].item()) if written else 0}
            row.update(compare(out.cpu(), lens, exact))
            results.append(row)
            try:
                from sgl_kernel import fast_topk_v2
            except ImportError:
                fast_topk_v2 = None
            if fast_topk_v2 is not None:
                legacy = fast_topk_v2(scores, seq, TOPK)
                torch.cuda.synchronize()
                row = {"kernel": "sgl_kernel fast_topk_v2 (verify / extend rows)", "batch": bs, "lens": list(lens),
                       "scale": scale}
                row.update(compare(legacy.cpu(), lens, exact))
                results.append(row)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sglang_topk_probe.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write the results here")
    o = p.parse_args(argv)
    results = probe()
    for r in results:
        print(f"{r['kernel']:<48} batch {r['batch']:>2} len {r['lens'][0]:>6} scale {r['scale']:.0e}: "
              f"{r['rows_differ']} of {r['rows']} rows differ from the exact top-k ({r['entries_differ']} entries)"
              + (f", {r['cluster_items']} rows on the cluster path" if "cluster_items" in r else ""))
    if o.json:
        with open(o.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
