"""Rebuild the measured tables that ``sglang-fp4-indexer check --context`` quotes.

    PYTHONPATH=. python3 scripts/update_check_tables.py BENCH_JSON ACCURACY_JSON [--model-accuracy JSON [JSON ...]]
        [--sglang-one-batch JSONL --sglang-profile JSON [JSON ...] --sglang-gpu NAME --sglang-date DATE]
        [--serving-profile JSON [JSON ...] --serving-gpu NAME --serving-date DATE --serving-stack TEXT
         --serving-layers N] [--cycle JSON:NEXT_N [...] --cycle-gpu NAME --cycle-date DATE --cycle-stack TEXT
         --cycle-rank TEXT --cycle-moe-gpus N] [--cycle-more JSON:NEXT_N [...] --cycle-more-gpu NAME
         --cycle-more-date DATE --cycle-more-stack TEXT --cycle-more-rank TEXT --cycle-more-moe-gpus N
         [--cycle-more-other-order JSON:NEXT_N [...]] [--cycle-more-load FP8_JSONL FP4_JSONL PRINTED NEXT_N
         [--cycle-more-load-other-order FP8_JSONL FP4_JSONL PRINTED]]]
        [--cycle-fused JSON:NEXT_N --cycle-fused-gpu NAME --cycle-fused-date DATE --cycle-fused-stack TEXT
         --cycle-fused-rank TEXT --cycle-fused-model NAME]
        [--bench-more BENCH_JSON [BENCH_JSON ...]] [--out PATH]

BENCH_JSON: a ``sglang-fp4-indexer bench --device cuda --json`` report measured
on an H200 (the FP8 times come from its ``deepgemm-fp8`` column when it has
one; without it the table says the FP8 time is not measured). ACCURACY_JSON:
an ``accuracy.json`` written by ``sglang-fp4-indexer accuracy`` (the GPU study
reaches 128K contexts). ``--model-accuracy``: ``model-accuracy.json`` results of
``sglang-fp4-indexer model-accuracy`` (the real-model study, stand-in and trained
indexer, CPU or GPU; a case measured by several is taken from the first given;
their loss and passkey numbers are what check's verdict quotes as the measured cost).
``--sglang-one-batch`` / ``--sglang-profile``: SGLang's ``bench_one_batch`` result lines and the decode kernel
tables (``scripts/sglang_bench.py profile-table --json``) of FP8 and FP4 runs of DeepSeek-V3.2's layer sizes
(``scripts/sglang_gpu_check.sh e2e``): check quotes their decode step at exactly those shapes.
``--serving-profile``: ``profile-table --json`` results of FP8 and FP4 servers profiled on another GPU
(``scripts/sglang_gpu_check.sh profile`` with MTP off, no ``SERVE_SPEC``: the rows are recorded as next_n 1):
their scorer kernels per layer (``--serving-layers``: the model's indexer layers) and decode step become the
timing rows check quotes for that GPU. ``--cycle``: ``scripts/sglang_bench.py timeline --json`` summaries of FP8 and
FP4 servers on one DP-attention + EP8 rank of DeepSeek-V3.2 cut to fewer layers (``scripts/sglang_gpu_check.sh
profile`` with ``PROFILE_SIZE=v32-rank``), each with the next_n its server verified: check quotes their busy time per
cycle, measured and projected to 61 layers, at exactly those shapes (``--cycle-rank``: what one GPU held, as check
names it; ``--cycle-moe-gpus``: the GPUs the routed experts spread over, the ``--tp-size`` check requires).
``--cycle-more``: the same for a further run on another GPU or rank (e.g. all 61 layers of an EP32 rank on an
H100, FP8 server then FP4 server), with its own ``--cycle-more-*`` facts; ``--cycle-more-other-order``: summaries
of the same shapes with the servers in the other order (FP4's first), whose busy times check quotes beside them;
``--cycle-more-load``: a KV-limited ``bench_serving`` load on the same rank (``scripts/sglang_gpu_check.sh serving``
with more requests than FP8's pool holds): each server's result line, what the pair printed (both servers' pool
lines) and the next_n its servers verified; check quotes its output tokens/s at exactly that per-rank concurrency
and context; ``--cycle-more-load-other-order``: the same load with the FP4 server first, quoted beside it.
``--cycle-fused``: timeline summaries of FP8 and FP4 servers of a model whose index path FP4 changes (GLM-5's
layers, ``PROFILE_SIZE=glm5-layers``: SGLang's fused index-query kernel for FP8, its unfused path and the plugin's
rotation for FP4), with its own ``--cycle-fused-*`` facts: check quotes it for that path. ``--bench-more``: further
``bench --json`` reports of other GPUs (e.g. the H100's runs beside DeepGEMM's newer SM90 kernel at next_n 1, 2 and
4), one ``timing_more`` section per GPU; a shape measured by several takes the median of the times of the newest day's
reports that measured it: check quotes
them for that GPU where its in-server rows have none near the shape. Writes ``sglang_fp4_indexer/data/h200_tables.json``
(shipped inside the wheel) unless ``--out`` says otherwise, and prints what it took.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sglang_fp4_indexer.tables import (
    TABLES_RESOURCE,
    bench_timing_section,
    build_tables,
    serving_timing_section,
    sglang_decode_section,
    verify_cycle_section,
    cycle_sections,
    kv_limited_load,
    kv_pools,
)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "sglang_fp4_indexer" / TABLES_RESOURCE


def _source(path: str) -> str:
    """The path as recorded: relative to the repository root when inside it (tests rebuild from it)."""
    full = Path(path).resolve()
    return str(full.relative_to(ROOT)) if full.is_relative_to(ROOT) else full.name


def _read(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"update_check_tables: {path}: cannot be read as JSON ({exc})") from None


def _depth(summaries: list[tuple[dict, int]]) -> str:
    """The depths timeline summaries ran at, as a section's method names them: "all 61" or "3 of its 78" (joined
    where several)."""
    depths = {(s["layers"], s["full_depth"]) for s, _ in summaries}
    return ", ".join(f"all {f}" if layers == f else f"{layers} of its {f}" for layers, f in sorted(depths))


def _add_run_facts(parser: argparse.ArgumentParser, flag: str, rank_example: str) -> None:
    """``FLAG-gpu``, ``FLAG-date``, ``FLAG-stack`` and ``FLAG-rank``: what was measured where, for a further
    verify-cycle run given by ``flag`` (``--cycle-more``, ``--cycle-fused``)."""
    parser.add_argument(f"{flag}-gpu", default=None, help=f"the GPU of the {flag} run")
    parser.add_argument(f"{flag}-date", default=None, help="its date (YYYY-MM-DD)")
    parser.add_argument(f"{flag}-stack", default=None, help="its torch, triton, SGLang and GEMM path")
    parser.add_argument(f"{flag}-rank", default=None, help=f"what one GPU held, e.g. '{rank_example}'")


def _merged(paths: list[str]) -> dict:
    """The ``profile-table --json`` results of ``paths`` as one dict (trace path -> its table)."""
    return {k: v for p in paths for k, v in _read(p).items()}


def main(argv: list[str] | None = None) -> int:
    """Build the tables from the two reports and write them; exit code 0, or 2 on a bad input."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench_json", metavar="BENCH_JSON")
    parser.add_argument("accuracy_json", metavar="ACCURACY_JSON")
    parser.add_argument("--model-accuracy", nargs="+", default=None, metavar="JSON",
                        help="model-accuracy.json results of the real-model study (adds the model section; a case "
                             "measured by several is taken from the first given)")
    parser.add_argument("--sglang-one-batch", default=None, metavar="JSONL",
                        help="bench_one_batch --result-filename lines of FP8 and FP4 runs (run names fp8 / fp4)")
    parser.add_argument("--sglang-profile", nargs="+", default=[], metavar="JSON",
                        help="profile-table --json results of the same runs' decode steps")
    parser.add_argument("--sglang-gpu", default=None, help="the GPU those runs used, as nvidia-smi names it")
    parser.add_argument("--sglang-date", default=None, help="the date of those runs (YYYY-MM-DD)")
    parser.add_argument("--serving-profile", nargs="+", default=[], metavar="JSON",
                        help="profile-table --json results of FP8 and FP4 servers (serving-profile traces)")
    parser.add_argument("--serving-gpu", default=None, help="the GPU those servers ran on, as nvidia-smi names it")
    parser.add_argument("--serving-date", default=None, help="the date of those runs (YYYY-MM-DD)")
    parser.add_argument("--serving-stack", default=None, help="their torch and triton, e.g. 'torch 2.11.0, triton 3.6.0'")
    parser.add_argument("--serving-layers", type=int, default=None,
                        help="indexer layers each profiled decode step ran (make-model's v32-layers: 3)")
    parser.add_argument("--cycle", nargs="+", default=[], metavar="JSON:NEXT_N",
                        help="sglang_bench.py timeline --json summaries of FP8 and FP4 servers, each with the next_n "
                             "its server verified (1: MTP off), e.g. timeline.json:4 (adds the cycle section)")
    parser.add_argument("--cycle-gpu", default=None, help="the GPU those servers ran on, as nvidia-smi names it")
    parser.add_argument("--cycle-date", default=None, help="the date of those runs (YYYY-MM-DD)")
    parser.add_argument("--cycle-stack", default=None, help="their torch, triton, SGLang and GEMM path")
    parser.add_argument("--cycle-rank", default=None, help="what one GPU of that deployment held, e.g. "
                        "'DP-attention + EP8 rank'")
    parser.add_argument("--cycle-moe-gpus", type=int, default=None,
                        help="over how many GPUs that deployment spread the routed experts (its --tp-size)")
    parser.add_argument("--cycle-more", nargs="+", default=[], metavar="JSON:NEXT_N",
                        help="timeline summaries of a further run (another GPU or rank), as --cycle")
    _add_run_facts(parser, "--cycle-more", "DP-attention + EP32 rank")
    parser.add_argument("--cycle-more-moe-gpus", type=int, default=None,
                        help="over how many GPUs its routed experts spread (its --tp-size)")
    parser.add_argument("--cycle-more-other-order", nargs="+", default=[], metavar="JSON:NEXT_N",
                        help="timeline summaries of the --cycle-more shapes with the servers in the other run order")
    parser.add_argument("--cycle-more-load", nargs=4, default=None, metavar=("FP8_JSONL", "FP4_JSONL", "PRINTED", "NEXT_N"),
                        help="a KV-limited bench_serving load on the --cycle-more rank: each server's result line, "
                             "the pair's printed start-up lines, the next_n its servers verified")
    parser.add_argument("--cycle-more-load-other-order", nargs=3, default=None,
                        metavar=("FP8_JSONL", "FP4_JSONL", "PRINTED"),
                        help="the same KV-limited load with the servers in the other order (FP4's first): each "
                             "server's result line and the pair's printed start-up lines (pools as --cycle-more-load's)")
    parser.add_argument("--cycle-fused", nargs="+", default=[], metavar="JSON:NEXT_N",
                        help="timeline summaries of FP8 and FP4 servers of a model whose index path FP4 changes "
                             "(GLM-5's layers), as --cycle")
    _add_run_facts(parser, "--cycle-fused", "DP-attention + EP8 rank")
    parser.add_argument("--cycle-fused-model", default=None, help="the model whose layers it ran, e.g. 'GLM-5'")
    parser.add_argument("--bench-more", nargs="+", default=[], metavar="BENCH_JSON",
                        help="bench --json reports of other GPUs (adds timing_more: one section per GPU; where several "
                             "measured a shape, the median of the newest day's reports' times)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help=f"output file (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    if args.sglang_one_batch and not (args.sglang_gpu and args.sglang_date):
        parser.error("--sglang-one-batch needs --sglang-gpu and --sglang-date (what was measured where)")
    if args.serving_profile and not (args.serving_gpu and args.serving_date and args.serving_stack
                                     and args.serving_layers):
        parser.error("--serving-profile needs --serving-gpu, --serving-date, --serving-stack and --serving-layers "
                     "(what was measured where)")
    if args.cycle and not (args.cycle_gpu and args.cycle_date and args.cycle_stack):
        parser.error("--cycle needs --cycle-gpu, --cycle-date and --cycle-stack (what was measured where)")
    if args.cycle_more_load and not args.cycle_more:
        parser.error("--cycle-more-load needs --cycle-more (the rank it was measured on)")
    if args.cycle_more_load and not args.cycle_more_load[3].isdigit():
        parser.error(f"--cycle-more-load: NEXT_N: expected an int, got {args.cycle_more_load[3]!r}")
    if args.cycle_more_load_other_order and not args.cycle_more_load:
        parser.error("--cycle-more-load-other-order needs --cycle-more-load (the first order's load)")
    if args.cycle_more_other_order and not args.cycle_more:
        parser.error("--cycle-more-other-order needs --cycle-more (the first order's summaries)")
    if args.cycle_more and not (args.cycle and args.cycle_more_gpu and args.cycle_more_date and args.cycle_more_stack):
        parser.error("--cycle-more needs --cycle, and --cycle-more-gpu, --cycle-more-date and --cycle-more-stack "
                     "(what was measured where)")
    if args.cycle_fused and not (args.cycle_fused_gpu and args.cycle_fused_date and args.cycle_fused_stack
                                 and args.cycle_fused_model):
        parser.error("--cycle-fused needs --cycle-fused-gpu, --cycle-fused-date, --cycle-fused-stack and "
                     "--cycle-fused-model (what was measured where)")
    try:
        model = [_read(p) for p in args.model_accuracy] if args.model_accuracy else None
        def pairs_of(items, flag):
            pairs = []
            for item in items:
                path, _, n = item.rpartition(":")
                if not path or not n.isdigit():
                    parser.error(f"{flag}: expected JSON:NEXT_N, got {item!r}")
                pairs.append((path, int(n)))
            return pairs

        cycle, cycle_more = None, None
        if args.cycle:
            pairs = pairs_of(args.cycle, "--cycle")
            cycle = verify_cycle_section(
                [(_read(p), n) for p, n in pairs], gpu=args.cycle_gpu, date=args.cycle_date, stack=args.cycle_stack,
                method="inside SGLang's server: the GPU's busy time (union of kernel intervals) per decode step or "
                       "MTP verify cycle, median over traces of FP8-first and FP4-first servers, on one DP-attention "
                       "+ EP8 rank of DeepSeek-V3.2 cut to fewer layers, projected to 61 from the per-layer time",
                sources=[_source(p) for p, _ in pairs], rank=args.cycle_rank, moe_gpus=args.cycle_moe_gpus)
        if args.cycle_more:
            pairs = pairs_of(args.cycle_more, "--cycle-more")
            summaries = [(_read(p), n) for p, n in pairs]
            depths = {(s["layers"], s["full_depth"]) for s, _ in summaries}
            depth = _depth(summaries)
            other = pairs_of(args.cycle_more_other_order, "--cycle-more-other-order")
            loads, load_sources = None, None
            if args.cycle_more_load:
                if len(depths) != 1:
                    parser.error("--cycle-more-load: the --cycle-more summaries are of several depths; which one "
                                 "the load ran is not known")
                (layers, full), = depths
                f8, f4, printed, n = args.cycle_more_load
                lines = [json.loads(Path(p).read_text().splitlines()[0]) for p in (f8, f4)]
                p8, p4 = kv_pools(Path(printed).read_text())
                others, load_sources = [], [_source(p) for p in (f8, f4, printed)]
                if args.cycle_more_load_other_order:
                    o8, o4, o_printed = args.cycle_more_load_other_order
                    o_pools = kv_pools(Path(o_printed).read_text())
                    if o_pools != (p8, p4):
                        parser.error(f"--cycle-more-load-other-order: {o_printed}: its pools {o_pools} are not the "
                                     f"first order's {(p8, p4)}")
                    others = [tuple(json.loads(Path(p).read_text().splitlines()[0]) for p in (o8, o4))]
                    load_sources += [_source(p) for p in (o8, o4, o_printed)]
                loads = [kv_limited_load(*lines, fp8_pool=p8, fp4_pool=p4, next_n=int(n), layers=layers,
                                         full_depth=full, other_orders=others or None)]
            cycle_more = [verify_cycle_section(
                summaries, gpu=args.cycle_more_gpu, date=args.cycle_more_date, stack=args.cycle_more_stack,
                method="inside SGLang's server: the GPU's busy time (union of kernel intervals) per decode step or "
                       "MTP verify cycle, median over the traces of its FP8 and FP4 servers, on one "
                       f"{args.cycle_more_rank or 'DP-attention rank'} of DeepSeek-V3.2 with {depth} layers"
                       + ("; the other run order's servers as a second figure" if other else ""),
                sources=[_source(p) for p, _ in pairs], rank=args.cycle_more_rank, moe_gpus=args.cycle_more_moe_gpus,
                other_orders=[(_read(p), n) for p, n in other] or None,
                other_order_sources=[_source(p) for p, _ in other] or None, loads=loads, load_sources=load_sources)]
        cycle_fused = None
        if args.cycle_fused:
            pairs = pairs_of(args.cycle_fused, "--cycle-fused")
            summaries = [(_read(p), n) for p, n in pairs]
            cycle_fused = verify_cycle_section(
                summaries, gpu=args.cycle_fused_gpu, date=args.cycle_fused_date, stack=args.cycle_fused_stack,
                method="inside SGLang's server: the GPU's busy time (union of kernel intervals) per decode step or "
                       "MTP verify cycle, median over the traces of its FP8 and FP4 servers, on one "
                       f"{args.cycle_fused_rank or 'DP-attention rank'} of {args.cycle_fused_model} with "
                       f"{_depth(summaries)} "
                       "layers: SGLang's fused index-query kernel with FP8, its unfused path and this plugin's "
                       "rotation with FP4",
                sources=[_source(p) for p, _ in pairs], rank=args.cycle_fused_rank, model=args.cycle_fused_model)
        sglang = None
        if args.sglang_one_batch:
            try:
                lines = [json.loads(x) for x in Path(args.sglang_one_batch).read_text().splitlines() if x.strip()]
            except (OSError, ValueError) as exc:
                raise SystemExit(f"update_check_tables: {args.sglang_one_batch}: cannot be read as JSON lines "
                                 f"({exc})") from None
            profiles = _merged(args.sglang_profile)
            sglang = sglang_decode_section(
                lines, profiles, gpu=args.sglang_gpu, date=args.sglang_date,
                model="DeepSeek-V3.2's layer sizes, 3 of its 61 layers, dummy weights",
                index_heads=64, kv_cache_dtype="fp8", fp8_gemm_backend="triton", tp_size=1,  # sglang_gpu_check.sh e2e
                sources=[_source(args.sglang_one_batch), *map(_source, args.sglang_profile)])
        serving = None
        if args.serving_profile:
            serving = serving_timing_section(
                _merged(args.serving_profile), gpu=args.serving_gpu,
                date=args.serving_date, stack=args.serving_stack, layers=args.serving_layers, index_heads=64,
                method="inside SGLang's server, its profiler over 5 decode steps of DeepSeek-V3.2's layer sizes "
                       f"({args.serving_layers} layers), CUDA graphs, MTP off",
                sources=list(map(_source, args.serving_profile)))
        by_gpu: dict = {}  # the reports of each GPU, in the order given
        bench = _read(args.bench_json)
        main_gpu = str((bench.get("meta") or {}).get("device")) if isinstance(bench, dict) else None
        for path in args.bench_more:
            doc = _read(path)
            if not isinstance(doc, dict):
                raise ValueError(f"--bench-more: {path}: not a 'sglang-fp4-indexer bench --json' report (a JSON object)")
            gpu = str((doc.get("meta") or {}).get("device"))
            if gpu == main_gpu:  # check quotes BENCH_JSON's section for that GPU: this one would never be read
                raise ValueError(f"--bench-more: {path} was measured on {gpu}, the GPU of BENCH_JSON; --bench-more "
                                 "takes other GPUs' reports")
            by_gpu.setdefault(gpu, []).append((doc, _source(path)))
        timing_more = [bench_timing_section([d for d, _ in docs], [n for _, n in docs]) for docs in by_gpu.values()]
        tables = build_tables(bench, _read(args.accuracy_json),
                              bench_source=_source(args.bench_json), accuracy_source=_source(args.accuracy_json),
                              model_accuracy=model,
                              model_source=[_source(p) for p in args.model_accuracy] if args.model_accuracy else "",
                              sglang=sglang, timing_serving=serving, cycle=cycle, cycle_more=cycle_more,
                              cycle_fused=cycle_fused, timing_more=timing_more or None)
    except ValueError as exc:
        parser.exit(2, f"update_check_tables: {exc}\n")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(tables, indent=1) + "\n")
    timing = tables["timing"]
    print(f"{out}: {len(timing['rows'])} timing rows ({timing['gpu']}, {timing['date']}, FP4 column "
          f"{timing['fp4_column']}, FP8 {'measured' if timing['fp8_measured'] else 'not measured'}), "
          f"{len(tables['recall']['rows'])} recall rows ({tables['recall']['device']})"
          + (f", {len(tables['model']['rows'])} model rows ({', '.join(sorted({r['indexer'] for r in tables['model']['rows']}))})"
             if "model" in tables else "")
          + (f", {len(tables['sglang']['rows'])} SGLang decode rows" if "sglang" in tables else "")
          + (f", {len(tables['timing_serving']['rows'])} serving timing rows ({tables['timing_serving']['gpu']})"
             if "timing_serving" in tables else "")
          + "".join(f", {len(sec['rows'])} cycle rows ({sec['gpu']})" for sec in cycle_sections(tables))
          + (f", {len(tables['cycle_fused']['rows'])} cycle rows of {tables['cycle_fused']['model']} "
             f"({tables['cycle_fused']['gpu']})" if "cycle_fused" in tables else "")
          + "".join(f", {len(sec['rows'])} kernel timing rows ({sec['gpu']})" for sec in tables.get("timing_more", [])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
