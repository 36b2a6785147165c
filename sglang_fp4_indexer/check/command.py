"""``sglang-fp4-indexer check``: its options and its printed report (``cli.py`` wires it).
"""

from __future__ import annotations

import argparse
import functools
import shlex
import sys
from fractions import Fraction
from typing import Callable

from ..argtypes import integer, memory_gib
from ..dcp import DcpCapacity, SHARDED
from ..gate import Decision
from ..tables import load_tables
from .budget import GPUS
from .cycle import cycle_line, verify_cycle
from .model import PACKAGED_MODELS
from .findings import NOT_LISTED, run_check
from .trade import _k, _pm, _shape_text, model_indexer_text, newer_kernel_text, worth_it

__all__ = [
    "add_arguments",
    "main",
    "MAX_NEXT_N",
    "MAX_CONTEXT",
    "KV_CACHE_DTYPES",
    "measured_cycles_text",
]


#: Largest --next-n: the paged scorer's ``ops.paged_logits.MAX_NEXT_N`` (restated, not imported: that module
#: loads Triton, which ``check`` never needs; tests/test_cli_errors.py keeps the two equal).
MAX_NEXT_N = 8
#: Largest --context for a config without ``max_position_embeddings``, and the most KV tokens one pool can index
#: (``--batch`` x ``--context`` per pool): SGLang keeps positions, lengths and token indices as int32.
MAX_CONTEXT = 2**31 - 1
#: ``check --kv-cache-dtype`` values: check's own names and SGLang's ``--kv-cache-dtype`` spellings of the same two
#: MLA KV formats, each to the format it sizes.
KV_CACHE_DTYPES = {"fp8": "fp8", "fp8_e4m3": "fp8", "bf16": "bf16", "bfloat16": "bf16"}


