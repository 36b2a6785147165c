"""``sglang-fp4-indexer check``: would the FP4 indexer serve this model, and what does it save?

Given a model directory (with ``config.json``), a Hugging Face config JSON or
the name of a packaged config (``PACKAGED_MODELS``: the public config fields of
DeepSeek-V3.2, GLM-5 and GLM-5.2, so no download is needed), and optionally
SGLang server flags (``--sglang-args="..."``), prints the gate's
``Decision`` as if ``--enable-fp4-indexer`` were given, and the memory effect:
index bytes per token per layer (132 FP8 -> 68 FP4) and the KV tokens a memory
budget holds with each. No weights are read and no GPU is needed.

With SGLang installed, the model is classified by SGLang's own DSA helpers and
the server flags are parsed by SGLang's own parser (``sglang_plugin.facts``).
Without SGLang (not importable), the config keys decide (``index_topk``
present, not a DeepSeek-V4 architecture), and server flags are refused; the
output says so. The device is the local CUDA GPU when there is one, else
``--capability`` (default 9.0, an H200). The MLA KV format is the server
flags' ``--kv-cache-dtype``, else ``check``'s own, else SGLang's default for
DSA models on that device (``sglang_kv_cache_dtype``). Under DCP the memory
rows are per rank (``dcp.bytes_per_token`` / ``dcp.dcp_capacity``); when the
deployment refuses FP4 (flags, device, unrotated keys) its rows are labelled as
what it would give if the refusal were lifted; when the model itself rules FP4
out (``MODEL_REFUSALS``) no FP4 figure is printed. A config lacking a key
``check`` reads is a usage error naming it.

With ``--context N`` (at most the model's positions; ``--batch`` and ``--next-n`` only with it) it adds what FP4 gains and
costs at that request length (``worth_it``): the requests that fit with each
index format, the indexer scorer's time FP4 vs FP8 measured on an H200 at the
nearest measured shape with the asked next_n, the top-k recall of each format
and the real-model study's loss and passkey numbers at the nearest measured
context (``tables``: the measured tables shipped in the package), then a
verdict that decides, with its exit code (``worth_it``, ``main``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import shlex
import sys
from fractions import Fraction
from pathlib import Path
from typing import Callable

from .argtypes import MAX_MEMORY_GIB, integer, memory_gib
from .dcp import REPLICATED, SHARDED, DcpCapacity, bytes_per_token, dcp_capacity
from .gate import (INDEXER_FUSION_ENV, INTERLEAVED_INDEXER_ARCHS, Decision, DeviceFacts, ModelFacts, ServerFacts,
                   dcp_mode_for, decide, index_key_rotation)

__all__ = ["add_arguments", "main", "load_hf_config", "mla_kv_bytes_per_token", "sglang_kv_cache_dtype", "run_check",
           "worth_it", "EXIT_FP4_FITS_MORE", "EXIT_REFUSED", "EXIT_SAME_REQUESTS", "EXIT_FITS_NEITHER"]

_V4_ARCHS = ("DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark")
#: Architectures whose DSA KV-cache dtype SGLang 0.5.23 defaults (``arg_groups/model_hook.py`` calls
#: ``overrides._dsa_kv_cache_dtype_default`` for these; all are in ``overrides._DEEPSEEK_FAMILY_ARCHS``).
DSA_KV_DTYPE_ARCHS = frozenset({
    "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "KimiK25ForConditionalGeneration", "MistralLarge3ForCausalLM",
    "PixtralForConditionalGeneration", "GlmMoeDsaForCausalLM", "Glm5NextForConditionalGeneration", "HYV4ForCausalLM",
    "HYV4ForCausalLMNextN", "LongcatFlashForCausalLM", "Dots3NoteForCausalLM",
})
#: SGLang ``--kv-cache-dtype`` spellings of the two MLA KV formats ``check`` sizes.
_SGLANG_KV_DTYPES = {"fp8_e4m3": "fp8", "bf16": "bf16", "bfloat16": "bf16"}
#: Config keys that must be integers when present (SGLang uses them as such, without coercion).
_INT_KEYS = ("num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim", "index_topk", "index_head_dim",
             "index_n_heads", "index_kpool", "index_topk_freq")
#: Config keys a DSA model needs for the memory rows (MLA KV size, layer count).
_DSA_SIZE_KEYS = ("num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim")
#: Architectures that are DeepSeek Sparse Attention by name: SGLang classes them as DSA only when the config
#: has ``index_topk`` (``is_deepseek_dsa``), so a config of one of these without it is incomplete.
_DSA_BY_NAME = ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM", "GlmMoeDsaForCausalLMNextN")


#: Largest --next-n: the paged scorer's ``ops.paged_logits.MAX_NEXT_N`` (restated, not imported: that module
#: loads Triton, which ``check`` never needs; tests/test_cli_errors.py keeps the two equal).
MAX_NEXT_N = 8
#: Largest --context: SGLang keeps positions and lengths as int32.
MAX_CONTEXT = 2**31 - 1
#: Refusal codes (``Decision.codes``) that come from the model itself: no server flag or environment lifts them,
#: so ``check`` gives no FP4 figure for such a model.
MODEL_REFUSALS = frozenset({"not_dsa", "deepseek_v4", "index_head_dim", "index_heads", "index_kpool"})
#: Config keys a DSA model needs for the check, and what each is; a missing one is a usage error naming it.
_DSA_KEYS = {
    "num_hidden_layers": "the layer count",
    "kv_lora_rank": "the MLA KV rank",
    "qk_rope_head_dim": "the MLA RoPE dims",
    "index_n_heads": "the indexer's head count",
    "index_head_dim": "the index key's length",
}
#: The line ``check`` prints on stderr before SGLang's import (measured: 23-27 s on a 2-core machine, every run).
LOADING_SGLANG = "loading SGLang to classify the model and parse its flags (its import takes 20-30 s)..."
#: Packaged configs (``data/models/NAME/config.json``): name -> Hugging Face repository. ``check NAME`` (or the
#: repository id) reads them when no local path of that name exists; data/models/README.md says where they come from.
PACKAGED_MODELS = {"deepseek-v3.2": "deepseek-ai/DeepSeek-V3.2", "glm-5": "zai-org/GLM-5", "glm-5.2": "zai-org/GLM-5.2"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``check``."""
    parser.add_argument("model", help="local model directory (with config.json) or a Hugging Face config JSON file, "
                                      "or one of the packaged configs: " + ", ".join(PACKAGED_MODELS)
                                      + "; another hub model needs its config first: "
                                        "hf download REPO config.json --local-dir DIR")
    parser.add_argument("--memory-gib", type=memory_gib(), default=100.0,
                        help="KV-pool memory budget per GPU in GiB for the token counts (default 100)")
    parser.add_argument("--context", type=integer(1, MAX_CONTEXT), default=None, metavar="N",
                        help="tokens per request (e.g. 131072), at most the model's positions "
                             "(max_position_embeddings, or --context-length in --sglang-args): adds what FP4 gains "
                             "and costs at that length -- requests that fit, the indexer's time FP4 vs FP8 (measured "
                             "on H200), the top-k recall FP4 vs FP8 (measured accuracy study) and the loss cost on a "
                             "real model -- and a verdict, also as the exit code: 0 FP4 fits more requests of that "
                             "length, 3 the same number either way (FP4 buys only indexer time, at the measured "
                             "cost), 4 the batch fits neither; 1 FP4 refused")
    parser.add_argument("--batch", type=integer(1), default=None, metavar="B",
                        help="with --context: requests decoded together (default 1)")
    parser.add_argument("--next-n", type=integer(1, MAX_NEXT_N), default=None, metavar="N",
                        help="with --context: query tokens per request and step: 1 for plain decode, draft "
                             "tokens + 1 with MTP / EAGLE speculative decoding, at most %d (default 1)" % MAX_NEXT_N)
    parser.add_argument("--capability", default=None,
                        help="CUDA compute capability to assume, e.g. 9.0 (default: the local GPU, else 9.0)")
    parser.add_argument("--kv-cache-dtype", choices=("fp8", "bf16"), default=None,
                        help="MLA KV cache format for the token counts: FlashMLA FP8 or bf16 (default: the "
                             "--kv-cache-dtype in --sglang-args, else SGLang's default for DSA models on the "
                             "device: fp8 from compute capability 10.0, bf16 below)")
    parser.add_argument("--sglang-args", default="", metavar="FLAGS",
                        help='SGLang server flags as one string, e.g. --sglang-args="--dcp-size 2" '
                             "(parsed by SGLang's own parser; needs SGLang installed; the model is the "
                             "positional argument, not --model-path)")


