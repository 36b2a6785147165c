"""``sglang-fp4-indexer bench``: the benchmark harness and its peers.

Times, side by side, per scorer shape: this project's paged FP4 scorer,
SGLang's own Triton FP4 scorer and DeepGEMM's FP8 scorers (each when it can
run, else ``unavailable: <reason>``), against the HBM floor measured in the
same run, and checks every timed output against the torch oracle; also the
store op against its floor and the CTA planner against its 5 us target.
docs/benchmarks.md describes the method.

Modules: ``shapes`` (the grid), ``floor`` (byte counts and floors), ``timing``
(CUDA graphs, copy bandwidth, L2 rotation), ``inputs`` (random caches on the
device), ``checks`` (the oracle comparisons), ``scorers`` (ours and the peers),
``peers`` (loading SGLang's kernel module and DeepGEMM), ``runner`` (one run),
``report`` (table, summary, JSON, plot), ``prefill`` (the ``--prefill`` rows:
gather and ragged scoring, TFLOP/s against the FP8 MMA rate measured in the
same run), ``history`` (the table of past headline results,
benchmarks/results/headline.csv, appended from a saved report).

This package module imports nothing heavy: ``cli.py`` builds its parser
before deciding whether Triton must run in interpreter mode. SGLang is loaded
only by ``peers``, lazily, and only on a CUDA device.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench`` subcommand's options to ``parser``."""
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                        help="where to run: cuda (CUDA graphs), cpu (Triton interpreter, tiny shapes, "
                             "not a speed figure) or auto (cuda when available)")
    parser.add_argument("--quick", action="store_true",
                        help="a first look: a short list of headline serving shapes only (the 'quick' set; "
                             "default on a GPU: the full grid); "
                             "GPU-sized, so refused with --device cpu")
    parser.add_argument("--shapes", default=None, metavar="LIST",
                        help="comma-separated HxBATCHxCONTEXTxNEXT_N shapes (K = 1024, e.g. 64x8x128Kx1) "
                             "and/or set names quick, full, cpu (default: full on a GPU, cpu on the CPU; "
                             "quick and full are refused on the CPU)")
    parser.add_argument("--scorers", default="ours,sglang,deepgemm,deepgemm-native,deepgemm-multicast",
                        metavar="LIST",
                        help="scorers to time: ours, sglang (SGLang's Triton FP4), deepgemm (DeepGEMM FP8 as "
                             "SGLang calls it on this GPU), deepgemm-native (DeepGEMM FP8 with its native next_n), "
                             "deepgemm-multicast (DeepGEMM's newer SM90 FP8 kernel, next_n 4 on a 2-CTA cluster, "
                             "through this project's launcher)")
    parser.add_argument("--impl", default=None, metavar="LIST",
                        help="paged_logits impl variants to time as separate 'ours' columns (default: the op's default)")
    parser.add_argument("--store-tokens", type=int, default=None, metavar="N",
                        help="tokens of the store-op row (default 65536 on a GPU, 256 on the CPU; 0 skips it)")
    parser.add_argument("--planner-batch", type=int, default=None, metavar="N",
                        help="batch of the planner row (default 64; 0 skips it)")
    parser.add_argument("--copy-mib", type=int, default=None, metavar="MIB",
                        help="size of the bandwidth-measuring copy (default 1024 on a GPU, 64 on the CPU)")
    parser.add_argument("--prefill", action="store_true",
                        help="run only the prefill rows: gather and ragged scoring of 4K/16K/32K new tokens "
                             "with 0 and 32K prefix, H 64, TFLOP/s against the FP8 MMA rate measured in the same run")
    parser.add_argument("--prefill-shapes", default=None, metavar="LIST",
                        help="with --prefill: comma-separated HxNEWxPREFIX shapes (K = 1024, e.g. 64x16Kx32K) "
                             "and/or gpu, cpu (default: gpu on a GPU, cpu on the CPU)")
    parser.add_argument("--prefill-budget-mib", type=float, default=None, metavar="MIB",
                        help="with --prefill: logits byte budget of the chunked scoring loop "
                             "(default 2048 on a GPU, 2 KiB on the CPU)")
    parser.add_argument("--mma-size", type=int, default=None, metavar="N",
                        help="with --prefill: side of the e4m3 torch._scaled_mm measuring the FP8 MMA rate "
                             "(default 8192 on a GPU, 64 on the CPU; 0 skips it)")
    parser.add_argument("--seed", type=int, default=0, help="input seed")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="write the full report as JSON (its folder must exist)")
    parser.add_argument("--plot", default=None, metavar="PATH",
                        help="save a PNG bar chart of the decode rows: one panel per index-head count, one bar per "
                             "scorer and shape (time per call, log scale), the FP4 floor as a tick (needs "
                             "matplotlib; its folder must exist)")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def _resolve_device(name: str):
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() and not _interpreting() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available")
        if _interpreting():
            raise ValueError("--device cuda: TRITON_INTERPRET=1 is set; unset it to time on the GPU")
        return torch.device("cuda", torch.cuda.current_device())
    if not _interpreting():
        if "triton" in sys.modules:
            raise ValueError("--device cpu needs TRITON_INTERPRET=1 set before Triton is imported "
                             "(run it through the sglang-fp4-indexer command, or set the variable)")
        os.environ["TRITON_INTERPRET"] = "1"
    return torch.device("cpu")


