"""``sglang-fp4-indexer check``: would the FP4 indexer serve this model, and what does it save?

Given a model directory (with ``config.json``) or a Hugging Face config JSON,
and optionally SGLang server flags (``--sglang-args="..."``), prints the gate's
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
rows are per rank (``dcp.bytes_per_token`` / ``dcp.dcp_capacity``); when FP4
is refused its rows are labelled as what it would give if the refusal were lifted.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from fractions import Fraction
from pathlib import Path

from .dcp import REPLICATED, SHARDED, DcpCapacity, bytes_per_token, dcp_capacity
from .gate import (INDEXER_FUSION_ENV, INTERLEAVED_INDEXER_ARCHS, Decision, DeviceFacts, ModelFacts, ServerFacts,
                   decide, index_key_rotation)

__all__ = ["add_arguments", "main", "load_hf_config", "mla_kv_bytes_per_token", "sglang_kv_cache_dtype", "run_check"]

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``check``."""
    parser.add_argument("model", help="local model directory (with config.json) or a Hugging Face config JSON file; "
                                      "a hub id needs its config first: huggingface-cli download REPO config.json")
    parser.add_argument("--memory-gib", type=float, default=100.0,
                        help="KV-pool memory budget per GPU in GiB for the token counts (default 100)")
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


def load_hf_config(path: str | Path) -> tuple[dict, Path]:
    """Read ``config.json`` from a local model directory, or a config JSON file.

    Returns:
        ``(config dict, the JSON file's path)``.

    Raises:
        ValueError: the path does not exist (with a hint for a Hugging Face hub
            id), has no ``config.json``, is not a JSON object, or one of the
            integer keys (``index_n_heads``, ``kv_lora_rank``, ...) holds
            something else (SGLang does not coerce them).
    """
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        hint = ""
        if not path.exists():
            name = str(path) if str(path).count("/") == 1 and not str(path).endswith(".json") else "REPO"
            hint = (f". check reads a local config.json or model directory, not the hub; "
                    f"get the config with: huggingface-cli download {name} config.json --local-dir DIR, "
                    f"then run check DIR")
        raise ValueError(f"model: no config file at {file}{hint}")
    try:
        cfg = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"model: {file} is not JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"model: {file} does not hold a JSON object")
    for key in _INT_KEYS:
        value = cfg.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"model: {file}: {key} must be an integer (SGLang uses it as one), "
                             f"got {value!r} ({type(value).__name__})")
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
            return "bf16", "SGLang's auto: the model dtype, taken as bf16 (architecture without a DSA KV default)"
        if capability[0] >= 10 and not sinks:
            return "fp8", f"SGLang's default for DSA models on CUDA {capability[0]}.{capability[1]} (fp8_e4m3 from 10.0)"
        why = "learnable attention sinks" if sinks else "below compute capability 10.0"
        return "bf16", f"SGLang's default for DSA models on CUDA {capability[0]}.{capability[1]} (bfloat16: {why})"
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


def _with_sglang(cfg: dict, model_path: str, flags: list[str]):
    """``(model facts, server facts, index layers, SGLang's --kv-cache-dtype)`` through SGLang.

    Returns ``(None, why)`` when SGLang cannot be imported. SGLang's import-time
    UserWarnings (AWQ, GGUF on a machine without a GPU) are suppressed.
    """
    from .sglang_plugin.facts import sglang_import_error

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
    return (model_facts(cfg), server_facts(record), index_layer_count(cfg, layers),
            str(server_field(record, "kv_cache_dtype", "auto"))), ""


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
    return model, ServerFacts(requested=True, indexer_fusion_disabled=fusion_off), layers, "auto"


