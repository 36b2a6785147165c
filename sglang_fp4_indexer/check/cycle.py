"""The server's whole step with FP8 and FP4 index keys, as ``check --context`` quotes it: only where measured.

The tables' verify-cycle sections (``tables.cycle_sections``: ``cycle``, then ``cycle_more``, each built by
``tables.verify_cycle_section``) hold the GPU's busy time per MTP verify cycle or decode step inside SGLang's server
on one DP-attention rank of DeepSeek-V3.2 (64 index heads, top-2048, an FP8 MLA KV cache, no DCP), at a few shapes:
20 layers of an EP8 rank on an H200, projected to 61, and all 61 layers of an EP32 rank on an H100. A step's time
mixes the indexer with every other kernel, so it is quoted only for that deployment: the GPU it was measured on (the
section of that GPU), DP attention, the model's index heads and top-k, the MLA KV format, no DCP, the GPUs the
routed experts spread over (``--tp-size``), and exactly the per-rank batch, context and next_n; anywhere else
``check`` says it was not measured and why.
"""

from __future__ import annotations

from ..tables import cycle_load, cycle_row, cycle_sections
from .trade import _k, _named_gpu, depth_text, measured_on, unquoted_reason

__all__ = ["verify_cycle", "cycle_line"]


def verify_cycle(tables: dict, found: dict, unmeasured: str | None, *, heads: int, batch: int, context: int,
                 next_n: int, topk: int) -> dict:
    """The ``cycle`` row measured for exactly this deployment and per-rank shape, or why none is quoted.

    Args:
        tables: the measured tables (``tables.load_tables``).
        found: ``run_check``'s findings (``device_facts``, ``batch_split``, ``kv_dtype``, ``dcp_size``).
        unmeasured: a reason the configuration was not measured at all (graphs, batch limits), or None.
        heads, topk: the model's index heads and top-k; batch: requests per rank; context: tokens per request;
            next_n: the rows each request verifies (1: MTP off).

    Returns:
        dict: ``cycle`` (the row, or None), ``cycle_why`` (why none is quoted; None where the tables have no such
        section), ``cycle_run`` (the section's ``gpu``, ``date``, ``stack`` and ``rank``; None without a section),
        ``cycle_load`` (the section's KV-limited load at exactly this per-rank batch as its concurrency, context and
        next_n, for the same deployment as a row, or None). The section is the one measured on this device's GPU
        where there is one, else the first.
    """
    sections = cycle_sections(tables)
    if not sections:
        return {"cycle": None, "cycle_why": None, "cycle_run": None, "cycle_load": None}
    # The section measured on this GPU (a named one; else the first, which an unnamed GPU is assumed to be).
    name = _named_gpu(found["device_facts"])
    sec = next((s for s in sections if name and measured_on(s["gpu"], name)), sections[0])
    shapes = ", ".join(f"{r['batch']} x {_k(r['context'])} " + ("with MTP off" if r["next_n"] == 1 else
                                                                 f"verifying {r['next_n']} tokens")
                       for r in sec["rows"])
    row = cycle_row(sec, batch, context, next_n)
    _, unit = found.get("batch_split", (1, ""))
    gpus = " and ".join(dict.fromkeys(s["gpu"] for s in sections))
    deployment = (
        (unit != "DP-attention rank", "DP attention, one rank's batch and layers, not this parallelism"),
        (heads != 64, f"64 index heads, not {heads}"),
        (topk != 2048, f"top-2048 selection, not top-{topk}"),
        (found.get("kv_dtype") != "fp8", f"an FP8 MLA KV cache, not {str(found.get('kv_dtype')).upper()}"),
        (found.get("dcp_size", 1) != 1, f"no DCP, not DCP {found.get('dcp_size')}"),
        (sec.get("moe_gpus") not in (None, found.get("tp_size")),
         f"the routed experts spread over {sec.get('moe_gpus')} GPUs as --tp-size {sec.get('moe_gpus')} spreads them, "
         f"not over {found.get('tp_size')}"))
    where = sec["gpu"] if measured_on(sec["gpu"], name) or not name else gpus
    why = unquoted_reason(where, found["device_facts"], row, f"{shapes} per rank", unmeasured, deployment)
    if why is not None:
        row = None
    load = cycle_load(sec, batch, context, next_n)
    if unquoted_reason(where, found["device_facts"], load, "", unmeasured, deployment) is not None:
        load = None
    return {"cycle": row, "cycle_why": why,
            "cycle_run": {"gpu": sec["gpu"], "date": sec["date"], "stack": sec["stack"],
                          "rank": sec.get("rank", "DP-attention rank")}, "cycle_load": load}


def cycle_line(w: dict, batch: int, context: int, next_n: int) -> str | None:
    """The line ``check`` prints for ``verify_cycle``'s result ``w`` (None where the tables have no such section)."""
    run, row = w.get("cycle_run"), w.get("cycle")
    if run is None:
        return None
    what = "MTP verify cycle" if next_n > 1 else "decode step"
    if row is None:
        return (f"{what} inside SGLang's server ({run['gpu']}, DeepSeek-V3.2's layers) at {batch} x {_k(context)} "
                f"per rank, next_n {next_n}: not measured ({w['cycle_why']})")
    return (f"{what} inside SGLang's server at {row['batch']} x {_k(row['context'])} per rank, next_n {row['next_n']} "
            f"({run['gpu']}, {run['date']}; one {run['rank']} of DeepSeek-V3.2 with {depth_text(row, 'its ')}"
            f", dummy weights; {run['stack']}): the GPU's busy time FP8 {row['fp8_ms']:.2f} "
            f"ms, FP4 {row['fp4_ms']:.2f} ms ({row['fp8_ms'] / row['fp4_ms']:.3f}x)"
            + "".join(f"; with the servers in the other order FP8 {o['fp8_ms']:.2f} ms, FP4 {o['fp4_ms']:.2f} ms "
                      f"({o['fp8_ms'] / o['fp4_ms']:.3f}x)" for o in row.get("other_orders", []))
            + (f"; projected to {row['full_depth']} layers {row['fp8_61_ms']:.2f} / {row['fp4_61_ms']:.2f} ms "
               f"({row['fp8_61_ms'] / row['fp4_61_ms']:.3f}x)" if row["layers"] < row["full_depth"] else "")
            + ("; FP8 there is DeepGEMM as SGLang 0.5.23 calls it on Hopper, one query row at a time: a DeepGEMM kernel "
               "that takes the verify rows natively would shorten FP8's side (docs/benchmarks.md, \"Against DeepGEMM's "
               "newer SM90 kernel\")" if row["next_n"] > 1 else ""))
