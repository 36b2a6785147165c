"""Where recall goes: error-to-spread ratio, where the lost keys sat, a Gaussian-noise model of recall, and the
FP4 encoder variants (``encoders``), as findings.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..demo import FP8_KEY_SCALE_FMT, _device
from ..metrics import topk_recall_rows
from ..reference import fp8_dequantize_rows, fp8_quantize_rows, topk_reference
from .inputs import DEFAULT_TOPK, StudyInput
from .encoders import SCALE_RULES, fp4_keys_variant
from .measuring import _case_tensors, _shared_key_logits

__all__ = [
    "LossAnalysis",
    "Diagnostics",
    "diagnose",
]


@dataclass
class LossAnalysis:
    """Where one format loses recall (pooled over the rows of one case).

    Attributes:
        recall: measured mean recall.
        noise_to_spread: mean over rows of ``std(logit error) / std(exact logits)`` (visible keys).
        error_topk_ratio: mean over rows of ``std(error over the exact top-k) / std(error over all keys)``:
            above 1 the error grows with the logit.
        lost_share: lost keys (exact top-k, not selected) over all exact top-k entries.
        lost_in_last_quarter: share of the lost keys whose exact rank is in the last quarter of the top-k.
        lost_median_gap: median ``|exact - kth exact score| / std(error)`` of the lost keys.
        lost_within_2sd: share of the lost keys within 2 error std of the k-th score.
        head_recall: mean share of the exact top-(k/4) inside the format's top-k.
        noise_model_recall: mean recall of ``exact + std(error) * N(0, 1)`` (row-wise std, i.i.d. noise).
    """

    recall: float
    noise_to_spread: float
    error_topk_ratio: float
    lost_share: float
    lost_in_last_quarter: float
    lost_median_gap: float
    lost_within_2sd: float
    head_recall: float
    noise_model_recall: float


@dataclass
class Diagnostics:
    """Why FP4 loses recall on one case, and what encoder variants would change.

    Attributes:
        workload, context, heads, topk: the case.
        analysis: ``{"FP8": LossAnalysis, "FP4": LossAnalysis}``.
        error_ratio: mean over rows of FP4's error std over FP8's.
        needed_error_factor: the factor by which FP4's error std would have to
            shrink for the noise model to reach FP8's recall minus 0.01 (1.0: met).
        variants: ``{rule: recall_mean}`` for ``SCALE_RULES`` (torch path).
        fp4_bf16_queries: FP4 recall with the bf16 queries left unquantized (the
            scorer accepts bf16 ``q``): what the shared e4m3 query step costs FP4.
        variant_key_error: ``{rule: ||k_hat - k|| / ||k||}`` over the case's keys.
        fp8_key_error: the same for FP8 keys.
    """

    workload: str
    context: int
    heads: int
    topk: int
    analysis: dict[str, LossAnalysis]
    error_ratio: float
    needed_error_factor: float
    variants: dict[str, float]
    fp4_bf16_queries: float
    variant_key_error: dict[str, float]
    fp8_key_error: float


def _noise_recall(exact: torch.Tensor, sigma: torch.Tensor, noise: torch.Tensor, exact_top: torch.Tensor,
                  lengths: torch.Tensor, topk: int) -> float:
    noisy = exact + sigma[:, None] * noise
    return float(topk_recall_rows(topk_reference(noisy, topk, lengths=lengths), exact_top).mean())


def _loss_analysis(logits: torch.Tensor, exact: torch.Tensor, exact_top: torch.Tensor, lengths: torch.Tensor,
                   topk: int, noise: torch.Tensor) -> tuple[LossAnalysis, torch.Tensor]:
    """The format's LossAnalysis and its per-row error std."""
    top = topk_reference(logits, topk, lengths=lengths)
    sigmas, spreads, topk_ratio, gaps, ranks_rel, head = [], [], [], [], [], []
    lost_total = entries = 0
    for r, n in enumerate(lengths.tolist()):
        kr = min(topk, n)
        e = exact[r, :n]
        err = logits[r, :n].to(torch.float64) - e
        sigma = float(err.std())
        sigmas.append(sigma)
        spreads.append(sigma / float(e.std()))
        chosen = exact_top[r, :kr].long()
        topk_ratio.append(float(err[chosen].std()) / sigma if sigma > 0 and kr > 1 else float("nan"))
        selected = torch.zeros(n, dtype=torch.bool, device=e.device)
        selected[top[r, :kr].long()] = True
        lost = ~selected[chosen]
        lost_idx = chosen[lost]
        lost_total += int(lost.sum())
        entries += kr
        kth = e[chosen[-1]]
        if lost_idx.numel():
            gaps.append(((e[lost_idx] - kth).abs() / max(sigma, 1e-300)).cpu())
            ranks_rel.append(lost.nonzero().reshape(-1).cpu().to(torch.float64) / kr)
        h = max(1, kr // 4)
        head.append(float(selected[chosen[:h]].to(torch.float64).mean()))
    sigma_t = torch.tensor(sigmas, dtype=torch.float64, device=exact.device)
    gaps_t = torch.cat(gaps) if gaps else torch.zeros(0, dtype=torch.float64)
    ranks_t = torch.cat(ranks_rel) if ranks_rel else torch.zeros(0, dtype=torch.float64)
    recall = float(topk_recall_rows(top, exact_top).mean())
    return LossAnalysis(
        recall=recall,
        noise_to_spread=sum(spreads) / len(spreads),
        error_topk_ratio=float(torch.tensor(topk_ratio).nanmean()),
        lost_share=lost_total / max(entries, 1),
        lost_in_last_quarter=float((ranks_t >= 0.75).to(torch.float64).mean()) if ranks_t.numel() else float("nan"),
        lost_median_gap=float(gaps_t.median()) if gaps_t.numel() else float("nan"),
        lost_within_2sd=float((gaps_t <= 2).to(torch.float64).mean()) if gaps_t.numel() else float("nan"),
        head_recall=sum(head) / len(head),
        noise_model_recall=_noise_recall(exact, sigma_t, noise, exact_top, lengths, topk),
    ), sigma_t


def diagnose(inp: StudyInput, context: int, heads: int, *, topk: int = DEFAULT_TOPK,
             device: str | torch.device = "cpu", noise_seed: int = 1) -> Diagnostics:
    """Why FP4 loses top-k recall on one case, in numbers (torch path; see ``Diagnostics``).

    The noise model replaces a format's logit error by i.i.d. Gaussian noise of
    the same per-row std (one fixed draw from ``torch.Generator().manual_seed(noise_seed)``,
    shared by all formats): if its recall matches the measured one, recall is
    set by the error's size next to the density of scores at the k-th score,
    not by anything systematic. ``needed_error_factor`` is found by bisection
    (14 steps) on that model.

    Raises:
        KeyError: no rows for the case.
    """
    dev = _device(device)
    spec = inp.rows[(context, heads)]
    keys, q8, w8, lengths, exact, exact_top = _case_tensors(inp, context, heads, topk, dev)
    q, w = spec.queries.to(dev), spec.weights.to(dev)
    g = torch.Generator().manual_seed(noise_seed)
    noise = torch.randn(exact.shape, generator=g, dtype=torch.float64).to(dev)
    fp8_keys = fp8_dequantize_rows(*fp8_quantize_rows(keys, FP8_KEY_SCALE_FMT))
    fp8 = _shared_key_logits(q8, w8, fp8_keys, lengths)
    kf = keys.to(torch.float32)
    key_norm_total = float(kf.norm())
    variants, variant_err, fp4 = {}, {}, None
    for rule in SCALE_RULES:
        k_hat = fp4_keys_variant(keys, rule)
        variant_err[rule] = float((k_hat - kf).norm()) / key_norm_total
        lg = _shared_key_logits(q8, w8, k_hat, lengths)
        variants[rule] = float(topk_recall_rows(topk_reference(lg, topk, lengths=lengths), exact_top).mean())
        if rule == "ceil":
            fp4 = lg
            bf16q = _shared_key_logits(q, w, k_hat, lengths)
            fp4_bf16q = float(topk_recall_rows(topk_reference(bf16q, topk, lengths=lengths), exact_top).mean())
    a8, s8 = _loss_analysis(fp8, exact, exact_top, lengths, topk, noise)
    a4, s4 = _loss_analysis(fp4, exact, exact_top, lengths, topk, noise)
    target = a8.recall - 0.01
    if a4.noise_model_recall >= target:
        factor = 1.0
    else:
        lo, hi = 0.0, 1.0  # multiplier of FP4's error std: model recall(lo) >= target > model recall(hi)
        for _ in range(14):
            mid = (lo + hi) / 2
            if _noise_recall(exact, mid * s4, noise, exact_top, lengths, topk) >= target:
                lo = mid
            else:
                hi = mid
        factor = (lo + hi) / 2
    return Diagnostics(inp.kind, context, heads, topk, {"FP8": a8, "FP4": a4}, float((s4 / s8).mean()),
                       factor, variants, fp4_bf16q, variant_err, float((fp8_keys - kf).norm()) / key_norm_total)
