"""The model ``check`` is asked about: packaged configs, reading and validating its ``config.json``, the MLA KV
format SGLang would pick and its size, and the model and server facts from the config keys alone (without SGLang).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ..gate import INDEXER_FUSION_ENV, INTERLEAVED_INDEXER_ARCHS, ModelFacts, ServerFacts

__all__ = [
    "load_hf_config",
    "mla_kv_bytes_per_token",
    "sglang_kv_cache_dtype",
    "PACKAGED_MODELS",
    "packaged_model",
    "resolve_model",
    "DSA_KV_DTYPE_ARCHS",
]


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
             "index_n_heads", "index_kpool", "index_topk_freq", "max_position_embeddings", "hidden_size",
             "intermediate_size", "moe_intermediate_size", "num_attention_heads", "num_key_value_heads",
             "vocab_size", "q_lora_rank", "qk_nope_head_dim", "v_head_dim", "n_routed_experts", "n_shared_experts",
             "num_experts_per_tok", "first_k_dense_replace", "num_nextn_predict_layers")
#: Of ``_INT_KEYS``, those that must also be >= 1 when present.
_POSITIVE_KEYS = ("num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim", "index_n_heads", "index_head_dim",
                  "index_topk", "max_position_embeddings", "hidden_size", "num_attention_heads", "vocab_size")
#: Config keys a DSA model needs for the memory rows (MLA KV size, layer count).
_DSA_SIZE_KEYS = ("num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim")
#: Architectures that are DeepSeek Sparse Attention by name: SGLang classes them as DSA only when the config
#: has ``index_topk`` (``is_deepseek_dsa``), so a config of one of these without it is incomplete.
_DSA_BY_NAME = ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM", "GlmMoeDsaForCausalLMNextN")
#: Config keys a DSA model needs for the check, and what each is; a missing one is a usage error naming it.
_DSA_KEYS = {
    "num_hidden_layers": "the layer count",
    "kv_lora_rank": "the MLA KV rank",
    "qk_rope_head_dim": "the MLA RoPE dims",
    "index_n_heads": "the indexer's head count",
    "index_head_dim": "the index key's length",
}
#: Packaged configs (``data/models/NAME/config.json``): name -> Hugging Face repository. ``check NAME`` (or the
#: repository id) reads them when no local path of that name exists; data/models/README.md says where they come from.
PACKAGED_MODELS = {"deepseek-v3.2": "deepseek-ai/DeepSeek-V3.2", "glm-5": "zai-org/GLM-5", "glm-5.2": "zai-org/GLM-5.2"}
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
            (``num_hidden_layers``, ``kv_lora_rank``, ``index_topk``, ...) is below 1, ``architectures`` is not
            a list of names, or ``quantization_config`` is not an object.
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
        if value is not None and value < 1 and key in _POSITIVE_KEYS:
            raise ValueError(f"model: {file}: {key} must be >= 1, got {value}")
    arch = cfg.get("architectures")
    if arch is not None and not (isinstance(arch, list) and all(isinstance(a, str) for a in arch)):
        raise ValueError(f"model: {file}: architectures must be a list of class names such as "
                         f"[\"DeepseekV32ForCausalLM\"], got {arch!r}")
    quant = cfg.get("quantization_config")
    if quant is not None and not isinstance(quant, dict):
        raise ValueError(f"model: {file}: quantization_config must be a JSON object, got {quant!r}")
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
    return (model, ServerFacts(requested=True, indexer_fusion_disabled=fusion_off), layers, "auto", None, (None, ""),
            None)


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