#: A Hugging Face hub id: ``owner/name``, each part letters, digits, ``-``, ``_``, ``.``, not starting with ``.``.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def packaged_model(name: str) -> tuple[Path, str] | None:
    """The packaged config of ``name`` (``PACKAGED_MODELS``: a short name or its hub id, any case), or None.

    Returns:
        ``(the packaged model directory, its Hugging Face repository)``, or
        None when ``name`` is neither (a local path is not looked up here).
    """
    from importlib import resources

    key = name.strip().lower()
    for short, repo in PACKAGED_MODELS.items():
        if key in (short, repo.lower()):
            folder = Path(str(resources.files("sglang_fp4_indexer").joinpath("data", "models", short)))
            return folder, repo
    return None


def resolve_model(model: str | Path) -> tuple[Path, str]:
    """Where ``check`` reads the model from: a local path when it exists, else a packaged config.

    Returns:
        ``(path, source)``: ``source`` is ``""`` for a local path, else the
        Hugging Face repository whose packaged config fields are used.

    Raises:
        ValueError: no such local path and no packaged config of that name;
            the message says how to get a config (``hf download`` for a hub
            id, the packaged names otherwise).
    """
    path = Path(model)
    if path.exists():
        return path, ""
    found = packaged_model(str(model))
    if found is not None:
        return found
    text = str(model)
    packaged = ", ".join(PACKAGED_MODELS)
    if _HUB_ID.fullmatch(text) and not text.endswith(".json"):
        raise ValueError(f"model: no local file or directory {text}, and no packaged config of that name "
                         f"({packaged}); check reads a local config.json or model directory, not the hub: get "
                         f"the config with: hf download {text} config.json --local-dir DIR, then run check DIR")
    raise ValueError(f"model: no such file or directory: {text} (give a model directory with config.json, a "
                     f"config JSON file, or a packaged config: {packaged})")


