"""``worth_it``: what FP4 gains and costs at one request length, from the measured tables shipped in the package,
and the verdict with its exit code.
"""

from __future__ import annotations

from ..dcp import DcpCapacity, SHARDED
from ..gate import DeviceFacts
from .budget import ASSUMED_GPU, UNNAMED_GPU

__all__ = [
    "worth_it",
    "newer_kernel_text",
    "cycle_gain_text",
    "load_gain_text",
    "requests_gain",
    "MEASURE_SPEED",
    "model_indexer_text",
    "fused_cycle_text",
    "FUSED_PATH",
    "EXIT_FP4_FITS_MORE",
    "EXIT_REFUSED",
    "EXIT_SAME_REQUESTS",
    "EXIT_FITS_NEITHER",
]


def _k(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)


def _shape_text(heads: int, batch: int, context: int, next_n: int) -> str:
    return f"H {heads}, batch {batch} x {_k(context)}, next_n {next_n}"


#: ``check --context`` exit codes: the verdict as a number (``main``).
EXIT_FP4_FITS_MORE = 0
EXIT_REFUSED = 1
EXIT_SAME_REQUESTS = 3
EXIT_FITS_NEITHER = 4


#: How to measure the indexer's speed where ``check`` has no measured time: the scorer on the user's own GPU.
MEASURE_SPEED = "sglang-fp4-indexer bench --device cuda --quick"
#: The same where FP4 also changes SGLang's index-query path (the rotation inside its fused indexer).
MEASURE_FUSED = (f"the scorer with {MEASURE_SPEED} and the query path with SGLang's profiler on your server, as the "
                 "user guide's GLM-5.x section shows")


def requests_gain(fp8: int, fp4: int, context: int, token_gain: float) -> str:
    """The gain in the deployer's unit: ``"FP4 fits 5 requests of 128K where FP8 fits 4 (+25 %)"``.

    Args:
        fp8: requests of ``context`` tokens the FP8 index's pool holds (>= 0).
        fp4: the same with FP4 (>= ``fp8``).
        context: tokens per request.
        token_gain: FP4's extra KV tokens as a fraction of FP8's (0.088 for +8.8 %).

    Returns:
        One clause; where both hold the same number, the KV-token gain that does not make a request. The
        percentage is whole where it is within 0.05 of a whole number, else to one decimal (9 against 8: +12.5 %).
    """
    many = lambda n: f"{n} request{'' if n == 1 else 's'}"  # noqa: E731
    if fp4 == fp8:
        return (f"FP4 fits no more requests of {_k(context)} than FP8 ({fp8} either way; +{token_gain * 100:.1f} % "
                "KV tokens)")
    if fp8 == 0:
        return f"FP4 fits {many(fp4)} of {_k(context)} where FP8 fits none"
    more = (fp4 / fp8 - 1) * 100
    shown = f"{more:.0f}" if abs(more - round(more)) < 0.05 else f"{more:.1f}"  # +25 %, +12.5 %, +33.3 %
    return f"FP4 fits {many(fp4)} of {_k(context)} where FP8 fits {fp8} (+{shown} %)"


def _pm(ms) -> str:
    m, se = ms
    return f"{m:+.4f}" if se != se else f"{m:+.4f} ± {se:.4f}"  # se != se: NaN (one window)


def model_indexer_text(row: dict) -> str:
    """A real-model row's indexer in words: ``"stand-in indexer"`` or ``"lightning indexer trained on 12 x 8192
    tokens"`` (``tables.nearest_model_cost``'s row)."""
    if row.get("indexer", "stand-in") == "stand-in":
        return "stand-in indexer"
    return "lightning indexer trained on " + (row.get("trained_on") or "text not recorded")


def _model_cost_text(rows: list[dict], context: int, topk: int) -> str:
    if not rows:
        return "the effect on a model's loss is not in these tables"
    parts = []
    for row in rows:
        text = (f"Δ loss vs dense attention FP4 {_pm(row['delta_fp4'])}, FP8 {_pm(row['delta_fp8'])} nats/token "
                f"(FP4 - FP8 {_pm(row['fp4_minus_fp8'])})")
        if "passkey_fp4" in row:
            text += (f", passkey FP4 {row['passkey_fp4'][0]}/{row['passkey_fp4'][1]} vs FP8 "
                     f"{row['passkey_fp8'][0]}/{row['passkey_fp8'][1]}")
        parts.append(text + f" on Gemma 3 270M at {_k(row['context'])}, top-{row['topk']} (real-model study, "
                     f"{model_indexer_text(row)}, {row.get('device', 'CPU')})")
    return "; ".join(parts)


def measured_on(gpu: str, name: str | None) -> bool:
    """Whether a time measured on ``gpu`` (as nvidia-smi names it) holds for the device named ``name``: the same
    name, case and an ``NVIDIA`` prefix aside (``check --gpu`` names each GPU it knows as nvidia-smi does,
    ``budget.GPUS``). Another variant or a name that only contains it (``"NVIDIA H100 PCIe"``,
    ``"NVIDIA H200 NVL"``, ``"NVIDIA GH200 480GB"``) is another GPU."""
    def key(text: str) -> str:
        return " ".join(text.upper().removeprefix("NVIDIA").split())

    return bool(name) and key(gpu) == key(name)