def _positive_or_none(value, name: str, default):
    if value is None:
        return default
    if value < 0:
        raise ValueError(f"{name}: expected >= 0, got {value}")
    return value or None


#: Shape sets sized for a GPU: in the Triton interpreter they run for hours.
GPU_SHAPE_SETS = ("quick", "full")


def _check_cpu_shapes(args: argparse.Namespace) -> None:
    """On the CPU, refuse the GPU shape sets (``--quick``, ``--shapes quick|full``) instead of running them.

    Raises:
        ValueError: naming the option and what to pass instead.
    """
    fix = ("on the CPU give --shapes cpu (the default) or small HxBATCHxCONTEXTxNEXT_N shapes, e.g. "
           "--shapes 32x1x256x1, or run on a GPU with --device cuda")
    if args.quick and not args.shapes:
        raise ValueError(f"--quick: its shapes (up to 32 x 128K keys) are GPU-sized and would run for hours in "
                         f"the Triton interpreter; {fix}")
    names = [item.strip().lower() for item in (args.shapes or "").split(",")]
    big = [name for name in GPU_SHAPE_SETS if name in names]
    if big:
        raise ValueError(f"--shapes: the set {big[0]!r} is GPU-sized and would run for hours in the Triton "
                         f"interpreter; {fix}")


def _check_scorer_options(shapes) -> None:
    """Shapes the paged scorer cannot run, before anything is timed (unknown ``--impl`` names:
    ``make_scorers``).

    Raises:
        ValueError: an H outside ``ops.paged_logits.SUPPORTED_HEADS`` or a
            ``next_n`` above ``MAX_NEXT_N`` (``--shapes``).
    """
    from ..ops.paged_logits import MAX_NEXT_N, SUPPORTED_HEADS

    bad = [s.spec for s in shapes if s.heads not in SUPPORTED_HEADS]
    if bad:
        raise ValueError(f"--shapes: H of {', '.join(bad)} not supported by the paged scorer "
                         f"(supported H: {SUPPORTED_HEADS})")
    bad = [s.spec for s in shapes if s.next_n > MAX_NEXT_N]
    if bad:
        raise ValueError(f"--shapes: next_n of {', '.join(bad)} above the paged scorer's MAX_NEXT_N = {MAX_NEXT_N}")


def _check_output_files(args: argparse.Namespace) -> None:
    """``--json`` and ``--plot`` name files whose folder exists (the rule of every file option), before any work.

    Raises:
        ValueError: naming the option (``workload.check_output_path``).
    """
    from ..workload import check_output_path

    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None:
            try:
                check_output_path(path)
            except ValueError as exc:
                raise ValueError(f"{flag}: {exc}") from None