def load_hf_config(path: str | Path) -> tuple[dict, Path]:
    """Read ``config.json`` from a local model directory, or a config JSON file.

    Returns:
        ``(config dict, the JSON file's path)``.

    Raises:
        ValueError: the path does not exist, has no ``config.json``, is not
            UTF-8 JSON text (a binary file), is not a JSON object, or one of the
            integer keys (``index_n_heads``, ``kv_lora_rank``, ...) holds
            something else (SGLang does not coerce them) or a size key
            (``num_hidden_layers``, ``kv_lora_rank``, ...) is below 1.
    """
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"model: no config file at {file}" + ("" if path.exists() else " (no such path)"))
    try:
        cfg = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"model: {file} is not a JSON text file (it holds binary data, not UTF-8 text); "
                         "give the model's config.json") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"model: {file} is not JSON ({exc})") from None
    except OSError as exc:
        raise ValueError(f"model: {file} cannot be read ({exc.strerror or exc})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"model: {file} does not hold a JSON object")
    for key in _INT_KEYS:
        value = cfg.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"model: {file}: {key} must be an integer (SGLang uses it as one), "
                             f"got {value!r} ({type(value).__name__})")
        if value is not None and value < 1 and key in _DSA_SIZE_KEYS + ("index_n_heads", "index_head_dim"):
            raise ValueError(f"model: {file}: {key} must be >= 1, got {value}")
    return cfg, file


def mla_kv_bytes_per_token(cfg: dict, kv_cache_dtype: str = "fp8") -> int:
    """MLA KV bytes per token per layer of SGLang's DSA pool.

    FP8 (FlashMLA layout): ``kv_lora_rank`` e4m3 bytes, one fp32 scale per 128
    of them, and the RoPE dims in bf16 (656 B for DeepSeek-V3.2: 512 + 16 + 128).
    bf16: ``(kv_lora_rank + qk_rope_head_dim) * 2``.

    Raises:
        ValueError: the config lacks ``kv_lora_rank`` / ``qk_rope_head_dim``, or an unknown dtype.
    """
    try:
        rank, rope = int(cfg["kv_lora_rank"]), int(cfg["qk_rope_head_dim"])
    except (KeyError, TypeError, ValueError):
        raise ValueError("model: config needs integer kv_lora_rank and qk_rope_head_dim (an MLA model)") from None
    if kv_cache_dtype == "fp8":
        return rank + rank // 128 * 4 + rope * 2
    if kv_cache_dtype == "bf16":
        return (rank + rope) * 2
    raise ValueError(f"kv_cache_dtype: expected 'fp8' or 'bf16', got {kv_cache_dtype!r}")


def sglang_kv_cache_dtype(cfg: dict, server_value: str, capability: tuple[int, int]) -> tuple[str, str]:
    """The MLA KV format SGLang 0.5.23 gives a DSA model on a CUDA GPU, and why.

    Follows ``arg_groups/overrides._dsa_kv_cache_dtype_default`` (run by
    ``model_hook`` for ``DSA_KV_DTYPE_ARCHS`` on CUDA): ``auto`` becomes
    ``fp8_e4m3`` from compute capability 10.0 when the model has no learnable
    attention sinks, else ``bfloat16``; ``bf16`` means ``bfloat16``; only those
    two are accepted. Other architectures keep ``auto`` (the model's dtype,
    taken as bf16 here).

    Args:
        cfg: the HF config dict.
        server_value: SGLang's ``--kv-cache-dtype`` value (``"auto"`` when not given).
        capability: CUDA compute capability ``(major, minor)``.

    Returns:
        ``("fp8" | "bf16", reason text)``.

    Raises:
        ValueError: a value SGLang refuses for DSA models (or ``check`` cannot size).
    """
    archs = cfg.get("architectures") or [None]
    sinks = bool(cfg.get("learnable_sink", False))
    if server_value == "auto":
        if archs[0] not in DSA_KV_DTYPE_ARCHS:
            return "bf16", "SGLang's auto, the model dtype, taken as bf16 for an architecture without a DSA KV default"
        where = f"SGLang's default for DSA models on CUDA {capability[0]}.{capability[1]}"
        if capability[0] >= 10 and not sinks:
            return "fp8", f"{where}: fp8_e4m3 from compute capability 10.0"
        why = "for learnable attention sinks" if sinks else "below compute capability 10.0"
        return "bf16", f"{where}: bfloat16 {why}"
    if sinks and server_value not in ("bf16", "bfloat16"):
        raise ValueError(f"--kv-cache-dtype {server_value}: SGLang requires a bfloat16 KV cache for learnable DSA "
                         "attention sinks")
    if server_value not in _SGLANG_KV_DTYPES:
        raise ValueError(f"--kv-cache-dtype {server_value}: SGLang serves DSA models with bf16/bfloat16 or fp8_e4m3 only")
    return _SGLANG_KV_DTYPES[server_value], f"--kv-cache-dtype {server_value} in --sglang-args"


