"""``run_check``: the gate's decision for a model config, device and server flags, and the memory effect of each
index format (per rank under DCP). No GPU and no weights are needed.
"""

from __future__ import annotations

import importlib.util
import math
import os
from fractions import Fraction
from typing import Callable

from ..argtypes import MAX_MEMORY_GIB
from ..dcp import DcpCapacity, REPLICATED, SHARDED, bytes_per_token, dcp_capacity
from ..gate import ENTRY_POINT_NAME, Decision, DeviceFacts, ServerFacts, dcp_mode_for, decide, index_key_rotation
from . import budget
from .budget import ASSUMED_GPU, GPUS, UNNAMED_GPU, KvBudget, gpu_key, gpu_memory, kv_budget
from .weights import Parallel
from .model import (
    _SGLANG_KV_DTYPES,
    _check_complete,
    _without_sglang,
    load_hf_config,
    mla_kv_bytes_per_token,
    resolve_model,
    sglang_kv_cache_dtype,
)

__all__ = [
    "run_check",
    "MODEL_REFUSALS",
    "LOADING_SGLANG",
    "NOT_LISTED",
    "plugin_not_listed",
]


#: The refusal code where SGLang's plugin whitelist leaves this plugin out (``plugin_not_listed``).
NOT_LISTED = "not_listed"


def plugin_not_listed() -> str | None:
    """Why SGLang will not load this plugin, or None: ``SGLANG_PLUGINS`` set (non-empty; ``","`` lists nothing)
    without this plugin's entry-point name (``fp4_indexer``). SGLang's ``load_plugins_by_group``
    (sglang/srt/plugins) loads only the comma-separated names that variable lists; without the plugin,
    ``--enable-fp4-indexer`` is an argument SGLang's parser does not know, so launch_server stops at it.
    """
    listed = os.environ.get("SGLANG_PLUGINS", "")
    if not listed or ENTRY_POINT_NAME in {x.strip() for x in listed.split(",")}:  # as SGLang reads it
        return None
    return (f"SGLANG_PLUGINS={listed!r} does not list {ENTRY_POINT_NAME}, so SGLang does not load the plugin and "
            "launch_server stops at --enable-fp4-indexer (unrecognized arguments)")


#: Refusal codes (``Decision.codes``) that come from the model itself: no server flag or environment lifts them,
#: so ``check`` gives no FP4 figure for such a model.
MODEL_REFUSALS = frozenset({"not_dsa", "deepseek_v4", "index_head_dim", "index_heads", "index_kpool"})
#: The line ``check`` prints on stderr before SGLang's import (docs/user-guide.md: 10-30 s,
#: 13-27 s measured on 2-core machines).
LOADING_SGLANG = "loading SGLang to classify the model and parse its flags (its import takes 10-30 s)..."
#: Device kinds SGLang's ``--device`` names (torch's device types that SGLang 0.5.23 runs on).
_DEVICE_KINDS = frozenset({"cuda", "cpu", "npu", "xpu", "hpu", "mps", "musa", "mlu"})


def _device(capability: str | None, gpu: str | None = None) -> tuple[DeviceFacts, str]:
    if capability is not None:
        try:
            major, minor = (int(x) for x in capability.split("."))
        except ValueError:
            raise ValueError(f"--capability: expected MAJOR.MINOR such as 9.0, got {capability!r}") from None
        if not (1 <= major <= 20 and 0 <= minor <= 9):  # CUDA's: 1.0 to 12.x so far, one-digit minor
            raise ValueError(f"--capability: expected a CUDA compute capability MAJOR.MINOR (major 1 to 20, minor 0 "
                             f"to 9) such as 9.0, got {capability!r}")
        if gpu is not None:  # --gpu: its name, so that claims measured on another GPU are not quoted for it
            return DeviceFacts("cuda", (major, minor), GPUS[gpu][2]), f"{gpu}, CUDA {major}.{minor} (given)"
        local = budget.local_gpu()
        if local is not None and local[0] == (major, minor):
            return DeviceFacts("cuda", local[0], local[1]), f"{local[1]}, CUDA {major}.{minor} (given; the local GPU)"
        # No GPU named: which GPU is unknown, so no time measured on one GPU is claimed for it (check.trade).
        return (DeviceFacts("cuda", (major, minor), UNNAMED_GPU),
                f"CUDA {major}.{minor} (given; GPU not named, pass --gpu)")
    local = budget.local_gpu()
    if local is not None:
        cap, name = local
        return DeviceFacts("cuda", cap, name), f"{name}, CUDA {cap[0]}.{cap[1]} (local)"
    return DeviceFacts("cuda", (9, 0), ASSUMED_GPU), "CUDA 9.0 (assumed: no local GPU; --capability to change)"