def _named_gpu(dev: DeviceFacts) -> str | None:
    """The CUDA GPU's name where one is known (local, or ``--gpu``), else None (assumed, unnamed, not CUDA)."""
    return dev.name if dev.kind == "cuda" and dev.name not in (ASSUMED_GPU, UNNAMED_GPU, None) else None


def _timing_sections(tables: dict, dev: DeviceFacts) -> list[dict]:
    """The timing sections measured on this device's GPU, in the order ``worth_it`` takes a near row from them.

    Where ``timing`` (the H200's kernel benchmark) is not this GPU's: ``timing_serving`` (measured inside SGLang's
    server, closer to what a server runs, so it wins where it has a near row) then each ``timing_more`` section (the
    scorer alone in a kernel benchmark) measured on this GPU. Else, or where none is this GPU's: ``[timing]``, whose
    GPU ``_unmeasured_configuration`` then compares."""
    name = _named_gpu(dev)
    if name and not measured_on(tables["timing"]["gpu"], name):
        own = [sec for sec in (tables.get("timing_serving"), *(tables.get("timing_more") or []))
               if sec and measured_on(sec["gpu"], name)]
        if own:
            return own
    return [tables["timing"]]


#: FP8's scorer in SGLang 0.5.23's server (the incumbent the verdict decides against), and DeepGEMM's newer SM90
#: kernel, which takes the verify rows natively but which SGLang 0.5.23 does not call.
_SGLANG_FP8 = "DeepGEMM as SGLang 0.5.23 calls it"
_NEWER_FP8 = "DeepGEMM's newer SM90 kernel, which SGLang 0.5.23 does not use"


def _against(ratio: float, what: str) -> str:
    """FP4's scorer against an FP8 one from their time ratio FP8 / FP4: "1.02x faster than X", or "0.79x, i.e.
    1.27x slower, than X"."""
    if ratio >= 1:
        return f"{ratio:.2f}x faster than {what}"
    return f"{ratio:.2f}x, i.e. {1 / ratio:.2f}x slower, than {what}"


def newer_kernel_text(row: dict) -> str | None:
    """FP4's scorer against both FP8 kernels of a timing row that has the newer kernel's time (``fp8_us`` and
    ``fp8_sm90_newer_us``): "1.02x faster than DeepGEMM as SGLang 0.5.23 calls it; 0.79x, i.e. 1.27x slower, than
    DeepGEMM's newer SM90 kernel, which SGLang 0.5.23 does not use"; None where either FP8 time is missing."""
    newer = row.get("fp8_sm90_newer_us")
    if newer is None or row.get("fp8_us") is None:
        return None
    return f"{_against(row['fp8_us'] / row['fp4_us'], _SGLANG_FP8)}; {_against(newer / row['fp4_us'], _NEWER_FP8)}"


#: What FP4 changes in SGLang's index path where the model's indexer RoPE is interleaved (GLM-5.x).
FUSED_PATH = ("with interleaved indexer RoPE, as in GLM-5.x, FP4 replaces SGLang's fused index-query kernel by "
              "SGLang's unfused path, where the plugin rotates index queries and keys")


def fused_cycle_text(sec: dict | None) -> str | None:
    """The measured step of the index path FP4 changes (a ``cycle_fused`` section), as ``check`` quotes it for every
    deployment with that path: "measured at one shape only, inside SGLang's server on one DP-attention + EP8 rank of
    GLM-5 with 3 of its 78 layers, NVIDIA H100 80GB HBM3, 2026-12-07, dummy weights: at 4 x 64K per rank verifying 4
    tokens the GPU's busy time per MTP verify cycle was FP8 5.31 ms, FP4 5.36 ms, a 1.009x longer cycle with FP4"
    (no parentheses: check quotes it inside its own); None without a section (or rows)."""
    if not sec or not sec.get("rows"):
        return None
    shapes = []
    for row in sec["rows"]:
        what = "MTP verify cycle" if row["next_n"] > 1 else "decode step"
        ratio = row["fp8_ms"] / row["fp4_ms"]
        change = _step_change(ratio, ratio)
        verify = f"verifying {row['next_n']} tokens" if row["next_n"] > 1 else "with MTP off"
        shapes.append(f"at {row['batch']} x {_k(row['context'])} per rank {verify} the GPU's busy time per {what} "
                      f"was FP8 {row['fp8_ms']:.2f} ms, FP4 {row['fp4_ms']:.2f} ms, {change} {what.split()[-1]} with "
                      "FP4")
    one = "at one shape only" if len(shapes) == 1 else f"at {len(shapes)} shapes only"
    # No parentheses: check quotes this inside its own.
    return (f"measured {one}, inside SGLang's server on one {sec.get('rank', 'DP-attention rank')} of "
            f"{sec['model']} with {depth_text(sec['rows'][0], 'its ')}, {sec['gpu']}, {sec['date']}, dummy weights: "
            + "; ".join(shapes))


