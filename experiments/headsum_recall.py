"""What the bf16 head sum (Hopper build option HEADSUM 2) does to the indexer's top-k, on the CPU.

HEADSUM 2 rounds each relu(q_h . k) to bf16 (relative error <= 2**-8, bf16's unit roundoff) and
multiplies by the weight as hi + lo bf16 (w to 2**-16) with fp32 accumulation
(docs/perf-notes.md, "The head sum"). Rounding commutes with the kernel's per-key power-of-two fold, so it
is emulated here on the fp32 per-head scores of the MXFP4 keys (the format's torch oracle,
``format.quantize_index_k`` then ``dequantize_index_k``), with the accuracy study's workloads and
e4m3 queries (``sglang_fp4_indexer.accuracy``). Printed per case: the top-k recall against the
exact top-k of the fp32 FP4 logits and of the bf16-head-sum ones, and how much of the fp32 FP4
top-k the bf16 one keeps.

    PYTHONPATH=. python3 -m experiments.headsum_recall [--kinds gaussian,outlier] [--contexts 16384,65536]
        [--heads 64,32] [--rows 32] [--json out.json]
"""
import argparse
import json

import torch

from sglang_fp4_indexer import format as fmt
from sglang_fp4_indexer.accuracy import build_study_input
from sglang_fp4_indexer.accuracy.measuring import _case_tensors, _shared_key_logits
from sglang_fp4_indexer.metrics import topk_recall_rows
from sglang_fp4_indexer.reference import topk_reference


def bf16_head_sum_logits(q8: torch.Tensor, w8: torch.Tensor, keys: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``[rows, width]`` logits of the HEADSUM 2 emulation: relu(s) rounded to bf16, weights as hi + lo
    bf16, an fp64 sum standing in for the fp32 accumulation; ``-inf`` past each row's length.
    ``keys``: ``[width, 128]`` fp32 (the dequantized MXFP4 keys)."""
    rows, width = q8.shape[0], keys.shape[0]
    out = torch.full((rows, width), float("-inf"), dtype=torch.float64)
    for r, n in enumerate(lengths.tolist()):
        s = keys[:n] @ q8[r].to(torch.float32).T  # [n, H] fp32 per-head scores
        w = w8[r].to(torch.float32)
        hi = w.to(torch.bfloat16).to(torch.float32)
        lo = (w - hi).to(torch.bfloat16).to(torch.float32)
        out[r, :n] = torch.relu(s).to(torch.bfloat16).to(torch.float64) @ (hi.to(torch.float64) + lo.to(torch.float64))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default="gaussian,outlier", help="accuracy-study workloads (not 'text': no model here)")
    ap.add_argument("--contexts", default="16384,65536")
    ap.add_argument("--heads", default="64,32")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    contexts = [int(x) for x in args.contexts.split(",")]
    heads = [int(x) for x in args.heads.split(",")]
    cases = [(c, h) for c in contexts for h in heads]
    results = []
    print("kind      context  H   recall fp32-FP4  recall bf16-head-sum  bf16 keeps of fp32 top-k (mean / min)")
    for kind in args.kinds.split(","):
        inp = build_study_input(kind, cases, rows=args.rows)
        for context, h in cases:
            keys, q8, w8, lengths, exact, exact_top = _case_tensors(inp, context, h, args.topk, torch.device("cpu"))
            deq = fmt.dequantize_index_k(*fmt.quantize_index_k(keys)).to(torch.float32)
            logits = {"fp32": _shared_key_logits(q8, w8, deq, lengths),  # the accuracy study's fp32 FP4 oracle
                      "bf16": bf16_head_sum_logits(q8, w8, deq, lengths)}
            tops = {name: topk_reference(x, args.topk, lengths=lengths) for name, x in logits.items()}
            rec = {name: topk_recall_rows(top, exact_top) for name, top in tops.items()}
            agree = topk_recall_rows(tops["bf16"], tops["fp32"])
            row = dict(kind=kind, context=context, heads=h, rows=args.rows, topk=args.topk,
                       recall_fp32=float(rec["fp32"].mean()), recall_bf16=float(rec["bf16"].mean()),
                       agreement_mean=float(agree.mean()), agreement_min=float(agree.min()))
            results.append(row)
            print(f"{kind:9s} {context:7d} {h:3d}   {row['recall_fp32']:.5f}          {row['recall_bf16']:.5f}"
                  f"               {row['agreement_mean']:.5f} / {row['agreement_min']:.5f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