def main(args: argparse.Namespace, console=None) -> int:
    """Run the benchmark with parsed ``args``; print the table once, then a short summary last
    (versions, failed shapes, the store op and the planner).

    Returns:
        0 when every timed output passed its check, 1 otherwise.

    Raises:
        ValueError: bad options (the CLI turns it into a usage error): among
            them, on the CPU, the GPU shape sets (``--quick``, ``--shapes
            quick|full``; ``_check_cpu_shapes``), shapes the paged scorer cannot
            run (``_check_scorer_options``), unknown ``--impl`` names (``make_scorers``)
            and a ``--json`` / ``--plot`` file whose folder does not exist (``_check_output_files``).
    """
    from rich.console import Console

    _check_output_files(args)
    device = _resolve_device(args.device)
    from .runner import CPU_STORE_TOKENS, GPU_STORE_TOKENS, PLANNER_BATCH, BenchConfig, run_benchmark
    from .report import render_summary, render_table, write_json, write_plot
    from .scorers import make_scorers
    from .shapes import parse_shapes

    if console is None:
        console = Console()
        if not console.is_terminal:  # a log file: do not wrap the tables at 80 columns
            console = Console(width=200)
    cpu = device.type == "cpu"
    if getattr(args, "prefill", False):
        return _main_prefill(args, device, console)
    if cpu:
        _check_cpu_shapes(args)
    spec = args.shapes or ("quick" if args.quick else "cpu" if cpu else "full")
    shapes = parse_shapes(spec)
    impls = [i.strip() for i in args.impl.split(",") if i.strip()] if args.impl else None
    _check_scorer_options(shapes)
    scorers = make_scorers([s.strip() for s in args.scorers.split(",") if s.strip()], impls)
    if not scorers:
        raise ValueError("--scorers: expected at least one scorer")
    copy_bytes = None if args.copy_mib is None else _positive_or_none(args.copy_mib, "--copy-mib", None)
    config = BenchConfig(
        device=device,
        shapes=shapes,
        scorers=scorers,
        seed=args.seed,
        store_tokens=_positive_or_none(args.store_tokens, "--store-tokens", CPU_STORE_TOKENS if cpu else GPU_STORE_TOKENS),
        planner_batch=_positive_or_none(args.planner_batch, "--planner-batch", PLANNER_BATCH),
        copy_bytes=copy_bytes * (1 << 20) if copy_bytes else None,
        command=shlex.join(["sglang-fp4-indexer", *sys.argv[1:]]) if sys.argv[1:2] == ["bench"] else "",
    )
    if args.plot:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise ValueError("--plot: matplotlib is not installed (pip install 'sglang-fp4-indexer[plot]')")
    console.print(f"bench on {device}: {len(shapes)} shape(s), scorers {', '.join(s.name for s in scorers)}")
    progress = (lambda partial: write_json(partial, args.json)) if args.json else None
    report = run_benchmark(config, log=console.print, on_progress=progress)
    console.print(render_table(report))
    if args.json:
        console.print(f"report: {write_json(report, args.json)}")
    if args.plot:
        console.print(f"plot: {write_plot(report, args.plot)}")
    console.print(render_summary(report, rows=False), highlight=False, markup=False, soft_wrap=True)
    return 0 if report["failures"] == 0 else 1


def _main_prefill(args: argparse.Namespace, device, console) -> int:
    """``bench --prefill``: the prefill rows only (``prefill.bench_prefill``)."""
    from .prefill import (
        CPU_BUDGET_BYTES, CPU_MMA_SIZE, GPU_BUDGET_BYTES, GPU_MMA_SIZE, PrefillConfig, bench_prefill,
        parse_prefill_shapes, render_prefill_summary, render_prefill_table,
    )
    from .report import write_json

    if args.quick or args.shapes or args.plot:
        raise ValueError("--prefill runs only the prefill rows: use --prefill-shapes, not --quick/--shapes/--plot")
    cpu = device.type == "cpu"
    shapes = parse_prefill_shapes(args.prefill_shapes or ("cpu" if cpu else "gpu"))
    if args.prefill_budget_mib is None:
        budget = CPU_BUDGET_BYTES if cpu else GPU_BUDGET_BYTES
    elif not args.prefill_budget_mib > 0:
        raise ValueError(f"--prefill-budget-mib: expected > 0, got {args.prefill_budget_mib}")
    else:
        budget = max(1, int(args.prefill_budget_mib * (1 << 20)))
    if args.mma_size is not None and args.mma_size < 0:
        raise ValueError(f"--mma-size: expected >= 0, got {args.mma_size}")
    mma_size = (CPU_MMA_SIZE if cpu else GPU_MMA_SIZE) if args.mma_size is None else args.mma_size
    copy_mib = _positive_or_none(args.copy_mib, "--copy-mib", None)
    config = PrefillConfig(
        device=device, shapes=shapes, budget_bytes=budget, mma_size=mma_size, seed=args.seed,
        copy_bytes=copy_mib * (1 << 20) if copy_mib else None,
        command=shlex.join(["sglang-fp4-indexer", *sys.argv[1:]]) if sys.argv[1:2] == ["bench"] else "",
    )
    console.print(f"bench --prefill on {device}: {len(shapes)} shape(s), logits budget {budget} bytes "
                  "(the chunked scoring loop is timed whole)", markup=False)
    progress = (lambda partial: write_json(partial, args.json)) if args.json else None
    report = bench_prefill(config, log=lambda line: console.print(line, markup=False, highlight=False),
                           on_progress=progress)
    console.print(render_prefill_table(report))
    if args.json:
        console.print(f"report: {write_json(report, args.json)}")
    console.print(render_prefill_summary(report), highlight=False, markup=False, soft_wrap=True)
    return 0 if report["failures"] == 0 else 1