def _device(capability: str | None) -> tuple[DeviceFacts, str]:
    if capability is not None:
        try:
            major, minor = (int(x) for x in capability.split("."))
        except ValueError:
            raise ValueError(f"--capability: expected MAJOR.MINOR such as 9.0, got {capability!r}") from None
        return DeviceFacts("cuda", (major, minor), "given"), f"CUDA {major}.{minor} (given)"
    import torch

    if torch.cuda.is_available() and not getattr(torch.version, "hip", None):
        cap = tuple(torch.cuda.get_device_capability())
        name = torch.cuda.get_device_name()
        return DeviceFacts("cuda", cap, name), f"{name}, CUDA {cap[0]}.{cap[1]} (local)"
    return DeviceFacts("cuda", (9, 0), "assumed H200"), "CUDA 9.0 (assumed: no local GPU; --capability to change)"


def _with_sglang(cfg: dict, model_path: str, flags: list[str], announce: Callable[[str], None]):
    """``(model facts, server facts, index layers, SGLang's --kv-cache-dtype, --context-length)`` through SGLang.

    Returns ``(None, why)`` when SGLang cannot be imported. ``announce`` gets
    one line before SGLang's (slow) import when SGLang is installed. SGLang's
    import-time UserWarnings (AWQ, GGUF on a machine without a GPU) are suppressed.
    """
    from .sglang_plugin.facts import sglang_import_error

    if importlib.util.find_spec("sglang") is not None:
        announce(LOADING_SGLANG)
    why = sglang_import_error()
    if why is not None:
        return None, why
    from .sglang_plugin.facts import (
        index_layer_count,
        model_facts,
        server_args_from_flags,
        server_facts,
        server_field,
    )

    record = server_args_from_flags(model_path, flags, requested=True)
    given_path = server_field(record, "model_path", model_path)
    if given_path != model_path:
        raise ValueError(f"--sglang-args: --model-path {given_path} is not used by check, which reads the model "
                         "given as its positional argument; drop --model-path from --sglang-args")
    layers = int(cfg.get("num_hidden_layers", 0) or 0)
    context_length = server_field(record, "context_length", None)
    return (model_facts(cfg), server_facts(record), index_layer_count(cfg, layers),
            str(server_field(record, "kv_cache_dtype", "auto")), context_length), ""


