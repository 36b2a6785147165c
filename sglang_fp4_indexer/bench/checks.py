"""Correctness checks of every timed output against the torch oracle, in the same run.

Reference: ``reference.paged_logits_reference`` (exact decode, fp64 sums) on
the rows of ``inputs.checked_requests`` (the first and last request: a subset,
to keep the check fast at 128 K keys). Error bound per (row, column), as in
tests/test_paged_logits.py: ``bound = sum_h |w_h| * sum_d |q_hd * k_d|``, the sum
of the magnitudes of every term of the logit; a scorer passes where
``|out - ref| <= rel * bound``. Tolerances (``rel``):

* this project's scorer: ``OURS_REL`` = 1e-3. Products are exact (e4m3 x e4m3,
  or the same values in fp16/bf16) and sums fp32 (2**-24 per addition, a few
  dozen additions), but Hopper's FP8 MMA adds products in an accumulator
  narrower than fp32 (DeepGEMM's notes); 1e-3 is the bound the project's GPU
  test uses. The Hopper CUDA kernel (``wgmma``) accumulates in f16 and decodes the
  groups far below their key's largest with rounding: ``sm90.rel_bound()`` (its
  f16 accumulation and head sum) of the bound plus ``sm90.logit_error_floor``
  per (row, key), computed from the inputs (``Expected.floor``).
* SGLang's Triton FP4 scorer: ``SGLANG_REL`` = 2e-2. Its own semantics round
  four times to bf16 (the weights, each head's dot, each weighted head score,
  the logit), each within 2**-8 (bf16's unit roundoff) of the bound: 4 x 2**-8 = 1.6e-2 < 2e-2.
* DeepGEMM's FP8 scorer: ``DEEPGEMM_REL`` = 1e-2, on an FP8 copy of the same
  keys that is exact (``inputs.SCALE_CODES``), so its reference is the same.

Beyond the checked rows, the whole output is swept for what needs no
reference: this project's scorer writes every element (outputs are poisoned
with NaN before the run, so an unwritten element is NaN) and writes ``-inf`` at
every column at or past its row's length. The peers leave columns past the
length unwritten by contract (SGLang's ``fp4_index_logits_paged`` and
DeepGEMM with ``clean_logits=False``), so only their visible columns are
compared.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..format import dequantize_index_k
from ..ops import sm90
from ..pool import read_index_k
from ..reference import expand_context_lens, logits_from_keys, paged_logits_reference, paged_slots
from .inputs import ScorerInputs, checked_requests

__all__ = ["OURS_REL", "SGLANG_REL", "DEEPGEMM_REL", "Expected", "CheckResult", "expected_logits", "check_logits"]

OURS_REL = 1e-3
SGLANG_REL = 2e-2
DEEPGEMM_REL = 1e-2


@dataclass
class Expected:
    """The reference for the checked rows of one shape.

    Attributes:
        rows: global row indices checked.
        lens: int64 ``[len(rows)]`` visible keys of each.
        logits: fp32 ``[len(rows), width]`` from ``paged_logits_reference``.
        bound: fp64 ``[len(rows), width]`` term-magnitude bound (0 past the length).
        all_lens: int64 ``[rows_total]`` visible keys of every row (for the -inf sweep).
        floor: fp64 ``[len(rows), width]`` the Hopper kernel's ``sm90.logit_error_floor`` (0 past the length;
            None where not computed), added to the tolerance of a scorer that asks for it.
    """

    rows: list[int]
    lens: torch.Tensor
    logits: torch.Tensor
    bound: torch.Tensor
    all_lens: torch.Tensor
    floor: torch.Tensor | None = None


@dataclass
class CheckResult:
    """Outcome of checking one op's outputs.

    Attributes:
        ok: every check passed.
        detail: what was checked, or the first failure.
        worst: largest ``|out - ref| / (rel * bound)`` over the checked elements
            (``<= 1`` passes); ``nan`` where not applicable.
        rows_checked: rows compared with the reference (per output set).
        sets_checked: output sets checked.
    """

    ok: bool
    detail: str
    worst: float = float("nan")
    rows_checked: int = 0
    sets_checked: int = 0

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "detail": self.detail,
            "worst": self.worst,
            "rows_checked": self.rows_checked,
            "sets_checked": self.sets_checked,
        }


def expected_logits(inputs: ScorerInputs) -> Expected:
    """Reference logits and error bounds for the rows of ``checked_requests`` (module docstring).

    Computed on ``inputs.caches[0]`` (every set holds the same keys).
    """
    shape = inputs.shape
    next_n = shape.next_n
    cache = inputs.caches[0]
    reqs = checked_requests(shape)
    req_idx = torch.tensor(reqs, device=inputs.device)
    rows = [b * next_n + i for b in reqs for i in range(next_n)]
    row_idx = torch.tensor(rows, device=inputs.device)
    q = inputs.q[row_idx]
    w = inputs.weights[row_idx]
    bt = inputs.block_table[req_idx]
    lens_req = inputs.context_lens[req_idx]
    ref = paged_logits_reference(q, w, cache, bt, lens_req, width=inputs.width)
    lens = expand_context_lens(lens_req, next_n).reshape(-1)
    bound = torch.zeros(len(rows), inputs.width, dtype=torch.float64, device=inputs.device)
    floor = torch.zeros_like(bound)
    for j, b in enumerate(reqs):
        longest = int(lens[j * next_n : (j + 1) * next_n].max())
        if longest == 0:
            continue
        payload, scales = read_index_k(cache, paged_slots(inputs.block_table[b], longest))
        keys = dequantize_index_k(payload, scales).abs()
        for i in range(next_n):
            r = j * next_n + i
            n = int(lens[r])
            if n:
                bound[r, :n] = logits_from_keys(q[r].float().abs(), w[r].abs(), keys[:n])
                floor[r, :n] = sm90.logit_error_floor(q[r].float(), w[r], keys[:n], scales[:n])
    all_lens = expand_context_lens(inputs.context_lens, next_n).reshape(-1)
    return Expected(rows, lens, ref, bound, all_lens, floor)


def _compare_rows(out: torch.Tensor, exp: Expected, rel: float, visible_only: bool,
                  floor: bool = False) -> tuple[bool, str, float]:
    got = out[torch.tensor(exp.rows, device=out.device)].to(torch.float64)
    ref = exp.logits.to(torch.float64)
    cols = torch.arange(ref.shape[1], device=ref.device)
    visible = cols[None, :] < exp.lens[:, None]
    if torch.isnan(got[visible]).any():
        return False, "NaN in a visible column of a checked row", float("nan")
    if not torch.isfinite(got[visible]).all():
        return False, "a visible column of a checked row is not finite", float("inf")
    if not visible_only and not torch.all(got[~visible] == float("-inf")):
        return False, "a column past a checked row's length is not -inf", float("nan")
    err = (got - ref).abs()[visible]
    allowed = rel * exp.bound[visible]
    if floor:
        if exp.floor is None:
            raise ValueError("floor: the reference was computed without Expected.floor")
        allowed = allowed + exp.floor[visible]
    worst = float((err / allowed.clamp_min(1e-300)).max()) if err.numel() else 0.0
    if err.numel() and not torch.all(err <= allowed):
        plus = " + floor" if floor else ""
        return False, f"|out - ref| exceeds {rel:g} x bound{plus} (worst {worst:.3g} x the tolerance)", worst
    return True, "", worst


def check_logits(outputs: dict[int, torch.Tensor], exp: Expected, rel: float, *, writes_all: bool,
                 floor: bool = False) -> CheckResult:
    """Check every rotation set's output of one scorer against the reference.

    Args:
        outputs: set index -> fp32 ``[rows, >= width]`` logits (a peer may return
            a wider, strided output; only the first ``width`` columns are read).
        exp: ``expected_logits`` of the shape.
        rel: tolerance relative to the term-magnitude bound.
        writes_all: the scorer's contract writes every element (``-inf`` past
            the length): sweep the whole output for NaN and the ``-inf`` tail.
        floor: add ``exp.floor`` (the Hopper kernel's ``sm90.logit_error_floor``) to the tolerance.

    Returns:
        ``CheckResult`` (``ok`` False on the first failing set, naming it).
    """
    worst = 0.0
    if not outputs:
        return CheckResult(False, "no output was produced")
    for s in sorted(outputs):
        out = outputs[s]
        if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != exp.all_lens.shape[0]:
            return CheckResult(False, f"set {s}: output is not a [rows, width] tensor", sets_checked=s)
        if out.shape[1] < exp.logits.shape[1]:
            return CheckResult(False, f"set {s}: output has {out.shape[1]} columns, expected {exp.logits.shape[1]}")
        out = out[:, : exp.logits.shape[1]]
        if writes_all:
            if torch.isnan(out).any():
                return CheckResult(False, f"set {s}: an output element was left unwritten (NaN)", sets_checked=s)
            cols = torch.arange(out.shape[1], device=out.device)
            tail = cols[None, :] >= exp.all_lens.to(out.device)[:, None]
            if not torch.all(out[tail] == float("-inf")):
                return CheckResult(False, f"set {s}: a column at or past its row's length is not -inf", sets_checked=s)
        ok, why, w = _compare_rows(out, exp, rel, visible_only=not writes_all, floor=floor)
        if w == w:  # not NaN
            worst = max(worst, w)
        if not ok:
            return CheckResult(False, f"set {s}: {why}", w, len(exp.rows), s)
    scope = "all elements written, -inf tails, " if writes_all else "visible columns, "
    return CheckResult(
        True,
        f"{scope}{len(exp.rows)} rows vs reference within {rel:g} x bound{' + floor' if floor else ''}, "
        f"{len(outputs)} set(s)",
        worst,
        len(exp.rows),
        len(outputs),
    )
