"""The whole study: every (workload, context, H) case, the diagnostics, and the environment it ran in.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..demo import _device
from .inputs import DEFAULT_TOPK, StudyInput
from .measuring import CaseResult, LOGITS_DTYPES, run_case
from .diagnostics import Diagnostics, diagnose

__all__ = [
    "StudyResult",
    "run_accuracy",
]


@dataclass
class StudyResult:
    """Everything ``run_accuracy`` measured."""

    device: str
    topk: int
    rows: int
    triton_max_context: int
    cases: list[CaseResult]
    diagnostics: list[Diagnostics]
    sources: dict[str, str]
    notes: list[str]
    seconds: float
    environment: dict[str, str]


def _environment(dev: torch.device) -> dict[str, str]:
    import triton

    env = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
           "device": str(dev)}
    if dev.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(dev)
    return env


def run_accuracy(inputs: Sequence[StudyInput], cases: Sequence[tuple[int, int]], *, topk: int = DEFAULT_TOPK,
                 device: str | torch.device = "cpu", triton_max_context: int | None = None,
                 logits_dtypes: Sequence[str] = tuple(LOGITS_DTYPES), seed: int = 0,
                 diagnose_cases: Sequence[tuple[str, int, int]] | None = None, keep_logits: bool = False,
                 log: Callable[[str], None] | None = None) -> StudyResult:
    """Run every (workload, context, H) case of the study, then the diagnostics.

    Args:
        inputs: one ``StudyInput`` per workload (order kept in the tables).
        cases: (context, H) pairs, each present in every input.
        topk: top-k.
        device: ``"cpu"`` or ``"cuda[:N]"``.
        triton_max_context: FP4 goes through the Triton kernels for contexts up
            to this (None: the smallest context on the CPU, all on CUDA; 0: never).
        logits_dtypes: FP4 logits dtypes.
        seed: page order of the FP4 cache.
        diagnose_cases: (workload, context, H) triples to diagnose (None: each
            workload at the largest context and the first H of ``cases``).
        keep_logits: keep logits tensors in the case results (memory!).
        log: progress callback, one line per step.

    Raises:
        ValueError: a case missing from an input, bad options (see ``run_case``).
    """
    started = time.perf_counter()
    dev = _device(device)
    log = log or (lambda line: None)
    cases = list(dict.fromkeys(cases))
    if not cases or not inputs:
        raise ValueError("inputs, cases: expected at least one of each")
    for inp in inputs:
        missing = [c for c in cases if c not in inp.rows]
        if missing:
            raise ValueError(f"inputs: the {inp.kind} input has no rows for (context, H) = {missing}; rebuild it "
                             f"for these cases")
    if triton_max_context is None:
        triton_max_context = min(c for c, _ in cases) if dev.type == "cpu" else max(c for c, _ in cases)
    if triton_max_context < 0:
        raise ValueError(f"triton_max_context: expected >= 0, got {triton_max_context}")
    results = []
    for inp in inputs:
        for context, heads in cases:
            use_triton = context <= triton_max_context
            log(f"{inp.kind}: context {context:,}, H {heads}, FP4 via {'Triton' if use_triton else 'torch oracle'}")
            res = run_case(inp, context, heads, topk=topk, device=dev, use_triton=use_triton,
                           logits_dtypes=logits_dtypes, seed=seed, keep_logits=keep_logits)
            f4, f8 = res.formats["FP4"], res.formats["FP8"]
            log(f"  recall FP8 {f8.recall_mean:.4f}  FP4 {f4.recall_mean:.4f}  ({res.seconds:.1f} s)")
            results.append(res)
    if diagnose_cases is None:
        first_h = cases[0][1]
        diagnose_cases = [(inp.kind, max(c for c, h in cases if h == first_h), first_h) for inp in inputs]
    by_kind = {inp.kind: inp for inp in inputs}
    diags = []
    for kind, context, heads in diagnose_cases:
        log(f"diagnostics: {kind}, context {context:,}, H {heads}")
        diags.append(diagnose(by_kind[kind], context, heads, topk=topk, device=dev))
    notes = [n for inp in inputs for n in inp.notes]
    return StudyResult(str(dev), topk, inputs[0].rows[cases[0]].rows, triton_max_context, results, diags,
                       {inp.kind: inp.source for inp in inputs}, notes, time.perf_counter() - started,
                       _environment(dev))
