"""``sglang-fp4-indexer accuracy``: its options and its run (``cli.py`` wires it).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from typing import Callable, Sequence

from rich.console import Console
from rich.markup import escape

from ..argtypes import int_list, integer, number
from ..demo import _device
from ..workload import check_memory, check_output_dir, check_output_path
from .inputs import (
    DEFAULT_CONTEXTS,
    DEFAULT_ROWS,
    DEFAULT_TOPK,
    GPU_CONTEXTS,
    NEEDLE_MARGIN,
    STUDY_HEADS,
    STUDY_WORKLOADS,
    StudyInput,
    build_study_input,
    load_inputs,
    save_inputs,
)
from .measuring import LOGITS_DTYPES
from .study import StudyResult, run_accuracy
from .output import load_result, write_outputs

__all__ = [
    "add_arguments",
    "main",
]


def _name_list(choices: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        values = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in values if v not in choices]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(choices)}, got {text!r}")
        return values
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``accuracy`` subcommand's options to ``parser``."""
    parser.add_argument("--device", default="cpu", help="'cpu' (default; Triton interpreter) or 'cuda' / 'cuda:N'")
    parser.add_argument("--workloads", type=_name_list(STUDY_WORKLOADS), default=list(STUDY_WORKLOADS),
                        help=f"comma-separated subset of {','.join(STUDY_WORKLOADS)} (default: all)")
    parser.add_argument("--contexts", type=int_list(1), default=None,
                        help="comma-separated context lengths (default 1024,4096,16384,65536; "
                             "with --device cuda also 131072)")
    parser.add_argument("--heads", type=int_list(1), default=list(STUDY_HEADS),
                        help="comma-separated index head counts (default 64,32)")
    parser.add_argument("--rows", type=integer(1), default=None,
                        help=f"decode rows per case (default {DEFAULT_ROWS}, or the --load-workload file's)")
    parser.add_argument("--topk", type=integer(1), default=DEFAULT_TOPK, help=f"top-k (default {DEFAULT_TOPK})")
    parser.add_argument("--seed", type=int, default=0, help="projection / sampling / page-order seed (default 0)")
    parser.add_argument("--logits-dtypes", type=_name_list(tuple(LOGITS_DTYPES)), default=list(LOGITS_DTYPES),
                        help="FP4 logits dtypes to measure (default fp32,bf16,fp16)")
    parser.add_argument("--triton-max-context", type=integer(0), default=None,
                        help="run the Triton kernels for contexts up to this (default: the smallest context on "
                             "the CPU, every context on CUDA; 0: never)")
    parser.add_argument("--needle-margin", type=number(0, exclusive_minimum=True), default=NEEDLE_MARGIN,
                        help=f"needle's exact logit over the best other key's, minus 1 (default {NEEDLE_MARGIN})")
    parser.add_argument("--no-diagnostics", action="store_true", help="skip the diagnostics")
    parser.add_argument("--save-workload", metavar="PATH", default=None,
                        help="save the built inputs (all --workloads) to PATH (.pt)")
    parser.add_argument("--save-only", action="store_true", help="with --save-workload: build, save and stop")
    parser.add_argument("--load-workload", metavar="PATH", default=None,
                        help="take the inputs of the kinds this file holds from it (e.g. text built on a machine "
                             "with the model); the other --workloads are built here")
    parser.add_argument("--from-json", metavar="PATH", default=None,
                        help="only re-render the tables and the plot of an accuracy.json (e.g. from a GPU run) "
                             "into --out-dir; measures nothing")
    parser.add_argument("--out-dir", default="out/accuracy",
                        help="where accuracy.md, accuracy.json and accuracy.png go (default ./out/accuracy)")