def _fmt(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{float(x):g}"


def run_check(model: str, *, memory_gib: float = 100.0, capability: str | None = None,
              kv_cache_dtype: str | None = None, server_flags: list[str] | None = None) -> dict:
    """Do the check and return its findings (what ``main`` prints).

    The MLA KV format is ``kv_cache_dtype`` (``"fp8"``/``"bf16"``) when given,
    else the ``--kv-cache-dtype`` of the server flags, else SGLang's default
    for the device (``sglang_kv_cache_dtype``). Under DCP (``--dcp-size W``)
    the memory rows are per rank (``dcp.bytes_per_token``, ``dcp.dcp_capacity``):
    the MLA KV is sharded over the W ranks, the index replicated or sharded.

    Returns:
        dict with ``decision`` (``Decision``), ``device`` (text), ``detection``
        (``"sglang"`` or ``"config keys (...)"``), ``model`` (``ModelFacts``),
        for DSA models ``index_keys`` (whether SGLang Hadamard-rotates the
        index keys, and why: ``gate.index_key_rotation``),
        ``model_text``, ``layers``, ``index_layers``, ``dcp_size``, and for DSA
        MLA models ``kv_dtype``, ``kv_dtype_why``, ``kv_bytes``, ``capacity``
        (``dcp.DcpCapacity``), ``fp4_mode`` (the DCP mode of the FP4 rows the
        gain refers to: the decision's, or what the flags would give when refused)
        and ``rows``: ``(label, index bytes per rank, KV + index bytes per layer
        per rank, KV + index bytes of all layers per rank, tokens)``, bytes as
        ``Fraction``.

    Raises:
        ValueError: unreadable config, bad options, rejected server flags, a
            KV dtype conflict between ``kv_cache_dtype`` and the server flags.
    """
    if memory_gib <= 0:
        raise ValueError(f"--memory-gib: expected > 0, got {memory_gib}")
    flags = list(server_flags or [])
    cfg, file = load_hf_config(model)
    found, why = _with_sglang(cfg, str(file.parent), flags)
    detection = "sglang"
    if found is None:
        found, detection = _without_sglang(cfg, flags, why), f"config keys (SGLang not importable: {why})"
    model_facts, server, index_layers, server_kv = found
    device, device_text = _device(capability)
    decision: Decision = decide(model_facts, server, device)
    arch = model_facts.architecture or f"no architectures in config, model_type {cfg.get('model_type')!r}"
    out = {"decision": decision, "device": device_text, "detection": detection, "model": model_facts,
           "model_text": arch, "layers": int(cfg.get("num_hidden_layers", 0) or 0), "index_layers": index_layers,
           "file": str(file), "dcp_size": server.dcp_size}
    if model_facts.is_dsa:
        out["index_keys"] = index_key_rotation(model_facts, server)[1]
    if model_facts.is_dsa and out["layers"] > 0 and "kv_lora_rank" in cfg:
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
        fp4_mode = SHARDED if server.dcp_shard and w > 1 else REPLICATED  # gate.decide's rule, refused or not

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


def main(args: argparse.Namespace) -> int:
    """Print the check; exit code 0 when the FP4 indexer would be enabled, 1 when refused."""
    from rich.console import Console
    from rich.table import Table

    res = run_check(args.model, memory_gib=args.memory_gib, capability=args.capability,
                    kv_cache_dtype=args.kv_cache_dtype, server_flags=shlex.split(args.sglang_args))
    d: Decision = res["decision"]
    console = Console(highlight=False)
    console.print(f"model: {res['model_text']} ({res['file']}; classified by {res['detection']})")
    console.print(f"device: {res['device']}")
    if "index_keys" in res:
        console.print(f"index keys: {res['index_keys']}")
    if d.enabled:
        console.print(f"FP4 indexer: ENABLED - {d.reason}")
    else:
        console.print(f"FP4 indexer: DISABLED (SGLang keeps its FP8 indexer) - {d.reason}")
        console.print(f"fix: {d.fix}")
    cap: DcpCapacity | None = res.get("capacity")
    if cap is None:
        console.print("memory effect: none (no DSA index-key cache)")
        return 0 if d.enabled else 1
    w = res["dcp_size"]
    where = "per GPU" if w == 1 else f"per rank, DCP {w} (MLA KV sharded over the {w} ranks)"
    notes = []
    if w > 1:
        notes.append("* the mode " + ("the server would use" if d.enabled else "these flags give")
                     + " (--fp4-indexer-dcp-shard: sharded)")
    if not d.enabled:
        notes.append("FP4 rows: what FP4 would give if the refusal were lifted; the server keeps FP8")
    table = Table(title=f"memory effect, {args.memory_gib:g} GiB KV pool {where}", caption="\n".join(notes) or None)
    table.add_column("index cache", no_wrap=True)
    table.add_column("index B/token/layer", justify="right")
    table.add_column("KV + index B/token/layer", justify="right")
    table.add_column("KV + index B/token", justify="right")
    table.add_column("KV tokens", justify="right")
    for label, idx, per_layer, total, tokens in res["rows"]:
        table.add_row(label, _fmt(idx), _fmt(per_layer), _fmt(total), str(tokens))
    console.print(table)
    gain = cap.gain_sharded if res["fp4_mode"] == SHARDED else cap.gain_replicated
    tokens = cap.tokens_fp4_sharded if res["fp4_mode"] == SHARDED else cap.tokens_fp4_replicated
    mode = "" if w == 1 else f" ({res['fp4_mode']})"
    console.print(
        f"layers: {res['layers']} ({res['index_layers']} with an index cache); MLA KV {res['kv_bytes']} B/token/layer "
        f"({res['kv_dtype']}: {res['kv_dtype_why']})"
    )
    if d.enabled:
        console.print(f"extra KV tokens with FP4{mode}: {tokens - cap.tokens_fp8} (+{gain * 100:.1f} %)")
    else:
        console.print(f"FP4 is not used; if the refusal were lifted, FP4{mode} would add "
                      f"{tokens - cap.tokens_fp8} KV tokens (+{gain * 100:.1f} %)")
    return 0 if d.enabled else 1