def _unmeasured_configuration(dev: DeviceFacts, gpu: str, sharded: bool, dcp_size: int,
                              fused_rotation: bool = False, server: str | None = None,
                              measured_gpus: str | None = None, without_dcp: bool = False,
                              fused_measured: str | None = None) -> str | None:
    """Why the measured times (one GPU, ``gpu``, the Hopper kernel, no DCP exchange) do not hold here, or None.

    The tables hold the Hopper CUDA kernel against DeepGEMM as SGLang 0.5.23 calls it on Hopper, on ``gpu`` (the
    sections': an H200, or an H100 inside a server and in a kernel benchmark), single-GPU; that is what a replicated
    DCP rank runs too (measured at DCP 2 on two H200). Anything else was not measured there, and a
    device given by its compute capability alone (``budget.UNNAMED_GPU``) may be another GPU.
    ``measured_gpus``: every GPU the tables hold times for, named where the device is none of them (default
    ``gpu``). ``without_dcp``: the times are a GPU's on which DCP was never measured (the H100's ``timing_serving``
    and ``timing_more``), so they hold without DCP only.
    ``fused_measured``: ``fused_cycle_text`` of the tables, quoted where ``fused_rotation`` (else "not measured").
    """
    if dev.kind != "cuda":
        return f"the times were measured on an NVIDIA {gpu.replace('NVIDIA ', '')}, not on a {dev.kind} device"
    cap = tuple(dev.capability or ())
    if cap != (9, 0):
        kernels = ("this plugin scores with its Triton kernel there and SGLang calls DeepGEMM with its native next_n"
                   if cap >= (10, 0) else "this plugin scores with its Triton kernel there")
        return (f"the times were measured on an {gpu.replace('NVIDIA ', '')} (compute capability 9.0, the Hopper "
                f"kernel); on compute capability {cap[0]}.{cap[1]} {kernels}")
    if dev.name == UNNAMED_GPU:
        return "reason: GPU not named; pass --gpu"
    name = _named_gpu(dev)
    if name and not measured_on(gpu, name):
        return f"measured on {measured_gpus or gpu}, not {name.replace('NVIDIA ', '')}"
    if server is not None:
        return f"reason: {server}"
    if sharded and dcp_size > 1:
        return ("the sharded index under DCP adds a candidate exchange per step; at DCP 2 on two H200 it was slower "
                "than the replicated index at every measured shape (user guide, \"Decode context parallelism\")")
    if without_dcp and dcp_size > 1:
        return f"the {gpu.replace('NVIDIA ', '')} times were measured without DCP, not at DCP {dcp_size}"
    if dcp_size > 2:
        return f"only DCP width 2 was measured (on two H200), not DCP {dcp_size}"
    if fused_rotation:
        if fused_measured:
            return f"{FUSED_PATH}; that path was {fused_measured}"
        return f"{FUSED_PATH}, so the indexer may be slower than with FP8; that path's time on a GPU is not measured"
    return None


def _gemm_and_gpus(sec: dict, found: dict) -> str:
    """The SGLang decode runs' FP8 GEMM backend and GPUs against the server flags' (``found``)."""
    tp = sec["tp_size"]
    asked = found["fp8_gemm_backend"] + (", SGLang's default," if found["fp8_gemm_backend"] == "auto" else "")
    return (f"--fp8-gemm-backend {sec['fp8_gemm_backend']} on {tp} GPU{'s' if tp > 1 else ''} at --tp-size {tp}, "
            f"not --fp8-gemm-backend {asked} at --tp-size {found['tp_size']}")


def unquoted_reason(gpu: str, dev: DeviceFacts, row: dict | None, shapes: str, unmeasured: str | None,
                    checks) -> str | None:
    """Why a whole-step row measured inside SGLang on ``gpu`` is not quoted for this deployment, or None.

    In order: another named GPU; no row at this shape (``shapes``: what was measured); ``unmeasured`` (the
    configuration's own reason); then every ``(differs, text)`` of ``checks`` that holds, joined as "measured with
    ...". The shape comes before the flags: where it was never measured, no flag or device would make a row hold.
    """
    if _named_gpu(dev) and not measured_on(gpu, dev.name):
        return f"measured on {gpu} only, not {dev.name.replace('NVIDIA ', '')}"
    if row is None:
        return f"measured at {shapes} only"
    if unmeasured is not None:
        return unmeasured
    differs = [text for cond, text in checks if cond]
    return "measured with " + "; ".join(differs) if differs else None