def measured_cycles_text(tables: dict | None = None) -> str:
    """Where a server's whole step was measured, from the packaged tables' verify-cycle sections, for ``--help``:
    "NVIDIA H200, a DP-attention + EP8 rank of DeepSeek-V3.2: 1 x 128K, 8 x 128K; ...; NVIDIA H100 80GB HBM3, a
    DP-attention + EP8 rank of GLM-5: 4 x 64K" (per-rank batch x context, each shape once whatever its next_n).
    Tables that cannot be read give "see docs/benchmarks.md" (help must never fail)."""
    from ..tables import cycle_sections

    try:
        tables = load_tables() if tables is None else tables
    except ValueError:
        return "see docs/benchmarks.md"
    secs = cycle_sections(tables) + ([tables["cycle_fused"]] if tables.get("cycle_fused") else [])
    parts = []
    for sec in secs:
        shapes = sorted({(r["batch"], r["context"]) for r in sec["rows"]} | {
            (x["concurrency"], x["context"]) for x in sec.get("loads") or []})
        parts.append(f"{sec['gpu']}, a {sec.get('rank', 'DP-attention rank')} of {sec.get('model', 'DeepSeek-V3.2')}: "
                     + ", ".join(f"{b} x {_k(c)}" for b, c in shapes))
    return "; ".join(parts) or "none"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``check``."""
    parser.add_argument("model", help="local model directory (with config.json) or a Hugging Face config JSON file, "
                                      "or one of the packaged configs: " + ", ".join(PACKAGED_MODELS)
                                      + "; another hub model needs its config first: "
                                        "hf download REPO config.json --local-dir DIR")
    parser.add_argument("--memory-gib", type=memory_gib(), default=None,
                        help="KV-pool memory per GPU in GiB for the token counts: the figure SGLang logs as "
                             "'KV Cache is allocated' (default: derived as SGLang sizes it, GPU memory x "
                             "--mem-fraction-static - the weights per GPU computed from the config; the output "
                             "says how)")
    parser.add_argument("--gpu", default=None, metavar="NAME",
                        help="GPU whose memory (and compute capability, unless --capability) the KV budget is "
                             f"derived for, and whose measured indexer times --context quotes: {', '.join(GPUS)} "
                             "(H100: the H100 80GB HBM3, SXM; default: the local GPU, else H200)")
    parser.add_argument("--context", type=integer(1), default=None, metavar="N",
                        help="tokens per request (e.g. 131072), at most the model's positions "
                             "(max_position_embeddings, or --context-length in --sglang-args): adds what FP4 gains "
                             "and costs at that length -- requests that fit, the indexer's time FP4 vs FP8 (measured "
                             "on H200; on an H100 80GB HBM3 inside SGLang's server, at 1 x 128K and 8 x 64K, next_n "
                             "1 only, and elsewhere the scorer alone in a kernel benchmark at next_n 1, 2 and 4, also "
                             "against DeepGEMM's newer SM90 kernel), the server's whole MTP verify cycle or decode "
                             "step FP4 vs FP8 where that "
                             f"deployment was measured (per rank: {measured_cycles_text()}), the top-k recall FP4 vs "
                             "FP8 (measured accuracy study) and the loss cost on a "
                             "real model -- and a verdict, also as the exit code: 0 FP4 fits more requests of that "
                             "length, 3 no more run with FP4 (the same number fit, or --max-running-requests allows no "
                             "more than FP8's pool holds: FP4 buys only indexer time, at the measured cost), 4 the "
                             "batch fits neither; 1 FP4 refused")
    parser.add_argument("--batch", type=integer(1), default=None, metavar="B",
                        help="with --context: requests decoded together (default 1)")
    parser.add_argument("--next-n", type=integer(1, MAX_NEXT_N), default=None, metavar="N",
                        help="with --context: query tokens per request and step: 1 for plain decode; with MTP / "
                             "EAGLE, SGLang's --speculative-num-draft-tokens (which counts the verified token: "
                             "steps + 1 with top-1 drafts), at most %d (default 1)" % MAX_NEXT_N)
    parser.add_argument("--capability", default=None,
                        help="CUDA compute capability to assume, e.g. 9.0 (default: the local GPU, else 9.0); "
                             "without --gpu it names no GPU (unless the local GPU has it), so no time measured "
                             "on one GPU is quoted")
    parser.add_argument("--kv-cache-dtype", choices=tuple(KV_CACHE_DTYPES), default=None,
                        help="MLA KV cache format for the token counts: FlashMLA FP8 (fp8, or SGLang's name "
                             "fp8_e4m3) or bf16 (bf16 or bfloat16) (default: the "
                             "--kv-cache-dtype in --sglang-args, else SGLang's default for DSA models on the "
                             "device: fp8 from compute capability 10.0, bf16 below)")
    parser.add_argument("--sglang-args", default="", metavar="FLAGS",
                        help='SGLang server flags as one string, e.g. --sglang-args="--dcp-size 2" '
                             "(parsed by SGLang's own parser; needs SGLang installed; the model is the "
                             "positional argument, not --model-path)")


def _fmt(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{float(x):g}"


def _print_worth_it(console, res: dict, w: dict, batch: int, next_n: int, context: int) -> None:
    row, heads = w["timing"], w["heads"]
    layers = res["index_layers"]
    dp, unit = w["batch_split"]
    if dp > 1:  # each DP-attention rank (or DP replica): its own pool, its share of the batch; times are per rank
        per = unit.split()[-1]
        console.print(f"at {_k(context)} tokens per request, per {unit} ({dp} {per}s, each with its own KV "
                      f"pool; the batch of {batch} is {w['rank_batch']} per {per}): requests that fit: FP8 "
                      f"{w['requests_fp8']}, FP4 {w['requests_fp4']} per {per} ({w['requests_fp8'] * dp} and "
                      f"{w['requests_fp4'] * dp} over the {dp} {per}s); {w['rank_batch']} "
                      f"{'request needs' if w['rank_batch'] == 1 else 'requests need'} "
                      f"{w['tokens_needed']} KV tokens, FP8 holds {w['tokens_fp8']}, FP4 {w['tokens_fp4']} per {per}")
        batch = w["rank_batch"]
    else:
        console.print(f"at {_k(context)} tokens per request: requests that fit: FP8 {w['requests_fp8']}, FP4 "
                      f"{w['requests_fp4']} (a batch of {batch} needs {w['tokens_needed']} KV tokens; "
                      f"FP8 holds {w['tokens_fp8']}, FP4 {w['tokens_fp4']})")
    if w.get("timing_unmeasured"):
        console.print(f"indexer scorer time: not measured for this configuration ({w['timing_unmeasured']}); "
                      "measure it on your GPU: sglang-fp4-indexer bench --device cuda --quick")
    elif w.get("timing_far") is not None and w["timing_far"]["heads"] != heads:
        # What differs is the head count: the shape (or one near it) was measured with another one only.
        own = w["timing_heads_shapes"]
        has = (f"{heads} index heads only at {', '.join(own)}" if own else f"no time with {heads} index heads")
        console.print(f"indexer scorer time at {batch} x {_k(context)}, next_n {next_n}: not measured with {heads} "
                      f"index heads at this shape (at next_n {next_n} the {w['timing_gpu']} tables have {has}, and a "
                      f"time measured with another head count is not quoted for {heads}); measure it: "
                      "sglang-fp4-indexer bench --device cuda")
    elif w.get("timing_far") is not None:
        f = w["timing_far"]
        console.print(f"indexer scorer time at {batch} x {_k(context)}, next_n {next_n}: not measured at this shape "
                      f"(the nearest measured one, {_shape_text(f['heads'], f['batch'], f['context'], f['next_n'])}, "
                      "is too far to stand for it: quoted only within 2x in keys read and 4x in batch, same index "
                      "heads); measure it: sglang-fp4-indexer bench --device cuda")
    elif row is None:
        console.print(f"indexer scorer time at next_n {next_n}: not measured (the {w['timing_gpu']} tables have "
                      f"next_n {', '.join(map(str, w['timing_next_n']))}; no other next_n is quoted for it)")
    else:
        where = ("at this shape" if w["timing_exact"]
                 else f"at the nearest measured shape, {_shape_text(row['heads'], row['batch'], row['context'], row['next_n'])}")
        fp8 = (f"FP8 (DeepGEMM, as SGLang calls it) {row['fp8_us']:.1f} us" if row["fp8_us"] is not None
               else "FP8 time not measured" + (f" (its memory-bandwidth floor there: {row['fp8_floor_us']:.1f} us)"
                                               if row.get("fp8_floor_us") else ""))
        native = row.get("fp8_native_us")
        if native is not None and row["fp8_us"] is not None and abs(native - row["fp8_us"]) > 0.05 * row["fp8_us"]:
            fp8 += f"; DeepGEMM with its native next_n, which SGLang 0.5.23 does not use on Hopper: {native:.1f} us"
        both = newer_kernel_text(row)
        if both:
            fp8 += f"; DeepGEMM's newer SM90 kernel {row['fp8_sm90_newer_us']:.1f} us; FP4 is {both}"
        if row.get("runs", 1) > 1:
            where += f", the median of {row['runs']} runs"
        how = "; ".join(x for x in (w.get("timing_stack"), w.get("timing_method")) if x)
        stack = f" ({how})" if how else ""
        console.print(f"indexer scorer per layer and step, measured on {w['timing_gpu']}{stack} {where}: "
                      f"FP4 {row['fp4_us']:.1f} us (times {layers} index layers: {row['fp4_us'] * layers / 1000:.2f} "
                      f"ms per step, multiplied out); {fp8}")
    _print_sglang_decode(console, w, batch, context)
    line = cycle_line(w, w["rank_batch"], context, next_n)
    if line:
        console.print(line, markup=False)
    ctx = w["recall"][0]["context"]
    where = f"at {_k(ctx)}" + ("" if w["recall_exact"] else f" (the nearest measured context to {_k(context)})")
    parts = ", ".join(f"{r['workload']} {r['fp4']:.3f} vs {r['fp8']:.3f}" for r in w["recall"])
    mk = w.get("model_topk", w["topk"])
    if context <= mk:
        console.print(f"top-{mk} recall: 1 for FP4 and FP8 (a {_k(context)} context has at most "
                      f"{mk} keys, all of them selected)")
    elif w.get("topk_unmeasured"):
        console.print(f"top-{mk} recall and the real-model cost: not measured ({w['topk_unmeasured']})")
    else:
        console.print(f"top-{w['topk']} recall against exact scoring, FP4 vs FP8, {where}, H {w['recall'][0]['heads']} "
                      f"(accuracy study on {w['recall_device']}): {parts}")
        for m in w["model_cost"]:
            indexer = ("a stand-in indexer built from its own queries and keys" if m.get("indexer", "stand-in") == "stand-in"
                       else f"a small {model_indexer_text(m)}")
            near = "" if m["context"] == context else f" (the nearest measured context to {_k(context)})"
            console.print(f"on a real model (Gemma 3 270M, sparse attention in its 3 global layers over {indexer}, "
                          f"{m.get('device', 'CPU')}), at {_k(m['context'])}, top-{m['topk']}, {m['windows']} text windows"
                          f"{near}: Δ loss vs dense attention exact selection "
                          f"{_pm(m['delta_exact'])}, FP8 {_pm(m['delta_fp8'])}, FP4 {_pm(m['delta_fp4'])} nats/token"
                          + (f"; passkey retrieved dense {m['passkey_dense'][0]}/{m['passkey_dense'][1]}, FP8 "
                             f"{m['passkey_fp8'][0]}/{m['passkey_fp8'][1]}, FP4 {m['passkey_fp4'][0]}/{m['passkey_fp4'][1]}"
                             if "passkey_fp4" in m else "")
                          + (f"; the indexer's own selection holds {m['attention_recall_exact']:.2f} of the layer's "
                             f"attention top-{m['topk']}" if "attention_recall_exact" in m else ""))
    console.print(f"verdict: {w['verdict']}")


def _print_sglang_decode(console, w: dict, batch: int, context: int) -> None:
    """The decode step measured inside SGLang at this shape, or why none is quoted (nothing without such rows)."""
    run, row = w.get("sglang_decode_run"), w.get("sglang_decode")
    if run is None:
        return
    if row is None:
        console.print(f"decode step inside SGLang (bench_one_batch on {run['gpu']}) at {batch} x {_k(context)}: not "
                      f"measured ({w['sglang_decode_why']})")
        return
    f8, f4 = row["fp8"], row["fp4"]
    kern = ""
    if f8["kernel_us"] is not None and f4["kernel_us"] is not None:
        kern = (f"; sum of kernel times per step (not a step time) FP8 "
                f"{f8['kernel_us']:.0f} us, FP4 {f4['kernel_us']:.0f} us, of which indexer logits "
                f"{f8['indexer_us']:.1f} and {f4['indexer_us']:.1f} us")
    console.print(f"decode step inside SGLang (bench_one_batch, CUDA graphs, {run['model']}; {run['gpu']}, "
                  f"{run['date']}) at {row['batch']} x {_k(row['context'])}: median FP8 {f8['decode_ms']:.2f} ms, "
                  f"FP4 {f4['decode_ms']:.2f} ms (single steps vary by about 0.2 ms there, so this difference is "
                  f"not resolved){kern}")


def _model_line(res: dict) -> str:
    where = (f"the config fields of {res['source']} packaged with sglang-fp4-indexer, {res['file']}" if res["source"]
             else f"config {res['file']}")
    note = f"; {res['config_model_note']}" if res.get("config_model_note") else ""
    return f"model: {res['model_text']} ({where}); classified by {res['detection']}{note}"


def _context_options(args: argparse.Namespace) -> tuple[int | None, int, int]:
    """``(context, batch, next_n)``; ``--batch`` and ``--next-n`` only with ``--context``.

    Raises:
        ValueError: ``--batch`` or ``--next-n`` without ``--context``, or a context shorter than ``--next-n``.
    """
    context = getattr(args, "context", None)
    batch, next_n = getattr(args, "batch", None), getattr(args, "next_n", None)
    if context is None:
        given = [flag for flag, value in (("--batch", batch), ("--next-n", next_n)) if value is not None]
        if given:
            raise ValueError(f"{given[0]}: only used with --context N (the request length in tokens): add "
                             f"--context, or drop {' and '.join(given)}")
        return None, 1, 1
    batch, next_n = batch or 1, next_n or 1
    if context < next_n:
        raise ValueError(f"--context: {context} tokens cannot hold --next-n {next_n} query tokens")
    return context, batch, next_n


def _check_request_size(res: dict, context: int, batch: int) -> None:
    """Refuse a request longer than the model serves, or a batch no KV pool can index, in one line each.

    Raises:
        ValueError: ``context`` above the model's positions (``res["positions"]``, else ``MAX_CONTEXT``), or a
            batch whose share per pool (``res["batch_split"]``) needs more than ``MAX_CONTEXT`` KV tokens.
    """
    if res["positions"] is not None and context > res["positions"]:
        raise ValueError(f"--context: {context} tokens is more than this model's {res['positions']} positions "
                         f"({res['positions_from']}, the longest request SGLang serves); give at most "
                         f"{res['positions']}")
    if context > MAX_CONTEXT:
        raise ValueError(f"--context: {context} tokens is more than the {MAX_CONTEXT} positions SGLang can hold "
                         "(int32; this config has no max_position_embeddings); give at most "
                         f"{MAX_CONTEXT}")
    pools, unit = res.get("batch_split", (1, ""))
    per_pool = -(-batch // pools)
    if per_pool * context > MAX_CONTEXT:
        where = f" per {unit} ({per_pool} of the {batch})" if pools > 1 else ""
        raise ValueError(f"--batch: {per_pool} requests of {context} tokens{where} need {per_pool * context} KV "
                         f"tokens, more than one KV pool can index ({MAX_CONTEXT}, int32 token indices); give at "
                         f"most --batch {MAX_CONTEXT // context * pools}")


def _verify_next_n(res: dict, given: int | None, default: int) -> int:
    """next_n for the trade: the speculative flags' target verify rows when they give them, else ``--next-n``.

    Raises:
        ValueError: ``--next-n`` differs from what the speculative flags give.
    """
    spec = res.get("verify_next_n")
    if spec is None:
        return default
    if given is not None and given != spec:
        raise ValueError(f"--next-n {given} differs from the {spec} rows per request that target verify scores "
                         f"with these flags ({res['verify_how']}); drop --next-n or change the flags")
    return spec


def _memory_table(res: dict, d: Decision, memory_gib: float):
    from rich.table import Table

    w = res["dcp_size"]
    where = "per GPU" if w == 1 else f"per rank, DCP {w} (MLA KV sharded over the {w} ranks)"
    notes = []
    if w > 1:
        mode = ("sharded (--fp4-indexer-dcp-shard, or SGLANG_FP4_INDEXER_DCP_SHARD set)" if res["fp4_mode"] == SHARDED
                else "replicated (the default; --fp4-indexer-dcp-shard would shard the index)")
        notes.append("* the mode " + ("the server would use" if d.enabled else "these flags give") + f": {mode}")
    if NOT_LISTED in d.codes:
        notes.append("FP4 rows: what FP4 would give with the plugin loaded; a server with --enable-fp4-indexer "
                     "does not start here")
    elif not d.enabled:
        notes.append("FP4 rows: what FP4 would give if the refusal were lifted; the server keeps FP8")
    table = Table(title=f"memory effect, {memory_gib:.4g} GiB KV pool {where}", caption="\n".join(notes) or None)
    table.add_column("index cache", no_wrap=True)
    for header in ("index B per token and layer", "KV + index B per token and layer", "KV + index B per token",
                   "KV tokens"):
        table.add_column(header, justify="right")
    for label, idx, per_layer, total, tokens in res["rows"]:
        table.add_row(label, _fmt(idx), _fmt(per_layer), _fmt(total), str(tokens))
    return table


def main(args: argparse.Namespace, read_sglang: Callable[[dict, str, list[str]], tuple] | None = None) -> int:
    """Print the check and return its exit code; ``read_sglang`` as ``run_check``'s.

    Without ``--context``: 0 when the FP4 indexer would be enabled, 1 when not (refused, or no
    indexer). With ``--context`` and FP4 enabled, the verdict's code (``worth_it``): 0 FP4 fits
    more requests of that length, 3 both fit the same number (FP4 buys only indexer time, at the
    measured cost), 4 the batch fits neither; 1 when refused. 2: a usage error (``cli.main``).

    Raises:
        ValueError: bad options or config (``run_check``, ``_context_options``), or a ``--context``
            beyond the model's positions.
    """
    from rich.console import Console

    def announce(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        flags = shlex.split(args.sglang_args)
    except ValueError as exc:
        raise ValueError(f"--sglang-args: cannot split {args.sglang_args!r} into flags ({exc})") from None
    context, batch, next_n = _context_options(args)
    res = run_check(args.model, memory_gib=args.memory_gib, gpu=getattr(args, "gpu", None), capability=args.capability,
                    kv_cache_dtype=KV_CACHE_DTYPES.get(args.kv_cache_dtype), server_flags=flags, announce=announce,
                    read_sglang=read_sglang)
    next_n = _verify_next_n(res, getattr(args, "next_n", None), next_n)
    if context is not None and context < next_n:
        raise ValueError(f"--context: {context} tokens cannot hold next_n {next_n} query tokens")
    if context is not None:
        _check_request_size(res, context, batch)
    d: Decision = res["decision"]
    console = Console(highlight=False)
    console.print(_model_line(res), markup=False)
    console.print(f"device: {res['device']}", markup=False)
    if "index_keys" in res:
        console.print(f"index keys: {res['index_keys']}", markup=False)
    if res.get("verify_how"):
        used = f"next_n {res['verify_next_n']}" if res["verify_next_n"] else f"next_n {next_n} (--next-n)"
        console.print(f"speculative decoding: {res['verify_how']}; the trade below uses {used}", markup=False)
    if d.enabled:
        console.print(f"FP4 indexer: ENABLED - {d.reason}", markup=False)
    elif NOT_LISTED in d.codes:  # SGLang does not load the plugin: the FP4 server does not start at all
        console.print(f"FP4 indexer: NOT LOADED - {d.reason}", markup=False)
        console.print(f"fix: {d.fix}", markup=False)
    elif "not_dsa" in d.codes:
        console.print(f"FP4 indexer: not applicable - {d.reason}; SGLang serves it as without the plugin",
                      markup=False)
    else:
        own = "its own DeepSeek-V4 indexer" if "deepseek_v4" in d.codes else "its FP8 indexer"
        console.print(f"FP4 indexer: DISABLED (SGLang keeps {own}) - {d.reason}", markup=False)
        if d.fix:
            console.print(f"fix: {d.fix}", markup=False)
    cap: DcpCapacity | None = res.get("capacity")
    if cap is None:
        why = ("no DSA index-key cache" if not res["model"].is_dsa or "deepseek_v4" in d.codes
               else "FP4 cannot serve this model's indexer, see above, so SGLang sizes its own index cache as "
                    "without the plugin")
        console.print(f"memory effect: none ({why})", markup=False)
        if context is not None:
            console.print("verdict: FP4 changes nothing for this model at any context", markup=False)
        return 0 if d.enabled else 1
    console.print(_memory_table(res, d, res["pool_gib"]))
    if res["budget"] is not None:
        console.print(res["budget"].text(), markup=False)
    else:
        console.print(f"KV pool per GPU: {args.memory_gib:g} GiB (--memory-gib)", markup=False)
    gain = cap.gain_sharded if res["fp4_mode"] == SHARDED else cap.gain_replicated
    tokens = cap.tokens_fp4_sharded if res["fp4_mode"] == SHARDED else cap.tokens_fp4_replicated
    share = f"+{gain * 100:.1f} %" if cap.tokens_fp8 else "FP8 holds no token in this pool"
    mode = "" if res["dcp_size"] == 1 else f" ({res['fp4_mode']})"
    console.print(
        f"layers: {res['layers']} ({res['index_layers']} with an index cache); MLA KV {res['kv_bytes']} B per "
        f"token and layer in {res['kv_dtype']} ({res['kv_dtype_why']})", markup=False)
    if d.enabled:
        console.print(f"extra KV tokens with FP4{mode}: {tokens - cap.tokens_fp8} ({share})")
    else:
        console.print(f"FP4 is not used; if the refusal were lifted, FP4{mode} would add "
                      f"{tokens - cap.tokens_fp8} KV tokens ({share})")
    if context is None:
        console.print("add --context N (and --batch, --next-n) for the time and recall FP4 costs or saves at that length")
    elif d.enabled:
        verdict = worth_it(res, context=context, batch=batch, next_n=next_n,
                           cycle=functools.partial(verify_cycle, load_tables(), res))
        _print_worth_it(console, res, verdict, batch, next_n, context)
        return verdict["exit_code"]
    else:
        console.print("verdict: SGLang does not load the plugin in this environment (above): list it in SGLANG_PLUGINS "
                      "first" if NOT_LISTED in d.codes else
                      "verdict: FP4 is refused for this deployment (above), so SGLang keeps FP8 at any context")
    return 0 if d.enabled else 1