def _without_sglang(cfg: dict, flags: list[str], why: str):
    if flags:
        raise ValueError(f"--sglang-args: SGLang is not importable here ({why}), so server flags cannot be parsed; "
                         "install SGLang or drop --sglang-args")
    archs = cfg.get("architectures") or [None]
    v4 = archs[0] in _V4_ARCHS
    model = ModelFacts(
        architecture=archs[0],
        is_dsa=cfg.get("index_topk") is not None and not v4,
        is_deepseek_v4=v4,
        index_head_dim=cfg.get("index_head_dim"),
        index_n_heads=cfg.get("index_n_heads"),
        index_kpool=int(cfg.get("index_kpool", 1) or 1),
        indexer_rope_interleave=archs[0] in INTERLEAVED_INDEXER_ARCHS or bool(cfg.get("indexer_rope_interleave", False)),
    )
    layers = int(cfg.get("num_hidden_layers", 0) or 0)
    fusion_off = os.environ.get(INDEXER_FUSION_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    return model, ServerFacts(requested=True, indexer_fusion_disabled=fusion_off), layers, "auto", None


def _fmt(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{float(x):g}"


def _check_complete(cfg: dict, file: Path, model: ModelFacts) -> None:
    """Refuse a config that lacks a key ``check`` needs, naming it (one rule for every such key).

    Raises:
        ValueError: a DSA-by-name architecture (``_DSA_BY_NAME``) without
            ``index_topk``; a DSA model without one of ``_DSA_KEYS``.
    """
    if not model.is_dsa and model.architecture in _DSA_BY_NAME and cfg.get("index_topk") is None:
        missing = {"index_topk": "the indexer's top-k; without it SGLang does not treat the model as DeepSeek "
                                 "Sparse Attention"}
    elif model.is_dsa:
        missing = {key: what for key, what in _DSA_KEYS.items() if cfg.get(key) is None}
    else:
        return
    if missing:
        keys = "; ".join(f"{key}, {what}" for key, what in missing.items())
        arch = model.architecture or "DeepSeek Sparse Attention"
        raise ValueError(f"model: {file}: missing {keys}. A {arch} config.json has "
                         f"{'it' if len(missing) == 1 else 'them'}; give the model's complete config.json")


def run_check(model: str, *, memory_gib: float = 100.0, capability: str | None = None,
              kv_cache_dtype: str | None = None, server_flags: list[str] | None = None,
              announce: Callable[[str], None] = lambda line: None) -> dict:
    """Do the check and return its findings (what ``main`` prints).

    ``model`` is a local model directory or config JSON file, or a packaged
    config's name (``resolve_model``). ``announce`` is called with one progress line before SGLang's slow import
    (``main`` prints it to stderr).

    The MLA KV format is ``kv_cache_dtype`` (``"fp8"``/``"bf16"``) when given,
    else the ``--kv-cache-dtype`` of the server flags, else SGLang's default
    for the device (``sglang_kv_cache_dtype``). Under DCP (``--dcp-size W``)
    the memory rows are per rank (``dcp.bytes_per_token``, ``dcp.dcp_capacity``):
    the MLA KV is sharded over the W ranks, the index replicated or sharded.

    Returns:
        dict with ``decision`` (``Decision``), ``device`` (text), ``detection``
        (what classified the model: SGLang's helpers or the config keys), ``model``
        (``ModelFacts``), ``model_text``, ``layers``, ``index_layers``,
        ``dcp_size``, ``file``, ``source`` (the Hugging Face repository of a
        packaged config, else empty), ``positions`` (the longest request: the
        server flags' ``--context-length``, else ``max_position_embeddings``,
        else None) and ``positions_from``, ``model_refusal`` (the refusal is the
        model's own, ``MODEL_REFUSALS``: then nothing below is given); for DSA
        models FP4 can serve ``index_keys`` (whether SGLang Hadamard-rotates the
        index keys, and why: ``gate.index_key_rotation``), ``kv_dtype``, ``kv_dtype_why``, ``kv_bytes``, ``capacity
        (``dcp.DcpCapacity``), ``fp4_mode`` (the DCP mode of the FP4 rows the
        gain refers to: the decision's, or what the flags would give when refused)
        and ``rows``: ``(label, index bytes per rank, KV + index bytes per layer
        per rank, KV + index bytes of all layers per rank, tokens)``, bytes as
        ``Fraction``; also ``device_facts`` (``DeviceFacts``).

    Raises:
        ValueError: unreadable or incomplete config (a DSA model without its
            layer count or MLA sizes, a DSA-by-name architecture without
            ``index_topk``), bad options (``memory_gib`` not a finite number in
            ``(0, MAX_MEMORY_GIB]``), rejected server flags, a KV dtype conflict
            between ``kv_cache_dtype`` and the server flags.
    """
    if not (isinstance(memory_gib, (int, float)) and math.isfinite(memory_gib) and 0 < memory_gib <= MAX_MEMORY_GIB):
        raise ValueError(f"--memory-gib: expected a finite number > 0 and <= {MAX_MEMORY_GIB}, got {memory_gib}")
    flags = list(server_flags or [])
    path, source = resolve_model(model)
    cfg, file = load_hf_config(path)
    found, why = _with_sglang(cfg, str(file.parent), flags, announce)
    detection = "SGLang's own DSA helpers"
    if found is None:
        found, detection = _without_sglang(cfg, flags, why), f"its config keys, SGLang not being importable here: {why}"
    model_facts, server, index_layers, server_kv, context_length = found
    _check_complete(cfg, file, model_facts)
    device, device_text = _device(capability)
    decision: Decision = decide(model_facts, server, device)
    arch = model_facts.architecture or f"no architectures in config, model_type {cfg.get('model_type')!r}"
    positions = context_length or cfg.get("max_position_embeddings")
    out = {"decision": decision, "device": device_text, "detection": detection, "model": model_facts,
           "model_text": arch, "layers": int(cfg.get("num_hidden_layers", 0) or 0), "index_layers": index_layers,
           "file": str(file), "source": source, "dcp_size": server.dcp_size, "device_facts": device,
           "positions": int(positions) if isinstance(positions, int) and positions > 0 else None,
           "positions_from": ("--context-length in --sglang-args" if context_length
                              else "max_position_embeddings in its config.json"),
           "model_refusal": bool(MODEL_REFUSALS.intersection(decision.codes))}
    if model_facts.is_dsa and not out["model_refusal"]:
        out["index_keys"] = index_key_rotation(model_facts, server)[1]
        if kv_cache_dtype is not None and server_kv != "auto":
            if _SGLANG_KV_DTYPES.get(server_kv) != kv_cache_dtype:
                raise ValueError(f"--kv-cache-dtype {kv_cache_dtype} conflicts with --kv-cache-dtype {server_kv} "
                                 "in --sglang-args; give one of them")
        if kv_cache_dtype is not None and server_kv == "auto":
            dtype, dtype_why = kv_cache_dtype, "--kv-cache-dtype of check"
        else:
            dtype, dtype_why = sglang_kv_cache_dtype(cfg, server_kv, device.capability or (9, 0))
        kv = mla_kv_bytes_per_token(cfg, dtype)
        w, layers = server.dcp_size, out["layers"]
        cap: DcpCapacity = dcp_capacity(int(memory_gib * 2**30), w, kv_bytes=kv, num_layers=layers,
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
        out.update(kv_dtype=dtype, kv_dtype_why=dtype_why, kv_bytes=kv, capacity=cap, fp4_mode=fp4_mode, rows=rows)
    return out


def _k(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)


def _shape_text(heads: int, batch: int, context: int, next_n: int) -> str:
    return f"H {heads}, batch {batch} x {_k(context)}, next_n {next_n}"


#: ``check --context`` exit codes: the verdict as a number (``main``).
EXIT_FP4_FITS_MORE = 0
EXIT_REFUSED = 1
EXIT_SAME_REQUESTS = 3
EXIT_FITS_NEITHER = 4


def _pm(ms) -> str:
    m, se = ms
    return f"{m:+.4f}" if se != se else f"{m:+.4f} ± {se:.4f}"  # se != se: NaN (one window)


def _model_cost_text(row: dict | None, context: int, topk: int) -> str:
    if row is None:
        return "the effect on a model's loss is not in these tables"
    text = (f"Δ loss vs dense attention FP4 {_pm(row['delta_fp4'])}, FP8 {_pm(row['delta_fp8'])} nats/token "
            f"(FP4 - FP8 {_pm(row['fp4_minus_fp8'])})")
    if "passkey_fp4" in row:
        text += f", passkey {row['passkey_fp4'][0]}/{row['passkey_fp4'][1]} vs {row['passkey_fp8'][0]}/{row['passkey_fp8'][1]}"
    return text + f" on Gemma 3 270M at {_k(row['context'])}, top-{row['topk']} (real-model study, stand-in indexer)"


def worth_it(found: dict, *, context: int, batch: int = 1, next_n: int = 1, tables: dict | None = None) -> dict:
    """What FP4 gains and costs at one serving shape, and the decision, from ``run_check``'s findings and the tables.

    The decision (``decision``, and the exit code ``main`` returns for it):

    - ``"neither"`` (``EXIT_FITS_NEITHER``): ``batch`` requests of ``context``
      tokens fit the KV pool with neither index format;
    - ``"more"`` (``EXIT_FP4_FITS_MORE``): FP4 fits more requests of this
      length than FP8 (the verdict says how many more, and whether the batch
      fits only with FP4);
    - ``"same"`` (``EXIT_SAME_REQUESTS``): both fit the same number of
      requests, so FP4 buys only its indexer time, at the measured cost.

    The time is the measured row nearest the shape among rows with the asked
    ``next_n`` (``tables.nearest_timing``); without such a row none is quoted.
    The cost is the top-k recall at the nearest measured context
    (``tables.nearest_recall``) and the real-model study's loss and passkey
    numbers at the nearest measured context (``tables.nearest_model_cost``,
    at the tables' top-k, 2048, DSA's ``index_topk``).

    Args:
        found: ``run_check``'s result for a DSA model (with ``capacity``).
        context: tokens per request.
        batch: requests decoded together.
        next_n: query tokens per request and step (1: decode; draft tokens + 1: speculative verify).
        tables: measured tables (default: the packaged ones, ``tables.load_tables``).

    Returns:
        dict: ``requests_fp8`` / ``requests_fp4`` (requests of ``context`` tokens
        that fit), ``tokens_needed`` (``batch * context``), ``timing`` (the
        nearest measured row with this next_n, or None), ``timing_next_n``
        (the measured next_n values), ``timing_exact``, ``timing_gpu``,
        ``recall`` (rows at the nearest measured context), ``recall_exact``,
        ``recall_device``, ``model_cost`` (``tables.nearest_model_cost`` or
        None), ``topk``, ``gpu_note``, ``decision``, ``exit_code`` and
        ``verdict`` (one line).

    Raises:
        ValueError: ``found`` has no memory rows (not a DSA model), a
            non-positive shape, or ``context < next_n``.
    """
    from .tables import load_tables, nearest_model_cost, nearest_recall, nearest_timing

    cap: DcpCapacity | None = found.get("capacity")
    if cap is None:
        raise ValueError("--context: the model has no DSA index-key cache, so FP4 changes nothing at any context")
    if context < next_n:
        raise ValueError(f"--context: {context} tokens cannot hold --next-n {next_n} query tokens")
    tables = load_tables() if tables is None else tables
    heads = found["model"].index_n_heads or 64
    sharded = found["fp4_mode"] == SHARDED
    tokens_fp4 = cap.tokens_fp4_sharded if sharded else cap.tokens_fp4_replicated
    gain = cap.gain_sharded if sharded else cap.gain_replicated
    measured_n = sorted({r["next_n"] for r in tables["timing"]["rows"]})
    same_n = [r for r in tables["timing"]["rows"] if r["next_n"] == next_n]
    row = nearest_timing({"timing": {"rows": same_n}}, heads, batch, context, next_n) if same_n else None
    recall = nearest_recall(tables, heads, context)
    topk = int(tables["recall"]["topk"])
    model_cost = nearest_model_cost(tables, context, topk)
    gpu = tables["timing"]["gpu"]
    dev: DeviceFacts = found["device_facts"]
    if dev.name in ("assumed H200", "given"):
        gpu_note = "" if tuple(dev.capability or ()) == (9, 0) else f" (not on a CUDA {dev.capability[0]}.{dev.capability[1]} GPU)"
    else:
        gpu_note = "" if "H200" in (dev.name or "") else f" (not on this {dev.name}: times differ)"
    out = {
        "requests_fp8": cap.tokens_fp8 // context, "requests_fp4": tokens_fp4 // context,
        "tokens_needed": batch * context, "tokens_fp8": cap.tokens_fp8, "tokens_fp4": tokens_fp4, "gain": gain,
        "timing": row, "timing_next_n": measured_n, "timing_gpu": gpu, "gpu_note": gpu_note,
        "timing_exact": row is not None and (row["heads"], row["batch"], row["context"]) == (heads, batch, context),
        "recall": recall, "recall_exact": recall[0]["context"] == context, "recall_device": tables["recall"]["device"],
        "model_cost": model_cost, "topk": topk, "heads": heads,
    }
    if row is None:
        speed = (f"an indexer time at next_n {next_n} that is not measured (measured: next_n "
                 f"{', '.join(map(str, measured_n))})")
    elif row["fp8_us"] is not None:
        fp4, fp8 = row["fp4_us"], row["fp8_us"]
        speed = f"a {fp8 / fp4:.2f}x faster indexer" if fp4 <= fp8 else f"a {fp4 / fp8:.2f}x slower indexer"
    elif row.get("fp8_floor_us") and row["fp4_us"] < row["fp8_floor_us"]:
        speed = "a faster indexer (FP4 under FP8's bandwidth floor)"
    else:
        speed = "an indexer time vs FP8 not measured"
    text = next((r for r in recall if r["workload"] == "text"), recall[0])
    if context <= topk:
        cost = f"no cost (top-{topk} keeps all {_k(context)} keys, so the selection cannot change)"
    else:
        cost = (f"{(text['fp8'] - text['fp4']) * 100:.1f} points less top-{topk} recall at "
                f"{_k(text['context'])} ({text['workload']} workload); {_model_cost_text(model_cost, context, topk)}")
    rf8, rf4 = out["requests_fp8"], out["requests_fp4"]
    if out["tokens_needed"] > tokens_fp4:
        out["decision"], out["exit_code"] = "neither", EXIT_FITS_NEITHER
        out["verdict"] = (f"neither format fits the batch: {batch} x {_k(context)} needs {out['tokens_needed']} KV "
                          f"tokens, FP8 holds {cap.tokens_fp8} ({rf8} such requests), FP4 {tokens_fp4} ({rf4}); "
                          f"lower --batch or add memory")
    elif rf4 > rf8:
        only = "; your batch fits only with FP4" if out["tokens_needed"] > cap.tokens_fp8 else ""
        out["decision"], out["exit_code"] = "more", EXIT_FP4_FITS_MORE
        out["verdict"] = (f"turn FP4 on where KV memory limits you: it fits {rf4 - rf8} more {_k(context)}-token "
                          f"request{'s' if rf4 - rf8 > 1 else ''} ({rf8} -> {rf4}, +{gain * 100:.1f} % KV tokens)"
                          f"{only}, with {speed}; "
                          f"measured cost: {cost}")
    else:
        out["decision"], out["exit_code"] = "same", EXIT_SAME_REQUESTS
        out["verdict"] = (f"FP4 fits no more {_k(context)}-token requests ({rf8} either way; +{gain * 100:.1f} % KV "
                          f"tokens), so it buys only {speed}, at a measured cost of {cost}: turn it on if that "
                          f"cost is acceptable")
    return out


def _print_worth_it(console, res: dict, w: dict, batch: int, next_n: int, context: int) -> None:
    row, heads = w["timing"], w["heads"]
    layers = res["index_layers"]
    console.print(f"at {_k(context)} tokens per request: requests that fit: FP8 {w['requests_fp8']}, FP4 "
                  f"{w['requests_fp4']} (a batch of {batch} needs {w['tokens_needed']} KV tokens; "
                  f"FP8 holds {w['tokens_fp8']}, FP4 {w['tokens_fp4']})")
    if row is None:
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
        console.print(f"indexer scorer per layer and step, measured on {w['timing_gpu']}{w['gpu_note']} {where}: "
                      f"FP4 {row['fp4_us']:.1f} us (x {layers} index layers = {row['fp4_us'] * layers / 1000:.2f} ms "
                      f"per step); {fp8}")
    if res["dcp_size"] > 1 and res["fp4_mode"] == SHARDED:
        console.print("  (single-GPU times; the sharded index adds a candidate exchange per step: see the user guide)")
    ctx = w["recall"][0]["context"]
    where = f"at {_k(ctx)}" + ("" if w["recall_exact"] else f" (the nearest measured context to {_k(context)})")
    parts = ", ".join(f"{r['workload']} {r['fp4']:.3f} vs {r['fp8']:.3f}" for r in w["recall"])
    if context <= w["topk"]:
        console.print(f"top-{w['topk']} recall: 1 for FP4 and FP8 (a {_k(context)} context has at most "
                      f"{w['topk']} keys, all of them selected)")
    else:
        console.print(f"top-{w['topk']} recall against exact scoring, FP4 vs FP8, {where}, H {w['recall'][0]['heads']} "
                      f"(accuracy study on {w['recall_device']}): {parts}")
        m = w["model_cost"]
        if m is not None:
            console.print(f"on a real model (Gemma 3 270M, sparse attention in its 3 global layers over a stand-in "
                          f"indexer, CPU), at {_k(m['context'])}, top-{m['topk']}, {m['windows']} text windows "
                          f"(the nearest measured context to {_k(context)}): Δ loss vs dense attention exact selection "
                          f"{_pm(m['delta_exact'])}, FP8 {_pm(m['delta_fp8'])}, FP4 {_pm(m['delta_fp4'])} nats/token"
                          + (f"; passkey retrieved dense {m['passkey_dense'][0]}/{m['passkey_dense'][1]}, FP8 "
                             f"{m['passkey_fp8'][0]}/{m['passkey_fp8'][1]}, FP4 {m['passkey_fp4'][0]}/{m['passkey_fp4'][1]}"
                             if "passkey_fp4" in m else ""))
    console.print(f"verdict: {w['verdict']}")


def _model_line(res: dict) -> str:
    where = (f"the config fields of {res['source']} packaged with sglang-fp4-indexer, {res['file']}" if res["source"]
             else f"config {res['file']}")
    return f"model: {res['model_text']} ({where}); classified by {res['detection']}"


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


def _memory_table(res: dict, d: Decision, memory_gib: float):
    from rich.table import Table

    w = res["dcp_size"]
    where = "per GPU" if w == 1 else f"per rank, DCP {w} (MLA KV sharded over the {w} ranks)"
    notes = []
    if w > 1:
        mode = ("sharded (--fp4-indexer-dcp-shard)" if res["fp4_mode"] == SHARDED
                else "replicated (the default; --fp4-indexer-dcp-shard would shard the index)")
        notes.append("* the mode " + ("the server would use" if d.enabled else "these flags give") + f": {mode}")
    if not d.enabled:
        notes.append("FP4 rows: what FP4 would give if the refusal were lifted; the server keeps FP8")
    table = Table(title=f"memory effect, {memory_gib:g} GiB KV pool {where}", caption="\n".join(notes) or None)
    table.add_column("index cache", no_wrap=True)
    for header in ("index B per token and layer", "KV + index B per token and layer", "KV + index B per token",
                   "KV tokens"):
        table.add_column(header, justify="right")
    for label, idx, per_layer, total, tokens in res["rows"]:
        table.add_row(label, _fmt(idx), _fmt(per_layer), _fmt(total), str(tokens))
    return table


def main(args: argparse.Namespace) -> int:
    """Print the check and return its exit code.

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
    res = run_check(args.model, memory_gib=args.memory_gib, capability=args.capability,
                    kv_cache_dtype=args.kv_cache_dtype, server_flags=flags, announce=announce)
    if context is not None and res["positions"] is not None and context > res["positions"]:
        raise ValueError(f"--context: {context} tokens is more than this model's {res['positions']} positions "
                         f"({res['positions_from']}, the longest request SGLang serves); give at most "
                         f"{res['positions']}")
    d: Decision = res["decision"]
    console = Console(highlight=False)
    console.print(_model_line(res), markup=False)
    console.print(f"device: {res['device']}", markup=False)
    if "index_keys" in res:
        console.print(f"index keys: {res['index_keys']}", markup=False)
    if d.enabled:
        console.print(f"FP4 indexer: ENABLED - {d.reason}", markup=False)
    elif "not_dsa" in d.codes:
        console.print(f"FP4 indexer: not applicable - {d.reason}; SGLang serves it as without the plugin",
                      markup=False)
    else:
        own = "its own DeepSeek-V4 indexer" if "deepseek_v4" in d.codes else "its FP8 indexer"
        console.print(f"FP4 indexer: DISABLED (SGLang keeps {own}) - {d.reason}", markup=False)
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
    console.print(_memory_table(res, d, args.memory_gib))
    gain = cap.gain_sharded if res["fp4_mode"] == SHARDED else cap.gain_replicated
    tokens = cap.tokens_fp4_sharded if res["fp4_mode"] == SHARDED else cap.tokens_fp4_replicated
    mode = "" if res["dcp_size"] == 1 else f" ({res['fp4_mode']})"
    console.print(
        f"layers: {res['layers']} ({res['index_layers']} with an index cache); MLA KV {res['kv_bytes']} B per "
        f"token and layer in {res['kv_dtype']} ({res['kv_dtype_why']})", markup=False)
    if d.enabled:
        console.print(f"extra KV tokens with FP4{mode}: {tokens - cap.tokens_fp8} (+{gain * 100:.1f} %)")
    else:
        console.print(f"FP4 is not used; if the refusal were lifted, FP4{mode} would add "
                      f"{tokens - cap.tokens_fp8} KV tokens (+{gain * 100:.1f} %)")
    if context is None:
        console.print("add --context N (and --batch, --next-n) for the time and recall FP4 costs or saves at that length")
    elif d.enabled:
        verdict = worth_it(res, context=context, batch=batch, next_n=next_n)
        _print_worth_it(console, res, verdict, batch, next_n, context)
        return verdict["exit_code"]
    else:
        console.print("verdict: FP4 is refused for this deployment (above), so SGLang keeps FP8 at any context")
    return 0 if d.enabled else 1