def _sglang_decode(tables: dict, found: dict, unmeasured: str | None, *, heads: int, batch: int, context: int,
                   next_n: int, topk: int) -> dict:
    """``sglang_decode`` (the SGLang-measured decode row of exactly this shape, for server flags with the runs'
    ``--fp8-gemm-backend`` and ``--tp-size``, or None) and, when None, ``sglang_decode_why`` (why none is quoted;
    None where the tables have no SGLang rows at all)."""
    from ..tables import measured_decode

    sec = tables.get("sglang")
    if not sec:
        return {"sglang_decode": None, "sglang_decode_why": None, "sglang_decode_run": None}
    shapes = ", ".join(f"{r['batch']} x {_k(r['context'])}" for r in sec["rows"])
    row = measured_decode(tables, batch, context)
    # The SGLang runs' model selects DSA's top-2048, the tables' top-k (make-model's v32-layers config).
    run_topk = int(tables["recall"]["topk"])
    why = unquoted_reason(sec["gpu"], found["device_facts"], row, shapes, unmeasured, (
        (next_n != 1, f"MTP off, not at next_n {next_n}"),
        (heads != sec["index_heads"], f"{sec['index_heads']} index heads, not {heads}"),
        (topk != run_topk, f"top-{run_topk} selection, not top-{topk}"),
        (found.get("kv_dtype") != sec["kv_cache_dtype"],
         f"an {sec['kv_cache_dtype'].upper()} MLA KV cache, not {str(found.get('kv_dtype')).upper()}"),
        (found["dcp_size"] != 1, f"no DCP, not DCP {found['dcp_size']}"),
        ((found["fp8_gemm_backend"], found["tp_size"]) != (sec["fp8_gemm_backend"], sec["tp_size"]),
         _gemm_and_gpus(sec, found))))
    if why is not None:
        row = None
    run = {k: sec[k] for k in ("gpu", "date", "model")}
    return {"sglang_decode": row, "sglang_decode_why": why, "sglang_decode_run": run}


def depth_text(row: dict, its: str = "") -> str:
    """The depth a ``cycle`` section row was measured at: "all 61 layers", or "20 of 61 layers" (``its="its "``:
    "20 of its 61 layers")."""
    if row["layers"] >= row["full_depth"]:
        return f"all {row['full_depth']} layers"
    return f"{row['layers']} of {its}{row['full_depth']} layers"


def cycle_gain_text(row: dict | None, run: dict | None) -> str | None:
    """The server's measured step as the verdict names it: "a 1.082x shorter MTP verify cycle (GPU busy time inside
    SGLang's server, NVIDIA H200, 20 of 61 layers)" (a decode step with next_n 1; "longer" where FP4's is
    longer; "a 1.090-1.092x shorter ... FP8 and FP4 servers in both orders" where the row has ``other_orders``),
    from a ``cycle`` section row and its section's ``gpu``; None without a row."""
    if row is None or run is None:
        return None
    ratios = [row["fp8_ms"] / row["fp4_ms"]] + [o["fp8_ms"] / o["fp4_ms"] for o in row.get("other_orders", [])]
    what = "MTP verify cycle" if row["next_n"] > 1 else "decode step"
    orders = ", FP8 and FP4 servers in both orders" if len(ratios) > 1 else ""
    return (f"{_step_change(min(ratios), max(ratios))} {what} (GPU busy time inside SGLang's server{orders}, "
            f"{run['gpu']}, {depth_text(row)})")


def _step_change(lo: float, hi: float) -> str:
    """FP4's step against FP8's from the FP8 / FP4 time ratios ``lo`` <= ``hi``: "a 1.090-1.092x shorter", "a
    1.009x longer", or "a 1.020x longer to 1.010x shorter" where they straddle 1."""
    def span(a: float, b: float) -> str:
        return f"{a:.3f}x" if f"{a:.3f}" == f"{b:.3f}" else f"{a:.3f}-{b:.3f}x"

    if lo >= 1:
        return f"a {span(lo, hi)} shorter"
    if hi < 1:
        return f"a {span(1 / hi, 1 / lo)} longer"
    return f"a {1 / lo:.3f}x longer to {hi:.3f}x shorter"


def load_gain_text(load: dict | None, run: dict | None, requests: tuple[int, int]) -> str | None:
    """A KV-limited load measured on this deployment's rank as the verdict names it: "measured on such a rank inside
    SGLang's server (9 requests of 64K with 512 output tokens each, MTP verifying 4 tokens, NVIDIA H100 80GB HBM3,
    all 61 layers): FP8 ran 8 at once and FP4 9, 24.8 against 27.4 output tokens/s (1.105x); with the servers in the
    other order 24.5 against 26.3 (1.077x)" (the last clause where the load has ``other_orders``), from a
    ``cycle_load`` result and its section's ``gpu``; None without one, or where ``requests`` (the FP8 and FP4 pools'
    requests that ``check`` found for this deployment's memory) are not the load's."""
    if load is None or run is None or requests != (load["fp8_requests"], load["fp4_requests"]):
        return None
    verify = f"MTP verifying {load['next_n']} tokens" if load["next_n"] > 1 else "MTP off"
    others = "".join(f"; with the servers in the other order {o['fp8_tok_s']:.1f} against {o['fp4_tok_s']:.1f} "
                     f"({o['fp4_tok_s'] / o['fp8_tok_s']:.3f}x)" for o in load.get("other_orders", []))
    return (f"measured on such a rank inside SGLang's server ({load['concurrency']} requests of {_k(load['context'])} "
            f"with {load['output_len']} output tokens each, {verify}, {run['gpu']}, {depth_text(load)}): FP8 ran "
            f"{load['fp8_requests']} at once and FP4 {load['fp4_requests']}, {load['fp8_tok_s']:.1f} against "
            f"{load['fp4_tok_s']:.1f} output tokens/s ({load['fp4_tok_s'] / load['fp8_tok_s']:.3f}x){others}")