#: Config fields that tell two models apart for ``check``: what it classifies and sizes the model by.
_SAME_MODEL_KEYS = ("architectures", "num_hidden_layers", "hidden_size", "kv_lora_rank", "qk_rope_head_dim",
                    "index_n_heads", "index_head_dim", "index_topk", "max_position_embeddings")


def _config_file_model(named: str | None, model: str, cfg: dict) -> str | None:
    """Compare the ``model-path`` of a ``--config`` file in the server flags with the model ``check`` was given.

    Args:
        named: the file's ``model-path`` (None: no file, or none in it).
        model: ``check``'s positional model; ``cfg`` its config.

    Returns:
        None where the file names no model or the same one (the same text, or a config with the same
        ``_SAME_MODEL_KEYS`` values); a note for the output where the file's model cannot be read here (neither a
        local path nor a packaged config).

    Raises:
        ValueError: the file names another model than ``model`` (its config differs in a ``_SAME_MODEL_KEYS``
            field): check describes one model, so it says which to give instead of ignoring either.
    """
    if named is None or named == model:
        return None
    try:
        other, _ = load_hf_config(resolve_model(named)[0])
    except ValueError:
        return (f"the --config file's model-path {named} is not read here (no local copy and no packaged config "
                f"of it): check describes {model}")
    differs = [key for key in _SAME_MODEL_KEYS if key in cfg and key in other and cfg[key] != other[key]]
    if differs:
        shown = "; ".join(f"{key} {other[key]!r} there, {cfg[key]!r} here" for key in differs)
        raise ValueError(f"--sglang-args: the --config file names model-path {named}, another model than {model} "
                         f"({shown}); check describes the model it is given: give {named} as check's model, or "
                         "the same model in both")
    return None


def _server_unmeasured(server: ServerFacts, memory: dict | None = None) -> str | None:
    """Why the measured times (a server that decodes under CUDA graphs, no hierarchical cache) do not hold for
    ``server`` (and the adapter's ``memory`` facts, when read), or None."""
    if memory and memory.get("eager_decode"):
        return ("decode without CUDA graphs: the times were measured under CUDA graphs, and an eager call's host "
                "time per layer is not in these tables")
    if server.disaggregation_mode == "prefill":
        return "PD disaggregation prefill server: it runs no decode steps"
    if server.disaggregation_mode == "decode":
        return "PD decode server not measured"
    if server.hicache:
        return "hierarchical cache not measured"
    if memory and memory.get("two_batch_overlap"):
        return "two-batch overlap runs each decode batch as two micro-batches; not measured"
    return None


def _batch_split(memory: dict | None) -> tuple[int, str]:
    """Over how many KV pools SGLang spreads a batch, and what each is: DP-attention ranks, else data-parallel
    replicas (``--dp-size`` without DP attention), each with its own pool; ``(1, "")`` for one server."""
    if memory and memory["attn_dp"] > 1:
        return memory["attn_dp"], "DP-attention rank"
    if memory and memory["dp_replicas"] > 1:
        return memory["dp_replicas"], "data-parallel replica"
    return 1, ""


def _derived_budget(cfg: dict, memory: dict | None, gpu: tuple[int, tuple[int, int] | None, str]) -> KvBudget:
    """The KV budget per GPU as SGLang sizes it (``budget.kv_budget``) from the adapter's ``memory`` facts.

    Raises:
        ValueError: no memory facts (SGLang not importable), or what ``kv_budget`` / ``fraction_for`` raise.
    """
    if memory is None:
        raise ValueError("--memory-gib: SGLang is not importable here, so its --mem-fraction-static rule cannot be "
                         "read to derive the KV pool; give --memory-gib (the size SGLang logs as 'KV Cache is "
                         "allocated')")
    par = Parallel(tp=memory["tp"], attn_dp=memory["attn_dp"], dp_lm_head=memory["dp_lm_head"],
                   a2a_moe=memory["a2a_moe"], mtp=memory["mtp"])
    fraction, how = memory["fraction_for"](gpu[0])
    return kv_budget(cfg, par, gpu[0], gpu[2], fraction, how)