def main(args: argparse.Namespace, console: Console | None = None) -> int:
    """Run the ``accuracy`` subcommand from parsed arguments. Returns the exit code (1 if a Triton check failed).

    Raises:
        ValueError: bad or conflicting options, each checked before any slow
            work: an ``--out-dir`` that is a file or cannot be created, contexts
            shorter than twice the rows (see also ``build_study_input``, ``run_accuracy``).
    """
    console = console or Console()
    started = time.perf_counter()
    try:
        check_output_dir(args.out_dir)  # before any work whose results go there
    except ValueError as exc:
        raise ValueError(f"--out-dir: {exc}") from None
    if args.from_json is not None:
        try:
            result, command = load_result(args.from_json)
        except ValueError as exc:
            raise ValueError(f"--from-json: {exc}") from None
        return _report(result, args.out_dir, command, console)
    dev = _device(args.device)  # fail before the (slow) input build
    if args.save_only and not args.save_workload:
        raise ValueError("--save-only: needs --save-workload PATH")
    if args.save_workload is not None:
        try:
            check_output_path(args.save_workload)  # before the (slow) build
        except ValueError as exc:
            raise ValueError(f"--save-workload: {exc}") from None
    for name in ("rows", "topk"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name}: expected >= 1, got {value}")
    from ..ops.paged_logits import SUPPORTED_HEADS

    bad_heads = [h for h in args.heads if h not in SUPPORTED_HEADS]
    if bad_heads:
        raise ValueError(f"--heads: {bad_heads} not supported by the scorer (supported: {SUPPORTED_HEADS})")
    contexts = args.contexts or list(GPU_CONTEXTS if dev.type == "cuda" else DEFAULT_CONTEXTS)
    check_memory(max(contexts), "--contexts", dev)
    cases = [(c, h) for c in sorted(set(contexts)) for h in dict.fromkeys(args.heads)]

    def log(line: str) -> None:
        console.print(f"[{time.perf_counter() - started:6.1f} s] {line}", highlight=False)

    loaded: dict[str, StudyInput] = {}
    if args.load_workload is not None:
        try:
            file_inputs = load_inputs(args.load_workload)
        except ValueError as exc:
            raise ValueError(f"--load-workload: {exc}") from None
        for inp in file_inputs:
            loaded[inp.kind] = inp
        log(f"loaded {', '.join(loaded)} from {escape(args.load_workload)}")
    rows = args.rows
    if loaded:
        file_rows = {spec.rows for inp in loaded.values() for spec in inp.rows.values()}
        if len(file_rows) != 1 or (rows is not None and rows not in file_rows):
            raise ValueError(f"--rows: the file's inputs have {sorted(file_rows)} rows per case; "
                             f"drop --rows or rebuild the file")
        rows = file_rows.pop()
    rows = rows or DEFAULT_ROWS
    short = [c for c in contexts if c < 2 * rows]
    if short:
        raise ValueError(f"--contexts: {short} below 2 x {rows} rows = {2 * rows} keys (each case needs twice "
                         "as many keys as decode rows); give longer contexts or fewer --rows")
    inputs = []
    for kind in args.workloads:
        if kind in loaded:
            inputs.append(loaded[kind])
            continue
        log(f"building the {kind} input: contexts up to {max(contexts):,}, H {args.heads}, {rows} rows")
        inputs.append(build_study_input(kind, cases, rows, args.seed, needle_margin=args.needle_margin, device=dev))
    for inp in inputs:
        for note in inp.notes:
            console.print(escape(note), style="yellow")
    if args.save_workload is not None:
        save_inputs(inputs, args.save_workload)
        log(f"saved {', '.join(i.kind for i in inputs)} to {escape(args.save_workload)}")
        if args.save_only:
            return 0
    result = run_accuracy(inputs, cases, topk=args.topk, device=dev, triton_max_context=args.triton_max_context,
                          logits_dtypes=args.logits_dtypes, seed=args.seed,
                          diagnose_cases=[] if args.no_diagnostics else None, log=log)
    command = "sglang-fp4-indexer " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["accuracy"] else None
    return _report(result, args.out_dir, command, console)


def _report(result: StudyResult, out_dir: str, command: str | None, console: Console) -> int:
    """Write the outputs, print the tables; exit code 1 if a Triton store check failed."""
    paths = write_outputs(result, out_dir, command)
    console.print(paths["markdown"].read_text(), markup=False, highlight=False, soft_wrap=True)
    for kind, path in paths.items():
        console.print(f"wrote {kind}: {path}")
    if "plot" not in paths:
        console.print("notice: matplotlib is not installed; no plot (pip install 'sglang-fp4-indexer[plot]')",
                      style="yellow")
    failed = [c for c in result.cases if c.store_bit_exact is False]
    return 1 if failed else 0