def worth_it(found: dict, *, context: int, batch: int = 1, next_n: int = 1, tables: dict | None = None,
             cycle=None) -> dict:
    """What FP4 gains and costs at one serving shape, and the decision, from ``run_check``'s findings and the tables.

    The decision (``decision``, and the exit code ``main`` returns for it):

    - ``"neither"`` (``EXIT_FITS_NEITHER``): ``batch`` requests of ``context``
      tokens fit the KV pool with neither index format;
    - ``"more"`` (``EXIT_FP4_FITS_MORE``): FP4 fits more requests of this
      length than FP8 (the verdict says how many more, and whether the batch
      fits only with FP4);
    - ``"same"`` (``EXIT_SAME_REQUESTS``): both fit the same number of
      requests, so FP4 buys only its indexer time, at the measured cost.

    The verdict leads with the gain in requests of ``context`` tokens (``requests_gain``: "FP4 fits 5 requests of
    128K where FP8 fits 4 (+25 %)"), whichever the decision. It says "turn it on" only for a measured benefit: more
    requests, or the same number with a measured faster indexer. Where the speed is not measured and the requests
    are the same, or FP4 runs SGLang's unfused index-query path (the rotation inside its fused indexer, whose speed
    may be lower), it says the speed is not measured and how to measure it (``MEASURE_SPEED``); where the indexer
    was measured slower and the requests are the same, it says to keep FP8.

    The time is the measured row nearest the shape among rows with the asked
    ``next_n`` (``tables.nearest_timing``), quoted only when it is near
    (``tables.timing_is_near``: same index heads, keys read within 2x, batch within 4x; else
    ``timing_far`` holds the nearest of all the GPU's sections and no speed is claimed, the reason being the head
    count where its heads differ from the model's); for an H100 80GB HBM3 the rows measured inside one SGLang server
    (``timing_serving``) win where one is near, else the kernel benchmark's (``timing_more``; ``_timing_sections``).
    Where the row has DeepGEMM's newer SM90 kernel's time, the speed names FP4 against it too (the decision stays
    against FP8 as SGLang 0.5.23 calls it). Without such a row none is quoted,
    and none where the measured configuration (an H200 at compute capability
    9.0 running the Hopper kernel, single-GPU or a replicated DCP rank; for an H100 80GB HBM3, without DCP) is not
    the one asked about: another GPU (by its whole name: H20, H100 PCIe, H200 NVL) or capability, a GPU not
    named (``--capability`` without ``--gpu`` and no local GPU of that capability), the sharded DCP index, a
    replicated DCP width other than 2 (any DCP for the H100's rows), a PD prefill or decode server, the
    hierarchical cache, two-batch overlap, a batch above the largest decode CUDA graph or above
    ``--max-running-requests`` (per DP-attention rank: its share), or
    the plugin's rotation inside SGLang's fused indexer (``timing_unmeasured`` says why).
    The cost is the top-k recall at the nearest measured context
    (``tables.nearest_recall``) and the real-model study's loss and passkey
    numbers at the nearest measured context for each indexer it was measured with
    (``tables.nearest_model_cost``, at the tables' top-k, 2048, DSA's ``index_topk``).

    With DP attention or data-parallel replicas (``found["batch_split"]``: ``(N, what)``, N > 1) every rank or
    replica holds its own KV pool, the per-GPU budget, and decodes its share of the batch: the requests that fit,
    the verdict and the time are per rank, for ``ceil(batch / N)`` requests. The cost is not quoted where the model's ``index_topk``
    (``found["index_topk"]``) is not the tables' top-k (``topk_unmeasured``).

    Args:
        found: ``run_check``'s result for a DSA model (with ``capacity``).
        context: tokens per request.
        batch: requests decoded together (over all DP-attention ranks).
        next_n: query tokens per request and step (1: decode; SGLang's draft tokens, the verified one counted, in
            speculative verify).
        tables: measured tables (default: the packaged ones, ``tables.load_tables``).
        cycle: the server's whole step measured for this deployment, as a function ``(unmeasured, heads=,
            batch=, context=, next_n=, topk=) -> dict`` (``check.cycle.verify_cycle`` bound to the tables and the
            findings); its result joins the output (``cycle``, ``cycle_why``, ``cycle_run``) and, where it holds a
            row, the verdict names that gain beside the indexer's (``cycle_gain_text``). None: no cycle.

    Returns:
        dict: ``requests_fp8`` / ``requests_fp4`` (requests of ``context`` tokens
        that fit), ``tokens_needed`` (``batch * context``), ``timing`` (the
        nearest measured row with this next_n, or None), ``timing_far`` (that row where it is too far to
        quote), ``timing_heads_shapes`` (the batch x context measured with this next_n and the model's index
        heads, as text), ``timing_next_n``
        (the measured next_n values), ``timing_exact``, ``timing_gpu``, ``timing_stack`` (torch and triton of that run),
        ``timing_method`` (how the quoted row's section measured it: inside a server, or the scorer alone on an
        H100; None for the H200's),
        ``recall`` (rows at the nearest measured context), ``recall_exact``,
        ``recall_device``, ``model_cost`` (``tables.nearest_model_cost`` per indexer in
        ``tables.model_indexers``' order; empty without a model section), ``sglang_decode`` (the decode step measured inside SGLang at
        exactly this batch and context, MTP off, with this index-head count,
        MLA KV format and no DCP: ``tables.measured_decode``; else None, with
        ``sglang_decode_why``), ``sglang_decode_run``, ``topk``, ``model_topk``, ``topk_unmeasured``,
        ``batch_split`` (as ``found``'s), ``rank_batch`` (requests per rank or replica; ``tokens_needed`` is theirs), ``decision``,
        ``exit_code`` and ``verdict`` (one line).

    Raises:
        ValueError: ``found`` has no memory rows (not a DSA model), a
            non-positive shape, or ``context < next_n``.
    """

    from ..tables import load_tables, model_indexers, nearest_model_cost, nearest_recall, nearest_timing, timing_is_near

    cap: DcpCapacity | None = found.get("capacity")
    if cap is None:
        raise ValueError("--context: the model has no DSA index-key cache, so FP4 changes nothing at any context")
    if context < next_n:
        raise ValueError(f"--context: {context} tokens cannot hold --next-n {next_n} query tokens")
    tables = load_tables() if tables is None else tables
    heads = found["model"].index_n_heads or 64
    # Every DP-attention rank or data-parallel replica holds its own KV pool and decodes its share of the batch.
    dp, unit = found.get("batch_split", (1, ""))
    rank_batch = -(-batch // dp)
    sharded = found["fp4_mode"] == SHARDED
    tokens_fp4 = cap.tokens_fp4_sharded if sharded else cap.tokens_fp4_replicated
    gain = cap.gain_sharded if sharded else cap.gain_replicated
    dev: DeviceFacts = found["device_facts"]
    sections = _timing_sections(tables, dev)
    timing = sections[0]
    measured_n = sorted({r["next_n"] for sec in sections for r in sec["rows"]})
    gpu = timing["gpu"]
    every = (tables["timing"], tables.get("timing_serving"), *(tables.get("timing_more") or []))
    all_gpus = " and ".join(dict.fromkeys(sec["gpu"] for sec in every if sec))
    fused = tables.get("cycle_fused") if found.get("fused_rotation") else None
    fused_text = fused_cycle_text(fused)
    # Every measured step of that path longer with FP4: what the verdict says instead of "not measured".
    fused_longer = fused_text is not None and all(r["fp4_ms"] > r["fp8_ms"] for r in fused["rows"])
    fused_said = ("on the index path FP4 takes with interleaved indexer RoPE its step was measured longer, not "
                  f"shorter ({fused_text})")
    unmeasured = _unmeasured_configuration(dev, gpu, sharded, found["dcp_size"], found.get("fused_rotation", False),
                                          found.get("server_unmeasured"), all_gpus,
                                          without_dcp=timing is not tables["timing"], fused_measured=fused_text)
    graph_max = found.get("decode_graph_max_bs")
    if unmeasured is None and graph_max is not None and rank_batch > graph_max:
        unmeasured = (f"reason: a batch of {rank_batch} is above the largest decode CUDA graph ({graph_max}, set by "
                      "the CUDA-graph flags), so it decodes without graphs; not measured")
    running = found.get("max_running_requests")
    limit_split = dp > 1 and unit == "DP-attention rank"  # SGLang splits the limit over DP-attention ranks
    if running is not None:
        running = max(1, int(running) // dp) if limit_split else int(running)
    if unmeasured is None and running is not None and rank_batch > running:
        unmeasured = (f"reason: a batch of {rank_batch} is above --max-running-requests ({running}"
                      f"{' per rank' if limit_split else ''}), so the server never decodes it at once; not measured")
    # The near row of the first section that has one (in-server before kernel benchmark); else the nearest of all.
    same_n = [r for sec in sections for r in sec["rows"] if r["next_n"] == next_n]
    row = far = None
    if same_n and unmeasured is None:
        for sec in sections:
            own = [r for r in sec["rows"] if r["next_n"] == next_n]
            near = own and nearest_timing({"timing": {"rows": own}}, heads, rank_batch, context, next_n)
            if near and timing_is_near(near, heads, rank_batch, context):
                row, timing = near, sec
                break
        else:
            far = nearest_timing({"timing": {"rows": same_n}}, heads, rank_batch, context, next_n)
    recall = nearest_recall(tables, heads, context)
    topk = int(tables["recall"]["topk"])
    model_topk = found.get("index_topk") or topk
    # The recall and loss tables are at top-``topk``: another top-k selects another share of the keys.
    topk_unmeasured = (f"measured at top-{topk}, not at this model's index_topk {model_topk}"
                       if model_topk != topk else None)
    model_cost = [r for r in (nearest_model_cost(tables, context, topk, kind, on) for kind, on in model_indexers(tables))
                  if r is not None]
    out = {
        "requests_fp8": cap.tokens_fp8 // context, "requests_fp4": tokens_fp4 // context,
        "tokens_needed": rank_batch * context, "tokens_fp8": cap.tokens_fp8, "tokens_fp4": tokens_fp4, "gain": gain,
        "batch_split": (dp, unit), "rank_batch": rank_batch, "model_topk": model_topk, "topk_unmeasured": topk_unmeasured,
        "timing": row, "timing_next_n": measured_n, "timing_gpu": gpu,
        "timing_stack": timing.get("stack", ""), "timing_method": timing.get("method"),
        "timing_unmeasured": unmeasured, "timing_far": far,
        "timing_heads_shapes": list(dict.fromkeys(f"{r['batch']} x {_k(r['context'])}" for r in same_n
                                                  if r["heads"] == heads)),
        "timing_exact": row is not None and (row["heads"], row["batch"], row["context"]) == (heads, rank_batch, context),
        "recall": recall, "recall_exact": recall[0]["context"] == context, "recall_device": tables["recall"]["device"],
        "model_cost": model_cost, "topk": topk, "heads": heads,
        **_sglang_decode(tables, found, unmeasured, heads=heads, batch=rank_batch, context=context, next_n=next_n,
                         topk=model_topk),
    }
    if cycle is not None:
        out.update(cycle(unmeasured, heads=heads, batch=rank_batch, context=context, next_n=next_n, topk=model_topk))
    step = cycle_gain_text(out.get("cycle"), out.get("cycle_run"))
    # The speed: measured faster or slower (``measured_speed``), else not measured and why (``speed_unknown``).
    measured_speed = speed_unknown = None
    if unmeasured is not None:
        speed_unknown = f"not measured for this configuration ({unmeasured})"
    elif far is not None:
        speed_unknown = "not measured " + ("at this shape" if far["heads"] == heads
                                           else f"with {heads} index heads at this shape")
    elif row is None:
        speed_unknown = f"not measured at next_n {next_n} (measured: next_n {', '.join(map(str, measured_n))})"
    elif row["fp8_us"] is not None:
        measured_speed = row["fp8_us"] / row["fp4_us"]
    elif row.get("fp8_floor_us") and row["fp4_us"] < row["fp8_floor_us"]:
        measured_speed = float("inf")  # FP4 under FP8's bandwidth floor: faster, by an unmeasured factor
    else:
        speed_unknown = "not measured against FP8 at this shape"
    # Against DeepGEMM's newer SM90 kernel too where the row has it: in the words only, the decision being against
    # FP8 as SGLang 0.5.23 calls it, what its server runs.
    newer = (f" ({_against(row['fp8_sm90_newer_us'] / row['fp4_us'], _NEWER_FP8)})"
             if measured_speed not in (None, float("inf")) and row.get("fp8_sm90_newer_us") is not None else "")
    # The server's whole step, where measured for this deployment, is a measured speed too.
    cycle_ratio = out["cycle"]["fp8_ms"] / out["cycle"]["fp4_ms"] if out.get("cycle") is not None else None
    if measured_speed is None and step is not None:
        speed = step
    elif measured_speed is None:
        speed = f"an indexer speed that is {speed_unknown}"
    elif measured_speed == float("inf"):
        speed = "a faster indexer (FP4 under FP8's bandwidth floor)"
    elif newer:
        speed = f"an indexer {_against(measured_speed, _SGLANG_FP8)}{newer}"
    else:
        speed = (f"a {measured_speed:.2f}x faster indexer" if measured_speed >= 1
                 else f"a {1 / measured_speed:.2f}x slower indexer")
    if step is not None and measured_speed is not None:
        speed += f" and {step}"
    # The speed that says "slower": the indexer's where measured, else the server's whole step.
    decisive, slower_what = ((measured_speed, "its indexer is") if measured_speed is not None
                             else (cycle_ratio, "the server's step is"))
    slower = 1 / decisive if decisive is not None and decisive < 1 else None
    text = next((r for r in recall if r["workload"] == "text"), recall[0])
    if context <= model_topk:
        cost = f"no cost (top-{model_topk} keeps all {_k(context)} keys, so the selection cannot change)"
    elif topk_unmeasured is not None:
        cost = None
    else:
        cost = (f"{(text['fp8'] - text['fp4']) * 100:.1f} points less top-{topk} recall at "
                f"{_k(text['context'])} ({text['workload']} workload); {_model_cost_text(model_cost, context, topk)}")
    rf8, rf4 = out["requests_fp8"], out["requests_fp4"]
    per_rank = (f", per {unit} ({dp} {unit}s, each with its own KV pool: the batch of {batch} is "
                f"{rank_batch} per {unit.split()[-1]})" if dp > 1 else "")
    gain_text = requests_gain(rf8, rf4, context, gain) + per_rank
    load_text = load_gain_text(out.get("cycle_load"), out.get("cycle_run"), (rf8, rf4))
    out["cycle_load"] = out.get("cycle_load") if load_text else None
    if load_text:
        gain_text += f"; {load_text}"
    # --max-running-requests at or below what FP8's pool holds: FP4's extra room is never used; between the
    # pools, only some of it.
    capped = running is not None and rf4 > rf8 and running <= rf8
    if running is not None and rf8 < rf4:
        lets = f"--max-running-requests lets {running} run at once{' per ' + unit.split()[-1] if limit_split else ''}"
        if capped:
            gain_text += f", but {lets}, which FP8's pool holds already"
        elif running < rf4:
            gain_text += f" ({lets}: {running - rf8} more than FP8's pool holds)"
    measure = MEASURE_FUSED if found.get("fused_rotation") else f"with {MEASURE_SPEED}"
    cost_text = (f"measured cost: {cost}" if cost is not None else f"its cost is not measured ({topk_unmeasured})")
    if out["tokens_needed"] > tokens_fp4:
        out["decision"], out["exit_code"] = "neither", EXIT_FITS_NEITHER
        out["verdict"] = (f"{gain_text}; neither fits the batch asked: {rank_batch} x {_k(context)} needs "
                          f"{out['tokens_needed']} KV tokens, FP8 holds {cap.tokens_fp8}, FP4 {tokens_fp4}; lower "
                          "--batch or add memory")
    elif rf4 > rf8 and not capped:
        # Where the batch asked fits FP8's pool too, FP4's extra requests count only under a larger load.
        per = f" per {unit.split()[-1]}" if dp > 1 else ""
        only = ("; your batch fits only with FP4" if out["tokens_needed"] > cap.tokens_fp8 else
                f" (more than {rf8} requests of {_k(context)} at once{per}; your batch of {rank_batch}{per} fits "
                "either way)")
        out["decision"], out["exit_code"] = "more", EXIT_FP4_FITS_MORE
        if found.get("fused_rotation") and measured_speed is None and step is None and fused_longer:
            out["verdict"] = (f"{gain_text}{only}, but {fused_said}: turn FP4 on only where those "
                              "extra requests are worth that, "
                              f"and measure your own shape first, {measure}; {cost_text}")
        elif found.get("fused_rotation") and measured_speed is None and step is None:
            # The one configuration whose speed may be lower with FP4 than with FP8: no "turn it on" unmeasured.
            out["verdict"] = (f"{gain_text}{only}, but its indexer speed is {speed_unknown}: measure it before "
                              f"turning FP4 on, {measure}; {cost_text}")
        else:
            out["verdict"] = (f"{gain_text}: turn FP4 on where KV memory limits you{only}, with {speed}; "
                              f"{cost_text}")
    else:
        out["decision"], out["exit_code"] = "same", EXIT_SAME_REQUESTS
        if measured_speed is None and step is None and fused_longer:
            out["verdict"] = (f"{gain_text}, and {fused_said}: FP4 gains nothing measured for this "
                              "deployment, keep FP8 (to "
                              f"measure your own shape: {measure}); {cost_text}")
        elif measured_speed is None and step is None:
            against = ("so no measured gain stands against its measured cost" if cost is not None
                       else f"and its cost is not measured either ({topk_unmeasured})")
            measured_cost = f"; {cost_text}" if cost is not None else ""
            out["verdict"] = (f"{gain_text}, and its indexer speed is {speed_unknown}, {against}: measure the "
                              f"speed before turning FP4 on, {measure}{measured_cost}")
        elif slower is not None:
            out["verdict"] = (f"{gain_text}, and {slower_what} {slower:.2f}x slower here"
                              + (f" than {_SGLANG_FP8}{newer}" if newer else "")
                              + (f" ({step})" if step else "") + f": FP4 gains nothing for this deployment, keep FP8; "
                              f"{cost_text}")
        elif cost is None:
            out["verdict"] = (f"{gain_text}, so it buys only {speed}, at a cost that is not measured "
                              f"({topk_unmeasured})")
        else:
            out["verdict"] = (f"{gain_text}, so it buys only {speed}, at a measured cost of {cost}: turn it on if "
                              "that cost is acceptable")
    return out
