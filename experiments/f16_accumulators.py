"""f16 accumulators for the Hopper kernel's FP8 wgmma: the numerics, on the CPU.

The kernel's score wgmma (``wgmma.mma_async ... .f32.e4m3.e4m3``) could accumulate in f16
(``.f16.e4m3.e4m3``), halving its accumulator registers. f16's largest finite value is 65504 and its
significand 11 bits, so today's fold (a key's largest group at ``2**6 x E2M1``, |S| up to
``128 * 448 * 384`` ~ ``2**24.4``) overflows. This module works out a fold and a query scaling that
cannot overflow, emulates the f16 accumulation in torch (fp64 arithmetic, exact f16 rounding), and
measures what it does to the top-k (docs/perf-notes.md, "f16 accumulators: the numerics").

The fold (docs/format.md, "How the scorers read it"): group ``g`` of a key, UE8M0 exponent ``s_g``,
``d = s_g - s_max <= 0`` below the key's largest group, is fed to the MMA as the e4m3 value
``E2M1 * 2**(d + c)`` (``c = FOLD_EXP``), the kernel's nibble-to-byte decode (exponent field
``A = d + c + 6``, normals only) flushing the group to zero when ``A < 1``; the index query is fed as
``q * 2**-p`` (``p = QUERY_SHIFT``) rounded to e4m3; ``2**(s_max - 127 - c + p)`` is applied per key
after the head sum. Every product of two e4m3 values is exact in f16 (8 significant bits, a multiple
of ``2**-18``), so the accumulator's roundings are the only new error.

No overflow, for ANY e4m3 query (|q| <= 448) and ANY stored key (|E2M1| <= 6): every partial sum of
any order and grouping of the 128 products is at most ``sum_d |q'_d k'_d| <= 128 * 448 * 2**-p *
6 * 2**c = 344064 * 2**(c - p)`` (``86016 * 2**(c - p)`` per k32 step); rounding is monotone, so the
rounded partial sums stay within the same chain of rounded bounds: exactly the bound when the step
bounds ``86016 * j * 2**(c - p)`` are f16 values (one rounding per k32 or k8 step), at most
``(1 + 2**-11)**128`` above it with a rounding per product. ``c - p = -3`` gives 43008 (45800 with
the per-product factor) < 65504; ``c - p = -2`` gives 86016, which overflows.

    PYTHONPATH=. python3 -m experiments.f16_accumulators [--kinds gaussian,outlier,needle]
        [--contexts 4096,16384] [--heads 64] [--rows 16] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import math

import torch

from sglang_fp4_indexer import format as fmt
from sglang_fp4_indexer.accuracy import build_study_input
from sglang_fp4_indexer.accuracy.measuring import _case_tensors, _shared_key_logits
from sglang_fp4_indexer.metrics import topk_recall_rows
from sglang_fp4_indexer.ops.sm90 import HEADSUM_REL
from sglang_fp4_indexer.reference import topk_reference

from .headsum_recall import bf16_head_sum_logits

#: f16's largest finite value.
F16_MAX = 65504.0
#: f16's unit roundoff (round to nearest, 11-bit significand).
F16_U = 2.0**-11
#: f16's smallest subnormal spacing.
F16_TINY = 2.0**-24
#: Largest |e4m3| index query and |E2M1| element.
Q_MAX, E2M1_MAX = 448.0, 6.0
#: Dimension of an index key, elements per group, groups per key.
DIM, GROUP, GROUPS = 128, 32, 4
#: The chosen fold: a key's largest group at ``2**FOLD_EXP x E2M1`` (today's kernel: 6).
FOLD_EXP = 3
#: The chosen query scaling: the index query fed as ``q * 2**-QUERY_SHIFT`` (today's kernel: 0).
QUERY_SHIFT = 6
#: The other fold (``--fold key``): the index query as it comes and a key's largest group at ``2**-3 x E2M1``
#: (the same ``c - p = -3``, so the same partial-sum bound), the groups whose values fall below e4m3's normal
#: range decoded as e4m3 subnormals rounded to nearest (``experiments.sm90_f16acc``'s ``keyfold`` table).
KEY_FOLD = dict(fold_exp=-3, query_shift=0, subnormals=True)
#: The default fold (``--fold query``).
QUERY_FOLD = dict(fold_exp=FOLD_EXP, query_shift=QUERY_SHIFT, subnormals=False)
#: Rounding points per 128-long dot product of each accumulation model (k32 step, k8 chunk, product).
ROUNDINGS = {"k32": DIM // 32, "k8": DIM // 8, "product": DIM}


def worst_partial_sum(fold_exp: int, query_shift: int, steps: int = GROUPS) -> float:
    """Largest |partial sum| of the f16 accumulator after ``steps`` k32 wgmma steps (1..4), any inputs.

    ``steps * 32 * 448 * 2**-query_shift * 6 * 2**fold_exp``: every product at its largest
    magnitude and the same sign; any partial sum inside a step is bounded by the same.

    Raises:
        ValueError: ``steps`` outside 1..4, or ``6 * 2**fold_exp`` above e4m3's 448.
    """
    if not 1 <= steps <= GROUPS:
        raise ValueError(f"steps: expected 1..{GROUPS}, got {steps}")
    if E2M1_MAX * 2.0**fold_exp > Q_MAX:
        raise ValueError(f"fold_exp: 6 * 2**{fold_exp} is not an e4m3 value")
    return steps * GROUP * Q_MAX * 2.0**-query_shift * E2M1_MAX * 2.0**fold_exp


def flushed_below(fold_exp: int) -> int:
    """Smallest ``d = s_g - s_max`` the normals-only decode keeps (``A = d + fold_exp + 6 >= 1``);
    groups further below their key's largest are flushed to zero (today's kernel: -11)."""
    return -5 - fold_exp


def query_exact_above(query_shift: int) -> float:
    """Smallest |q| (e4m3, before scaling) that ``q * 2**-query_shift`` keeps exactly; below it the
    scaled query is rounded to a multiple of ``2**(query_shift - 9)`` (absolute error at most
    ``2**(query_shift - 10)``, unscaled units), and |q| below ``2**(query_shift - 10)`` becomes 0. With no
    shift every e4m3 value is kept (0.0)."""
    if query_shift == 0:
        return 0.0
    return 2.0 ** (query_shift - 6)


def round_f16(x: torch.Tensor) -> torch.Tensor:
    """Round fp64 ``x`` to the nearest f16 value, ties to even, subnormals and overflow to ±inf
    included, returned as fp64 (one rounding, unlike ``x.float().half()``)."""
    if x.dtype != torch.float64:
        raise ValueError(f"x: expected float64, got {x.dtype}")
    _, e = torch.frexp(x)  # x = m * 2**e, 0.5 <= |m| < 1
    ulp_exp = torch.clamp(e - 11, min=-24)
    y = torch.ldexp(torch.round(torch.ldexp(x, -ulp_exp)), ulp_exp.to(torch.float64))
    return torch.where(y.abs() > F16_MAX, torch.copysign(torch.full_like(y, math.inf), y), y)


def fold_keys(payload: torch.Tensor, scales: torch.Tensor, fold_exp: int = FOLD_EXP, subnormals: bool = False):
    """The e4m3 values the kernel would feed to the MMA for stored MXFP4 keys, as fp64.

    Args:
        payload, scales: ``format.quantize_index_k`` output, uint8 ``[N, 64]`` and ``[N, 4]``.
        fold_exp: the fold's exponent ``c``.
        subnormals: False: the normals-only decode (groups below ``flushed_below`` are zero); True: every
            element is ``E2M1 * 2**(d + c)`` rounded to nearest e4m3, subnormals included (one rounding: the
            value is exact in fp32 before torch's ``float8_e4m3fn`` cast).

    Returns:
        ``(folded fp64 [N, 128], key_scale fp64 [N], flushed bool [N, 4])``: ``folded * key_scale`` is
        the dequantized key except in the flushed groups (zero there) and, with ``subnormals``, the rounded
        elements; ``flushed`` marks, with ``subnormals``, the groups that are not exact.
    """
    deq = fmt.dequantize_index_k(payload, scales).to(torch.float64)
    s = scales.to(torch.int64) - 127
    s_max = s.max(dim=1).values
    d = s - s_max[:, None]
    flushed = d < flushed_below(fold_exp)
    mul = torch.ldexp(torch.ones_like(d, dtype=torch.float64), (fold_exp - s_max[:, None] + 0 * d).to(torch.float64))
    group_mul = torch.where(flushed, torch.zeros_like(mul), mul)
    folded = (deq.view(-1, GROUPS, GROUP) * group_mul[:, :, None]).view(-1, DIM)
    if subnormals:
        exact = deq.view(-1, GROUPS, GROUP) * mul[:, :, None]
        rounded = exact.to(torch.float32).to(torch.float8_e4m3fn).to(torch.float64)
        flushed = (rounded != exact).any(dim=2)
        folded = rounded.view(-1, DIM)
    key_scale = torch.ldexp(torch.ones_like(s_max, dtype=torch.float64), (s_max - fold_exp).to(torch.float64))
    return folded, key_scale, flushed


def scale_queries(q8: torch.Tensor, query_shift: int = QUERY_SHIFT) -> torch.Tensor:
    """``q * 2**-query_shift`` rounded to e4m3 (what the kernel's shared-memory B operand would hold),
    as fp64 ``[..., 128]``; ``q8`` is float8_e4m3fn."""
    if q8.dtype != torch.float8_e4m3fn:
        raise ValueError(f"q8: expected float8_e4m3fn, got {q8.dtype}")
    return (q8.to(torch.float32) * 2.0**-query_shift).to(torch.float8_e4m3fn).to(torch.float64)


def f16_scores(qs: torch.Tensor, folded: torch.Tensor, model: str = "k32") -> torch.Tensor:
    """Head scores ``[N, H]`` of one row with an f16 accumulator, in the folded and scaled units.

    Products are exact; the accumulator is rounded to f16 after every chunk of the dot product:
    ``"k32"`` (one k32 wgmma step: the assumption, the hardware's precision inside a step is not
    documented), ``"k8"`` or ``"product"`` (pessimistic variants). Chunks add in dimension order.

    Args:
        qs: fp64 ``[H, 128]`` scaled queries; folded: fp64 ``[N, 128]`` folded keys.
    """
    if model not in ROUNDINGS:
        raise ValueError(f"model: expected one of {sorted(ROUNDINGS)}, got {model!r}")
    step = DIM // ROUNDINGS[model]
    acc = torch.zeros(folded.shape[0], qs.shape[0], dtype=torch.float64)
    for k0 in range(0, DIM, step):
        acc = round_f16(acc + folded[:, k0:k0 + step] @ qs[:, k0:k0 + step].T)  # chunk sums exact in fp64
    return acc


def f16_logits(q8, w8, payload, scales, lengths, model="k32", fold_exp=FOLD_EXP, query_shift=QUERY_SHIFT,
               subnormals=False):
    """``[rows, width]`` logits of the f16-accumulator kernel emulation; ``-inf`` past each row's length.

    f16 head scores (``f16_scores``), relu, rounded to bf16, weights as hi + lo bf16, an fp64 sum
    standing in for the head sum's fp32 accumulation (as ``experiments.headsum_recall``), then the
    per-key ``2**(s_max - 127 - c + p)``.

    Args:
        q8: float8_e4m3fn ``[rows, H, 128]``; w8: fp32 ``[rows, H]``; payload, scales: the stored keys
        (``[width, 64]``, ``[width, 4]`` uint8); lengths: int ``[rows]``; fold_exp, query_shift, subnormals:
        the fold (``QUERY_FOLD`` or ``KEY_FOLD``).
    """
    folded, key_scale, _ = fold_keys(payload, scales, fold_exp, subnormals)
    qs = scale_queries(q8, query_shift)
    rows, width = q8.shape[0], folded.shape[0]
    out = torch.full((rows, width), float("-inf"), dtype=torch.float64)
    for r, n in enumerate(lengths.tolist()):
        s = f16_scores(qs[r], folded[:n], model)
        w = w8[r].to(torch.float32)
        hi = w.to(torch.bfloat16).to(torch.float32)
        lo = (w - hi).to(torch.bfloat16).to(torch.float32)
        hs = torch.relu(s).to(torch.float32).to(torch.bfloat16).to(torch.float64) @ (hi + lo).to(torch.float64)
        out[r, :n] = hs * key_scale[:n] * 2.0**query_shift
    return out


def f16_rel(model: str = "k32") -> float:
    """Relative error of a head score from the f16 accumulator, relative to ``sum_d |q'_d k'_d|``:
    ``gamma_n = n u / (1 - n u)`` for the model's ``n`` roundings, ``u = 2**-11``."""
    n = ROUNDINGS[model]
    return n * F16_U / (1 - n * F16_U)


def f16_logit_error_bound(term, relu_term, flush_term, abs_w, model: str = "k32"):
    """Error bound per logit of the f16-accumulator kernel, in the style of ``sm90.logit_error_bound``.

    Args (per (row, key), folded-and-scaled units, i.e. before the per-key factor):
        term: ``sum_h |w_h| sum_d |q'_d k'_d|``; relu_term: ``sum_h |w_h| relu(s_h)``, ``s_h`` exact;
        flush_term: ``sum_h |w_h| sum_d |q_d k_d - q'_d k'_d|`` (what the fold and query scaling drop;
        0 unless a group is flushed or a query element is below ``query_exact_above``);
        abs_w: ``sum_h |w_h|``.

    Returns:
        ``E + HEADSUM_REL * (relu_term + E)`` with ``E = f16_rel * term + n * 2**-25 * abs_w + flush_term``
        (the accumulator's relative rounding, its subnormal floor, the flush), the head sum as today.
    """
    e = f16_rel(model) * term + ROUNDINGS[model] * F16_TINY / 2 * abs_w + flush_term
    return e + HEADSUM_REL * (relu_term + e)


def _bound_check(q8, w8, payload, scales, lengths, logits, model, fold_exp=FOLD_EXP, query_shift=QUERY_SHIFT,
                 subnormals=False):
    """Largest measured ``|logit - exact| / f16_logit_error_bound`` over the case (must be <= 1)."""
    deq = fmt.dequantize_index_k(payload, scales).to(torch.float64)
    folded, key_scale, _ = fold_keys(payload, scales, fold_exp, subnormals)
    qs = scale_queries(q8, query_shift)
    worst = 0.0
    for r, n in enumerate(lengths.tolist()):
        sc = key_scale[:n, None] * 2.0**query_shift
        q, w = q8[r].to(torch.float64), w8[r].to(torch.float64)
        exact_s = deq[:n] @ q.T  # [n, H], unscaled
        exact = torch.relu(exact_s) @ w
        term = (folded[:n].abs() @ qs[r].abs().T) @ w.abs()
        # |q k - q' k'| (unscaled) <= |q - q's| |k| + |q's| |k - k'sc|, per element
        dq, dk = (q - qs[r] * 2.0**query_shift).abs(), (deq[:n] - folded[:n] * key_scale[:n, None]).abs()
        flush = (deq[:n].abs() @ dq.T + dk @ (qs[r].abs() * 2.0**query_shift).T) @ w.abs() / sc[:, 0]
        relu_term = (torch.relu(exact_s) @ w.abs()) / sc[:, 0]
        bound = f16_logit_error_bound(term, relu_term, flush, float(w.abs().sum()), model) * sc[:, 0]
        worst = max(worst, float(((logits[r, :n] - exact).abs() / bound).max()))
    return worst


def flush_stats(payload: torch.Tensor, scales: torch.Tensor, q8: torch.Tensor, fold_exp=FOLD_EXP,
                query_shift=QUERY_SHIFT, subnormals=False) -> dict:
    """What the chosen fold and query scaling drop on one case: flushed (inexact, with ``subnormals``)
    (key, group)s and query elements below ``query_exact_above`` (their share, and the query's largest
    relative change)."""
    _, _, flushed = fold_keys(payload, scales, fold_exp, subnormals)
    s = scales.to(torch.int64)
    d = s - s.max(dim=1, keepdim=True).values
    q = q8.to(torch.float64)
    lossy = (q.abs() < query_exact_above(query_shift)) & (q != 0)
    changed = (scale_queries(q8, query_shift) * 2.0**query_shift - q).abs()
    amax = q.abs().amax(dim=-1, keepdim=True)
    return dict(groups_flushed=float(flushed.double().mean()), min_group_offset=int(d.min()),
                query_elements_inexact=float(lossy.double().mean()),
                query_max_abs_change_rel_head_amax=float((changed / amax).max()))


def main() -> None:
    """Run the study: per case, top-k agreement with fp64 scoring of the same FP4 keys of today's
    f32-accumulator + bf16 head sum and of the f16-accumulator emulation (each rounding model)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default="gaussian,outlier,needle")
    ap.add_argument("--contexts", default="4096,16384")
    ap.add_argument("--heads", default="64")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--models", default="k32,k8,product")
    ap.add_argument("--fold", choices=("query", "key"), default="query",
                    help="query: the index query shifted by 2**-6, keys' largest group at 2**3 (QUERY_FOLD); key: "
                         "the query as it comes, keys' largest group at 2**-3, subnormal decode (KEY_FOLD)")
    ap.add_argument("--json", default=None, help="also write the results here (appended to its runs if it exists)")
    args = ap.parse_args()
    fold_args = KEY_FOLD if args.fold == "key" else QUERY_FOLD
    cases = [(int(c), int(h)) for c in args.contexts.split(",") for h in args.heads.split(",")]
    models = args.models.split(",")
    c, p = fold_args["fold_exp"], fold_args["query_shift"]
    fold = dict(fold_exp=c, query_shift=p, subnormals=fold_args["subnormals"],
                worst_partial_sum_per_k32_step=[worst_partial_sum(c, p, j) for j in range(1, 5)],
                f16_max=F16_MAX, groups_flushed_below_offset=None if fold_args["subnormals"] else flushed_below(c),
                query_exact_above=query_exact_above(p),
                f16_rel={m: f16_rel(m) for m in ROUNDINGS}, headsum_rel=HEADSUM_REL,
                today=dict(fold_exp=6, worst_partial_sum=worst_partial_sum(6, 0), groups_flushed_below_offset=-11))
    results = []
    for kind in args.kinds.split(","):
        inp = build_study_input(kind, cases, rows=args.rows)
        for context, h in cases:
            keys, q8, w8, lengths, _, _ = _case_tensors(inp, context, h, args.topk, torch.device("cpu"))
            payload, scales = fmt.quantize_index_k(keys)
            deq = fmt.dequantize_index_k(payload, scales)
            ref = _shared_key_logits(q8, w8, deq.to(torch.float64), lengths, exact=True)  # fp64, same FP4 keys
            ref_top = topk_reference(ref, args.topk, lengths=lengths)
            today = topk_recall_rows(topk_reference(bf16_head_sum_logits(q8, w8, deq.to(torch.float32), lengths),
                                                    args.topk, lengths=lengths), ref_top)
            row = dict(kind=kind, context=context, heads=h, rows=args.rows, topk=args.topk,
                       today_f32_bf16_mean=float(today.mean()), today_f32_bf16_min=float(today.min()),
                       **flush_stats(payload, scales, q8, **fold_args))
            for m in models:
                lg = f16_logits(q8, w8, payload, scales, lengths, m, **fold_args)
                a = topk_recall_rows(topk_reference(lg, args.topk, lengths=lengths), ref_top)
                row[f"f16_{m}_mean"], row[f"f16_{m}_min"] = float(a.mean()), float(a.min())
                row[f"f16_{m}_nonfinite"] = int((~torch.isfinite(lg) & torch.isfinite(ref)).sum())
                row[f"f16_{m}_err_over_bound_max"] = _bound_check(q8, w8, payload, scales, lengths, lg, m, **fold_args)
            results.append(row)
            print(json.dumps(row), flush=True)
    if args.json:  # one file holds the runs of several commands (the fold is the same in all)
        command = ("PYTHONPATH=. python3 -m experiments.f16_accumulators "
                   f"--kinds {args.kinds} --contexts {args.contexts} --heads {args.heads} "
                   f"--rows {args.rows} --models {args.models}" + (" --fold key" if args.fold == "key" else ""))
        try:
            with open(args.json) as f:
                runs = json.load(f)["runs"]
        except FileNotFoundError:
            runs = []
        with open(args.json, "w") as f:
            json.dump(dict(fold=fold, runs=runs + [dict(command=command, cases=results)]), f, indent=1)


if __name__ == "__main__":
    main()