def run_check(model: str, *, memory_gib: float | None = None, gpu: str | None = None, capability: str | None = None,
              kv_cache_dtype: str | None = None, server_flags: list[str] | None = None,
              announce: Callable[[str], None] = lambda line: None,
              read_sglang: Callable[[dict, str, list[str]], tuple] | None = None, capacity: bool = True,
              whitelist: bool = True) -> dict:
    """Do the check and return its findings (what ``main`` prints).

    ``model`` is a local model directory or config JSON file, or a packaged
    config's name (``resolve_model``). ``announce`` is called with one progress line before SGLang's slow import
    (``main`` prints it to stderr).

    ``read_sglang(cfg, model_dir, server_flags)`` reads the model and server facts through SGLang (the adapter's
    ``sglang_plugin.check_facts.read_sglang_facts``, which the ``sglang-fp4-indexer`` command passes): it returns
    ``((model facts, server facts, index layers, SGLang's --kv-cache-dtype, --context-length, (next_n, how),
    memory), "")`` (``(next_n, how)``: target verify's rows per request from the speculative flags, or
    ``(None, ...)``; ``memory``: the parallel layout and SGLang's ``--mem-fraction-static`` rule), or
    ``(None, why)`` when SGLang cannot be imported. Without it the config keys decide, as without SGLang.

    The KV-pool budget per GPU is ``memory_gib`` GiB when given, else derived as SGLang sizes it
    (``budget.kv_budget``): the memory of ``gpu`` (a ``budget.GPUS`` name; default the local GPU, else an H200)
    x ``--mem-fraction-static`` (the flag's, else SGLang's own default for that GPU and these flags) - the
    weights per GPU computed from the config's shapes (``weights.weight_bytes_per_gpu``); ``budget`` holds it
    (None when given). ``gpu`` also sets the compute capability when ``capability`` is not given.

    The MLA KV format is ``kv_cache_dtype`` (``"fp8"``/``"bf16"``) when given,
    else the ``--kv-cache-dtype`` of the server flags, else SGLang's default
    for the device (``sglang_kv_cache_dtype``). Under DCP (``--dcp-size W``)
    the memory rows are per rank (``dcp.bytes_per_token``, ``dcp.dcp_capacity``):
    the MLA KV is sharded over the W ranks, the index replicated or sharded.

    With ``whitelist`` (the default), an ``SGLANG_PLUGINS`` in this environment that leaves the plugin out
    (``plugin_not_listed``) is the decision, before any other refusal (code ``NOT_LISTED`` first): a server
    launched from here with ``--enable-fp4-indexer`` would not start. ``ab`` passes False for servers that run
    elsewhere (given by URL).

    Returns:
        dict with ``decision`` (``Decision``), ``device`` (text), ``detection``
        (what classified the model: SGLang's helpers or the config keys), ``model``
        (``ModelFacts``), ``model_text``, ``layers``, ``index_layers``,
        ``dcp_size``, ``file``, ``source`` (the Hugging Face repository of a
        packaged config, else empty), ``positions`` (the longest request: the
        server flags' ``--context-length``, else ``max_position_embeddings``,
        else None) and ``positions_from``, ``verify_next_n`` and ``verify_how`` (target
        verify's rows per request from the speculative flags and how, or None), ``fp8_gemm_backend`` and
        ``tp_size`` (the server flags' ``--fp8-gemm-backend`` and ``--tp-size``, SGLang's defaults ``auto`` and 1
        without them), ``gpu_layout`` (the GPUs one server takes as SGLang's parser reads the flags, abbreviations
        included: ``gpus``, ``--tp-size`` x ``--pp-size`` x data-parallel replicas, and ``nnodes``,
        ``base_gpu_id``, ``gpu_id_step``; None without SGLang), ``model_refusal`` (the refusal is the
        model's own, ``MODEL_REFUSALS``: then nothing below is given); for DSA
        models FP4 can serve ``index_keys`` (whether the index keys are Hadamard-rotated, by
        SGLang or the plugin: ``gate.index_key_rotation``), ``kv_dtype``, ``kv_dtype_why``, ``kv_bytes``, ``capacity
        (``dcp.DcpCapacity``), ``fp4_mode`` (the DCP mode of the FP4 rows the
        gain refers to: the decision's, or what the flags would give when refused)
        and ``rows``: ``(label, index bytes per rank, KV + index bytes per layer
        per rank, KV + index bytes of all layers per rank, tokens)``, bytes as
        ``Fraction``; also ``device_facts`` (``DeviceFacts``). With ``capacity`` False (``ab`` asks for the
        decision only: the servers it launches size their own pools) the keys from ``kv_dtype`` on are left out
        and no memory budget is derived, so nothing about the memory is raised.

    Raises:
        ValueError: unreadable or incomplete config (a DSA model without its
            layer count or MLA sizes, a DSA-by-name architecture without
            ``index_topk``), bad options (``memory_gib`` not a finite number in
            ``(0, MAX_MEMORY_GIB]``), rejected server flags, a KV dtype conflict
            between ``kv_cache_dtype`` and the server flags; without ``memory_gib``: an unknown ``gpu``, weights
            that do not fit, a config without the sizes the weights need, or SGLang not importable.
    """
    if memory_gib is not None and not (isinstance(memory_gib, (int, float)) and math.isfinite(memory_gib) and 0 < memory_gib <= MAX_MEMORY_GIB):
        raise ValueError(f"--memory-gib: expected a finite number > 0 and <= {MAX_MEMORY_GIB}, got {memory_gib}")
    flags = list(server_flags or [])
    path, source = resolve_model(model)
    cfg, file = load_hf_config(path)
    if read_sglang is None:
        found, why = None, "the check was not given SGLang's fact reader"
    else:
        if importlib.util.find_spec("sglang") is not None:
            announce(LOADING_SGLANG)
        found, why = read_sglang(cfg, str(file.parent), flags)
    detection = "SGLang's own DSA helpers"
    if found is None:
        found, detection = _without_sglang(cfg, flags, why), f"its config keys, SGLang not being importable here: {why}"
    model_facts, server, index_layers, server_kv, context_length, verify, memory = found
    _check_complete(cfg, file, model_facts)
    config_model_note = _config_file_model((memory or {}).get("config_model_path"), model, cfg)
    gpu_found = gpu_memory(gpu) if memory_gib is None or gpu is not None else None
    if capability is None and gpu_found is not None and gpu_found[1] is not None:
        capability = "%d.%d" % gpu_found[1]
    device, device_text = _device(capability, gpu_key(gpu) if gpu is not None else None)
    asked = (memory or {}).get("device")
    if asked:  # --device in the server flags: the server's device, whatever this machine has
        kind, _, ordinal = str(asked).partition(":")
        if kind not in _DEVICE_KINDS or (ordinal and not ordinal.isdigit()):
            raise ValueError(f"--sglang-args: --device {asked!r}: expected one of {', '.join(sorted(_DEVICE_KINDS))}"
                             ", optionally with :INDEX (such as cuda:0)")
        if kind != "cuda":
            device, device_text = DeviceFacts(kind), f"{asked} (--device in --sglang-args)"
    decision: Decision = decide(model_facts, server, device)
    unlisted = plugin_not_listed() if whitelist else None
    if unlisted is not None:  # before any other refusal: a server with the flag does not start at all
        decision = Decision(False, unlisted, fix=f"add {ENTRY_POINT_NAME} to SGLANG_PLUGINS, or unset it",
                            codes=(NOT_LISTED, *(c for c in decision.codes if c != "off")))
    arch = model_facts.architecture or f"no architectures in config, model_type {cfg.get('model_type')!r}"
    positions = context_length or cfg.get("max_position_embeddings")
    out = {"decision": decision, "device": device_text, "detection": detection, "model": model_facts,
           "model_text": arch, "layers": int(cfg.get("num_hidden_layers", 0) or 0), "index_layers": index_layers,
           "file": str(file), "source": source, "dcp_size": server.dcp_size, "device_facts": device,
           "positions": int(positions) if isinstance(positions, int) and positions > 0 else None,
           "positions_from": ("--context-length in --sglang-args" if context_length
                              else "max_position_embeddings in its config.json"),
           "model_refusal": bool(MODEL_REFUSALS.intersection(decision.codes)),
           "config_model_note": config_model_note,
           "verify_next_n": verify[0], "verify_how": verify[1],
           "server_unmeasured": _server_unmeasured(server, memory),
           "batch_split": _batch_split(memory),
           "index_topk": cfg.get("index_topk"),
           "decode_graph_max_bs": memory.get("decode_graph_max_bs") if memory else None,
           "max_running_requests": memory.get("max_running_requests") if memory else None,
           # Without SGLang no flags are read: the server's would be SGLang's defaults.
           "fp8_gemm_backend": memory["fp8_gemm_backend"] if memory else "auto",
           "tp_size": memory["tp"] if memory else 1,
           "gpu_layout": dict({k: memory[k] for k in ("nnodes", "base_gpu_id", "gpu_id_step")},
                              gpus=memory["tp"] * memory["pp"] * memory["dp_replicas"]) if memory else None}
    if model_facts.is_dsa and not out["model_refusal"]:
        out["index_keys"] = index_key_rotation(model_facts, server)[1]
        # The plugin's rotation inside SGLang's fused indexer (interleaved indexer RoPE, fusion not disabled) runs
        # SGLang's unfused query path there: its speed is not what the tables measured.
        out["fused_rotation"] = bool(model_facts.indexer_rope_interleave and not server.indexer_fusion_disabled)
        if kv_cache_dtype is not None and server_kv != "auto":
            if _SGLANG_KV_DTYPES.get(server_kv) != kv_cache_dtype:
                raise ValueError(f"--kv-cache-dtype {kv_cache_dtype} conflicts with --kv-cache-dtype {server_kv} "
                                 "in --sglang-args; give one of them")
        if not capacity:
            return out
        if kv_cache_dtype is not None and server_kv == "auto":
            dtype, dtype_why = kv_cache_dtype, "--kv-cache-dtype of check"
        else:
            dtype, dtype_why = sglang_kv_cache_dtype(cfg, server_kv, device.capability or (9, 0))
        kv = mla_kv_bytes_per_token(cfg, dtype)
        budget = None if memory_gib is not None else _derived_budget(cfg, memory, gpu_found)
        pool_bytes = int(memory_gib * 2**30) if budget is None else budget.bytes
        w, layers = server.dcp_size, out["layers"]
        cap: DcpCapacity = dcp_capacity(pool_bytes, w, kv_bytes=kv, num_layers=layers,
                                        num_index_layers=index_layers)
        fp4_mode = dcp_mode_for(server) or REPLICATED  # gate.decide's rule, refused or not

        def row(label, index, mode, tokens):
            per_layer = bytes_per_token(w, index=index, mode=mode, kv_bytes=kv)
            total = (layers - index_layers) * Fraction(kv, w) + index_layers * per_layer
            index_per_rank = bytes_per_token(w, index=index, mode=mode, kv_bytes=0)
            return label, index_per_rank, per_layer, total, tokens

        rows = [row("FP8 (SGLang)", "fp8", REPLICATED, cap.tokens_fp8)]
        fp4 = "FP4 (this plugin)" if decision.enabled else "FP4 (refused)"
        if w == 1:
            rows.append(row(fp4, "fp4", REPLICATED, cap.tokens_fp4_replicated))
        else:
            for mode, tokens in ((REPLICATED, cap.tokens_fp4_replicated), (SHARDED, cap.tokens_fp4_sharded)):
                rows.append(row(f"FP4 {mode}{' *' if mode == fp4_mode else ''}", "fp4", mode, tokens))
        out.update(kv_dtype=dtype, kv_dtype_why=dtype_why, kv_bytes=kv, capacity=cap, fp4_mode=fp4_mode, rows=rows,
                   budget=budget, pool_gib=pool_bytes / 2**30)
    return out
