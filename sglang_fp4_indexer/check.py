"""``sglang-fp4-indexer check``: would the FP4 indexer serve this model, and what does it save?

Given a model directory (with ``config.json``) or a Hugging Face config JSON,
and optionally SGLang server flags (``--sglang-args="..."``), prints the gate's
``Decision`` as if ``--enable-fp4-indexer`` were given, and the memory effect:
index bytes per token per layer (132 FP8 -> 68 FP4) and the KV tokens a memory
budget holds with each. No weights are read and no GPU is needed.

With SGLang installed, the model is classified by SGLang's own DSA helpers and
the server flags are parsed by SGLang's own parser (``sglang_plugin.facts``).
Without SGLang, the config keys decide (``index_topk`` present, not a
DeepSeek-V4 architecture), and server flags are refused; the output says so.
The device is the local CUDA GPU when there is one, else ``--capability``
(default 9.0, an H200).
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from .gate import Decision, DeviceFacts, ModelFacts, ServerFacts, decide
from .pool import FP4_INDEX_BYTES_PER_TOKEN, FP8_INDEX_BYTES_PER_TOKEN, capacity

__all__ = ["add_arguments", "main", "load_hf_config", "mla_kv_bytes_per_token", "run_check"]

_V4_ARCHS = ("DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``check``."""
    parser.add_argument("model", help="model directory (with config.json) or a Hugging Face config JSON file")
    parser.add_argument("--memory-gib", type=float, default=100.0,
                        help="KV-pool memory budget per GPU in GiB for the token counts (default 100)")
    parser.add_argument("--capability", default=None,
                        help="CUDA compute capability to assume, e.g. 9.0 (default: the local GPU, else 9.0)")
    parser.add_argument("--kv-cache-dtype", choices=("fp8", "bf16"), default="fp8",
                        help="MLA KV cache format for the token counts: FlashMLA FP8 (default) or bf16")
    parser.add_argument("--sglang-args", default="", metavar="FLAGS",
                        help='SGLang server flags as one string, e.g. --sglang-args="--dcp-size 2" '
                             "(parsed by SGLang's own parser; needs SGLang installed)")


def load_hf_config(path: str | Path) -> tuple[dict, Path]:
    """Read ``config.json`` from a model directory, or a config JSON file.

    Returns:
        ``(config dict, the JSON file's path)``.

    Raises:
        ValueError: the path does not exist, has no ``config.json``, or is not a JSON object.
    """
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"model: no config file at {file}")
    try:
        cfg = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"model: {file} is not JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"model: {file} does not hold a JSON object")
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
    """Model facts, server facts and index layer count through SGLang; None when SGLang is not installed."""
    try:
        from .sglang_plugin.facts import index_layer_count, model_facts, server_args_from_flags, server_facts
    except ImportError:
        return None
    record = server_args_from_flags(model_path, flags, requested=True)
    layers = int(cfg.get("num_hidden_layers", 0) or 0)
    return model_facts(cfg), server_facts(record), index_layer_count(cfg, layers)


def _without_sglang(cfg: dict, flags: list[str]):
    if flags:
        raise ValueError("server flags: SGLang is not installed, so they cannot be parsed")
    archs = cfg.get("architectures") or [None]
    v4 = archs[0] in _V4_ARCHS
    model = ModelFacts(
        architecture=archs[0],
        is_dsa=cfg.get("index_topk") is not None and not v4,
        is_deepseek_v4=v4,
        index_head_dim=cfg.get("index_head_dim"),
        index_n_heads=cfg.get("index_n_heads"),
        index_kpool=int(cfg.get("index_kpool", 1) or 1),
    )
    layers = int(cfg.get("num_hidden_layers", 0) or 0)
    return model, ServerFacts(requested=True), layers


def run_check(model: str, *, memory_gib: float = 100.0, capability: str | None = None,
              kv_cache_dtype: str = "fp8", server_flags: list[str] | None = None) -> dict:
    """Do the check and return its findings (what ``main`` prints).

    Returns:
        dict with ``decision`` (``Decision``), ``device`` (text), ``detection``
        (``"sglang"`` or ``"config keys"``), ``layers``, ``index_layers`` and,
        for MLA models, ``capacity`` (``pool.Capacity``) and ``kv_bytes``.

    Raises:
        ValueError: unreadable config, bad options, or rejected server flags.
    """
    if memory_gib <= 0:
        raise ValueError(f"--memory-gib: expected > 0, got {memory_gib}")
    flags = list(server_flags or [])
    cfg, file = load_hf_config(model)
    found = _with_sglang(cfg, str(file.parent), flags)
    detection = "sglang"
    if found is None:
        found, detection = _without_sglang(cfg, flags), "config keys"
    model_facts, server, index_layers = found
    device, device_text = _device(capability)
    decision: Decision = decide(model_facts, server, device)
    out = {"decision": decision, "device": device_text, "detection": detection, "model": model_facts,
           "layers": int(cfg.get("num_hidden_layers", 0) or 0), "index_layers": index_layers, "file": str(file)}
    if model_facts.is_dsa and out["layers"] > 0 and "kv_lora_rank" in cfg:
        kv = mla_kv_bytes_per_token(cfg, kv_cache_dtype)
        out["kv_bytes"] = kv
        out["capacity"] = capacity(int(memory_gib * 2**30), kv, out["layers"], num_index_layers=index_layers)
    return out


def main(args: argparse.Namespace) -> int:
    """Print the check; exit code 0 when the FP4 indexer would be enabled, 1 when refused."""
    from rich.console import Console
    from rich.table import Table

    res = run_check(args.model, memory_gib=args.memory_gib, capability=args.capability,
                    kv_cache_dtype=args.kv_cache_dtype, server_flags=shlex.split(args.sglang_args))
    d: Decision = res["decision"]
    console = Console(highlight=False)
    console.print(f"model: {res['model'].architecture} ({res['file']}; classified by {res['detection']})")
    console.print(f"device: {res['device']}")
    if d.enabled:
        console.print(f"FP4 indexer: ENABLED - {d.reason}")
    else:
        console.print(f"FP4 indexer: DISABLED (SGLang keeps its FP8 indexer) - {d.reason}")
        console.print(f"fix: {d.fix}")
    cap = res.get("capacity")
    if cap is None:
        console.print("memory effect: none (no DSA index-key cache)")
        return 0 if d.enabled else 1
    table = Table(title=f"memory effect, {args.memory_gib:g} GiB KV pool per GPU")
    table.add_column("index cache")
    table.add_column("index B/token/layer", justify="right")
    table.add_column("KV + index B/token", justify="right")
    table.add_column("KV tokens", justify="right")
    table.add_row("FP8 (SGLang)", str(FP8_INDEX_BYTES_PER_TOKEN), str(cap.bytes_per_token_fp8), str(cap.tokens_fp8))
    table.add_row("FP4 (this plugin)", str(FP4_INDEX_BYTES_PER_TOKEN), str(cap.bytes_per_token_fp4), str(cap.tokens_fp4))
    console.print(table)
    console.print(
        f"layers: {res['layers']} ({res['index_layers']} with an index cache); MLA KV {res['kv_bytes']} B/token/layer "
        f"({args.kv_cache_dtype}); extra KV tokens with FP4: {cap.tokens_fp4 - cap.tokens_fp8} (+{cap.gain * 100:.1f} %)"
    )
    return 0 if d.enabled else 1
